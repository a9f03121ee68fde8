"""The fill prefill on tiny random Llama models: exactness, causality, oracle maps, decoding."""

import pytest
import torch

from ridgefill import InputError, generate_after, predict_inputs, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.adapters import adapter_for
from conftest import oracle_maps, reference, tiny_llama

S = 2


def cache_kv(cache, layer):
    return cache.layers[layer].keys, cache.layers[layer].values


def test_exact_mode_equals_plain_forward(tiny, tiny_ids):
    out = reference(tiny, tiny_ids)
    res = prefill_instrumented(tiny, tiny_ids, tail=tiny_ids.shape[1], mode="exact", logits="exact", select=None)
    assert torch.equal(res.logits, out.logits)
    for layer in range(tiny.config.num_hidden_layers):
        for a, b in zip(cache_kv(res.cache, layer), cache_kv(out.cache, layer)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["identity", "none", "ridge"])
def test_tail_whole_prompt_equals_exact(tiny, tiny_ids, mode):
    out = reference(tiny, tiny_ids)
    maps = oracle_maps(tiny, tiny_ids[:1], S) if mode == "ridge" else None
    res = prefill_instrumented(tiny, tiny_ids, maps, tail=tiny_ids.shape[1], mode=mode, split=S, logits="exact", select=None)
    torch.testing.assert_close(res.logits, out.logits, rtol=0, atol=2e-5)
    for layer in range(tiny.config.num_hidden_layers):
        for a, b in zip(cache_kv(res.cache, layer), cache_kv(out.cache, layer)):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("mode", ["identity", "none"])
def test_lower_layers_exact_and_late_layers_differ(tiny, tiny_ids, mode):
    out = reference(tiny, tiny_ids)
    res = prefill(tiny, tiny_ids, tail=8, mode=mode, split=S, select=None)
    for layer in range(S + 1):
        for a, b in zip(cache_kv(res.cache, layer), cache_kv(out.cache, layer)):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    # the last layer's filled rows are predicted, not exact: the check above is not vacuous
    k, _ = cache_kv(res.cache, 5)
    if mode == "identity":
        assert (k[:, :, :40] - out.cache.layers[5].keys[:, :, :40]).abs().max() > 1e-2
    else:
        assert k.shape[2] == 8  # mode none: late layers hold the exact rows only


def test_identity_fill_first_late_layer_is_exact(tiny, tiny_ids):
    """x_{S+1} = h_S, so the identity fill is exact at layer S+1 (and not beyond)."""
    out = reference(tiny, tiny_ids)
    res = prefill(tiny, tiny_ids, tail=8, mode="identity", split=S, select=None)
    torch.testing.assert_close(res.cache.layers[S + 1].keys, out.cache.layers[S + 1].keys, rtol=0, atol=2e-5)


def test_oracle_maps_give_exact_cache_and_logits():
    model = tiny_llama(seed=3, hidden=96)
    ids = torch.randint(0, 101, (1, 60), generator=torch.Generator().manual_seed(5))
    maps = oracle_maps(model, ids, S)
    out = reference(model, ids)
    res = prefill_instrumented(model, ids, maps, tail=6, mode="ridge", logits="exact", select=None)
    for layer in range(model.config.num_hidden_layers):
        for a, b in zip(cache_kv(res.cache, layer), cache_kv(out.cache, layer)):
            torch.testing.assert_close(a, b, rtol=0, atol=5e-4)
    torch.testing.assert_close(res.logits, out.logits[:, -6:], rtol=0, atol=5e-4)


def test_oracle_maps_with_selected_exact_rows():
    model = tiny_llama(seed=3, hidden=96)
    ids = torch.randint(0, 101, (1, 60), generator=torch.Generator().manual_seed(5))
    maps = oracle_maps(model, ids, S)
    out = reference(model, ids)
    rows = [0, 17, 41]
    res = prefill_instrumented(model, ids, maps, tail=4, exact_rows=rows, mode="ridge", logits="exact", select=None)
    assert res.exact_positions.tolist() == rows + [56, 57, 58, 59]
    torch.testing.assert_close(res.logits, out.logits[:, res.exact_positions], rtol=0, atol=5e-4)


def test_scattered_exact_rows_attend_in_blocks(monkeypatch):
    """Exact rows spread over the prompt attend in blocks of ``query_block`` rows, each block reading
    the keys up to its last row only: blocks of 2 rows give the true model's logits (oracle maps) and,
    in mode none (keys masked to the exact rows), the same logits and cache as one block."""
    model = tiny_llama(seed=3, hidden=96)
    ids = torch.randint(0, 101, (1, 60), generator=torch.Generator().manual_seed(5))
    maps = oracle_maps(model, ids, S)
    out = reference(model, ids)
    rows = [0, 3, 17, 18, 30, 41, 50]
    one = prefill_instrumented(model, ids, maps, tail=4, exact_rows=rows, mode="none", split=S, logits="exact", select=None)
    monkeypatch.setattr(type(adapter_for(model)), "query_block", 2)
    res = prefill_instrumented(model, ids, maps, tail=4, exact_rows=rows, mode="ridge", logits="exact", select=None)
    torch.testing.assert_close(res.logits, out.logits[:, res.exact_positions], rtol=0, atol=5e-4)
    blocks = prefill_instrumented(model, ids, maps, tail=4, exact_rows=rows, mode="none", split=S, logits="exact", select=None)
    torch.testing.assert_close(blocks.logits, one.logits, rtol=0, atol=1e-5)
    for layer in range(model.config.num_hidden_layers):
        for a, b in zip(cache_kv(blocks.cache, layer), cache_kv(one.cache, layer)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("mode", ["identity", "none"])
def test_attention_blocks_read_keys_up_to_their_last_row(monkeypatch, family, mode):
    """Batch 2, Llama and Gemma 3's full-attention layers: blocks of 3 rows give the logits and cache of
    one block, and each block's attention call reads exactly the keys up to its last row."""
    import sys

    import ridgefill.adapters.llama as llama_module
    from test_gemma3 import tiny_gemma3

    model = tiny_llama(seed=4) if family == "llama" else tiny_gemma3(seed=4)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (2, 50), generator=torch.Generator().manual_seed(6))
    rows = [0, 5, 9, 22, 23, 31, 40]
    kwargs = dict(tail=3, exact_rows=rows, mode=mode, split=S, logits="exact", select=None)
    one = prefill_instrumented(model, ids, **kwargs)
    monkeypatch.setattr(type(adapter_for(model)), "query_block", 3)
    seen, sdpa = [], llama_module.F.scaled_dot_product_attention

    def spy(q, k, v, **kw):  # the masked calls of LlamaAdapter.attend (not the causal lower layers)
        if kw.get("attn_mask") is not None and sys._getframe(1).f_code.co_filename.endswith("llama.py"):
            seen.append((q.shape[2], k.shape[2]))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(llama_module.F, "scaled_dot_product_attention", spy)
    blocks = prefill_instrumented(model, ids, **kwargs)
    torch.testing.assert_close(blocks.logits, one.logits, rtol=0, atol=1e-5)
    for layer in range(model.config.num_hidden_layers):
        for a, b in zip(cache_kv(blocks.cache, layer), cache_kv(one.cache, layer)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    exact = blocks.exact_positions.tolist()  # [0, 5, 9, 22, 23, 31, 40, 47, 48, 49]
    want = [(len(exact[i:i + 3]), exact[min(i + 3, len(exact)) - 1] + 1) for i in range(0, len(exact), 3)]
    late_full = [layer for layer in range(S + 1, model.config.num_hidden_layers)
                 if not getattr(adapter_for(model), "is_sliding", lambda _: False)(layer)]
    assert seen == want * len(late_full)


def test_attention_blocks_any_row_order(monkeypatch):
    """Rows in any order: a block reads the keys up to its latest row, so blocks of 2 equal one call."""
    ad = adapter_for(tiny_llama(seed=5))
    g = torch.Generator().manual_seed(7)
    positions = torch.tensor([30, 5, 12, 39, 2])
    q = torch.randn(1, ad.num_heads, 5, ad.head_dim, generator=g)
    k, v = (torch.randn(1, ad.num_kv_heads, 40, ad.head_dim, generator=g) for _ in range(2))
    one = ad.attend(3, q, positions, k, v, None)
    monkeypatch.setattr(type(ad), "query_block", 2)
    torch.testing.assert_close(ad.attend(3, q, positions, k, v, None), one, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["ridge", "identity", "none"])
def test_causality_later_tokens_never_change_earlier_rows(tiny, tiny_ids, mode):
    t = 30
    maps = oracle_maps(tiny, tiny_ids[:1], S) if mode == "ridge" else None
    changed = tiny_ids.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 7) % 101
    a = prefill(tiny, tiny_ids, maps, tail=5, mode=mode, split=S, select=None)
    b = prefill(tiny, changed, maps, tail=5, mode=mode, split=S, select=None)
    for layer in range(tiny.config.num_hidden_layers):
        ka, va = cache_kv(a.cache, layer)
        kb, vb = cache_kv(b.cache, layer)
        if ka.shape[2] == tiny_ids.shape[1]:  # every row present (not the late layers of mode none)
            assert torch.equal(ka[:, :, : t + 1], kb[:, :, : t + 1])
            assert torch.equal(va[:, :, : t + 1], vb[:, :, : t + 1])
            assert not torch.equal(ka[:, :, t + 1:], kb[:, :, t + 1:])  # the change did reach later rows


def test_every_row_has_a_cache_entry_at_every_layer(tiny, tiny_ids):
    res = prefill(tiny, tiny_ids, tail=5, mode="identity", split=S, select=None)
    for layer in range(tiny.config.num_hidden_layers):
        k, v = cache_kv(res.cache, layer)
        assert k.shape[2] == v.shape[2] == tiny_ids.shape[1]
        assert torch.isfinite(k).all() and torch.isfinite(v).all()
        assert (k.abs().sum(-1) > 0).all()  # no empty (zero) rows


@pytest.mark.parametrize("mode", ["ridge", "identity", "none"])
def test_decode_step_equals_prefill_with_one_more_exact_row(tiny, tiny_ids, mode):
    """A decoding step after the fill is the full model on one more exact row."""
    maps = oracle_maps(tiny, tiny_ids[:1], S) if mode == "ridge" else None
    res = prefill(tiny, tiny_ids, maps, tail=5, mode=mode, split=S, select=None)
    nxt = res.logits.argmax(-1)
    with torch.no_grad():
        step = tiny(nxt, cache=res.cache, use_cache=True).logits
    longer = prefill(tiny, torch.cat([tiny_ids, nxt], 1), maps, tail=6, mode=mode, split=S, select=None)
    torch.testing.assert_close(step, longer.logits, rtol=0, atol=2e-5)


def test_generate_after_exact_fill_matches_exact():
    model = tiny_llama(seed=3, hidden=96)
    ids = torch.randint(0, 101, (1, 60), generator=torch.Generator().manual_seed(5))
    maps = oracle_maps(model, ids, S)
    ref = generate_after(model, ids, prefill(model, ids, tail=6, mode="exact", select=None), 8)
    got = generate_after(model, ids, prefill(model, ids, maps, tail=6, mode="ridge", select=None), 8)
    with torch.no_grad():
        plain = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)[:, 60:]
    assert torch.equal(ref, plain)
    assert torch.equal(got, ref)


def test_predict_inputs_identity_is_identity():
    h = torch.randn(2, 5, 8)
    assert torch.equal(predict_inputs(h, torch.eye(8), torch.zeros(8)), h)
    w, b = torch.randn(8, 8), torch.randn(8)
    torch.testing.assert_close(predict_inputs(h, w, b), h @ w + b)


def test_bad_inputs(tiny, tiny_ids):
    n = tiny_ids.shape[1]
    with pytest.raises(InputError, match="tail"):
        prefill(tiny, tiny_ids, tail=n + 1, mode="identity", split=S, select=None)
    with pytest.raises(InputError, match="tail"):
        prefill(tiny, tiny_ids, tail=0, mode="identity", split=S, select=None)
    with pytest.raises(InputError, match="split"):
        prefill(tiny, tiny_ids, tail=4, mode="identity", split=5, select=None)
    with pytest.raises(InputError, match="split"):
        prefill(tiny, tiny_ids, tail=4, mode="identity", split=-1, select=None)
    with pytest.raises(InputError, match="mode"):
        prefill(tiny, tiny_ids, tail=4, mode="fast", split=S, select=None)
    with pytest.raises(InputError, match="needs maps"):
        prefill(tiny, tiny_ids, tail=4, mode="ridge", select=None)
    with pytest.raises(InputError, match="exact_rows"):
        prefill(tiny, tiny_ids, tail=4, exact_rows=[n], mode="identity", split=S, select=None)
    with pytest.raises(InputError, match="int64"):
        prefill(tiny, tiny_ids.float(), tail=4, mode="identity", split=S, select=None)


def test_nan_activations_raise(tiny_ids):
    from ridgefill import NonFiniteError

    model = tiny_llama(seed=4)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="h_S"):
        prefill(model, tiny_ids, tail=4, mode="identity", split=S, select=None)


def test_adapter_kv_matches_transformers_cache(tiny, tiny_ids):
    """The adapter's K/V for rows from their true layer input equal transformers' cache."""
    out = reference(tiny, tiny_ids)
    ad = adapter_for(tiny)
    pos = torch.arange(tiny_ids.shape[1])
    x = out.hidden_states[4]
    k, v = ad.kv(4, x, ad.rope(pos, x))
    torch.testing.assert_close(k, out.cache.layers[4].keys, rtol=0, atol=1e-5)
    torch.testing.assert_close(v, out.cache.layers[4].values, rtol=0, atol=1e-5)
