"""Query-aware row selection (``prefill(..., select=Select(...))``) and the centred identity fill."""

import dataclasses

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from ridgefill import InputError, MapsFormatError, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.select import DEFAULT_SELECT, Select, Selection, as_selection, choose_rows, local_contrast
from conftest import oracle_maps, reference, tiny_llama
from test_gemma3 import tiny_gemma3

S = 2


def kv(cache, layer):
    return cache.layers[layer].keys, cache.layers[layer].values


def assert_same_prefill(a, b, layers, atol=1e-5):
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=atol)
    assert torch.equal(a.exact_positions, b.exact_positions)
    for layer in range(layers):
        for x, y in zip(kv(a.cache, layer), kv(b.cache, layer)):
            torch.testing.assert_close(x, y, rtol=0, atol=atol)


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(seed=4, hidden=64)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 101, (1, 96), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def maps(llama, ids):
    m = oracle_maps(llama, ids[:, :40], S)  # fitted on a prefix only: not exact on later rows
    m.weights += 0.05 * torch.randn(m.weights.shape, generator=torch.Generator().manual_seed(0))
    return m


@pytest.mark.parametrize("mode", ["ridge", "identity"])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("sel", [Select(budget=12, before=1, after=3), Select(budget=0.2, queries=4, heads="max", rounds=2),
                                 Select(budget=10, reference=5, floor=0.5),
                                 Selection((Select(budget=6, before=1, after=3),
                                            Select(budget=6, queries=8, heads="sum", before=0, after=1, contrast=0)))])
def test_two_pass_equals_one_pass_with_the_chosen_rows(llama, ids, maps, mode, fast, sel):
    res = prefill_instrumented(llama, ids, maps, tail=8, mode=mode, split=S, select=sel, logits="exact", fast=fast)
    chosen = res.selected
    assert 0 < chosen.numel() <= sel.budget_rows(ids.shape[1])
    assert chosen.max() < ids.shape[1] - 8  # filled rows only
    one = prefill_instrumented(llama, ids, maps, tail=8, exact_rows=chosen.tolist(), mode=mode, split=S, logits="exact", fast=fast, select=None)
    assert_same_prefill(res, one, llama.config.num_hidden_layers)
    assert one.selected is None


def test_selection_never_changes_the_lower_layers(llama, ids, maps):
    plain = prefill(llama, ids, maps, tail=8, mode="ridge", select=None)
    sel = prefill(llama, ids, maps, tail=8, mode="ridge", select=Select(budget=20))
    for layer in range(S + 1):
        for x, y in zip(kv(plain.cache, layer), kv(sel.cache, layer)):
            assert torch.equal(x, y)
    # and it does change the late layers: at layer S+1 the chosen rows' input is h_S itself, so their
    # K/V there are now the exact model's, where the perturbed maps' prediction was off
    out = reference(llama, ids)
    rows = sel.selected
    want = out.cache.layers[S + 1].keys[:, :, rows]
    assert (kv(plain.cache, S + 1)[0][:, :, rows] - want).abs().max() > 1e-2
    torch.testing.assert_close(kv(sel.cache, S + 1)[0][:, :, rows], want, rtol=0, atol=1e-5)


def _oracle_scores(select: Select, exact_tail: int = 6):
    """A tiny Llama with oracle maps (the mixed cache is the exact one): the exact model's attention
    ``[layer] -> [1, H, N, N]``, and the scores ``AttentionScores(select)`` records in one late-layer pass
    with the last ``exact_tail`` rows exact."""
    from ridgefill.adapters import adapter_for
    from ridgefill.fill import AttentionScores as _AttentionScores, _LateLayers, _fill_maps

    model = tiny_llama(seed=3, hidden=96)
    ids = torch.randint(0, 101, (1, 60), generator=torch.Generator().manual_seed(5))
    maps = oracle_maps(model, ids, S)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        att = model(ids, output_attentions=True).attentions
    model.config._attn_implementation = "sdpa"
    ad = adapter_for(model)
    n = ids.shape[1]
    x = ad.embed(ids)
    pos = torch.arange(n)
    rope = ad.rope(pos, x)
    with torch.no_grad():
        for layer in range(S + 1):
            shape = (1, ad.num_kv_heads, n, ad.head_dim)
            x = ad.layer(layer, x, rope, pos, torch.empty(shape), torch.empty(shape))
        fill = _LateLayers(ad, range(S + 1, ad.num_layers), x, rope, _fill_maps("ridge", maps, x), 0, None,
                           fast=True, none=False)
        scorer = _AttentionScores(ad, n, select)
        fill.run(np.arange(n - exact_tail, n), [scorer])
    return att, scorer, range(S + 1, model.config.num_hidden_layers)


def test_scores_are_the_exact_attention_with_oracle_maps():
    """With maps that reproduce every late-layer input the mixed cache is the exact one, so the scores
    are the exact model's attention of the last row, summed over heads and late layers (no reference)."""
    att, scorer, late = _oracle_scores(Select(heads="sum", reference=0))
    want = sum(att[layer][0, :, -1].sum(0) for layer in late)
    torch.testing.assert_close(scorer.scores, want, rtol=0, atol=5e-4)
    # the best filled rows (the same ones the exact attention prefers) are what choose_rows takes first
    n = want.numel()
    cand = torch.ones(n, dtype=torch.bool)
    cand[-6:] = False
    top = int(torch.argmax(torch.where(cand, want, -1.0)))
    assert top in choose_rows(scorer.scores, cand, Select(before=0, after=0, sink=0), 1).tolist()


@pytest.mark.parametrize("reference", [3, 50])
def test_reference_scores_are_the_exact_attention_over_the_reference_rows(reference):
    """``Select(reference=r)``: with oracle maps a row's score is, per late layer and head, the last
    row's exact attention to it over the mean attention of the ``r`` exact rows before the last plus
    ``floor / N``, summed over heads and layers (``heads="sum"``). With ``r`` beyond the exact rows (50
    of 6) the rows there are (5) are the reference."""
    floor = 0.5
    att, scorer, late = _oracle_scores(Select(heads="sum", reference=reference, floor=floor))
    assert scorer.rows == 1 + reference
    n, r = att[0].shape[-1], min(reference, 5)
    want = sum((att[l][0, :, -1] / (att[l][0, :, -1 - r:-1].mean(1) + floor / n)).sum(0) for l in late)
    filled = slice(0, n - 6)  # the scores that choose rows (the exact rows' own entries are never read)
    torch.testing.assert_close(scorer.scores[filled], want[filled], rtol=1e-4, atol=1e-3)


def test_gemma3_two_pass_fills_rows_newly_seen_by_sliding_layers():
    """In sliding-window layers a chosen row in the middle of the prompt makes the rows of its window
    readable; pass 2 must give them predicted K/V, as a one-pass prefill does."""
    model = tiny_gemma3(seed=2)
    ids = torch.randint(3, 101, (1, 80), generator=torch.Generator().manual_seed(3))
    maps = oracle_maps(model, ids[:, :30], 1)
    sel = Select(budget=6, before=0, after=2)
    res = prefill_instrumented(model, ids, maps, tail=4, mode="ridge", select=sel, logits="exact")
    assert res.selected.numel() and res.selected.min() < 60  # some chosen rows lie outside the tail's window
    one = prefill_instrumented(model, ids, maps, tail=4, exact_rows=res.selected.tolist(), mode="ridge", logits="exact", select=None)
    assert_same_prefill(res, one, model.config.num_hidden_layers)


def test_choose_rows_widens_around_the_best_rows_and_keeps_the_budget():
    scores = torch.zeros(40)
    scores[10], scores[30], scores[5] = 3.0, 2.0, 1.0
    cand = torch.ones(40, dtype=torch.bool)
    cand[36:] = False
    sel = Select(before=1, after=2, sink=0)
    assert choose_rows(scores, cand, sel, 8).tolist() == [9, 10, 11, 12, 29, 30, 31, 32]
    scores[0] = 9.0  # the sink: chosen first, alone, when sink=1
    assert choose_rows(scores, cand, Select(before=1, after=2), 6).tolist() == [0, 9, 10, 11, 12, 29]
    assert choose_rows(scores, cand, Select(before=1, after=2, sink=0), 6).tolist() == [0, 1, 2, 9, 10, 11]
    scores[0] = 0.0
    assert choose_rows(scores, cand, sel, 6).tolist() == [9, 10, 11, 12, 29, 30]  # last window cut to fit
    cand[9:13] = False  # rows already exact are never chosen again
    assert choose_rows(scores, cand, sel, 4).tolist() == [29, 30, 31, 32]
    assert choose_rows(scores, cand, sel, 0).tolist() == []


def test_local_contrast_ranks_a_far_spike_above_nearby_text():
    # attention decaying toward the start of the prompt (distance from the question), a spike far away
    n = 1000
    base = torch.linspace(1e-5, 1e-3, n)
    scores = base.clone()
    scores[100] = 3e-4  # 30x its neighbours, but below the raw scores of the last ~700 rows
    cand = torch.ones(n, dtype=torch.bool)
    cand[0] = False
    assert choose_rows(scores, cand, Select(before=0, after=0, sink=0, contrast=0), 1).tolist() == [999]
    assert choose_rows(scores, cand, Select(before=0, after=0, sink=0, contrast=50), 1).tolist() == [100]
    c = local_contrast(scores, cand, 50)
    # row 500: mean of rows 450..550 (101 candidates, linear ramp) equals its own score
    assert c[500].item() == pytest.approx(base[500].item() / (base[500].item() + 0.01 / n), rel=1e-4)
    # non-candidates are left out of the means: row 1's window is rows 1..51 (row 0 excluded)
    assert c[1].item() == pytest.approx(base[1].item() / (base[1:52].double().mean().item() + 0.01 / n), rel=1e-4)
    with pytest.raises(InputError):
        Select(contrast=-1)


def test_select_parse_and_errors():
    assert Select.parse("off") is None
    assert Select.parse("on") == DEFAULT_SELECT and Select.parse("attention") == Select()
    assert Select.parse("budget=64,after=8,heads=max,rounds=2") == Select(budget=64, after=8, heads="max", rounds=2)
    assert Select.parse("contrast=0").contrast == 0 and Select().contrast == 128
    assert Select(budget=0.025).budget_rows(2048) == 51
    for bad in ("budget=0", "budget=2.5", "heads=mean", "queries=0", "rounds=0", "before=-1", "colour=red", "budget"):
        with pytest.raises(InputError):
            Select.parse(bad)


def test_select_refused_without_filled_kv_and_ignored_in_exact_mode(llama, ids):
    """Mode "none" writes no filled K/V for the attention parts to score: refused. In mode "exact" every
    row is exact, so there is nothing to choose: the selection (the default "on" too) is ignored."""
    with pytest.raises(InputError, match="select"):
        prefill(llama, ids, tail=8, mode="none", split=S, select=Select())
    plain = prefill(llama, ids, tail=8, mode="exact", select=None)
    for select in (Select(), "on"):
        res = prefill(llama, ids, tail=8, mode="exact", select=select)
        assert res.selected is None and torch.equal(res.logits, plain.logits)


def test_centred_identity_fill(llama, ids, maps):
    """Mode 'centred' is the fill with W = I and b_l = x̄_l − h̄ (the λ → ∞ limit of the ridge maps)."""
    d, late = llama.config.hidden_size, llama.config.num_hidden_layers - S - 1
    g = torch.Generator().manual_seed(1)
    m = maps.to()
    m.mean_h, m.mean_x = torch.randn(d, generator=g), torch.randn(late, d, generator=g)
    res = prefill_instrumented(llama, ids, m, tail=8, mode="centred", logits="exact", select=None)
    ref = maps.to()
    ref.weights, ref.biases = torch.eye(d).repeat(late, 1, 1), m.mean_x - m.mean_h
    want = prefill_instrumented(llama, ids, ref, tail=8, mode="ridge", logits="exact", select=None)
    assert_same_prefill(res, want, llama.config.num_hidden_layers)
    # with x̄_l = h̄ it is the plain identity fill
    m.mean_x = m.mean_h.repeat(late, 1)
    same = prefill_instrumented(llama, ids, m, tail=8, mode="centred", logits="exact", select=None)
    assert_same_prefill(same, prefill_instrumented(llama, ids, tail=8, mode="identity", split=S, logits="exact", select=None),
                        llama.config.num_hidden_layers)
    with pytest.raises(MapsFormatError, match="means"):
        prefill(llama, ids, maps, tail=8, mode="centred", select=None)


def test_induction_selection_keeps_only_the_top_heads(llama, ids, maps):
    from ridgefill.adapters import adapter_for
    from ridgefill.select import AttentionScores, induction_scores

    ad = adapter_for(llama)
    scores = induction_scores(ad)
    assert scores.shape == (llama.config.num_hidden_layers, llama.config.num_attention_heads)
    sel = Select(heads="induction", top_heads=3, budget=10)
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for layer, heads in enumerate(AttentionScores(ad, ids.shape[1], sel).heads):
        keep[layer, heads] = True
    assert int(keep.sum()) == 3 and float(scores[keep].min()) >= float(scores[~keep].max())
    res = prefill_instrumented(llama, ids, maps, tail=8, mode="ridge", select=sel, logits="exact")
    one = prefill_instrumented(llama, ids, maps, tail=8, exact_rows=res.selected.tolist(), mode="ridge", logits="exact", select=None)
    assert_same_prefill(res, one, llama.config.num_hidden_layers)


def test_leverage_selection_is_one_pass_with_the_chosen_rows(llama, ids, maps):
    """Query-agnostic selection (``by="leverage"``): rows chosen from ``h_S`` alone, before any late layer;
    the result equals a one-pass fill with them as ``exact_rows``, in every fill mode."""
    import dataclasses

    from ridgefill.select import leverage_scores

    h = reference(llama, ids[:, :40]).hidden_states[S + 1][0].double()  # h_S of the rows the maps saw
    maps = dataclasses.replace(maps, mean_h=h.mean(0).float(), cov_h=torch.cov(h.T, correction=0).float())
    sel = Select.parse("prompt,budget=6")
    assert (sel.by, sel.before, sel.after, sel.contrast, sel.budget) == ("leverage", 14, 2, 0, 6)
    for mode in ("ridge", "identity", "none"):
        res = prefill(llama, ids, maps, tail=3, mode=mode, select=sel)
        assert 0 < res.selected.numel() <= 6
        one = prefill(llama, ids, maps, tail=3, mode=mode, exact_rows=res.selected, select=None)
        assert torch.allclose(res.logits, one.logits, atol=1e-5)
        for layer in range(len(res.cache.layers)):
            assert torch.allclose(res.cache.layers[layer].keys, one.cache.layers[layer].keys, atol=1e-5)
    # the score: a row equal to the calibration mean has leverage 0; one unit along a direction of
    # variance v has leverage 1 / (v + ε)
    d = maps.cov_h.shape[0]
    cov = torch.diag(torch.linspace(1.0, 2.0, d))
    h = torch.zeros(1, 3, d)
    h[0, 1, 0] = 1.0
    h[0, 2, d - 1] = 1.0
    eps = 1e-3 * 1.5
    lev = leverage_scores(h, torch.zeros(d), cov)
    assert lev.tolist() == pytest.approx([0.0, 1 / (1 + eps), 1 / (2 + eps)], rel=1e-6)
    with pytest.raises(InputError, match="calibration mean and covariance"):
        prefill(llama, ids, None, tail=3, mode="identity", split=maps.split, select=sel)


def test_leverage_part_names_the_fix_for_maps_without_the_covariance(llama, ids, maps):
    """A leverage part needs ``mean_h``/``cov_h``; K/V maps do not store them: the error says so and names
    the attention-only selection (the default, which needs neither)."""
    import dataclasses

    from ridgefill.select import check_leverage_stats

    two_part = Select.parse("prompt,budget=35+attention+total=0.05")
    kv_maps = dataclasses.replace(maps, meta={**maps.meta, "kind": "kv"}, mean_h=None, cov_h=None)
    with pytest.raises(InputError, match=r"K/V maps do not store them.*--select attention"):
        check_leverage_stats(two_part, kv_maps)
    with pytest.raises(InputError, match=r"these maps have none.*--select attention"):
        prefill(llama, ids, dataclasses.replace(maps, cov_h=None), tail=8, mode="ridge", split=S, select=two_part)
    check_leverage_stats(DEFAULT_SELECT, kv_maps)


def test_selection_parts_choose_in_order_within_their_own_budgets(llama, ids, maps):
    wide = Select(budget=7, before=1, after=3)
    narrow = Select(budget=5, queries=8, heads="sum", before=0, after=1, contrast=0)
    alone = prefill(llama, ids, maps, tail=8, mode="ridge", split=S, select=wide).selected
    both = prefill(llama, ids, maps, tail=8, mode="ridge", split=S, select=Selection((wide, narrow))).selected
    assert alone.numel() == 7  # the first part chooses from the same first-pass scores as alone
    assert set(alone.tolist()) < set(both.tolist())
    assert both.numel() == 12  # the second part adds its own 5 rows, none of them already chosen
    assert both.max() < ids.shape[1] - 8
    assert Selection((wide, narrow)).budget_rows(ids.shape[1]) == 12
    assert Selection((wide, narrow)).queries == 9 and Selection((wide, narrow)).rounds == 1


def test_selection_total_caps_the_parts_together(llama, ids, maps):
    """With a total the parts choose in order, each within its own budget and what the parts before it
    left: the second part takes the rest of the total; a total below the first part's budget leaves the
    second part nothing. The result is still the one-pass fill with the chosen rows exact."""
    wide = Select(budget=7, before=1, after=3)
    narrow = Select(budget=30, queries=8, heads="sum", before=0, after=1, contrast=0)
    alone = prefill(llama, ids, maps, tail=8, mode="ridge", split=S, select=wide).selected
    capped = Selection((wide, narrow), total=11)
    res = prefill_instrumented(llama, ids, maps, tail=8, mode="ridge", split=S, select=capped, logits="exact")
    assert set(alone.tolist()) < set(res.selected.tolist()) and res.selected.numel() == 11  # 7, then 4 of 30
    assert capped.budget_rows(96) == 11 and Selection((wide, narrow), total=0.5).budget_rows(96) == 37
    one = prefill_instrumented(llama, ids, maps, tail=8, mode="ridge", split=S, exact_rows=res.selected.tolist(), logits="exact", select=None)
    assert_same_prefill(res, one, llama.config.num_hidden_layers)
    first_only = prefill(llama, ids, maps, tail=8, mode="ridge", split=S, select=Selection((wide, narrow), total=5)).selected
    assert first_only.numel() == 5 and set(first_only.tolist()) <= set(alone.tolist())
    fraction = Selection((wide, narrow), total=0.1)  # 9 of 96 rows
    assert prefill(llama, ids, maps, tail=8, mode="ridge", split=S, select=fraction).selected.numel() == 9


def test_selection_total_keeps_an_earlier_part_s_later_rounds(llama, ids, maps):
    """With a total, an attention part listed first keeps the budget of its later rounds: a later part
    does not take it in round 0 (here part 0's round-0 share is 0 rows, its round-1 share row 0, the sink,
    and the total of 1 row is its)."""
    sel = Selection((Select(budget=1, rounds=2, sink=1), Select(budget=5, sink=0)), total=1)
    res = prefill(llama, ids, maps, tail=8, mode="ridge", split=S, select=sel)
    assert res.selected.tolist() == [0]
    assert_same_prefill(prefill_instrumented(llama, ids, maps, tail=8, mode="ridge", split=S, select=sel, logits="exact"),
                        prefill_instrumented(llama, ids, maps, tail=8, mode="ridge", split=S, exact_rows=[0], logits="exact", select=None),
                        llama.config.num_hidden_layers)


def test_selection_total_parse_and_errors():
    sel = Select.parse("prompt,budget=35+attention+total=0.05")
    assert sel == Selection((Select(budget=35, by="leverage", before=14, after=2, contrast=0), Select()), total=0.05)
    assert str(sel) == "prompt,budget=35+attention+total=0.05"
    with pytest.raises(InputError, match="'on' is the default selection, itself 3 parts"):
        Select.parse("prompt,budget=35+on+total=0.05")  # the default is three parts: 'on' is not one part
    assert Select.parse(str(sel)) == sel and sel.budget_rows(1000) == 50 and sel.budget_rows(980) == 49
    assert Select.parse("attention+total=40").budget_rows(10_000) == 40  # a row count caps a larger part budget
    for bad, match in (("total=0.05", "caps the parts"), ("attention+total=0.05+attention", "must be the last"),
                       ("attention+total=x", "not a number"), ("attention+total=2.5", "whole row count"),
                       ("attention+total=0", "fraction of the prompt in"), ("attention+totals=3", "must be 'total=F'")):
        with pytest.raises(InputError, match=match):
            Select.parse(bad)
    with pytest.raises(InputError, match="total must be"):
        Selection((Select(),), total=True)


def test_selection_parse_and_errors():
    sel = Select.parse("budget=0.025+budget=0.025,queries=256,before=0,after=3,contrast=0")
    assert sel == Selection((Select(budget=0.025), Select(budget=0.025, queries=256, before=0, after=3, contrast=0)))
    assert sel.budget_rows(2048) == 51 + 51
    assert str(sel) == "budget=0.025+budget=0.025,before=0,after=3,queries=256,contrast=0"
    for spec in ("on", "attention", "ngram", "ngram,budget=0.02+attention+total=0.05", "prompt", "prompt,budget=5+attention", "attention,budget=9+prompt,after=3", "budget=40,heads=sum,rounds=2", "budget=0.0125,by=leverage",
                 "reference=63,floor=0.25", "budget=0.0123456789", "budget=1234567", "floor=0.3333333333333333",
                 "budget=1e-05,floor=1e-06"):
        parsed = Select.parse(spec)
        assert Select.parse(str(parsed)) == parsed, spec  # str is a reusable --select spec
    assert str(Select()) == "attention" and str(Select.parse("prompt")) == "prompt"
    assert str(Select(by="leverage")) == "prompt,before=2,after=16,contrast=128"  # pairs that differ from the preset
    assert Select.parse("prompt+attention") == Selection((Select(by="leverage", before=14, after=2, contrast=0), Select()))
    with pytest.raises(InputError, match="Select parts"):
        Selection(())
    with pytest.raises(InputError, match="not key=value"):
        Select.parse("budget=0.02+bogus")
    assert as_selection(Select.parse("reference=63")).queries == 64  # query and reference rows are scored
    assert Select.parse("reference=63,floor=0.1") == Select(reference=63, floor=0.1)
    for bad in ("floor=0", "floor=-1", "floor=1e-50", "reference=-1"):
        with pytest.raises(InputError, match="floor|reference"):
            Select.parse(bad)
    for bad in (dict(reference=True), dict(floor=True), dict(before=False)):
        with pytest.raises(InputError, match="must be"):
            Select(**bad)
    assert Select.parse(str(Select(budget=1 / 3, floor=1 / 7))) == Select(budget=1 / 3, floor=1 / 7)
    for bad in ("on+", "+on", "on++on"):
        with pytest.raises(InputError, match="empty part"):
            Select.parse(bad)


def test_selection_with_a_query_agnostic_part_equals_one_pass(llama, ids, maps):
    """A leverage part (chosen before the late layers) and an attention part (two passes) together:
    the result is the one-pass fill with all chosen rows exact; the leverage part's rows are those it
    chooses alone."""
    import dataclasses

    h = reference(llama, ids[:, :40]).hidden_states[S + 1][0].double()
    maps = dataclasses.replace(maps, mean_h=h.mean(0).float(), cov_h=torch.cov(h.T, correction=0).float())
    lev = Select.parse("prompt,budget=5")
    sel = Selection((lev, Select(budget=6, before=1, after=2)))
    res = prefill_instrumented(llama, ids, maps, tail=8, mode="ridge", select=sel, logits="exact")
    alone = prefill(llama, ids, maps, tail=8, mode="ridge", select=lev).selected
    assert set(alone.tolist()) < set(res.selected.tolist()) and res.selected.numel() == 11
    one = prefill_instrumented(llama, ids, maps, tail=8, mode="ridge", exact_rows=res.selected.tolist(), logits="exact", select=None)
    assert_same_prefill(res, one, llama.config.num_hidden_layers)


def test_rounds_with_a_budget_smaller_than_the_rounds_still_spend_it(llama, ids, maps):
    """A round whose share rounds down to no row does not end the selection: later rounds take the
    budget (here 3 rows over 4 rounds: 0, 1, 1, 1), from the same scores while nothing changed."""
    sel = Select(budget=3, rounds=4, before=0, after=0, sink=0)
    res = prefill_instrumented(llama, ids, maps, tail=8, mode="ridge", split=S, select=sel, logits="exact")
    assert res.selected.numel() == 3
    one = prefill_instrumented(llama, ids, maps, tail=8, exact_rows=res.selected.tolist(), mode="ridge", split=S, logits="exact", select=None)
    assert_same_prefill(res, one, llama.config.num_hidden_layers)


def test_ngram_scores_the_row_that_ends_the_match_and_widens_it():
    """The lexical part (``by="ngram"``) on a hand-made prompt: the score goes to the row that ends a shared
    sequence (a 2- and a 3-token match end at row 22, only a 2-token match at row 21; each sequence ends at
    one row outside the query rows, so ``1`` per sequence; the query rows score 0), the window is ``[22 - before, 22 + after]``, given
    exact rows and the tail are never chosen, row 0 comes first, and without a match only row 0 is chosen."""
    from ridgefill.select import ngram_scores

    ids = list(range(100, 150))  # 50 filled rows, no repeats
    ids[20:23] = [500, 501, 502]
    prompt = torch.tensor([ids + [900, 901, 500, 501, 502, 902]])  # a 6-row tail quoting rows 20-22
    tail = torch.arange(50, 56)
    scores = ngram_scores(prompt, tail)
    assert np.flatnonzero(scores).tolist() == [21, 22]
    assert scores[21].item() == 1.0 and scores[22].item() == 2.0  # 501-502's match counts at 22 too
    twice = prompt.clone()
    twice[0, 40:42] = torch.tensor([501, 502])  # a second filled copy of 501-502 halves its weight
    assert ngram_scores(twice, tail)[[21, 22, 41]].tolist() == [1.0, 1.5, 0.5]
    assert ngram_scores(prompt, tail[-1:])[:50].sum().item() == 0  # the last row ends no quoted sequence
    sel = Select.parse("ngram,before=1,after=2,min_score=0")
    filled = torch.ones(56, dtype=torch.bool)
    filled[50:] = False
    assert choose_rows(scores, filled, sel, 10).tolist() == [0, 21, 22, 23, 24]
    given = filled.clone()
    given[[0, 23]] = False
    assert choose_rows(scores, given, sel, 10).tolist() == [21, 22, 24]
    assert choose_rows(scores, filled, sel, 3).tolist() == [0, 21, 22]  # cut to the budget
    assert choose_rows(torch.zeros(56), filled, sel, 10).tolist() == [0]  # nothing matches: budget unspent
    narrow = Select.parse("ngram,before=0,after=0,min_score=0")  # windows of one row: every anchor shows
    assert choose_rows(scores, filled, narrow, 10).tolist() == [0, 21, 22]
    strict = Select.parse("ngram,before=0,after=0,min_score=2")  # only row 22 scores 2: row 21 anchors nothing
    assert choose_rows(scores, filled, strict, 10).tolist() == [0, 22]
    assert choose_rows(ngram_scores(twice, tail), filled, strict, 10).tolist() == [0]  # 1.5 < 2: no anchor
    assert choose_rows(scores, filled, Select.parse("ngram,before=1,after=2"), 10).tolist() == [0]  # preset: 3
    contrasted = Select.parse("ngram,before=0,after=0,min_score=2,contrast=8")  # the threshold is on the score,
    assert choose_rows(scores, filled, contrasted, 10).tolist() == [0, 22]  # not on its (larger) contrast
    batch = torch.cat([prompt, prompt, prompt])  # a batch of copies scores as one prompt: the threshold holds
    assert np.array_equal(ngram_scores(batch, tail), scores)


def test_ngram_threshold_leaves_prose_to_the_next_part():
    """The preset's ``min_score=3``: a row anchors a window only if the sequences it ends weigh 3 (a quoted
    5-token key, found once outside the question, scores 4 at its last row and 3 at the row before); a
    2-token phrase the question shares with the prose (score 1 per copy) anchors nothing, so the part
    chooses only the key's window and row 0, and leaves the rest of its budget."""
    from ridgefill.select import ngram_scores

    ids = list(range(100, 180))  # 80 filled rows, no repeats
    ids[30:35] = [500, 501, 502, 503, 504]  # the key
    ids[60:62] = [700, 701]  # a phrase the question also uses
    prompt = torch.tensor([ids + [900, 700, 701, 901, 500, 501, 502, 503, 504, 902]])
    tail = torch.arange(80, 90)
    scores = ngram_scores(prompt, tail)
    assert scores[[33, 34, 61]].tolist() == [3.0, 4.0, 1.0]
    filled = torch.ones(90, dtype=torch.bool)
    filled[80:] = False
    chosen = choose_rows(scores, filled, Select.parse("ngram,budget=30,before=1,after=2"), 30).tolist()
    assert chosen == [0, 33, 34, 35, 36]  # row 34's window, then row 33's rows are already chosen
    anyone = choose_rows(scores, filled, Select.parse("ngram,budget=30,before=1,after=2,min_score=0"), 30).tolist()
    assert {60, 61, 62, 63} <= set(anyone)  # without the threshold the phrase anchors a window too
    with pytest.raises(InputError, match="min_score"):
        Select(min_score=1.0)  # a threshold for attention scores is refused
    with pytest.raises(InputError, match="min_score"):
        Select(by="leverage", min_score=1.0)  # and for leverage scores
    assert Select.parse("ngram,by=attention").min_score == 0  # the preset's threshold goes with by=ngram
    with pytest.raises(InputError, match="min_score"):
        Select.parse("ngram,min_score=-1")


def test_ngram_part_chooses_the_asked_needle_and_leaves_the_rest_to_attention(llama, ids, maps, monkeypatch):
    """In a :class:`Selection` the lexical part chooses first, before the late layers (its rows are exact
    in the first late-layer pass), only around its matches; the attention part takes the rest of the
    total; the result is the one-pass fill with the chosen rows exact. Alone it is one pass in any fill
    mode, also ``"none"``. Its question is the tail's last rows, never ``exact_rows`` outside the tail."""
    import ridgefill.fill as fill_module
    from ridgefill.select import ngram_scores

    passes = []  # the exact rows of each late-layer pass
    run = fill_module._LateLayers.run
    monkeypatch.setattr(fill_module._LateLayers, "run", lambda self, ex, *a, **k: passes.append(ex.tolist()) or run(self, ex, *a, **k))
    quoted = ids.clone()
    quoted[0, -5:-2] = quoted[0, 30:33]  # the tail quotes rows 30-32
    lex = Select.parse("ngram,budget=20,before=1,after=1,queries=8,min_score=0")
    alone = prefill(llama, quoted, maps, tail=8, mode="ridge", select=lex).selected.tolist()
    assert {0, 31, 32, 33} <= set(alone) and len(alone) < 20  # row 0, the match's window; budget left
    assert len(passes) == 1 and set(alone) <= set(passes[0])  # one pass, the chosen rows exact in it
    passes.clear()
    sel = Selection((lex, Select(budget=12, before=1, after=2)), total=16)
    res = prefill_instrumented(llama, quoted, maps, tail=8, mode="ridge", select=sel, logits="exact")
    assert len(passes) == 2 and set(alone) <= set(passes[0])  # chosen before the attention pass
    copied = quoted.clone()
    copied[0, 60:64] = copied[0, 10:14]  # exact rows 60-63 repeat rows 10-13, the 2-row tail quotes nothing
    assert (ngram_scores(copied, torch.tensor([60, 61, 62, 63, 94, 95]))[11:14] > 0).all()
    far = prefill(llama, copied, maps, tail=2, exact_rows=range(60, 64), mode="ridge", select=lex).selected.tolist()
    assert far == [0]  # the exact rows 60-63 are not the question
    assert set(alone) < set(res.selected.tolist()) and res.selected.numel() == 16
    one = prefill_instrumented(llama, quoted, maps, tail=8, mode="ridge", exact_rows=res.selected.tolist(), logits="exact", select=None)
    assert_same_prefill(res, one, llama.config.num_hidden_layers)
    none = prefill_instrumented(llama, quoted, None, tail=8, mode="none", split=S, select=lex, logits="exact")
    one = prefill_instrumented(llama, quoted, None, tail=8, mode="none", split=S, exact_rows=alone, logits="exact", select=None)
    assert none.selected.tolist() == alone
    assert_same_prefill(none, one, llama.config.num_hidden_layers)


def test_ngram_parse_and_spec():
    """``"ngram"`` is the lexical preset; a spec reads back; the combined spec has the n-gram part first."""
    from ridgefill.select import NGRAM_PRESET

    assert Select.parse("ngram") == Select(**NGRAM_PRESET)
    assert (Select.parse("ngram").before, Select.parse("ngram").after, Select.parse("ngram").queries) == (4, 16, 64)
    assert Select.parse("ngram").min_score == 3 and Select().min_score == 0
    from ridgefill.select import DEFAULT_SELECT
    assert Select.parse("on") is DEFAULT_SELECT and DEFAULT_SELECT.total == 0.05
    assert str(DEFAULT_SELECT) == ("ngram,budget=0.02+budget=0.02,by=predicted,reference=63+budget=0.03,before=0,"
                                   "after=3,queries=256,contrast=0,by=predicted+total=0.05")  # docs/evaluate.md's one-pass
    from ridgefill.select import TWO_PASS_SELECT
    assert str(TWO_PASS_SELECT) == ("ngram,budget=0.02+budget=0.02,reference=63+budget=0.03,before=0,after=3,"
                                    "queries=256,contrast=0+total=0.05")
    from ridgefill.select import PROMPT_PRESET, parse_setting  # the named settings of the command line
    assert parse_setting("on") is DEFAULT_SELECT and parse_setting("off") is None
    assert parse_setting("prompt") == Select(**PROMPT_PRESET)
    assert parse_setting("prompt,budget=35") == Select(**PROMPT_PRESET, budget=35)
    doubled = parse_setting("on,budget=0.1")  # every part's budget scaled with the total
    assert doubled.total == 0.1 and [p.budget for p in doubled.parts] == pytest.approx([0.04, 0.04, 0.06])
    assert [dataclasses.replace(p, budget=1) for p in doubled.parts] == [
        dataclasses.replace(p, budget=1) for p in DEFAULT_SELECT.parts]
    from ridgefill.select import ONE_PASS_SELECT, TWO_PASS_SELECT
    assert parse_setting("auto") == "auto" and parse_setting("two-pass") is TWO_PASS_SELECT
    assert parse_setting("one-pass") is ONE_PASS_SELECT and Select.parse("one-pass") is ONE_PASS_SELECT
    assert [p.by for p in ONE_PASS_SELECT.parts] == ["ngram", "predicted", "predicted"]
    assert ONE_PASS_SELECT.parts[0] == TWO_PASS_SELECT.parts[0] and ONE_PASS_SELECT.total == TWO_PASS_SELECT.total
    assert [dataclasses.replace(p, by="attention") for p in ONE_PASS_SELECT.parts[1:]] == list(
        TWO_PASS_SELECT.parts[1:])  # the same attention parts, scored in one pass
    assert ONE_PASS_SELECT.rounds == 0 and TWO_PASS_SELECT.rounds == 1
    assert parse_setting("one-pass,budget=0.1").parts[1].budget == pytest.approx(0.04)
    for bad, message in (("budget=4", "use one of auto, on, two-pass, one-pass, prompt, off"),
                         ("on,budget=2", "share of the prompt"), ("off,budget=0.1", "takes no budget"),
                         ("auto,budget=0.1", "follows the maps' setting"), ("on,after=3", "only ',budget=F'")):
        with pytest.raises(InputError, match=message):
            parse_setting(bad)
    for spec in ("ngram", "ngram,after=20", "ngram,min_score=0", "ngram,budget=0.02+attention+total=0.05"):
        assert str(Select.parse(spec)) == spec
    sel = Select.parse("ngram,budget=0.02+attention+total=0.05")
    assert [p.by for p in sel.parts] == ["ngram", "attention"] and sel.by == "attention"
    assert Selection((Select.parse("ngram"),)).by == "ngram"
    with pytest.raises(InputError, match="'attention', 'leverage', 'ngram' or 'predicted'"):
        Select(by="words")


def test_auto_resolves_to_the_recorded_setting_else_on():
    """``resolve_auto`` (``prefill``'s ``select``, the vLLM plugin's and ``export-vllm``'s): ``"auto"`` is the setting a
    maps file records, else ``"on"`` (one pass), or two-pass with K/V maps; any other setting stands as given; a
    recorded spec that does not parse is refused."""
    from ridgefill.select import ONE_PASS_SELECT, TWO_PASS_SELECT, resolve_auto

    assert resolve_auto("auto", None) == DEFAULT_SELECT == ONE_PASS_SELECT
    assert resolve_auto(" auto ", "two-pass") == TWO_PASS_SELECT
    assert resolve_auto("auto", None, inputs=False) == TWO_PASS_SELECT  # K/V maps predict no queries
    assert resolve_auto("auto", "one-pass", inputs=False) == ONE_PASS_SELECT  # a recorded setting stands
    assert resolve_auto("auto", "off") is None and resolve_auto("auto", "prompt").by == "leverage"
    assert resolve_auto("two-pass", "one-pass") == TWO_PASS_SELECT and resolve_auto("off", "on") is None
    assert resolve_auto(Select(), "off") == Select() and resolve_auto(None, "on") is None
    # a model with recurrent-state layers: one-pass, or a recorded setting that runs one pass
    assert resolve_auto("auto", None, recurrent=True) == ONE_PASS_SELECT
    assert resolve_auto("auto", "two-pass", recurrent=True) == ONE_PASS_SELECT
    assert resolve_auto("auto", "off", recurrent=True) is None and resolve_auto("auto", "prompt", True).by == "leverage"
    with pytest.raises(InputError, match="key=value"):
        resolve_auto("auto", "sideways")
