"""Qwen2, Qwen3, Qwen3-MoE, Mistral and Phi-3 adapters on tiny random models (no download).

Every family is built twice where it has a sliding-window option (window 8, shorter than the 40-row
prompt): without and with windows. Biases and norm weights are random (transformers initialises them
to 0 and 1), so dropping a bias or misplacing a norm changes the results. References are the
``transformers`` forward and ``model.generate``.
"""

import numpy as np
import pytest
import torch
from ridgefill import generate_after, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.adapters import (MistralAdapter, Phi3Adapter, Qwen2Adapter, Qwen3Adapter, adapter_for,
                                supported_model_types)
from transformers import (DynamicCache, MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

from conftest import oracle_maps, reference


@pytest.fixture(autouse=True, scope="module")
def _own_model_cache(tmp_path_factory):
    """The tiny GGUFs here are converted into cached copies (ridgefill.data.models.gguf_copy): keep those out
    of the user's cache. No test here uses the bundled model."""
    mp = pytest.MonkeyPatch()
    mp.setenv("RIDGEFILL_CACHE", str(tmp_path_factory.mktemp("model-cache")))
    yield
    mp.undo()

VOCAB, HIDDEN, LAYERS, WINDOW, N = 101, 64, 5, 8, 40
S = 1  # split: layers 0-1 exact, 2-4 late
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
              pad_token_id=0, eos_token_id=1, bos_token_id=2)

# name -> (model class, config, adapter class, fill_kv expected to be used)
FAMILIES = {
    "qwen2": (Qwen2ForCausalLM, lambda: Qwen2Config(**COMMON), Qwen2Adapter, True),
    "qwen2-window": (Qwen2ForCausalLM, lambda: Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=WINDOW,
                                                           max_window_layers=3), Qwen2Adapter, True),
    "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(**COMMON, head_dim=16), Qwen3Adapter, False),
    "qwen3-bias-window": (Qwen3ForCausalLM, lambda: Qwen3Config(**COMMON, head_dim=16, attention_bias=True,
                                                                use_sliding_window=True, sliding_window=WINDOW,
                                                                max_window_layers=2), Qwen3Adapter, False),
    "qwen3_moe": (Qwen3MoeForCausalLM, lambda: Qwen3MoeConfig(**COMMON, head_dim=16, num_experts=4,
                                                              num_experts_per_tok=2, moe_intermediate_size=32,
                                                              mlp_only_layers=[3]), Qwen3Adapter, False),
    "mistral": (MistralForCausalLM, lambda: MistralConfig(**COMMON, sliding_window=None), MistralAdapter, True),
    "mistral-window": (MistralForCausalLM, lambda: MistralConfig(**COMMON, sliding_window=WINDOW), MistralAdapter,
                       True),
    "phi3": (Phi3ForCausalLM, lambda: Phi3Config(**COMMON), Phi3Adapter, True),
    "phi3-partial-window": (Phi3ForCausalLM, lambda: Phi3Config(**COMMON, partial_rotary_factor=0.5,
                                                                sliding_window=WINDOW), Phi3Adapter, False),
}
_MODELS: dict = {}


def build(name: str):
    """The tiny random model of ``FAMILIES[name]`` (float32, eval mode, random biases and norm weights)."""
    if name not in _MODELS:
        cls, cfg, _, _ = FAMILIES[name]
        torch.manual_seed(0)
        model = cls(cfg()).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.copy_(1 + 0.3 * torch.randn_like(p))
                elif pname.endswith(".bias"):
                    p.normal_(0.0, 0.5)
        _MODELS[name] = model
    return _MODELS[name]


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(1))


def kv(cache, layer):
    return cache.layers[layer].keys, cache.layers[layer].values


def assert_cache_close(a, b, atol):
    assert len(a.layers) == len(b.layers)
    for layer in range(len(a.layers)):
        for x, y in zip(kv(a, layer), kv(b, layer)):
            assert x.shape == y.shape, layer
            torch.testing.assert_close(x, y, rtol=0, atol=atol)


def sliding_layers(model) -> list[int]:
    return [i for i, layer in enumerate(DynamicCache(config=model.config).layers) if getattr(layer, "is_sliding", False)]


def test_supported_types_listed():
    assert {"llama", "gemma3_text", "qwen2", "qwen3", "qwen3_moe", "mistral", "phi3"} <= set(supported_model_types())


@pytest.mark.parametrize("name", FAMILIES)
def test_adapter_and_windows(name):
    """The adapter is the family's; its sliding layers are those transformers' cache makes sliding;
    the batched filled-row path is offered exactly where it computes what ``kv`` computes."""
    model = build(name)
    ad = adapter_for(model)
    assert type(ad) is FAMILIES[name][2]
    assert ad.supports_fill_kv() is FAMILIES[name][3]
    assert [i for i in range(LAYERS) if ad.is_sliding(i)] == sliding_layers(model)
    assert bool(sliding_layers(model)) == ("window" in name)


@pytest.mark.parametrize("name", FAMILIES)
def test_layer_by_layer_equals_transformers(name, ids):
    """Embedding, every layer's output and K/V, and the logits equal the transformers forward."""
    model = build(name)
    out = reference(model, ids)
    ad = adapter_for(model)
    pos = torch.arange(N)
    with torch.no_grad():
        x = ad.embed(ids)
        assert torch.equal(x, out.hidden_states[0])
        rope = ad.rope(pos, x)
        for layer in range(LAYERS):
            k, v = x.new_empty(2, ad.num_kv_heads, N, ad.head_dim), x.new_empty(2, ad.num_kv_heads, N, ad.head_dim)
            kk, vv = ad.kv(layer, x, rope)
            x = ad.layer(layer, x, rope, pos, k, v)
            torch.testing.assert_close(kk, k, rtol=0, atol=1e-6)
            torch.testing.assert_close(vv, v, rtol=0, atol=1e-6)
            ck, cv = kv(out.cache, layer)
            width = ck.shape[2]  # transformers keeps window - 1 rows in sliding layers
            torch.testing.assert_close(k[:, :, -width:], ck, rtol=0, atol=1e-5)
            torch.testing.assert_close(v[:, :, -width:], cv, rtol=0, atol=1e-5)
            if layer < LAYERS - 1:
                torch.testing.assert_close(x, out.hidden_states[layer + 1], rtol=0, atol=1e-5)
        torch.testing.assert_close(ad.logits(x), out.logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_exact_mode_equals_transformers_forward(name, ids):
    model = build(name)
    out = reference(model, ids)
    res = prefill_instrumented(model, ids, tail=N, mode="exact", logits="exact", select=None)
    assert torch.equal(res.logits, out.logits)
    for layer in range(LAYERS):
        (a, b), (c, d) = kv(res.cache, layer), kv(out.cache, layer)
        w = c.shape[2]  # sliding layers: one row more than transformers keeps (see generate_after)
        assert torch.equal(a[:, :, -w:], c) and torch.equal(b[:, :, -w:], d)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("mode", ["identity", "none", "ridge"])
def test_tail_whole_prompt_equals_exact(name, ids, mode):
    model = build(name)
    exact = prefill_instrumented(model, ids, tail=N, mode="exact", logits="exact", select=None)
    maps = oracle_maps(model, ids[:1], S) if mode == "ridge" else None
    res = prefill_instrumented(model, ids, maps, tail=N, mode=mode, split=S, logits="exact", select=None)
    torch.testing.assert_close(res.logits, exact.logits, rtol=0, atol=1e-5)
    assert_cache_close(res.cache, exact.cache, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_oracle_fill_equals_exact_prefill(name, ids):
    """Maps that reproduce the true late-layer inputs: the fill's cache and logits equal the exact
    prefill's (filled rows' K/V through the layer's own norm, projections, biases, q/k norms and RoPE)."""
    model = build(name)
    one = ids[:1]
    maps = oracle_maps(model, one, S)
    exact = prefill_instrumented(model, one, tail=N, mode="exact", logits="exact", select=None)
    for fast in (True, False):
        res = prefill_instrumented(model, one, maps, tail=5, exact_rows=[11, 20], mode="ridge", logits="exact", fast=fast, select=None)
        torch.testing.assert_close(res.logits, exact.logits[:, res.exact_positions], rtol=0, atol=1e-5)
        assert_cache_close(res.cache, exact.cache, atol=1e-5)


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f[3]])
def test_fill_kv_equals_per_layer_path(name, ids):
    """Where the batched filled-row path is used (biases, Phi-3's fused QKV weights), it equals the
    per-layer ``kv`` path; the identity fill differs from the exact cache in late layers."""
    model = build(name)
    maps = oracle_maps(model, ids[:1], S)
    for m in (maps, None):
        mode = "ridge" if m is not None else "identity"
        fast = prefill_instrumented(model, ids, m, tail=4, mode=mode, split=S, logits="exact", fast=True, select=None)
        slow = prefill_instrumented(model, ids, m, tail=4, mode=mode, split=S, logits="exact", fast=False, select=None)
        torch.testing.assert_close(fast.logits, slow.logits, rtol=0, atol=1e-5)
        assert_cache_close(fast.cache, slow.cache, atol=1e-5)
    exact = prefill(model, ids, tail=N, mode="exact", select=None)
    assert (kv(fast.cache, LAYERS - 1)[0] - kv(exact.cache, LAYERS - 1)[0]).abs().max() > 1e-2


@pytest.mark.parametrize("name", FAMILIES)
def test_generate_after_fill_matches_model_generate(name, ids):
    """16 greedy tokens after an exact-input fill (oracle maps, tail 5) equal ``model.generate`` on the
    whole prompt, and so do those after ``mode="exact"`` and after a fill with tail = prompt length."""
    model = build(name)
    one = ids[:1]
    with torch.no_grad():
        plain = model.generate(one, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)[:, N:]
    maps = oracle_maps(model, one, S)
    assert torch.equal(generate_after(model, one, prefill(model, one, tail=N, mode="exact", select=None), 16), plain)
    assert torch.equal(generate_after(model, one, prefill(model, one, maps, tail=5, mode="ridge", select=None), 16), plain)
    assert torch.equal(generate_after(model, one, prefill(model, one, tail=N, mode="identity", split=S, select=None), 16), plain)


@pytest.mark.parametrize("name", FAMILIES)
def test_decode_step_after_full_tail_equals_exact_decoding(name, ids):
    model = build(name)
    exact = prefill(model, ids, tail=N, mode="exact", select=None)
    res = prefill(model, ids, tail=N, mode="identity", split=S, select=None)
    nxt = exact.logits.argmax(-1)
    with torch.no_grad():
        want = model(nxt, cache=exact.cache, use_cache=True).logits
        got = model(nxt, cache=res.cache, use_cache=True).logits
        whole = model(torch.cat([ids, nxt], 1)).logits[:, -1:]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(want, whole, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# The model type is checked before loading
# ------------------------------------------------------------------------------------------------

def test_unsupported_directory_is_refused_before_loading(tmp_path):
    """A config of an unsupported type is refused from config.json alone (there are no weights to load)."""
    from ridgefill import UnsupportedModelError
    from ridgefill.data.models import load_model

    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2}')
    with pytest.raises(UnsupportedModelError, match=r"'gpt2'.*supported: \[.*'phi3'.*'qwen3_moe'"):
        load_model(tmp_path)


def test_unsupported_gguf_is_refused_from_its_header(tmp_path):
    """A GGUF is refused from its general.architecture key, before transformers dequantises anything."""
    import gguf
    from ridgefill import UnsupportedModelError
    from ridgefill.data.models import check_model_type, load_model

    def write(name, arch, model_name):
        w = gguf.GGUFWriter(str(tmp_path / name), arch)
        w.add_name(model_name)
        w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))  # a well-formed file: one tensor
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    write("m.gguf", "mamba", "tiny mamba")
    with pytest.raises(UnsupportedModelError, match=r"GGUF m.gguf .*'mamba'.*supported"):
        load_model(tmp_path / "m.gguf")
    write("q.gguf", "qwen3moe", "tiny")
    assert check_model_type(tmp_path, "q.gguf") == "qwen3_moe"
    write("mi.gguf", "llama", "Mistral 7B Instruct")
    assert check_model_type(tmp_path, "mi.gguf") == "mistral"


def test_supported_directory_loads(tmp_path, ids):
    from ridgefill.data.models import load_model

    model = build("qwen3")
    model.save_pretrained(tmp_path)
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
                            ).save_pretrained(tmp_path)
    loaded, _, _ = load_model(tmp_path)
    assert type(adapter_for(loaded)) is Qwen3Adapter
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_window_wider_than_prompt_uses_fill_kv(ids, monkeypatch):
    """With every filled row inside the window of the exact rows, no row is left out
    (needed_filled_rows gives None) and the batched path runs; it equals the per-layer path and, with
    maps that reproduce the true inputs, the exact prefill."""
    model = build("mistral-window")
    ad = adapter_for(model)
    short = ids[:1, :WINDOW - 1]
    fl, ex = torch.arange(WINDOW - 3), torch.arange(WINDOW - 3, WINDOW - 1)
    assert ad.needed_filled_rows(LAYERS - 1, fl, ex) is None
    assert ad.needed_filled_rows(LAYERS - 1, torch.arange(30), torch.arange(35, 40)).tolist() == list(range(28, 30))
    maps = oracle_maps(model, short, S)
    exact = prefill_instrumented(model, short, tail=short.shape[1], mode="exact", logits="exact", select=None)
    calls = []
    real = ad.fill_kv
    monkeypatch.setattr(ad, "fill_kv", lambda *a, **k: calls.append(1) or real(*a, **k))
    fast = prefill_instrumented(model, short, maps, tail=2, mode="ridge", logits="exact", fast=True, select=None)
    assert calls == [1]
    slow = prefill_instrumented(model, short, maps, tail=2, mode="ridge", logits="exact", fast=False, select=None)
    torch.testing.assert_close(fast.logits, exact.logits[:, -2:], rtol=0, atol=1e-5)
    assert_cache_close(fast.cache, slow.cache, atol=1e-5)
    assert_cache_close(fast.cache, exact.cache, atol=1e-5)
