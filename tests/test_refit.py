"""The maps refitted on the prompt's exact rows (``prefill(..., refit=α)``, :mod:`ridgefill.refit`)."""

import pytest
import torch

from ridgefill import InputError, RidgeMaps, prefill
from ridgefill.adapters import adapter_for
from ridgefill.fill import predict_inputs
from ridgefill.maps import calibration_cov
from ridgefill.refit import PromptRefit, fit_count
from ridgefill.ridge import RidgeStats, fit_maps
from ridgefill.select import Select
from conftest import oracle_maps, reference, tiny_llama
from test_select import ids, llama  # noqa: F401 (the tiny model and prompt of the selection tests)

S = 2
F64 = torch.float64


def kv(cache, layer):
    return cache.layers[layer].keys, cache.layers[layer].values


def with_stats(fitted, stats, split, lam_spec="fixed", heldout=0) -> RidgeMaps:
    """RidgeMaps carrying the statistics a refit needs, as `ridgefill calibrate` writes them."""
    mean_h, mean_x = stats.means()
    meta = {"kind": "inputs", "calibration_tokens": stats.count + (heldout if lam_spec != "auto" else 0),
            "heldout_tokens": heldout, "lambda_spec": lam_spec}
    return RidgeMaps(split, fitted.weights.float(), fitted.biases.float(), list(fitted.lambdas), meta,
                     mean_h=mean_h.float(), mean_x=mean_x.float(), cov_h=calibration_cov(stats).float())


def random_problem(seed, d=8, layers=3, n=200):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=F64) * 3 + 5
    xs = torch.stack([h @ torch.randn(d, d, generator=g, dtype=F64) + torch.randn(d, generator=g, dtype=F64)
                      + 0.3 * torch.randn(n, d, generator=g, dtype=F64) for _ in range(layers)])
    stats = RidgeStats(layers, d)
    stats.update(h, xs)
    return stats, g


@pytest.mark.parametrize("alpha", [1, 3])
def test_refit_is_the_fit_on_the_calibration_rows_and_alpha_copies_of_the_exact_rows(alpha):
    stats, g = random_problem(0)
    lams = [0.5, 2.0, 7.0]
    maps = with_stats(fit_maps(stats, lams), stats, 1)
    hp = torch.randn(5, 8, generator=g, dtype=F64) * 2 - 1  # rows unlike the calibration rows
    xp = torch.stack([hp @ torch.randn(8, 8, generator=g, dtype=F64) for _ in range(3)])
    copies = RidgeStats(3, 8)
    copies.update(hp.repeat(alpha, 1), xp.repeat(1, alpha, 1))
    want = fit_maps(stats.merged(copies), lams)
    refit = PromptRefit(maps, hp, alpha)
    for i in range(3):
        w, b = refit.layer(i, xp[i])
        assert (want.weights[i] - maps.weights[i].double()).abs().max() > 0.05  # the rows do move the map
        torch.testing.assert_close(w, want.weights[i], rtol=0, atol=1e-6)
        torch.testing.assert_close(b, want.biases[i], rtol=0, atol=1e-5)


def test_refit_with_a_fractional_weight_solves_the_weighted_normal_equations():
    stats, g = random_problem(1)
    maps = with_stats(fit_maps(stats, [1.0, 1.0, 1.0]), stats, 1)
    hp = torch.randn(4, 8, generator=g, dtype=F64)
    xp = torch.randn(3, 4, 8, generator=g, dtype=F64)
    alpha = 0.37
    w, b = PromptRefit(maps, hp, alpha).layer(2, xp[2])
    # the gradient of Σ_calib ‖x − hW − b‖² + α Σ_exact ‖x − hW − b‖² + λ‖W − I‖² is zero at (W, b):
    # in centred calibration statistics (G, B about the calibration means) plus the exact rows' terms
    mh, mx = stats.means()
    gram, cross, _ = stats.centred(2)
    n = stats.count
    rc = lambda hh, xx: xx - hh @ w - b  # residual
    # calibration part: Σ (h−h̄)ᵀ r = B − G W − ... with r = x − hW − b, split into centred and mean terms
    r_mean = mx[2] - mh @ w - b
    grad_w = -(cross - gram @ w) - n * torch.outer(mh, r_mean) - alpha * hp.T @ rc(hp, xp[2]) + 1.0 * (w - torch.eye(8, dtype=F64))
    grad_b = -n * r_mean - alpha * rc(hp, xp[2]).sum(0)
    assert grad_w.abs().max() < 1e-6 * (1 + gram.abs().max())
    assert grad_b.abs().max() < 1e-6 * n


def test_fit_count_follows_the_lambda_spec_and_refuses_maps_without_statistics():
    stats, _ = random_problem(2)
    fitted = fit_maps(stats, [1.0] * 3)
    assert fit_count(with_stats(fitted, stats, 1, "auto", heldout=40)) == stats.count  # 'auto': fit + held-out
    assert fit_count(with_stats(fitted, stats, 1, "1.0", heldout=40)) == stats.count
    bare = RidgeMaps(1, fitted.weights.float(), fitted.biases.float(), [1.0] * 3, {})
    with pytest.raises(InputError, match="refit needs input maps that store"):
        fit_count(bare)
    with pytest.raises(InputError, match="refit weight α must be > 0"):
        PromptRefit(with_stats(fitted, stats, 1), torch.zeros(2, 8), 0.0)


@pytest.fixture(scope="module")
def maps(llama):
    """Maps of the tiny model fitted on other random prompts (λ = 1), with their statistics."""
    calib = torch.randint(0, 101, (4, 64), generator=torch.Generator().manual_seed(11))
    out = reference(llama, calib)
    layers = llama.config.num_hidden_layers
    stats = RidgeStats(layers - S - 1, 64)
    for b in range(calib.shape[0]):
        stats.update(out.hidden_states[S + 1][b].double(),
                     torch.stack([out.hidden_states[l][b].double() for l in range(S + 1, layers)]))
    m = with_stats(fit_maps(stats, [1.0] * (layers - S - 1)), stats, S)
    from ridgefill.maps import model_provenance
    m.meta.update(model_provenance(llama))
    return m


def test_refit_second_late_layer_from_the_true_inputs_of_the_exact_rows(llama, ids, maps):
    """Layer S+1's input is ``h_S`` itself, so its map is the identity and its filled K/V are exact; the
    exact rows' inputs of layer S+2 are then the plain forward's, and the refitted map of S+2 can be
    computed from them: the filled rows' K/V at S+2 are that map's, and differ from the calibration map's."""
    rho, tail = 2.0, 10
    seen = {}

    def hook(layer, k, v, rows):
        seen[layer] = (k, v, rows)
        return k, v

    res = prefill(llama, ids, maps, tail=tail, exact_rows=[0, 30], mode="ridge", refit=rho, kv_hook=hook)
    out = reference(llama, ids)
    ex = res.exact_positions
    pairs = ex[ex != 0]  # row 0 (the sink) is left out of the pairs
    alpha = rho * fit_count(maps) / pairs.numel()  # the exact rows together weigh ρ times the calibration rows
    assert fit_count(maps) == 256 and pairs.numel() == 11
    h = out.hidden_states[S + 1][0]  # h_S: the input of layer S+1
    k1, _, rows = seen[S + 1]
    assert rows.tolist() == [r for r in range(96) if r not in ex.tolist()]
    torch.testing.assert_close(k1, out.cache.layers[S + 1].keys[:, :, rows], rtol=0, atol=2e-5)
    w, b = PromptRefit(maps, h[pairs], alpha).layer(1, out.hidden_states[S + 2][0, pairs])
    k, v, _ = seen[S + 2]
    ad = adapter_for(llama)
    x_hat = predict_inputs(h[None, rows], w.float(), b.float())
    kw, vw = ad.kv(S + 2, x_hat, ad.rope(torch.arange(96), h[None]).rows(rows))
    torch.testing.assert_close(k, kw, rtol=0, atol=5e-5)
    torch.testing.assert_close(v, vw, rtol=0, atol=5e-5)
    plain = prefill(llama, ids, maps, tail=tail, exact_rows=[0, 30], mode="ridge")
    assert (plain.cache.layers[S + 2].keys[:, :, rows] - k).abs().max() > 1e-3


def test_refit_keeps_maps_that_are_exact_on_the_exact_rows():
    """Oracle maps reproduce every row's late-layer input, so the exact rows' residuals are zero and the
    refit leaves the maps as they are: the prefill is still the exact forward."""
    model = tiny_llama(seed=3, hidden=96)
    ids = torch.randint(0, 101, (1, 60), generator=torch.Generator().manual_seed(5))
    m = oracle_maps(model, ids, S)
    out = reference(model, ids)
    h = out.hidden_states[S + 1][0].double()
    m.mean_h = h.mean(0).float() + 1.0  # any calibration statistics: the correction is zero without residuals
    m.mean_x = (m.mean_h.double() @ m.weights.double() + m.biases.double()).float()
    m.cov_h = torch.eye(96) * 3.0
    m.meta.update({"kind": "inputs", "calibration_tokens": 500, "lambda_spec": "auto"})
    res = prefill(model, ids, m, tail=6, mode="ridge", refit=4.0, logits="exact")
    for layer in range(model.config.num_hidden_layers):
        for a, b in zip(kv(res.cache, layer), kv(out.cache, layer)):
            torch.testing.assert_close(a, b, rtol=0, atol=5e-4)
    torch.testing.assert_close(res.logits, out.logits[:, -6:], rtol=0, atol=5e-4)


def test_refit_with_selection_equals_one_pass_with_the_first_pass_maps(llama, ids, maps):
    """With selection the maps are refitted once, in the first pass (on the tail): the result is the one-pass
    prefill with the chosen rows exact and those refitted maps (``refit_maps``) as the maps, no refit."""
    sel = Select(budget=12, before=1, after=3)
    res = prefill(llama, ids, maps, tail=8, mode="ridge", select=sel, refit=2.0, logits="exact")
    w, b = res.refit_maps
    assert w.shape == (maps.weights.shape[0], 1, 64, 64) and b.shape == (maps.weights.shape[0], 1, 64)
    first = RidgeMaps(S, w[:, 0], b[:, 0], maps.lambdas, dict(maps.meta))
    one = prefill(llama, ids, first, tail=8, exact_rows=res.selected.tolist(), mode="ridge", logits="exact")
    torch.testing.assert_close(res.logits, one.logits, rtol=0, atol=1e-5)
    for layer in range(llama.config.num_hidden_layers):
        for x, y in zip(kv(res.cache, layer), kv(one.cache, layer)):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
    # the first pass's maps are those of a refit on the tail alone
    tail_only = prefill(llama, ids, maps, tail=8, mode="ridge", refit=2.0)
    torch.testing.assert_close(tail_only.refit_maps[0], w, rtol=0, atol=1e-6)
    assert (w[:, 0] - maps.weights).abs().max() > 1e-3  # the refit moved the maps
    plain = prefill(llama, ids, maps, tail=8, exact_rows=res.selected.tolist(), mode="ridge", logits="exact")
    assert (plain.logits - one.logits).abs().max() > 1e-3  # and the result


def test_refit_per_prompt_of_a_batch(llama, maps):
    ids = torch.randint(0, 101, (2, 50), generator=torch.Generator().manual_seed(8))
    both = prefill(llama, ids, maps, tail=6, mode="ridge", refit=3.0, logits="exact")
    for b in range(2):
        one = prefill(llama, ids[b:b + 1], maps, tail=6, mode="ridge", refit=3.0, logits="exact")
        torch.testing.assert_close(both.logits[b:b + 1], one.logits, rtol=0, atol=1e-5)
        for layer in range(llama.config.num_hidden_layers):
            for x, y in zip(kv(both.cache, layer), kv(one.cache, layer)):
                torch.testing.assert_close(x[b:b + 1], y, rtol=0, atol=1e-5)
    assert (both.refit_maps[0][:, 0] - both.refit_maps[0][:, 1]).abs().max() > 1e-3  # one map per prompt
    plain = prefill(llama, ids, maps, tail=6, mode="ridge", logits="exact")
    assert (plain.logits - both.logits).abs().max() > 1e-3


def test_refit_makes_filled_rows_depend_on_the_exact_rows_after_them(llama, ids, maps):
    """What refitting gives up: a filled row's late-layer K/V now depend on the exact rows after it (the
    lower layers still depend on the row's own prefix only)."""
    t = 40
    changed = ids.clone()
    changed[:, -4:] = (changed[:, -4:] + 7) % 101  # change the tail only
    a = prefill(llama, ids, maps, tail=8, mode="ridge", refit=2.0)
    b = prefill(llama, changed, maps, tail=8, mode="ridge", refit=2.0)
    for layer in range(S + 1):
        assert torch.equal(kv(a.cache, layer)[0][:, :, :t], kv(b.cache, layer)[0][:, :, :t])
    assert not torch.equal(kv(a.cache, S + 2)[0][:, :, :t], kv(b.cache, S + 2)[0][:, :, :t])  # (S+1: identity)
    plain_a = prefill(llama, ids, maps, tail=8, mode="ridge")
    plain_b = prefill(llama, changed, maps, tail=8, mode="ridge")
    assert torch.equal(kv(plain_a.cache, S + 2)[0][:, :, :t], kv(plain_b.cache, S + 2)[0][:, :, :t])


def test_refit_rows_before_the_scored_rows_keep_them_causal(llama, ids, maps):
    """Fitted on a block of exact rows before the tail (``refit_rows``), the refit never reads the tail: a change
    of the tail's tokens leaves every earlier row's K/V as they were, which a loss evaluation needs (without
    ``refit_rows`` the change reaches the filled rows' K/V)."""
    block = list(range(72, 88))
    changed = ids.clone()
    changed[:, -4:] = (changed[:, -4:] + 7) % 101
    kw = dict(tail=8, exact_rows=block, mode="ridge", refit=2.0, logits="exact")
    a = prefill(llama, ids, maps, refit_rows=block, **kw)
    b = prefill(llama, changed, maps, refit_rows=block, **kw)
    for layer in range(llama.config.num_hidden_layers):
        for x, y in zip(kv(a.cache, layer), kv(b.cache, layer)):
            assert torch.equal(x[:, :, :92], y[:, :, :92])
    torch.testing.assert_close(a.logits[:, :len(block) + 4], b.logits[:, :len(block) + 4], rtol=0, atol=0)
    c = prefill(llama, ids, maps, **kw)  # fitted on the block and the tail: the tail reaches row 40
    d = prefill(llama, changed, maps, **kw)
    assert not torch.equal(kv(c.cache, S + 2)[0][:, :, :40], kv(d.cache, S + 2)[0][:, :, :40])
    plain = prefill(llama, ids, maps, tail=8, exact_rows=block, mode="ridge")
    assert (kv(plain.cache, S + 2)[0][:, :, :40] - kv(a.cache, S + 2)[0][:, :, :40]).abs().max() > 1e-3


def test_refit_errors(llama, ids, maps):
    for bad in (-1.0, float("nan"), "1", True):
        with pytest.raises(InputError, match="refit must be a finite number"):
            prefill(llama, ids, maps, tail=8, mode="ridge", refit=bad)
    with pytest.raises(InputError, match="mode 'identity' has none"):
        prefill(llama, ids, maps, tail=8, mode="identity", split=S, refit=1.0)
    with pytest.raises(InputError, match=r"rows \[10\] are filled rows"):
        prefill(llama, ids, maps, tail=8, mode="ridge", refit=1.0, refit_rows=[10, 95])
    with pytest.raises(InputError, match="given without refit"):
        prefill(llama, ids, maps, tail=8, mode="ridge", refit_rows=[95])
    with pytest.raises(InputError, match=r"other than row 0 .*got \[0\]"):
        prefill(llama, ids, maps, tail=8, exact_rows=[0], mode="ridge", refit=1.0, refit_rows=[0])
    bare = RidgeMaps(S, maps.weights, maps.biases, maps.lambdas, dict(maps.meta))
    with pytest.raises(InputError, match="refit needs input maps that store"):
        prefill(llama, ids, bare, tail=8, mode="ridge", refit=1.0)
