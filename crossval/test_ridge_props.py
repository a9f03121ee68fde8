"""Property tests of ``KvaLean.Ridge`` and ``KvaLean.Identity`` on the real fit.

Every example fits through the project's entry points (:class:`ridgefill.RidgeStats` streamed in
chunks, :func:`ridgefill.fit_maps`, which calls :func:`ridgefill.solve_ridge`) and evaluates the
objective ``J(W, b) = ‖H W + 1 bᵀ − X‖² + λ‖W − I‖²`` directly on the rows ``H`` ``[n, d]``, ``X``
``[n, d]``, never through the statistics the fit used.

Tolerances. ``J`` is a sum of squares; float64 rounding moves it by a small multiple of ``eps`` times
:func:`crossval.problems.magnitude` (the size of the numbers summed), whatever the conditioning: the
gap identity and optimality are checked to ``64 eps`` times that. Statements about ``W`` itself (its
distance to the exact minimiser, to ``I``) are checked to ``eps`` times the condition number
``κ(G + λI)``, the forward-error bound of a backward-stable solve.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from ridgefill import solve_ridge
from ridgefill.certify import exact_solve
from ridgefill.errors import InputError

from crossval import tally
from crossval.problems import (
    EPS,
    F64,
    condition,
    fit,
    lambdas,
    magnitude,
    objective,
    reg_spectrum,
    ridge_problems,
    stats_of,
)

GAP_C = 64.0     # J rounding: multiples of eps · magnitude
FORWARD_C = 16.0  # W forward error: multiples of d · eps · κ


def perturbation(draw, d: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P [d, d], p [d])`` of Frobenius size about ``scale``, from a drawn seed."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 32 - 1)))
    return torch.randn(d, d, generator=g, dtype=F64) * scale, torch.randn(d, generator=g, dtype=F64) * scale


@given(ridge_problems(), st.data())
def test_gap_identity(p, data):
    """``J(W, b) = J(W★, b★) + ‖H(W − W★) + 1(b − b★)ᵀ‖² + λ‖W − W★‖²`` for the fitted ``(W★, b★)`` and
    any ``(W, b)`` (Lean: the ridge gap identity; the intercept is the unpenalised column of ``H``)."""
    fitted, _ = fit(p)
    for layer in range(p.xs.shape[0]):
        x, ws, bs = p.xs[layer], fitted.weights[layer], fitted.biases[layer]
        size = 10.0 ** data.draw(st.floats(-8, 2), label="log10 perturbation") * (1 + float(ws.norm()))
        dw, db = perturbation(data.draw, p.d, size)
        w, b = ws + dw, bs + db * (1 + float(p.h.abs().max()))
        gap = float((p.h @ dw + (b - bs)).square().sum() + p.lam * dw.square().sum())
        lhs, star = objective(p.h, x, w, b, p.lam), objective(p.h, x, ws, bs, p.lam)
        tol = GAP_C * EPS * (magnitude(p.h, x, w, b, p.lam) + magnitude(p.h, x, ws, bs, p.lam))
        assert abs(lhs - (star + gap)) <= tol, (lhs, star, gap, tol)
        tally.example()


@given(ridge_problems(max_dim=5))
def test_solve_matches_exact_minimiser(p):
    """The fitted ``W`` is the solution of the normal equations ``(G + λI) W = B + λI`` of its own
    statistics, computed exactly in rationals, to ``d · eps · κ(G + λI)`` (relative, Frobenius)."""
    fitted, stats = fit(p)
    for layer in range(p.xs.shape[0]):
        gram, cross, _ = stats.centred(layer)
        q = [[Fraction(v) for v in row] for row in gram.tolist()]
        exact = exact_solve(q, [[Fraction(v) for v in row] for row in cross.tolist()], Fraction(p.lam))
        exact = torch.tensor([[float(v) for v in row] for row in exact], dtype=F64)
        kappa = condition(gram, p.lam)
        err = float((fitted.weights[layer] - exact).norm())
        assert err <= FORWARD_C * p.d * EPS * kappa * float(exact.norm()) + 1e-300, (err, kappa)
        tally.example()


@given(ridge_problems(), st.data())
def test_no_perturbation_lowers_objective(p, data):
    """Optimality: ``J(W★ + P, b★ + q) ≥ J(W★, b★)`` for perturbations from 1e-8 to 1e2 of ``‖W★‖``."""
    fitted, _ = fit(p)
    for layer in range(p.xs.shape[0]):
        x, ws, bs = p.xs[layer], fitted.weights[layer], fitted.biases[layer]
        star = objective(p.h, x, ws, bs, p.lam)
        for _ in range(4):
            size = 10.0 ** data.draw(st.floats(-8, 2), label="log10 perturbation") * (1 + float(ws.norm()))
            dw, db = perturbation(data.draw, p.d, size)
            w, b = ws + dw, bs + db * (1 + float(p.h.abs().max()))
            tol = GAP_C * EPS * (magnitude(p.h, x, w, b, p.lam) + magnitude(p.h, x, ws, bs, p.lam))
            assert objective(p.h, x, w, b, p.lam) >= star - tol
            tally.example()


@given(ridge_problems(), st.data())
def test_minimiser_unique(p, data):
    """Uniqueness for ``λ > 0``: every other ``W`` is worse by at least ``λ‖W − W★‖²`` (strict), and the
    fit does not depend on the order or chunking of the rows it streamed."""
    fitted, stats = fit(p)
    order = torch.randperm(p.n, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31))))
    again, _ = fit(p, order=order, parts=data.draw(st.integers(1, 5), label="parts"))
    for layer in range(p.xs.shape[0]):
        x, ws, bs = p.xs[layer], fitted.weights[layer], fitted.biases[layer]
        gram, _, _ = stats.centred(layer)
        kappa = condition(gram, p.lam)
        drift = float((again.weights[layer] - ws).norm())
        assert drift <= 4 * FORWARD_C * p.d * EPS * kappa * (float(ws.norm()) + 1), (drift, kappa)
        size = 10.0 ** data.draw(st.floats(-4, 2), label="log10 perturbation") * (1 + float(ws.norm()))
        dw, _ = perturbation(data.draw, p.d, size)
        tol = GAP_C * EPS * (magnitude(p.h, x, ws + dw, bs, p.lam) + magnitude(p.h, x, ws, bs, p.lam))
        margin = p.lam * float(dw.square().sum())
        assume(margin > 2 * tol)  # a strict increase must be visible above rounding
        assert objective(p.h, x, ws + dw, bs, p.lam) - objective(p.h, x, ws, bs, p.lam) >= margin - tol
        tally.example()


@given(ridge_problems())
def test_identity_rate(p):
    """``λ‖W_λ − I‖ ≤ ‖H̃ᵀ(X̃ − H̃)‖`` (centred rows), so ``W_λ → I`` as ``λ → ∞``. The slack is the
    normal-equation residual of the computed ``W`` and the rounding of the statistics."""
    fitted, stats = fit(p)
    hc = p.h - p.h.mean(0)
    for layer in range(p.xs.shape[0]):
        xc = p.xs[layer] - p.xs[layer].mean(0)
        w = fitted.weights[layer]
        gram, _, _ = stats.centred(layer)
        lo, hi = reg_spectrum(gram, p.lam)
        eye = torch.eye(p.d, dtype=F64)
        lhs = p.lam * float((w - eye).norm())
        rhs = float((hc.T @ (xc - hc)).norm())
        rounding = (p.n + p.d) * float((hc.abs().T @ (xc.abs() + hc.abs())).norm()) \
            + hi * (float(w.norm()) + p.d) + max(0.0, p.lam - lo) * float((w - eye).norm())
        assert lhs <= rhs + GAP_C * EPS * rounding, (lhs, rhs, rounding)
        tally.example()


@given(ridge_problems(targets="inputs", lam=st.one_of(st.just(0.0), lambdas)))
def test_exact_targets_give_identity(p):
    """Targets equal to the inputs (``x_l = h_S``) give ``W = I`` and ``b = 0`` for every ``λ`` (for
    ``λ = 0`` when the Gram is non-singular), to ``eps · κ(G + λI)``."""
    if p.lam == 0:
        assume(condition(stats_of(p).centred(0)[0], 0.0) < 1e10)
    fitted, stats = fit(p)
    eye = torch.eye(p.d, dtype=F64)
    for layer in range(p.xs.shape[0]):
        gram, _, _ = stats.centred(layer)
        kappa = condition(gram, p.lam)
        err_w = float((fitted.weights[layer] - eye).norm())
        assert err_w <= FORWARD_C * (p.n + p.d) * EPS * kappa * p.d, (err_w, kappa)
        mean = float(p.h.mean(0).norm())
        err_b = float(fitted.biases[layer].norm())
        assert err_b <= mean * (err_w + FORWARD_C * p.d * EPS) + 1e-300, (err_b, mean, err_w)
        tally.example()


_RAT = st.fractions(min_value=-9, max_value=9, max_denominator=8)
_POS_LAM = st.fractions(min_value=Fraction(1, 1000), max_value=1000, max_denominator=1000)


@given(st.integers(2, 5), st.data())
def test_positive_lambda_solves_singular_gram(d, data):
    """Existence (Lean ``exists_solve_addDiag``, ``exists_normalEq``): for ``λ > 0`` the normal equations
    ``(G + λI) W = B + λI`` have a solution even when the Gram matrix ``G = XᵀX`` is singular (here
    ``X`` has fewer rows than columns, so ``rank G < d``). Exact: Gauss–Jordan on fractions
    (:func:`ridgefill.certify.exact_solve`, the elimination the Lean proof performs) refuses ``λ = 0``
    but never meets a zero pivot for ``λ > 0``, and its ``W`` solves the equations exactly. Float:
    :func:`ridgefill.solve_ridge` factorises ``G + λI`` and lands on that ``W`` to ``d · eps · κ``."""
    m = data.draw(st.integers(1, d - 1), label="rows")
    x = data.draw(st.lists(st.lists(_RAT, min_size=d, max_size=d), min_size=m, max_size=m), label="X")
    y = data.draw(st.lists(st.lists(_RAT, min_size=d, max_size=d), min_size=m, max_size=m), label="Y")
    lam = data.draw(_POS_LAM, label="λ")
    gram = [[sum((x[k][i] * x[k][j] for k in range(m)), Fraction(0)) for j in range(d)] for i in range(d)]
    cross = [[sum((x[k][i] * y[k][j] for k in range(m)), Fraction(0)) for j in range(d)] for i in range(d)]
    with pytest.raises(InputError, match="singular"):
        exact_solve(gram, cross, Fraction(0))  # G itself is singular: λ = 0 has no unique solution
    w = exact_solve(gram, cross, lam)
    for i in range(d):
        for c in range(d):
            lhs = sum((gram[i][j] * w[j][c] for j in range(d)), Fraction(0)) + lam * w[i][c]
            assert lhs == cross[i][c] + lam * (1 if i == c else 0)
    g64 = torch.tensor([[float(v) for v in r] for r in gram], dtype=F64)
    b64 = torch.tensor([[float(v) for v in r] for r in cross], dtype=F64)
    exact = torch.tensor([[float(v) for v in r] for r in w], dtype=F64)
    got = solve_ridge(g64, b64, float(lam))
    kappa = condition(g64, float(lam))
    err = float((got - exact).norm())
    assert err <= FORWARD_C * d * EPS * kappa * (float(exact.norm()) + 1), (err, kappa)
    tally.example()


@given(ridge_problems(max_rows=24, max_dim=4), st.floats(-2, 4), st.data())
def test_context_penalty_gap_identity(p, log_alpha, data):
    """Context maps with ``context_penalty = α`` (``ridgefill.ridge.fit_maps``): the fitted ``(W★, b★)`` on
    the features ``F = [h(t), h(t−1)]`` satisfy the gap identity of ``J_α(W, b) = ‖F W + 1 bᵀ − X‖² +
    λ‖W_h − I‖² + αλ‖W_p‖²``, ``J_α(W, b) = J_α(W★, b★) + ‖F ΔW + 1 Δbᵀ‖² + λ‖ΔW_h‖² + αλ‖ΔW_p‖²`` (so
    they minimise it): the ridge of ``KvaLean.fit_maps_optimal`` on the scaled features ``[h(t),
    h(t−1)/√α]``, mapped back to the raw features."""
    from ridgefill import RidgeStats, fit_maps

    alpha, d = 10.0 ** log_alpha, p.d
    f = torch.cat([p.h, torch.cat([torch.zeros(1, d, dtype=F64), p.h[:-1]])], 1)
    stats = RidgeStats(p.xs.shape[0], d, context=1)
    for rows in torch.arange(p.n).chunk(p.parts):
        stats.update(f[rows], p.xs[:, rows])
    fitted = fit_maps(stats, p.lam, context_penalty=alpha)
    prior = torch.cat([torch.eye(d, dtype=F64), torch.zeros(d, d, dtype=F64)])
    pen = torch.cat([torch.ones(d, dtype=F64), torch.full((d,), alpha, dtype=F64)])[:, None]

    def j(w, b, x):
        return float((f @ w + b - x).square().sum() + p.lam * (pen * (w - prior).square()).sum())

    def size(w, b, x):
        return float((f.abs() @ w.abs() + b.abs() + x.abs()).square().sum()
                     + p.lam * (pen * (w.abs() + prior).square()).sum())

    for layer in range(p.xs.shape[0]):
        x, ws, bs = p.xs[layer], fitted.weights[layer], fitted.biases[layer]
        scale = 10.0 ** data.draw(st.floats(-8, 2), label="log10 perturbation") * (1 + float(ws.norm()))
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 32 - 1)))
        dw = torch.randn(2 * d, d, generator=g, dtype=F64) * scale
        db = torch.randn(d, generator=g, dtype=F64) * scale * (1 + float(p.h.abs().max()))
        w, b = ws + dw, bs + db
        gap = float((f @ dw + db).square().sum() + p.lam * (pen * dw.square()).sum())
        tol = GAP_C * EPS * (size(w, b, x) + size(ws, bs, x))
        assert abs(j(w, b, x) - (j(ws, bs, x) + gap)) <= tol, (j(w, b, x), j(ws, bs, x), gap, tol)
        tally.example()
