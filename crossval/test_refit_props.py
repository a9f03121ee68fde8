"""Property tests of the maps refitted on a prompt's exact rows (:mod:`ridgefill.refit`,
``prefill(..., refit=α)``), against ``KvaLean.ridge_update``: the update of the calibration map computed
from the calibration Gram, the map and the new rows alone is the ridge fit on the calibration rows and
``α`` copies of each new row together, so by ``ridge_multi_optimal`` / ``fit_maps_optimal`` it minimises
that objective. Checked on the raw rows, to float64 rounding, over the same ill-conditioned problems as
``test_ridge_props.py`` (the maps are kept in float64 here; the shipped maps file rounds them to float32).
"""

from __future__ import annotations

import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from ridgefill import RidgeMaps, RidgeStats, fit_maps
from ridgefill.errors import SingularGramError
from ridgefill.maps import calibration_cov
from ridgefill.refit import PromptRefit

from crossval import tally
from crossval.problems import EPS, F64, magnitude, objective, ridge_problems

GAP_C = 64.0  # J rounding: multiples of eps · magnitude (as test_ridge_props.py)


@given(ridge_problems(), st.data())
def test_refit_minimises_the_objective_on_the_calibration_and_exact_rows(p, data):
    """The first ``cut`` rows are the calibration text, the rest a prompt's exact rows, counted ``α`` times:
    the refitted ``(W', b')`` scores the weighted objective no worse than ``fit_maps`` on all those rows
    (both are its minimiser, so each is within rounding of the other's value)."""
    assume(p.n >= 2)
    cut = data.draw(st.integers(1, p.n - 1), label="calibration rows")
    alpha = data.draw(st.integers(1, 4), label="α")
    layers = p.xs.shape[0]
    calib = RidgeStats(layers, p.d)
    calib.update(p.h[:cut], p.xs[:, :cut])
    copies = RidgeStats(layers, p.d)
    h_new, x_new = p.h[cut:], p.xs[:, cut:]
    copies.update(h_new.repeat(alpha, 1), x_new.repeat(1, alpha, 1))
    try:
        fitted = fit_maps(calib, p.lam)
        want = fit_maps(calib.merged(copies), p.lam)
        mean_h, mean_x = calib.means()
        maps = RidgeMaps(0, fitted.weights, fitted.biases, fitted.lambdas,
                         {"kind": "inputs", "calibration_tokens": cut, "lambda_spec": "auto"},
                         mean_h=mean_h, mean_x=mean_x, cov_h=calibration_cov(calib))
        refit = PromptRefit(maps, h_new, alpha)
        got = [refit.layer(layer, x_new[layer]) for layer in range(layers)]
    except SingularGramError:
        assume(False)  # λ too small for a singular Gram: the fit refuses it too
    rows_h = torch.cat([p.h[:cut], h_new.repeat(alpha, 1)])
    for layer in range(layers):
        rows_x = torch.cat([p.xs[layer, :cut], x_new[layer].repeat(alpha, 1)])
        w, b = got[layer]
        ws, bs = want.weights[layer], want.biases[layer]
        tol = GAP_C * EPS * (magnitude(rows_h, rows_x, w, b, p.lam) + magnitude(rows_h, rows_x, ws, bs, p.lam))
        j, j_star = objective(rows_h, rows_x, w, b, p.lam), objective(rows_h, rows_x, ws, bs, p.lam)
        assert j <= j_star + tol, (j, j_star, tol)
        assert j_star <= j + tol, (j, j_star, tol)
        tally.example()
