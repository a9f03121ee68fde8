"""Property tests of the large-``λ`` limit of the fitted predictor (``KvaLean.Identity``, section
``Limit``): with the unpenalised intercept, ``ridgefill.fit_maps`` tends to ``W = I``,
``b = x̄_l − h̄`` (the ``centred`` mode of :func:`ridgefill.fill.prefill`), not to the identity fill
``b = 0`` unless ``x̄_l = h̄``.

The bounds are the theorems' own: ``λ²‖W_λ − I‖²_F ≤ ‖H̃ᵀ(X̃ − H̃)‖²_F`` (centred rows,
``ridge_multi_identity_rate``) and ``‖b_λ − (x̄ − h̄)‖ ≤ ‖h̄‖ ‖W_λ − I‖_F`` (``intercept_err_le``),
checked on the rows, with the means from :meth:`ridgefill.RidgeStats.means`. Slack: float64 rounding,
``eps`` times the size of the numbers involved.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from ridgefill import fit_maps

from crossval import tally
from crossval.problems import EPS, F64, ridge_problems, stats_of

ROUND_C = 64.0  # multiples of eps · d · size


def _rate_rhs(p, layer: int) -> float:
    """``‖H̃ᵀ(X̃ − H̃)‖_F`` on the centred rows."""
    hc = p.h - p.h.mean(0)
    xc = p.xs[layer] - p.xs[layer].mean(0)
    return float((hc.T @ (xc - hc)).norm())


@given(ridge_problems(), st.floats(6, 12))
def test_huge_lambda_gives_centred_identity(p, log_scale):
    """``fit_maps`` with ``λ = 10^k (1 + R)``, ``k ∈ [6, 12]``: ``W ≈ I`` within ``R/λ`` and
    ``b ≈ x̄_l − h̄`` within ``‖h̄‖ R/λ`` (Lean: ``fit_maps_tendsto_centred``), plus rounding."""
    stats = stats_of(p)
    mean_h, mean_x = stats.means()
    eye = torch.eye(p.d, dtype=F64)
    rates = [_rate_rhs(p, layer) for layer in range(p.xs.shape[0])]
    lam = 10.0 ** log_scale * (1.0 + max(rates))
    fitted = fit_maps(stats, lam)
    for layer in range(p.xs.shape[0]):
        w, b = fitted.weights[layer], fitted.biases[layer]
        size = 1.0 + float(p.h.abs().max()) + float(p.xs[layer].abs().max())
        err_w = float((w - eye).norm())
        assert err_w <= rates[layer] / lam + ROUND_C * p.d * EPS * size, (err_w, rates[layer], lam)
        err_b = float((b - (mean_x[layer] - mean_h)).norm())
        bound_b = float(mean_h.norm()) * rates[layer] / lam
        assert err_b <= bound_b + ROUND_C * p.d * EPS * size * (1 + float(w.norm())), (err_b, bound_b)
        # the limit differs from the identity fill (b = 0) by exactly x̄_l − h̄
        gap = float((mean_x[layer] - mean_h).norm())
        # (triangle inequality; the three norms are each rounded, so allow a few ulps of their size)
        assert abs(float(b.norm()) - gap) <= err_b + 8 * EPS * (gap + float(b.norm())) + 1e-300
        tally.example()


@given(ridge_problems())
def test_intercept_error_bounded_by_map_error(p):
    """For every ``λ``: ``‖b_λ − (x̄_l − h̄)‖ ≤ ‖h̄‖ ‖W_λ − I‖_F`` (Lean: ``intercept_err_le``; equality
    of ``b − (x̄ − h̄)`` and ``−h̄(W − I)`` plus Cauchy–Schwarz), up to rounding."""
    stats = stats_of(p)
    mean_h, mean_x = stats.means()
    fitted = fit_maps(stats, p.lam)
    eye = torch.eye(p.d, dtype=F64)
    for layer in range(p.xs.shape[0]):
        w, b = fitted.weights[layer], fitted.biases[layer]
        size = 1.0 + float(p.h.abs().max()) + float(p.xs[layer].abs().max())
        err_b = float((b - (mean_x[layer] - mean_h)).norm())
        bound = float(mean_h.norm()) * float((w - eye).norm())
        assert err_b <= bound + ROUND_C * p.d * EPS * size * (1 + float(w.norm())), (err_b, bound)
        tally.example()
