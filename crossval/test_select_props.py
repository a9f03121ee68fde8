"""Property tests of query-aware row selection (``prefill(..., select=...)``) and of the K/V-map fit.

Selection makes the set of exact rows depend on the whole prompt (pass 1's attention of the last row),
so it is *not* causal in the exact-set sense: which rows are exact can change when later tokens change.
What it keeps, and what these properties check on tiny random Llamas with Hypothesis-drawn prompts,
splits, tails and budgets:

- every row still has K/V in every layer (no token is dropped; Lean: ``KvaLean.Causality``
  ``no_token_dropped``, stated for a given exact set);
- given the exact set it chose, the result is the one-pass prefill with that exact set, so every entry
  of row ``i`` depends only on rows ``≤ i`` and the chosen set (``filled_causal`` for that set), and
  exact rows see every earlier row (their logits equal the one-pass prefill's, which attends causally);
- the chosen rows are filled rows, within the budget (the parts' sum, or the selection's total when it
  has one), and include the first part's sink rows;
- a lexical part (``by="ngram"``, chosen before the late layers from the token ids) chooses, besides its
  sink rows, only rows within its window of a row that shares a 2- to 5-token sequence with its query rows
  and scores at least its ``min_score``.
"""

from __future__ import annotations

import torch
from hypothesis import example, given
from hypothesis import strategies as st
from ridgefill import prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.select import NGRAM_SIZES, Select, Selection, as_selection, choose_rows, leverage_scores, ngram_scores
from ridgefill.ridge import RidgeStats, fit_maps

from crossval import tally
from crossval.models import CONFIGS, VOCAB, fitted_maps, kv, prompts, reference, tiny_llama

selects = st.builds(Select, budget=st.integers(1, 12), before=st.integers(0, 3), after=st.integers(0, 4),
                    queries=st.integers(1, 3), heads=st.sampled_from(["sum", "max"]), rounds=st.integers(1, 2),
                    sink=st.integers(0, 1), reference=st.integers(0, 8), floor=st.sampled_from([0.1, 1.0]),
                    by=st.sampled_from(["attention", "attention", "ngram"]))
# one Select, or a Selection of two parts (each its own budget, scored in the same first pass), with or
# without a total that caps both (a row count, or a fraction of the prompt)
totals = st.one_of(st.none(), st.integers(1, 16), st.sampled_from([0.05, 0.1, 0.3]))
selects = st.one_of(selects, st.builds(Selection, st.tuples(selects, selects), totals))


@given(prompts(min_rows=4), st.sampled_from(["ridge", "identity"]), selects)
def test_selection_keeps_every_row_and_equals_the_one_pass_prefill(prompt, mode, sel):
    index, ids, split, tail, _ = prompt
    n = ids.shape[1]
    tail = min(tail, n - 1)  # at least one filled row to choose from
    model = tiny_llama(index)
    maps = fitted_maps(index, split) if mode == "ridge" else None
    res = prefill_instrumented(model, ids, maps, tail=tail, mode=mode, split=split, select=sel, logits="exact")
    chosen = res.selected
    assert chosen.numel() <= sel.budget_rows(n)
    assert bool((chosen < n - tail).all()) and torch.equal(chosen, torch.unique(chosen))
    first = as_selection(sel).parts[0]  # the first part chooses first: its sink rows are exact
    assert set(range(min(first.sink, n - tail, first.budget_rows(n), sel.budget_rows(n)))) <= set(chosen.tolist())
    one = prefill_instrumented(model, ids, maps, tail=tail, exact_rows=chosen.tolist(), mode=mode, split=split, logits="exact", select=None)
    torch.testing.assert_close(res.logits, one.logits, rtol=0, atol=1e-5)
    for layer in range(CONFIGS[index][1]):
        (k, v), (k1, v1) = kv(res.cache, layer), kv(one.cache, layer)
        assert k.shape[2] == n and v.shape[2] == n  # every row has K/V in every layer
        torch.testing.assert_close(k, k1, rtol=0, atol=1e-5)
        torch.testing.assert_close(v, v1, rtol=0, atol=1e-5)
    tally.example()


@given(st.lists(st.integers(0, 6), min_size=2, max_size=120), st.integers(1, 40), st.integers(0, 40),
       st.integers(0, 4), st.integers(0, 6), st.integers(1, 20), st.integers(1, 40), st.sampled_from([0.0, 1.0, 2.5]))
@example(tokens=[0, 0, 0], tail=1, given_row=0, before=0, after=0, queries=1, budget=1, min_score=2.5)  # a match below the threshold
def test_ngram_part_chooses_only_windows_around_matches(tokens, tail, given_row, before, after, queries, budget, min_score):
    n = len(tokens)
    tail = min(tail, n - 1)
    sel = Select(by="ngram", budget=budget, before=before, after=after, queries=queries, contrast=0, min_score=min_score)
    exact = sorted({min(given_row, n - 1)} | set(range(n - tail, n)))
    filled = torch.ones(n, dtype=torch.bool)
    filled[exact] = False
    scores = ngram_scores(torch.tensor([tokens]), torch.tensor(exact[-queries:]))
    chosen = choose_rows(scores, filled, sel, budget).tolist()
    assert len(chosen) <= budget and all(filled[r] for r in chosen)
    ends = {e for e in exact[-queries:]}
    def seq(r, k):  # the k-token sequence ending at row r
        return tuple(tokens[r - k + 1:r + 1]) if r >= k - 1 else None

    for r in range(n):  # brute force: each sequence ending at r and at a query row adds 1 / (rows outside the queries ending it)
        want = 0.0
        for k in NGRAM_SIZES:
            if r not in ends and seq(r, k) is not None and any(seq(e, k) == seq(r, k) for e in ends):
                want += 1.0 / sum(seq(o, k) == seq(r, k) for o in range(n) if o not in ends)
        assert abs(float(scores[r]) - want) <= 1e-6 * max(1.0, want)
    anchors = [r for r in range(n) if filled[r] and scores[r] > 0 and scores[r] >= min_score]
    for r in chosen:
        assert r < sel.sink or any(a - before <= r <= a + after for a in anchors)
    if not anchors:
        assert chosen == [r for r in range(min(sel.sink, n)) if filled[r]][:budget]
    tally.example()


@given(st.integers(0, 2**31 - 1), st.integers(2, 6), st.integers(1, 5), st.floats(1e-3, 1e3))
def test_kv_map_fit_equals_float64_reference(seed, hidden, outputs, lam):
    """The zero-prior ridge fit with an unpenalised intercept (K/V maps) equals the float64 solution of
    ``min ‖H W + 1bᵀ − Y‖² + λ‖W‖²`` computed directly from the rows."""
    g = torch.Generator().manual_seed(seed)
    rows = 3 * hidden + 4
    h = torch.randn(rows, hidden, generator=g, dtype=torch.float64) * 3 + 1
    y = torch.randn(2, rows, outputs, generator=g, dtype=torch.float64)
    st_ = RidgeStats(2, hidden, outputs=outputs, targets="kv")
    st_.update(h[: rows // 2], y[:, : rows // 2])
    part = RidgeStats(2, hidden, outputs=outputs, targets="kv")
    part.update(h[rows // 2:], y[:, rows // 2:])
    fitted = fit_maps(st_.merged(part), lam)
    hc = h - h.mean(0)
    for layer in range(2):
        yc = y[layer] - y[layer].mean(0)
        w = torch.linalg.solve(hc.T @ hc + lam * torch.eye(hidden, dtype=torch.float64), hc.T @ yc)
        b = y[layer].mean(0) - h.mean(0) @ w
        torch.testing.assert_close(fitted.weights[layer], w, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(fitted.biases[layer], b, rtol=1e-9, atol=1e-9)
    tally.example()


def _exact_upto(res, t: int) -> list[int]:
    """The exact rows ``≤ t`` of a prefill (tail, exact rows and chosen rows)."""
    return [r for r in res.exact_positions.tolist() if r <= t]


def _select(by: str, budget: int) -> Select:
    """One part of kind ``by`` choosing ``budget`` rows, no widening, no sink rows, any lexical match."""
    return Select(by=by, budget=budget, before=0, after=0, queries=3, sink=0, contrast=0, heads="sum")


@given(prompts(min_rows=6), st.sampled_from(["ngram", "leverage", "attention"]), st.integers(1, 4), st.data())
def test_selected_causal_on_the_real_selection(prompt, by, budget, data):
    """Lean ``selected_causal`` on :mod:`ridgefill.select`. Its hypothesis: the two prompts agree on tokens
    ``0..t`` and the selection agrees on which rows ``0..t`` are exact; its conclusion: rows ``≤ t`` get the
    same cache entries at every layer. Drawn prompts whose tokens after ``t`` change: where the real
    selection agrees on rows ``≤ t`` the conclusion is checked on the real cache; and for the
    query-agnostic part the per-row scores (leverage of ``h_S(j)``) of rows ``≤ t`` are unchanged, while
    the choice among them reads every row (``test_selection_of_earlier_rows_reads_later_tokens``)."""
    index, ids, split, tail, _ = prompt
    n = ids.shape[1]
    tail = min(tail, n - 2)
    t = data.draw(st.integers(0, n - tail - 1), label="t")  # rows ≤ t lie before the tail
    shift = torch.tensor(data.draw(st.lists(st.integers(1, VOCAB - 1), min_size=n - t - 1, max_size=n - t - 1),
                                   label="token changes"))
    changed = ids.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + shift) % VOCAB
    model, maps = tiny_llama(index), fitted_maps(index, split)
    sel = _select(by, budget)
    a = prefill(model, ids, maps, tail=tail, split=split, select=sel)
    b = prefill(model, changed, maps, tail=tail, split=split, select=sel)
    if by == "leverage":  # the query-agnostic scores are causal: row j's reads h_S(j) only
        ha = reference(model, ids).hidden_states[split + 1]
        hb = reference(model, changed).hidden_states[split + 1]
        sa, sb = leverage_scores(ha, maps.mean_h, maps.cov_h), leverage_scores(hb, maps.mean_h, maps.cov_h)
        torch.testing.assert_close(sa[: t + 1], sb[: t + 1], rtol=1e-5, atol=1e-6)
    if _exact_upto(a, t) == _exact_upto(b, t):  # the hypothesis holds for this pair: check the conclusion
        for layer in range(CONFIGS[index][1]):
            (ka, va), (kb, vb) = kv(a.cache, layer), kv(b.cache, layer)
            torch.testing.assert_close(ka[:, :, : t + 1], kb[:, :, : t + 1], rtol=0, atol=1e-5)
            torch.testing.assert_close(va[:, :, : t + 1], vb[:, :, : t + 1], rtol=0, atol=1e-5)
    tally.example()


def test_selection_of_earlier_rows_reads_later_tokens():
    """Where ``selected_causal``'s hypothesis fails on the real selection (as ``selection_not_causal`` says it
    may): for each kind of part, two prompts that agree on tokens ``0..t`` whose selection differs on rows
    ``≤ t``. The lexical part scores rows by the sequences they share with the question (the tail); the
    attention parts by the attention the tail's rows pay them; the query-agnostic part ranks every row's
    leverage against the others' (its scores are causal, its choice is not)."""
    model, maps, split = tiny_llama(0), fitted_maps(0, 1), 1
    # lexical: row 2 ends "5 6 7", which the question (last 3 rows) repeats in the first prompt only
    first = torch.tensor([[5, 6, 7, 9, 10, 11, 12, 13, 14, 5, 6, 7]])
    second = first.clone()
    second[0, -3:] = torch.tensor([20, 21, 22])
    a = prefill(model, first, maps, tail=3, split=split, select=_select("ngram", 1))
    b = prefill(model, second, maps, tail=3, split=split, select=_select("ngram", 1))
    assert _exact_upto(a, 8) == [2] and _exact_upto(b, 8) == []
    for by in ("attention", "leverage"):  # found among fixed random prompts
        g = torch.Generator().manual_seed(11)
        found = None
        for trial in range(40):
            ids = torch.randint(0, VOCAB, (1, 24), generator=g)
            changed = ids.clone()
            changed[0, 12:] = torch.randint(0, VOCAB, (12,), generator=g)
            a = prefill(model, ids, maps, tail=4, split=split, select=_select(by, 2))
            b = prefill(model, changed, maps, tail=4, split=split, select=_select(by, 2))
            if _exact_upto(a, 11) != _exact_upto(b, 11):
                found = trial
                break
        assert found is not None, f"no prompt pair among 40 changed the {by} part's choice of rows ≤ 11"
    tally.example()
