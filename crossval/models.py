"""Tiny random-weight Llama models and maps fitted on them through the project's own calibration, for
the fill property tests (no download; each model is built once per session).

Maps come from :func:`ridgefill.calibration.calibrate` on random text with a one-character-per-token
tokenizer, so they carry the model's hash and pass :meth:`ridgefill.RidgeMaps.check_model`.
"""

from __future__ import annotations

import functools
import random

import torch
from hypothesis import strategies as st
from ridgefill import RidgeMaps
from ridgefill.calibration import calibrate
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

VOCAB = 61
#: (seed, layers, hidden, attention heads, KV heads): GQA and MHA, 3 to 5 layers.
CONFIGS = ((0, 4, 32, 4, 2), (1, 5, 16, 2, 1), (2, 3, 24, 2, 2))


@functools.cache
def tiny_llama(index: int) -> LlamaForCausalLM:
    """Model ``CONFIGS[index]``: float32 random weights, eval mode."""
    seed, layers, hidden, heads, kv = CONFIGS[index]
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=256,
                      rope_theta=10000.0, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


#: The tiny Gemma 3's sliding window and layer types: sliding-window layers mixed with full ones.
GEMMA_WINDOW = 6
GEMMA_TYPES = ("sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention",
               "sliding_attention")


@functools.cache
def tiny_gemma3() -> Gemma3ForCausalLM:
    """A random Gemma 3 text model with sliding-window layers (window :data:`GEMMA_WINDOW`, layer types
    :data:`GEMMA_TYPES`), vocabulary :data:`VOCAB`, hidden 32, 2 heads, 1 KV head, float32, eval mode."""
    torch.manual_seed(7)
    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=len(GEMMA_TYPES),
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
        sliding_window=GEMMA_WINDOW, layer_types=list(GEMMA_TYPES), query_pre_attn_scalar=16,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return Gemma3ForCausalLM(cfg).eval()


class CharTokenizer:
    """One token per character (``ord(c) mod VOCAB``): enough for :func:`ridgefill.calibration.calibrate`."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) % VOCAB for c in text]}


def random_text(seed: int, chars: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ,.;ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(chars))


@functools.cache
def fitted_maps(index: int, split: int, lam: float | str = "auto", context: int = 0) -> RidgeMaps:
    """Maps for ``tiny_llama(index)`` at ``split``, calibrated on 1024 random tokens (chunks of 64); with
    ``context = 1``, context maps (input ``[h_S(t), h_S(t−1)]``, :func:`ridgefill.fill.context_features`)."""
    return calibrate(tiny_llama(index), CharTokenizer(), [random_text(index, 1024)], split=split, tokens=1024,
                     chunk=64, lam=lam, model_name=f"tiny-{index}", progress=False, context=context)


@torch.no_grad()
def reference(model: LlamaForCausalLM, ids: torch.Tensor):
    """The plain ``transformers`` forward: ``.cache``, ``.logits`` ``[batch, N, vocab]`` and
    ``.hidden_states`` (entry ``l`` is the input of layer ``l``)."""
    return model(ids, cache=DynamicCache(config=model.config), use_cache=True, output_hidden_states=True)


def kv(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[batch, kv_heads, rows, head_dim]`` of ``layer`` in a ``transformers`` cache."""
    return cache.layers[layer].keys, cache.layers[layer].values


@st.composite
def prompts(draw, min_rows: int = 2, max_rows: int = 40):
    """``(index, ids [batch, N], split, tail, exact_rows)`` for one of :data:`CONFIGS`."""
    index = draw(st.integers(0, len(CONFIGS) - 1))
    layers = CONFIGS[index][1]
    n = draw(st.integers(min_rows, max_rows))
    batch = draw(st.integers(1, 2))
    ids = torch.tensor(draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n),
                                     min_size=batch, max_size=batch)), dtype=torch.long)
    split = draw(st.integers(0, layers - 2))
    tail = draw(st.integers(1, n))
    exact_rows = draw(st.lists(st.integers(0, n - 1), max_size=3, unique=True))
    return index, ids, split, tail, exact_rows


def oracle_maps(ref, split: int, layers: int, rows: torch.Tensor) -> RidgeMaps:
    """Maps that reproduce the true late-layer inputs of the prompt's ``rows`` (bool ``[N]``):
    ``[h_S 1] [W; b] = x_l`` by least squares over those rows of every batch entry, an exact
    interpolation when there are at most ``hidden`` of them and they are generic."""
    h = ref.hidden_states[split + 1][:, rows].double().flatten(0, 1)
    ha = torch.cat([h, torch.ones(h.shape[0], 1, dtype=h.dtype)], 1)
    ws, bs = [], []
    for layer in range(split + 1, layers):
        sol = torch.linalg.lstsq(ha, ref.hidden_states[layer][:, rows].double().flatten(0, 1)).solution
        ws.append(sol[:-1])
        bs.append(sol[-1])
    return RidgeMaps(split, torch.stack(ws).float(), torch.stack(bs).float(), [0.0] * len(ws))
