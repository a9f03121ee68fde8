"""`ridgefill tune` and the calibration that scales: one Gram decomposition per split, the multi-split
statistics, the choice rule and the memory refusal."""

import pytest
import torch

from ridgefill import InputError, RidgeStats, fit_maps, solve_ridge
from ridgefill.ridge import default_prior, heldout_errors, lambda_grid

F64 = torch.float64


def context_stats(n=300, d=8, layers=4, seed=0, parts=3):
    """Fit and held-out context statistics (``features = 2d``) of correlated random rows."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=F64) + 3.0
    f = torch.cat([h, torch.roll(h, 1, 0) * 0.5], 1)
    w = torch.randn(layers, 2 * d, d, generator=g, dtype=F64) * 0.3
    xs = torch.einsum("nf,lfe->lne", f, w) + torch.randn(layers, n, d, generator=g, dtype=F64) * 0.4 + 1.0
    fit, held = RidgeStats(layers, d, context=1), RidgeStats(layers, d, context=1)
    for i, idx in enumerate(torch.arange(n).chunk(parts * 4)):
        (held if i % 4 == 3 else fit).update(f[idx], xs[:, idx])
    return fit, held


def todays_fit(stats, held, lam, penalty=1.0):
    """The solve before the shared decomposition: one eigh per layer for λ, a Cholesky per layer."""
    raw, raw_held = stats, held
    if penalty != 1:
        scale = penalty ** -0.5
        stats, held = stats.with_context_scale(scale), held.with_context_scale(scale)
    n = stats.layers
    if lam == "auto":
        lams = []
        for layer in range(n):
            gram, _, _ = stats.centred(layer)
            grid = lambda_grid(gram)
            lams.append(float(grid[int(torch.argmin(heldout_errors(stats, held, layer, grid)))]))
        final = raw.merged(raw_held)
    else:
        lams, final = [float(lam)] * n, raw
    if penalty != 1:
        final = final.with_context_scale(penalty ** -0.5)
    mh, mx = final.means()
    ws = []
    torch.set_num_threads(1)
    try:
        for layer in range(n):
            gram, cross, _ = final.centred(layer)
            ws.append(solve_ridge(gram, cross, lams[layer], default_prior(final)))
    finally:
        torch.set_num_threads(n_threads)
    return lams, torch.stack(ws)


n_threads = torch.get_num_threads()


@pytest.mark.parametrize("lam,penalty", [("auto", 1.0), ("auto", 4.0), (0.5, 1.0)])
def test_shared_decomposition_gives_todays_maps(lam, penalty):
    fit, held = context_stats(seed=1)
    lams, weights = todays_fit(fit, held, lam, penalty)
    got = fit_maps(fit, lam, held, context_penalty=penalty)
    assert got.lambdas == lams
    w = got.weights
    if penalty != 1:
        w = w.clone()
        w[:, fit.hidden:] /= penalty ** -0.5
    torch.testing.assert_close(w, weights, rtol=1e-12, atol=1e-12)


def test_one_eigendecomposition_per_split(monkeypatch):
    fit, held = context_stats(seed=2, layers=5)
    calls = []
    real = torch.linalg.eigh

    def counted(a, *args, **kw):
        calls.append(tuple(a.shape))
        return real(a, *args, **kw)

    monkeypatch.setattr(torch.linalg, "eigh", counted)
    res = fit_maps(fit, "auto", held)
    assert calls == [(16, 16)]  # λ for all 5 layers and the held-out report share one eigh
    assert len(res.heldout_rel_error) == 5
    calls.clear()
    fit_maps(fit, 0.3, held)  # a fixed λ: the report alone, still one
    assert calls == [(16, 16)]


def test_heldout_errors_refuses_a_foreign_decomposition():
    from ridgefill.ridge import HeldoutDecomposition

    fit, held = context_stats(seed=3)
    other, _ = context_stats(seed=4)
    dec = HeldoutDecomposition(fit, held)
    lams = torch.tensor([0.1, 1.0], dtype=F64)
    torch.testing.assert_close(heldout_errors(fit, held, 2, lams, decomposition=dec),
                               heldout_errors(fit, held, 2, lams), rtol=0, atol=0)
    with pytest.raises(InputError, match="other statistics"):
        heldout_errors(other, held, 0, lams, decomposition=dec)
