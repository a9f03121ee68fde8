"""Shared fixtures: tiny random-weight Llama models built in the test process (no download)."""

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from ridgefill import RidgeMaps


def script_module(name: str):
    """The research script ``scripts/<name>.py`` imported as a module (its ``main`` not run)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_llama(seed: int = 0, layers: int = 6, hidden: int = 64, vocab: int = 101) -> LlamaForCausalLM:
    """A random Llama (GQA: 4 heads, 2 KV heads) with float32 weights, in eval mode."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    return model


@pytest.fixture(scope="session")
def tiny():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 101, (2, 48), generator=g)


@torch.no_grad()
def reference(model, ids):
    cache = DynamicCache(config=model.config)
    out = model(ids, cache=cache, use_cache=True, output_hidden_states=True)
    return out


def oracle_maps(model, ids, split):
    """Maps that reproduce the true late-layer inputs of *these* rows: with no more rows than
    hidden + 1 the least-squares fit of ``x_l`` on ``[h_S, 1]`` interpolates them exactly. Used to
    check the fill path, not the fit."""
    out = reference(model, ids)
    h = out.hidden_states[split + 1][0].double()
    ha = torch.cat([h, torch.ones(h.shape[0], 1, dtype=h.dtype)], 1)
    ws, bs = [], []
    for layer in range(split + 1, model.config.num_hidden_layers):
        x = out.hidden_states[layer][0].double()
        sol = torch.linalg.lstsq(ha, x).solution
        ws.append(sol[:-1])
        bs.append(sol[-1])
    return RidgeMaps(split, torch.stack(ws).float(), torch.stack(bs).float(), [0.0] * len(ws))


def oracle_context_maps(model, ids, split, swap=False):
    """Context maps (input ``[h_S(t), h_S(t−1)]``, :func:`ridgefill.fill.context_features`) that interpolate
    *these* rows' true late-layer inputs: the least-squares fit on ``[h_S(t), h_S(t−1), 1]`` with no more rows
    than ``2·hidden + 1``. ``swap``: the two feature blocks' weights exchanged (a map reading the wrong block)."""
    from ridgefill.fill import context_features

    out = reference(model, ids)
    d = model.config.hidden_size
    feats = context_features(out.hidden_states[split + 1][0].double(), 1)
    fa = torch.cat([feats, torch.ones(feats.shape[0], 1, dtype=feats.dtype)], 1)
    ws, bs = [], []
    for layer in range(split + 1, model.config.num_hidden_layers):
        sol = torch.linalg.lstsq(fa, out.hidden_states[layer][0].double(), driver="gelsd").solution
        w = sol[:-1]
        ws.append(torch.cat([w[d:], w[:d]]) if swap else w)
        bs.append(sol[-1])
    return RidgeMaps(split, torch.stack(ws).float(), torch.stack(bs).float(), [0.0] * len(ws), {"context": 1})
