"""The fast fill path equals the reference path numerically (cache and logits).

Fast path: the filled rows' K/V of every late layer from the split state
(:meth:`ridgefill.adapters.LlamaAdapter.fill_kv`: context features read in place, norm weight folded into the
fused K/V weight, RoPE written into the cache, in blocks of rows). Reference: ``prefill_instrumented(..., fast=False, select=None)``, one layer at a time
through ``predict_inputs`` and the adapter's ``kv`` (the layer's own norm, projections and RoPE).
"""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from ridgefill import RidgeMaps, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.adapters import adapter_for
from ridgefill.bench import timing_maps

S = 2


def llama(seed=0, hidden=64, layers=6, bias=False, dtype=torch.float32):
    """A tiny random Llama whose RMSNorm weights are random too (they are 1 at initialisation, which
    would hide a wrong fold of the norm weight into the K/V weights)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=101, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=10000.0, tie_word_embeddings=False, attention_bias=bias)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.to(dtype)


def random_maps(model, split=S, seed=0):
    """Maps far from the identity, with a non-zero bias, in the model's dtype."""
    maps = timing_maps(model, split, seed=seed, scale=0.5)
    g = torch.Generator().manual_seed(seed + 1)
    bias = torch.randn(maps.biases.shape, generator=g) * 0.1
    return RidgeMaps(split, maps.weights, bias.to(maps.biases.dtype), maps.lambdas)


def ids_for(model, rows=40, batch=2, seed=2):
    return torch.randint(0, model.config.vocab_size, (batch, rows), generator=torch.Generator().manual_seed(seed))


def assert_same(a, b, layers, atol):
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=atol)
    for layer in range(layers):
        torch.testing.assert_close(a.cache.layers[layer].keys, b.cache.layers[layer].keys, rtol=0, atol=atol)
        torch.testing.assert_close(a.cache.layers[layer].values, b.cache.layers[layer].values, rtol=0, atol=atol)


@pytest.mark.parametrize("mode", ["ridge", "identity"])
@pytest.mark.parametrize("exact_rows", [(), (0, 7, 19)])
@pytest.mark.parametrize("bias", [False, True])
def test_fast_equals_reference(mode, exact_rows, bias):
    model = llama(seed=1, bias=bias)
    ids = ids_for(model)
    maps = random_maps(model) if mode == "ridge" else None
    kw = dict(tail=5, exact_rows=exact_rows, mode=mode, split=S, logits="exact", select=None)
    fast = prefill_instrumented(model, ids, maps, **kw)
    ref = prefill_instrumented(model, ids, maps, fast=False, **kw)
    assert torch.equal(fast.exact_positions, ref.exact_positions)
    assert_same(fast, ref, model.config.num_hidden_layers, atol=1e-5)
    # the late layers' filled rows are predicted (the comparison is not between two exact caches)
    assert fast.cache.layers[5].keys.abs().sum() > 0


def test_fast_path_is_taken_and_skips_per_layer_kv(monkeypatch):
    model = llama(seed=2)
    ad = adapter_for(model)
    assert ad.supports_fill_kv()
    calls = {"fill_kv": 0, "kv": 0}
    fill_kv, kv = ad.fill_kv, ad.kv

    def count_fill(*a, **k):
        calls["fill_kv"] += 1
        return fill_kv(*a, **k)

    def count_kv(*a, **k):
        calls["kv"] += 1
        return kv(*a, **k)

    monkeypatch.setattr(ad, "fill_kv", count_fill)
    monkeypatch.setattr(ad, "kv", count_kv)
    ids = ids_for(model, batch=1)
    prefill(model, ids, random_maps(model), tail=4, mode="ridge", select=None)
    assert calls == {"fill_kv": 1, "kv": 0}
    prefill_instrumented(model, ids, random_maps(model), tail=4, mode="ridge", fast=False, select=None)
    assert calls == {"fill_kv": 1, "kv": model.config.num_hidden_layers - S - 1}


def test_kv_hook_uses_the_per_layer_path():
    """A splice hook sees each layer's K/V, so the fast step is not used; results still agree."""
    model = llama(seed=3)
    ids = ids_for(model, batch=1)
    maps = random_maps(model)
    seen = []

    def hook(layer, k, v, filled):
        seen.append(layer)
        return k, v

    a = prefill_instrumented(model, ids, maps, tail=4, mode="ridge", kv_hook=hook, select=None)
    b = prefill(model, ids, maps, tail=4, mode="ridge", select=None)
    assert seen == list(range(S + 1, model.config.num_hidden_layers))
    assert_same(a, b, model.config.num_hidden_layers, atol=1e-5)


@pytest.mark.parametrize("maps_kind", ["identity", "plain", "context"])
def test_fill_kv_equals_the_layers_kv_for_any_rows_and_blocks(maps_kind):
    """``fill_kv`` over rows ``start..stop-1`` (all rows, a range that starts after row 0, which context maps
    must read back from, and the same in blocks of 5 rows) equals the layer's own norm, K/V and RoPE applied
    to ``f W + b`` (``f`` the rows' :func:`~ridgefill.maps.context_features`); other rows stay untouched."""
    from ridgefill.maps import context_features

    model = llama(seed=4)
    ad = adapter_for(model)
    L, d = model.config.num_hidden_layers, model.config.hidden_size
    late = range(S + 1, L)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 33, d, generator=g)
    context = 1 if maps_kind == "context" else 0
    maps = None if maps_kind == "identity" else timing_maps(model, S, scale=0.5, context=context)
    if maps is not None:
        maps = RidgeMaps(S, maps.weights, torch.randn(maps.biases.shape, generator=g) * 0.1, maps.lambdas,
                         {"context": context})
    w, b = (None, None) if maps is None else (maps.weights, maps.biases)
    feats = context_features(h, context)
    rope = ad.rope(torch.arange(33), h)
    shape = (2, ad.num_kv_heads, 33, ad.head_dim)
    ref = [ad.kv(i, feats if maps is None else feats @ w[i - S - 1] + b[i - S - 1], rope) for i in late]

    def run(start, stop):
        k, v = [torch.full(shape, 7.0) for _ in late], [torch.full(shape, 7.0) for _ in late]
        with torch.inference_mode():
            ad.fill_kv(late, h, w, b, rope.rows(slice(start, stop)), k, v, start, stop)
        return k, v

    old = ad.fill_chunk_bytes
    for start, stop in ((0, 33), (5, 20)):
        for chunk in (old, (d + 2 * ad.num_kv_heads * ad.head_dim) * 4 * 5):  # one block; blocks of 5 rows
            ad.fill_chunk_bytes = chunk
            try:
                k, v = run(start, stop)
            finally:
                ad.fill_chunk_bytes = old
            for i in range(len(late)):
                torch.testing.assert_close(k[i][:, :, start:stop], ref[i][0][:, :, start:stop], rtol=0, atol=1e-5)
                torch.testing.assert_close(v[i][:, :, start:stop], ref[i][1][:, :, start:stop], rtol=0, atol=1e-5)
                assert (k[i][:, :, :start] == 7).all() and (v[i][:, :, stop:] == 7).all()


def test_fill_kv_sees_weight_edits():
    """The folded K/V weights are cached; editing a weight in place must invalidate the cache."""
    model = llama(seed=5)
    ids = ids_for(model, batch=1)
    maps = random_maps(model)
    before = prefill(model, ids, maps, tail=4, mode="ridge", select=None)
    with torch.no_grad():
        model.model.layers[S + 1].input_layernorm.weight.mul_(2.0)
        model.model.layers[S + 2].self_attn.k_proj.weight.mul_(-1.0)
    after = prefill(model, ids, maps, tail=4, mode="ridge", select=None)
    ref = prefill_instrumented(model, ids, maps, tail=4, mode="ridge", fast=False, select=None)
    assert not torch.allclose(before.cache.layers[S + 1].keys, after.cache.layers[S + 1].keys)
    assert_same(after, ref, model.config.num_hidden_layers, atol=1e-5)


def test_fill_kv_rejects_bad_shapes():
    model = llama(seed=6)
    ad = adapter_for(model)
    late = range(S + 1, model.config.num_hidden_layers)
    h = torch.randn(1, 8, model.config.hidden_size)
    rope = ad.rope(torch.arange(8), h)
    good = (1, ad.num_kv_heads, 8, ad.head_dim)
    bufs = lambda shape=good: [torch.empty(shape) for _ in late]  # noqa: E731
    with pytest.raises(ValueError, match="outputs must be"):
        ad.fill_kv(late, h, None, None, rope, bufs(good[:-1] + (3,)), bufs(), 0, 8)
    with pytest.raises(ValueError, match="maps must be"):
        ad.fill_kv(late, h, torch.empty(2, 3, 3), torch.empty(2, 3), rope, bufs(), bufs(), 0, 8)
    with pytest.raises(ValueError, match="rows 0..8"):
        ad.fill_kv(late, h, None, None, rope, bufs(), bufs(), 0, 9)


def test_bfloat16_fast_equals_reference():
    """In bf16 (the GPU dtype) the maps are applied in bf16 and the two paths round differently, by
    a few bf16 ulps of values of size ~1."""
    model = llama(seed=7, dtype=torch.bfloat16)
    ids = ids_for(model)
    maps = random_maps(model)
    assert maps.weights.dtype == torch.bfloat16
    fast = prefill_instrumented(model, ids, maps, tail=5, mode="ridge", logits="exact", select=None)
    ref = prefill_instrumented(model, ids, maps, tail=5, mode="ridge", logits="exact", fast=False, select=None)
    assert fast.cache.layers[5].keys.dtype == torch.bfloat16
    scale = max(ref.cache.layers[i].keys.abs().max().item() for i in range(6))
    assert_same(fast, ref, model.config.num_hidden_layers, atol=0.05 * scale)


def test_float32_maps_on_a_bfloat16_model():
    """Maps are stored in float32 and cast to the model's dtype once per prefill."""
    model = llama(seed=8, dtype=torch.bfloat16)
    ids = ids_for(model, batch=1)
    maps32 = random_maps(model)
    maps32 = RidgeMaps(S, maps32.weights.float(), maps32.biases.float(), maps32.lambdas)
    res = prefill(model, ids, maps32, tail=4, mode="ridge", select=None)
    ref = prefill(model, ids, random_maps(model), tail=4, mode="ridge", select=None)
    assert torch.equal(res.cache.layers[5].keys, ref.cache.layers[5].keys)


def test_conftest_tiny_llama_takes_the_fast_path(tiny, tiny_ids):
    assert adapter_for(tiny).supports_fill_kv()
    a = prefill(tiny, tiny_ids, tail=5, mode="identity", split=S, select=None)
    b = prefill_instrumented(tiny, tiny_ids, tail=5, mode="identity", split=S, fast=False, select=None)
    assert_same(a, b, tiny.config.num_hidden_layers, atol=1e-5)


def test_gemma3_adapter_does_not_use_the_llama_fast_step():
    """Gemma 3 subclasses the Llama adapter but normalises keys per head and scales its norm by
    1 + weight: the Llama fast step must not be used for it."""
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                           sliding_window=8, layer_types=["full_attention"] * 4, query_pre_attn_scalar=24,
                           tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    model = Gemma3ForCausalLM(cfg).eval()
    assert not adapter_for(model).supports_fill_kv()
    ids = ids_for(model, batch=1)
    a = prefill(model, ids, tail=4, mode="identity", split=1, select=None)
    b = prefill_instrumented(model, ids, tail=4, mode="identity", split=1, fast=False, select=None)
    assert_same(a, b, 4, atol=0)

