"""Splice tests: the kv_hook extension point of the fill and the splices built on it."""

import pytest
import torch

from ridgefill import InputError, prefill
from ridgefill.fill import prefill_instrumented
from ridgefill.evaluate.loss import score_documents, summarise, tail_nll
from ridgefill.evaluate.splice import COMPONENTS, exact_kv, splice_hook, splice_variants
from conftest import tiny_llama
from conftest import oracle_maps

S = 2
TAIL = 10


@pytest.fixture(scope="module")
def setup():
    model = tiny_llama(seed=3)
    doc = torch.randint(0, 101, (57,), generator=torch.Generator().manual_seed(9))
    exact, pos, res = tail_nll(model, doc, tail=TAIL, mode="exact")
    return model, doc, exact, res


@pytest.mark.parametrize("mode", ["identity", "ridge"])
def test_splicing_exact_k_and_v_reproduces_exact_nll(setup, mode):
    model, doc, exact, res = setup
    maps = oracle_maps(model, doc[None, :16], S) if mode == "ridge" else None  # deliberately poor maps
    fill, _, _ = tail_nll(model, doc, tail=TAIL, mode=mode, maps=maps, split=S)
    assert (fill - exact).abs().max() > 1e-3  # the fill alone is not exact: the check below is not vacuous
    hook = splice_hook(exact_kv(res.cache, range(S + 1, 6)), "kv")
    spliced, _, out = tail_nll(model, doc, tail=TAIL, mode=mode, maps=maps, split=S, kv_hook=hook)
    torch.testing.assert_close(spliced, exact, rtol=0, atol=1e-5)
    for layer in range(6):  # and the whole cache is the exact one
        torch.testing.assert_close(out.cache.layers[layer].keys, res.cache.layers[layer].keys, rtol=0, atol=1e-5)


def test_hook_sees_filled_rows_and_replaces_them(setup):
    model, doc, _, res = setup
    ids = doc[None, :-1]
    calls = []

    def hook(layer, k, v, filled):
        calls.append((layer, filled.tolist(), tuple(k.shape)))
        return torch.zeros_like(k), v

    out = prefill_instrumented(model, ids, tail=TAIL, exact_rows=[5, 20], mode="identity", split=S, kv_hook=hook, select=None)
    n = ids.shape[1]
    filled = [p for p in range(n - TAIL) if p not in (5, 20)]
    assert [c[0] for c in calls] == list(range(S + 1, 6))
    assert all(c[1] == filled and c[2] == (1, 2, len(filled), 16) for c in calls)
    k = out.cache.layers[S + 1].keys
    assert k[:, :, filled].abs().max() == 0 and k[:, :, [5, 20]].abs().min() > 0  # exact rows untouched
    # no hook in mode none (no filled K/V) or exact
    calls.clear()
    prefill_instrumented(model, ids, tail=TAIL, mode="none", split=S, kv_hook=hook, select=None)
    assert calls == []


def test_key_scale_and_direction_splices(setup):
    model, doc, _, res = setup
    late = range(S + 1, 6)
    exact = exact_kv(res.cache, late)
    k = torch.randn(1, 2, 4, 16)
    v = torch.randn(1, 2, 4, 16)
    filled = torch.tensor([0, 3, 7, 8])
    ek = exact[S + 1][0][:, :, filled]
    ks, vs = splice_hook(exact, "k_scale")(S + 1, k, v, filled)
    torch.testing.assert_close(ks.norm(dim=-1), ek.norm(dim=-1))  # exact norm per row and head
    torch.testing.assert_close(ks / ks.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True))  # fill's direction
    assert vs is v
    kd, _ = splice_hook(exact, "k_direction")(S + 1, k, v, filled)
    torch.testing.assert_close(kd.norm(dim=-1), k.norm(dim=-1))
    torch.testing.assert_close(kd / kd.norm(dim=-1, keepdim=True), ek / ek.norm(dim=-1, keepdim=True))
    kk, vv = splice_hook(exact, "v", layers=[S + 2])(S + 1, k, v, filled)  # layer not chosen: untouched
    assert kk is k and vv is v
    assert splice_hook(exact, "fill") is None


def test_splice_bad_input(setup):
    model, doc, _, res = setup
    with pytest.raises(InputError, match="component"):
        splice_hook(exact_kv(res.cache, [3]), "q")
    with pytest.raises(InputError, match="no exact K/V"):
        splice_hook(exact_kv(res.cache, [3]), "k", layers=[3, 4])
    with pytest.raises(InputError, match="mode"):
        splice_variants(model, {S: None}, tail=TAIL, mode="none")
    with pytest.raises(InputError, match="needs maps"):
        splice_variants(model, {S: None}, tail=TAIL, mode="ridge")


def test_splice_variants_through_score_documents(setup):
    model, doc, exact, _ = setup
    recs = score_documents(model, [doc, doc.flip(0)], ["plain", "plain"], tail=TAIL, window=4,
                           variants=splice_variants(model, {S: None}, tail=TAIL, mode="identity"))
    assert list(recs[0].fill) == [f"{S}/identity+{c}" for c in COMPONENTS]
    rows = {r["variant"]: r["delta_nll"] for r in summarise(recs, tau=0.0, resamples=50) if r["tokens"] == "all"}
    assert abs(rows[f"{S}/identity+kv"]["mean"]) < 1e-6
    fill = torch.tensor(recs[0].fill[f"{S}/identity+fill"])
    assert (fill - torch.tensor(recs[0].exact)).abs().max() > 1e-3  # the fill alone is not exact
    torch.testing.assert_close(torch.tensor(recs[0].exact, dtype=torch.float64), exact)


def test_fitted_key_scales_and_lambda_refit(setup):
    from ridgefill.evaluate.splice import fit_key_scales, key_scale_hook, refit_lambda
    from ridgefill.ridge import RidgeStats

    model, doc, _, _ = setup
    rows = doc[:40]
    maps = oracle_maps(model, rows[None], S)  # exact on these rows: the fill's keys are the exact keys
    scales = fit_key_scales(model, maps, [rows])
    assert scales.shape == (6 - S - 1, 2)
    torch.testing.assert_close(scales, torch.ones_like(scales), rtol=0, atol=1e-3)
    ident = fit_key_scales(model, None, [rows], mode="identity", split=S)
    assert ident[0].tolist() == pytest.approx([1.0, 1.0], abs=1e-5)  # x_{S+1} = h_S: exact at S+1
    assert (ident[1:] - 1).abs().max() > 1e-3
    k, v = torch.ones(1, 2, 3, 16), torch.ones(1, 2, 3, 16)
    k2, v2 = key_scale_hook(torch.tensor([[2.0, 3.0]] * 3), S)(S + 2, k, v, torch.arange(3))
    assert k2[0, 0].unique().tolist() == [2.0] and k2[0, 1].unique().tolist() == [3.0] and v2 is v
    with pytest.raises(InputError, match="chunk"):
        fit_key_scales(model, maps, [])
    # λ refit from the statistics: a huge λ gives the identity map
    stats = RidgeStats(6 - S - 1, 64)
    g = torch.Generator().manual_seed(0)
    stats.update(torch.randn(200, 64, generator=g), torch.randn(6 - S - 1, 200, 64, generator=g))
    maps.stats, maps.lambdas = stats, [1.0] * (6 - S - 1)
    big = refit_lambda(maps, 1e12)
    assert big.lambdas == [1e12] * (6 - S - 1)
    torch.testing.assert_close(big.weights[1], torch.eye(64), rtol=0, atol=1e-4)
    maps.stats = None
    with pytest.raises(InputError, match="statistics"):
        refit_lambda(maps, 10.0)
