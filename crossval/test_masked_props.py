"""Property tests of ``KvaLean.Masked`` (the decoder that reads the cache through a visibility mask) on the
real fill.

Every example runs :func:`ridgefill.prefill` through its public arguments (``exact_rows``, ``mode``,
``select="off"``) on a tiny random Llama or Gemma 3 (:mod:`crossval.models`) and compares with the plain
``transformers`` forward:

- ``decode_entry_exact`` (a): when every filled entry the prefill keeps is exact (maps that interpolate the
  filled rows' true layer inputs), the exact rows' outputs are exact, although in Gemma 3's sliding-window
  layers the prefill keeps only the filled rows some exact row sees (``fill_modes_cover``);
- ``none_changes_exact_row`` (b): mode ``none`` drops entries exact rows see, and their outputs move;
- ``reads_later_row_not_causal`` (c): a layer whose mask lets a row see the next one breaks causality on
  the real fill, and the real mask does not.
"""

from __future__ import annotations

from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ridgefill import prefill
from ridgefill.adapters import adapter_for
from ridgefill.fill import prefill_instrumented

from crossval import tally
from crossval.models import (CONFIGS, GEMMA_TYPES, GEMMA_WINDOW, VOCAB, kv, oracle_maps, reference, tiny_gemma3,
                             tiny_llama)

ATOL = 1e-4  # interpolating maps (float64 least squares stored in float32) on tiny float32 models
#: half the profile's examples (ci: 20 per test; each runs two to four prefills)
EXAMPLES = max(2, settings.default.max_examples // 2)


def sees(window: int, t: int, j: int) -> bool:
    """Lean ``KvaLean.sees``: row ``t`` attends to row ``j`` (``window = 0``: full causal attention)."""
    return j <= t and (window == 0 or t - j < window)


def plan(data, n: int, layers: int):
    split = data.draw(st.integers(0, layers - 2), label="split")
    tail = data.draw(st.integers(1, max(1, n // 2)), label="tail")
    exact_rows = data.draw(st.lists(st.integers(0, n - 1), max_size=3, unique=True), label="exact rows")
    return split, tail, exact_rows


@settings(max_examples=EXAMPLES)
@given(st.sampled_from(["llama", "gemma3"]), st.data())
def test_kept_exact_entries_give_exact_rows(family, data):
    """``decode_entry_exact`` on the real fill: maps that reproduce the filled rows' true late-layer inputs
    make every entry the prefill keeps exact; it keeps one for every filled row an exact row sees and no
    other (the ``kv_hook`` records them: Gemma 3's sliding-window layers drop the filled rows outside every
    exact row's window); and the exact rows' logits then equal the plain forward's."""
    if family == "llama":
        index = data.draw(st.integers(0, len(CONFIGS) - 1), label="model")
        model, layers, hidden = tiny_llama(index), CONFIGS[index][1], CONFIGS[index][2]
        windows, low = [0] * layers, 0
    else:
        model, layers, hidden = tiny_gemma3(), len(GEMMA_TYPES), 32
        windows = [GEMMA_WINDOW if t == "sliding_attention" else 0 for t in GEMMA_TYPES]
        low = 3  # no pad (0), end (1) or start (2) token: a prompt must not look padded
    n = data.draw(st.integers(8, 30), label="rows")
    seed = data.draw(st.integers(0, 2 ** 31), label="seed")
    ids = torch.randint(low, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))
    split, tail, exact_rows = plan(data, n, layers)
    ref = reference(model, ids)
    probe = prefill_instrumented(model, ids, None, tail=tail, exact_rows=exact_rows, mode="identity", split=split,
                                 select="off")
    exact = probe.exact_positions.tolist()
    filled_mask = torch.ones(n, dtype=torch.bool)
    filled_mask[exact] = False
    assert int(filled_mask.sum()) <= hidden
    maps = oracle_maps(ref, split, layers, filled_mask)
    written: dict[int, list[int]] = {}

    def hook(layer, k, v, rows):
        written.setdefault(layer, []).extend(rows.tolist())
        return k, v

    res = prefill_instrumented(model, ids, maps, tail=tail, exact_rows=exact_rows, mode="ridge", split=split,
                               logits="exact", kv_hook=hook, select="off")
    assert res.exact_positions.tolist() == exact
    filled = [j for j in range(n) if j not in exact]
    for layer in range(split + 1, layers):  # coverage: kept = every filled row an exact row sees
        seen = sorted(j for j in filled if any(sees(windows[layer], t, j) for t in exact))
        assert sorted(written.get(layer, [])) == seen, (layer, written.get(layer), seen)
    for layer in range(layers):  # the kept entries are exact: every row below the split, exact and kept rows above
        (got_k, got_v), (want_k, want_v) = kv(res.cache, layer), kv(ref.cache, layer)
        if got_k.shape[2] != n:  # a sliding-window layer returns its window's rows only (the logits cover it)
            assert windows[layer] > 0, (layer, got_k.shape)
            continue
        rows = list(range(n)) if layer <= split else sorted(set(exact) | set(written.get(layer, [])))
        torch.testing.assert_close(got_k[:, :, rows], want_k[:, :, rows], rtol=0, atol=ATOL)
        torch.testing.assert_close(got_v[:, :, rows], want_v[:, :, rows], rtol=0, atol=ATOL)
    torch.testing.assert_close(res.logits, ref.logits[:, exact], rtol=0, atol=10 * ATOL)
    tally.example()


@settings(max_examples=EXAMPLES)
@given(st.integers(0, len(CONFIGS) - 1), st.data())
def test_mode_none_changes_an_exact_row(index, data):
    """``none_changes_exact_row`` on the real fill: with a filled row before the last (exact) row and a late
    layer, mode ``none`` keeps no late-layer entry for the filled rows, which the last row sees, and its
    logits differ from the exact forward's; the same plan with interpolating maps (every entry kept and
    exact) gives the exact logits."""
    model, layers, hidden = tiny_llama(index), CONFIGS[index][1], CONFIGS[index][2]
    n = data.draw(st.integers(4, 30), label="rows")
    seed = data.draw(st.integers(0, 2 ** 31), label="seed")
    ids = torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))
    split = data.draw(st.integers(0, layers - 2), label="split")
    tail = data.draw(st.integers(max(1, n - hidden), n - 1), label="tail")  # row 0 filled; at most hidden filled
    ref = reference(model, ids)
    none = prefill(model, ids, tail=tail, mode="none", split=split, select="off")
    assert not torch.equal(none.logits, ref.logits[:, -1:])
    gap = float((none.logits - ref.logits[:, -1:]).abs().max())
    assert gap > 1e-3, gap
    filled = torch.zeros(n, dtype=torch.bool)
    filled[: n - tail] = True
    kept = prefill(model, ids, oracle_maps(ref, split, layers, filled), tail=tail, mode="ridge",
                   split=split, select="off")
    torch.testing.assert_close(kept.logits, ref.logits[:, -1:], rtol=0, atol=10 * ATOL)
    tally.example()


def peek_next(adapter_cls):
    """The adapter's mask with one more visible key: row ``p`` also sees row ``p + 1`` (a layer that reads a
    later row, the decoder ``peek`` of ``reads_later_row_not_causal``)."""
    def visible_keys(self, layer, positions, num_keys, visible, *rest):
        keys = torch.arange(num_keys, device=positions.device)
        mask = keys[None, :] <= positions[:, None] + 1
        if visible is not None:
            mask &= visible[None, :num_keys]
        return mask
    return mock.patch.object(adapter_cls, "visible_keys", visible_keys)


@settings(max_examples=EXAMPLES)
@given(st.integers(0, len(CONFIGS) - 1), st.data())
def test_a_layer_reading_a_later_row_breaks_causality(index, data):
    """``reads_later_row_not_causal`` on the real fill (every row exact: the masked exact model): changing the
    token of row ``t + 1`` leaves row ``t``'s cache entries and logits unchanged under the adapter's own mask
    (``input_causal``), and changes them when the mask lets row ``t`` see row ``t + 1``."""
    model = tiny_llama(index)
    n = data.draw(st.integers(3, 30), label="rows")
    t = data.draw(st.integers(0, n - 3), label="t")
    seed = data.draw(st.integers(0, 2 ** 31), label="seed")
    ids = torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))
    changed = ids.clone()
    changed[0, t + 1] = (changed[0, t + 1] + 1 + data.draw(st.integers(0, VOCAB - 2), label="shift")) % VOCAB

    def row_t(x):
        # every row exact (tail = N): the prefill's own layers (the adapter's attention and its mask), which
        # equal the exact model then (test_fill_props::test_no_filled_rows_is_exact_mode)
        res = prefill_instrumented(model, x, None, tail=n, mode="identity", split=0, logits="exact", select="off")
        return res.logits[:, t], kv(res.cache, CONFIGS[index][1] - 1)[0][:, :, t]

    a, b = row_t(ids), row_t(changed)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with peek_next(type(adapter_for(model))):
        pa, pb = row_t(ids), row_t(changed)
    assert not torch.equal(pa[0], pb[0]), "a row that sees the next one did not move with it"
    tally.example()
