"""Property tests of ``KvaLean.Causality`` (and ``Identity.identity_fill_eq``) on the real fill.

Every example runs :func:`ridgefill.prefill` on a tiny random Llama (:mod:`crossval.models`) with a
prompt, split, tail and exact rows drawn by Hypothesis, in modes ``ridge`` (maps fitted by the project's
calibration; ``ridge-context``: context maps, whose input is ``[h_S(t), h_S(t−1)]``), ``identity`` and ``none``, and compares its cache (``[batch, kv_heads, rows, head_dim]``
per layer) and logits with the plain ``transformers`` forward. Cache rows are absolute positions.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from ridgefill import RidgeMaps, exact_positions, predict_inputs, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill import fit_maps
from ridgefill.adapters import adapter_for
from ridgefill.adapters.base import apply_rope
from ridgefill.fill import context_features

from crossval import tally
from crossval.models import (
    CONFIGS,
    GEMMA_TYPES,
    GEMMA_WINDOW,
    VOCAB,
    fitted_maps,
    kv,
    oracle_maps,
    prompts,
    reference,
    tiny_gemma3,
    tiny_llama,
)

modes = st.sampled_from(["ridge", "ridge-context", "identity", "none", "exact"])
ATOL = 2e-5  # the adapter's layer code against transformers' (float32, tiny models)


def run(index, ids, split, tail, exact_rows, mode, logits="last"):
    model = tiny_llama(index)
    context = int(mode == "ridge-context")
    maps = fitted_maps(index, split, context=context) if mode.startswith("ridge") else None
    return prefill_instrumented(model, ids, maps, tail=tail, exact_rows=exact_rows, mode=mode.removesuffix("-context"),
                   split=split, logits=logits, select=None)


@given(prompts(), modes, st.data())
def test_later_tokens_never_change_earlier_rows(prompt, mode, data):
    """Causality: changing the tokens after row ``t`` leaves every cache row ``≤ t`` of every layer
    bitwise unchanged (filled and exact rows alike, in the fill modes and the exact model), and does
    change row ``t + 1``."""
    index, ids, split, tail, exact_rows = prompt
    n = ids.shape[1]
    t = data.draw(st.integers(0, n - 2), label="t")
    shift = torch.tensor(data.draw(st.lists(st.integers(1, VOCAB - 1), min_size=n - t - 1, max_size=n - t - 1),
                                   label="token changes"))
    changed = ids.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + shift) % VOCAB
    a = run(index, ids, split, tail, exact_rows, mode)
    b = run(index, changed, split, tail, exact_rows, mode)
    for layer in range(CONFIGS[index][1]):
        (ka, va), (kb, vb) = kv(a.cache, layer), kv(b.cache, layer)
        # rows held at this layer: every position, or (mode none, late layers) the exact rows only
        pos = torch.arange(n) if ka.shape[2] == n else a.exact_positions
        early = pos <= t
        assert torch.equal(ka[:, :, early], kb[:, :, early]), f"layer {layer}: keys of rows ≤ {t} changed"
        assert torch.equal(va[:, :, early], vb[:, :, early]), f"layer {layer}: values of rows ≤ {t} changed"
    k0a, k0b = kv(a.cache, 0)[0], kv(b.cache, 0)[0]
    assert not torch.equal(k0a[:, :, t + 1], k0b[:, :, t + 1])  # the change reached row t + 1
    tally.example()


@given(prompts(), st.data())
def test_lower_layers_exact(prompt, data):
    """Layers ``0..S`` of the fill's cache equal the plain forward's in every mode, and are the same
    bits whatever the mode, maps, tail or exact rows."""
    index, ids, split, tail, exact_rows = prompt
    ref = reference(tiny_llama(index), ids)
    results = [run(index, ids, split, tail, exact_rows, mode) for mode in ("ridge", "identity", "none")]
    other_tail = data.draw(st.integers(1, ids.shape[1]), label="other tail")
    results.append(run(index, ids, split, other_tail, [], "identity"))
    for layer in range(split + 1):
        want = kv(ref.cache, layer)
        first = kv(results[0].cache, layer)
        for got, exp in zip(first, want):
            torch.testing.assert_close(got, exp, rtol=0, atol=ATOL)
        for res in results[1:]:
            for got, exp in zip(kv(res.cache, layer), first):
                assert torch.equal(got, exp)
    tally.example()


@given(prompts(), st.sampled_from(["identity-last-split", "oracle-maps"]), st.integers(0, 2 ** 31))
def test_exact_rows_exact_when_filled_cache_exact(prompt, scenario, seed):
    """When every filled row's cache entry is exact, the exact rows' logits (and cache) are exact, and
    so is a decoding step after the prompt.

    Two ways to make the filled cache exact: the identity fill at ``S = L − 2`` (the one late layer's
    input is ``h_S`` itself), and maps that interpolate the filled rows' true late-layer inputs (at most
    ``d`` filled rows of generic tokens, drawn from ``seed``, so the least-squares fit is exact). The
    precondition is checked, then the conclusion."""
    index, ids, split, tail, exact_rows = prompt
    model = tiny_llama(index)
    layers, hidden = CONFIGS[index][1], CONFIGS[index][2]
    batch, n = ids.shape
    if scenario == "identity-last-split":
        split, maps, mode, pre_tol = layers - 2, None, "identity", ATOL
        ref = reference(model, ids)
    else:
        ids = torch.randint(0, VOCAB, ids.shape, generator=torch.Generator().manual_seed(seed))
        tail = max(tail, n - hidden // batch)  # at most hidden filled rows in the whole batch
        ref = reference(model, ids)
        filled = torch.ones(n, dtype=torch.bool)
        filled[exact_positions(n, tail, exact_rows)] = False
        maps, mode, pre_tol = oracle_maps(ref, split, layers, filled), "ridge", 1e-4
    res = prefill_instrumented(model, ids, maps, tail=tail, exact_rows=exact_rows, mode=mode, split=split, logits="exact", select=None)
    for layer in range(layers):  # precondition: the filled (and every) cache row is exact
        for got, exp in zip(kv(res.cache, layer), kv(ref.cache, layer)):
            torch.testing.assert_close(got, exp, rtol=0, atol=pre_tol)
    torch.testing.assert_close(res.logits, ref.logits[:, res.exact_positions], rtol=0, atol=10 * pre_tol)
    # a decoding step after the prompt is one more exact row: its output is exact too
    nxt = res.logits[:, -1:].argmax(-1)
    with torch.no_grad():
        step = model(nxt, cache=res.cache, use_cache=True).logits
    longer = reference(model, torch.cat([ids, nxt], 1))
    torch.testing.assert_close(step, longer.logits[:, -1:], rtol=0, atol=10 * pre_tol)
    tally.example()


@given(prompts(), st.sampled_from(["ridge", "identity", "none"]), st.booleans())
def test_no_filled_rows_is_exact_mode(prompt, mode, by_exact_rows):
    """With no filled row (a tail of the whole prompt, or every earlier row listed as exact) each fill
    mode is the exact model: same logits at every row and the same cache."""
    index, ids, split, _, _ = prompt
    n = ids.shape[1]
    tail, rows = (1, list(range(n - 1))) if by_exact_rows else (n, [])
    res = run(index, ids, split, tail, rows, mode, logits="exact")
    exact = prefill_instrumented(tiny_llama(index), ids, tail=tail, exact_rows=rows, mode="exact", logits="exact", select=None)
    assert res.exact_positions.tolist() == list(range(n))
    torch.testing.assert_close(res.logits, exact.logits, rtol=0, atol=ATOL)
    for layer in range(CONFIGS[index][1]):
        for got, want in zip(kv(res.cache, layer), kv(exact.cache, layer)):
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    tally.example()


@given(prompts(), st.sampled_from(["ridge", "identity"]))
def test_every_row_has_a_cache_entry_at_every_layer(prompt, mode):
    """No token is dropped: every layer's cache holds one finite entry per row, and each filled row's
    late-layer entry is the one its predicted input gives (``kv_l(h_S W_l + b_l)`` at its position)."""
    index, ids, split, tail, exact_rows = prompt
    model = tiny_llama(index)
    n, layers = ids.shape[1], CONFIGS[index][1]
    res = run(index, ids, split, tail, exact_rows, mode)
    ref = reference(model, ids)
    adapter = adapter_for(model)
    filled = torch.ones(n, dtype=torch.bool)
    filled[res.exact_positions] = False
    h = ref.hidden_states[split + 1][:, filled]
    rope = adapter.rope(torch.arange(n), h).rows(filled.nonzero()[:, 0])
    maps = fitted_maps(index, split) if mode == "ridge" else None
    for layer in range(layers):
        k, v = kv(res.cache, layer)
        assert k.shape == v.shape == (ids.shape[0], model.config.num_key_value_heads, n, k.shape[-1])
        assert torch.isfinite(k).all() and torch.isfinite(v).all()
        if layer > split and filled.any():
            x_hat = predict_inputs(h, *maps.layer(layer)) if mode == "ridge" else h
            kf, vf = adapter.kv(layer, x_hat, rope)
            torch.testing.assert_close(k[:, :, filled], kf, rtol=0, atol=1e-4)
            torch.testing.assert_close(v[:, :, filled], vf, rtol=0, atol=1e-4)
    tally.example()


@given(prompts(), st.integers(1, 3), st.integers(1, 5))
def test_identity_fill_is_ridge_fill_with_identity_maps(prompt, batch, rows):
    """``W = I``, ``b = 0`` predicts ``h_S`` itself: :func:`predict_inputs` returns its input bit for
    bit, and the ridge fill with identity maps is the identity fill, cache and logits."""
    index, ids, split, tail, exact_rows = prompt
    model = tiny_llama(index)
    layers, d = CONFIGS[index][1], CONFIGS[index][2]
    h = torch.randn(batch, rows, d)
    assert torch.equal(predict_inputs(h, torch.eye(d), torch.zeros(d)), h)
    eye = RidgeMaps(split, torch.eye(d).repeat(layers - split - 1, 1, 1), torch.zeros(layers - split - 1, d),
                    [float("inf")] * (layers - split - 1))
    a = prefill_instrumented(model, ids, eye, tail=tail, exact_rows=exact_rows, mode="ridge", logits="exact", select=None)
    b = run(index, ids, split, tail, exact_rows, "identity", logits="exact")
    assert torch.equal(a.logits, b.logits)
    for layer in range(layers):
        for x, y in zip(kv(a.cache, layer), kv(b.cache, layer)):
            assert torch.equal(x, y)
    tally.example()


@given(prompts(), st.sampled_from(["ridge", "identity"]), st.integers(0, VOCAB - 1))
def test_decoding_after_fill_is_an_exact_row_of_the_fill(prompt, mode, token):
    """Decode semantics: one decoding step on the cache the fill returned (filled rows' entries as the
    fill left them, not exact) equals the fill of the prompt extended by that token with the new row
    exact and the same rows filled (``tail + 1``): the step is one more exact row of the filled model,
    whatever the filled rows' errors (Lean ``decode_eq_fill``)."""
    index, ids, split, tail, exact_rows = prompt
    model = tiny_llama(index)
    maps = fitted_maps(index, split) if mode == "ridge" else None
    res = prefill(model, ids, maps, tail=tail, exact_rows=exact_rows, mode=mode, split=split, select=None)
    nxt = torch.full((ids.shape[0], 1), token, dtype=torch.long)
    with torch.no_grad():
        step = model(nxt, cache=res.cache, use_cache=True).logits
    longer = prefill(model, torch.cat([ids, nxt], 1), maps, tail=tail + 1, exact_rows=exact_rows, mode=mode,
                     split=split, select=None)
    assert torch.equal(longer.exact_positions[:-1], res.exact_positions)  # the same rows are filled
    torch.testing.assert_close(step[:, -1], longer.logits[:, -1], rtol=0, atol=ATOL)
    tally.example()


@given(prompts(), st.data())
def test_context_features_are_causal(prompt, data):
    """``KvaLean.Decoder.fillCache_ofContextMap``: with context maps a filled row ``t`` writes its late-layer
    cache entry from ``map(h_S(t), h_S(t−1))`` (``h_S(−1) = 0``): the features of row ``t`` are exactly the
    split states of rows ``t`` and ``t − 1`` of the plain forward, none of a later row; and the fill's cache
    entry of a filled row equals the layer's own K/V of ``x̂ = [h_S(t), h_S(t−1)] W_l + b_l``."""
    index, ids, split, tail, exact_rows = prompt
    model, n = tiny_llama(index), ids.shape[1]
    h = reference(model, ids).hidden_states[split + 1]  # [batch, n, d]
    feats = context_features(h, 1)
    t = data.draw(st.integers(0, n - 1), label="t")
    prev = h[:, t - 1] if t > 0 else torch.zeros_like(h[:, 0])
    assert torch.equal(feats[:, t], torch.cat([h[:, t], prev], -1))
    later = h.clone()
    later[:, t + 1:] = torch.randn_like(later[:, t + 1:])
    assert torch.equal(context_features(later, 1)[:, : t + 1], feats[:, : t + 1])
    maps = fitted_maps(index, split, context=1)
    res = prefill(model, ids, maps, tail=tail, exact_rows=exact_rows, select=None)
    filled = torch.ones(n, dtype=torch.bool)
    filled[res.exact_positions] = False
    if filled[t]:
        ad = adapter_for(model)
        layer = data.draw(st.integers(split + 1, CONFIGS[index][1] - 1), label="late layer")
        w, b = maps.layer(layer)
        x_hat = predict_inputs(feats[:, t: t + 1], w, b)
        k, v = ad.kv(layer, x_hat, ad.rope(torch.tensor([t]), x_hat))
        got_k, got_v = kv(res.cache, layer)
        torch.testing.assert_close(got_k[:, :, t: t + 1], k, rtol=0, atol=ATOL)
        torch.testing.assert_close(got_v[:, :, t: t + 1], v, rtol=0, atol=ATOL)
    tally.example()


def sees(window: int, t: int, j: int) -> bool:
    """Lean ``KvaLean.sees``: row ``t`` attends to row ``j`` (``window = 0``: full causal attention)."""
    return j <= t and (window == 0 or t - j < window)


@given(st.sampled_from(["llama", "gemma3"]), st.sampled_from(["ridge", "centred", "identity", "none"]), st.data())
def test_fill_modes_keep_every_entry_an_exact_row_sees(family, mode, data):
    """Lean ``no_token_dropped`` / ``none_drops_token`` on the real cache: in the fill modes every late
    attention layer writes an entry for exactly the filled rows some exact row sees (all of them under full
    attention; in Gemma 3's sliding-window layers those within the window of an exact row at or after them,
    ``needed_filled_rows``), before any exact row reads the layer; in mode ``none`` no filled row writes a
    late-layer entry although exact rows see them, and the returned late layers hold the exact rows only."""
    if family == "llama":
        index = data.draw(st.integers(0, len(CONFIGS) - 1), label="model")
        model, layers = tiny_llama(index), CONFIGS[index][1]
        windows = [0] * layers
        low = 0
    else:
        model, layers = tiny_gemma3(), len(GEMMA_TYPES)
        windows = [GEMMA_WINDOW if t == "sliding_attention" else 0 for t in GEMMA_TYPES]
        mode = "identity" if mode in ("ridge", "centred") else mode  # no calibration of the Gemma model
        low = 3  # no pad (0), end (1) or start (2) token: a prompt must not look padded
    n = data.draw(st.integers(2, 30), label="rows")
    ids = torch.tensor([data.draw(st.lists(st.integers(low, VOCAB - 1), min_size=n, max_size=n), label="ids")])
    split = data.draw(st.integers(0, layers - 2), label="split")
    tail = data.draw(st.integers(1, n), label="tail")
    exact_rows = data.draw(st.lists(st.integers(0, n - 1), max_size=3, unique=True), label="exact rows")
    maps = fitted_maps(index, split) if mode in ("ridge", "centred") else None
    written: dict[int, list[int]] = {}

    def hook(layer, k, v, rows):
        written.setdefault(layer, []).extend(rows.tolist())
        return k, v

    res = prefill_instrumented(model, ids, maps, tail=tail, exact_rows=exact_rows, mode=mode, split=split,
                               kv_hook=hook, select=None)
    exact = res.exact_positions.tolist()
    filled = [j for j in range(n) if j not in exact]
    for layer in range(split + 1, layers):
        seen = sorted(j for j in filled if any(sees(windows[layer], t, j) for t in exact))
        if mode == "none":
            assert layer not in written, f"mode none wrote filled rows {written.get(layer)} at layer {layer}"
            if windows[layer] == 0:  # a full layer's returned cache: the exact rows only
                assert kv(res.cache, layer)[0].shape[2] == len(exact)
            if filled:  # the last row is exact and sees every filled row in a full layer
                assert seen or windows[layer] > 0
        else:
            assert sorted(written.get(layer, [])) == seen, (layer, written.get(layer), seen)
    tally.example()


@given(st.integers(0, len(CONFIGS) - 1), st.integers(0, 120), st.integers(0, 120), st.integers(0, 120),
       st.integers(0, 2 ** 31))
def test_rope_keys_and_score_shift(index, p, q, d, seed):
    """Lean ``rope_score_rel``, ``rope_score_shift`` and ``fillCache_rope`` on the real RoPE
    (``ridgefill.adapters.base.apply_rope`` with the adapter's tables): the tables satisfy the
    angle-subtraction identities the theorems assume; the score of a query rotated at ``p`` and a key
    rotated at ``q`` is the score with the key rotated at ``q − p`` (for ``q ≥ p``), and is unchanged when
    both move by ``d``; and the key the fill writes for a filled row at position ``p`` (the adapter's
    ``kv`` and its fast ``fill_kv``) is the key the exact path (the adapter's full ``layer``) writes for
    the same layer input at ``p``."""
    model = tiny_llama(index)
    ad = adapter_for(model)
    g = torch.Generator().manual_seed(seed)
    like = torch.zeros(1, 1, CONFIGS[index][2])
    pos = torch.tensor([p, q, d, abs(q - p), p + d, q + d])
    rope = ad.rope(pos, like)
    half = ad.head_dim // 2
    c, s = rope.cos[0, :, :half].double(), rope.sin[0, :, :half].double()
    lo, hi = min(p, q), max(p, q)
    # angle subtraction: c(hi − lo) = c(hi)c(lo) + s(hi)s(lo), s(hi − lo) = s(hi)c(lo) − c(hi)s(lo)
    i_lo, i_hi = (0, 1) if p <= q else (1, 0)
    torch.testing.assert_close(c[3], c[i_hi] * c[i_lo] + s[i_hi] * s[i_lo], rtol=0, atol=1e-4)  # float32 tables
    torch.testing.assert_close(s[3], s[i_hi] * c[i_lo] - c[i_hi] * s[i_lo], rtol=0, atol=1e-4)
    assert hi - lo == abs(q - p)
    x = torch.randn(1, 1, 2, ad.head_dim, generator=g)  # [batch, heads, rows, head_dim]: query, key

    def score(a, b):
        qr = apply_rope(x[:, :, :1], rope.rows(torch.tensor([a])))
        kr = apply_rope(x[:, :, 1:], rope.rows(torch.tensor([b])))
        return float((qr * kr).sum())

    size = float(x.norm()) ** 2
    assert abs(score(4, 5) - score(0, 1)) <= 1e-4 * size  # moved by d (rows 4, 5 of the tables: p + d, q + d)
    if p <= q:
        rel = float((x[:, :, :1] * apply_rope(x[:, :, 1:], rope.rows(torch.tensor([3])))).sum())
        assert abs(score(0, 1) - rel) <= 1e-4 * size
    # the key of a filled row at p = the key the exact layer writes for the same input at p
    layer = CONFIGS[index][1] - 1
    h = torch.randn(1, 1, CONFIGS[index][2], generator=g)
    at_p = ad.rope(torch.tensor([p]), h)
    shape = (1, ad.num_kv_heads, p + 1, ad.head_dim)
    keys, values = h.new_zeros(shape), h.new_zeros(shape)
    fk, fv = [h.new_zeros(1, ad.num_kv_heads, 1, ad.head_dim)], [h.new_zeros(1, ad.num_kv_heads, 1, ad.head_dim)]
    with torch.no_grad():
        k_fill, v_fill = ad.kv(layer, h, at_p)  # a filled row's entry (per-layer path)
        ad.layer(layer, h, at_p, torch.tensor([p]), keys, values)  # an exact row's entry
        ad.fill_kv(range(layer, layer + 1), h, None, None, at_p, fk, fv, 0, 1)  # the fast fill path
    torch.testing.assert_close(keys[:, :, p:], k_fill, rtol=0, atol=ATOL)
    torch.testing.assert_close(values[:, :, p:], v_fill, rtol=0, atol=ATOL)
    torch.testing.assert_close(fk[0], k_fill, rtol=0, atol=ATOL)
    torch.testing.assert_close(fv[0], v_fill, rtol=0, atol=ATOL)
    tally.example()


@given(prompts(), st.sampled_from([0, 1]))
def test_centred_mode_is_ridge_with_identity_and_mean_shift(prompt, refit):
    """Mode ``centred`` is the ridge fill with the maps ``W_l = I``, ``b_l = x̄_l − h̄``
    (``RidgeMaps.centred_biases``): the same cache and logits; and (Lean ``fit_maps_tendsto_centred``) the
    ridge fill with maps refitted from the same statistics at ``λ = 10¹²`` comes within ``10⁻³`` of it."""
    index, ids, split, tail, exact_rows = prompt
    model = tiny_llama(index)
    layers, d = CONFIGS[index][1], CONFIGS[index][2]
    maps = fitted_maps(index, split)
    late = layers - split - 1
    if refit:
        fitted = fit_maps(maps.stats, 1e12)
        other = RidgeMaps(split, fitted.weights.float(), fitted.biases.float(), [1e12] * late, dict(maps.meta))
        tol = 1e-3
    else:
        other = RidgeMaps(split, torch.eye(d).repeat(late, 1, 1), maps.centred_biases().float(), [float("inf")] * late,
                          dict(maps.meta))
        tol = ATOL
    a = prefill_instrumented(model, ids, maps, tail=tail, exact_rows=exact_rows, mode="centred", logits="exact",
                             select=None)
    b = prefill_instrumented(model, ids, other, tail=tail, exact_rows=exact_rows, mode="ridge", logits="exact",
                             select=None)
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=tol)
    for layer in range(layers):
        for x, y in zip(kv(a.cache, layer), kv(b.cache, layer)):
            torch.testing.assert_close(x, y, rtol=0, atol=tol)
    tally.example()
