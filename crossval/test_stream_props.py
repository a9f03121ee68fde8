"""Property tests of the streaming-statistics algebra (``KvaLean.Ridge``, section ``Streaming``):
:class:`ridgefill.RidgeStats` keeps sums about a shift, merges chunks whose shifts differ
(:meth:`~ridgefill.RidgeStats.merged`) and turns the sums into second moments about any point
(:meth:`~ridgefill.RidgeStats.moments`). ``sum_sub_mul_sub`` and ``sum_append`` say the result is the
moment computed directly on the rows; here it is compared with that direct sum on the raw rows, to
float64 rounding (``eps`` times the number of rows times the size of the products summed).
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from ridgefill import RidgeStats

from crossval import tally
from crossval.problems import EPS, F64, ridge_problems

ROUND_C = 64.0


@given(ridge_problems(), st.data())
def test_merged_moments_equal_direct_moments(p, data):
    """Two chunks (each with its own shift) merged, then moments about a drawn point ``(m_h, m_x)``:
    equal to ``Σ (h − m_h)(h − m_h)ᵀ``, ``Σ (h − m_h)(x_l − m_x)ᵀ``, ``Σ ‖x_l − m_x‖²`` on the rows; and
    about the means (``centred``), equal to the centred Gram and cross terms of the rows."""
    cut = data.draw(st.integers(0, p.n), label="rows in the first chunk")
    offset = data.draw(st.floats(-100, 100), label="offset of the second chunk")
    h, xs = p.h.clone(), p.xs.clone()
    h[cut:] += offset  # a second chunk far from the first: its shift differs
    xs[:, cut:] -= offset
    first, second = RidgeStats(xs.shape[0], p.d), RidgeStats(xs.shape[0], p.d)
    if cut:
        first.update(h[:cut], xs[:, :cut])
    if cut < p.n:
        second.update(h[cut:], xs[:, cut:])
    merged = first.merged(second)
    assert merged.count == p.n
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    for layer in range(xs.shape[0]):
        mh = h.mean(0) + torch.randn(p.d, generator=g, dtype=F64)
        mx = xs[layer].mean(0) + torch.randn(p.d, generator=g, dtype=F64)
        shh, shx, sxx = merged.moments(layer, mh, mx)
        dh, dx = h - mh, xs[layer] - mx
        size = (1 + float(h.abs().max()) + float(mh.abs().max())) * \
            (1 + float(xs[layer].abs().max()) + float(mx.abs().max()) + float(h.abs().max()))
        tol = ROUND_C * (p.n + p.d) * EPS * size
        assert float((shh - dh.T @ dh).abs().max()) <= tol
        assert float((shx - dh.T @ dx).abs().max()) <= tol
        assert abs(float(sxx) - float(dx.square().sum())) <= tol * p.d
        # about the means: the centred Gram and cross terms (Lean sum_centred_mul_eq_shifted)
        cg, cc, _ = merged.centred(layer)
        hc, xc = h - h.mean(0), xs[layer] - xs[layer].mean(0)
        assert float((cg - hc.T @ hc).abs().max()) <= tol
        assert float((cc - hc.T @ xc).abs().max()) <= tol
        tally.example()


@given(ridge_problems(), st.data())
def test_ridge_update_solves_the_merged_normal_equations(p, data):
    """``KvaLean.ridge_update``: with ``W`` the ridge solve on the first chunk's Gram ``G`` and cross term
    ``B`` (:func:`ridgefill.ridge.solve_ridge`), ``W + (G + ΔG + λI)⁻¹(ΔB − ΔG W)`` satisfies the normal
    equations of the merged statistics, ``(G + ΔG + λI) W' = B + ΔB + λ W₀``, and equals the solve on them."""
    from ridgefill.ridge import solve_ridge

    lam = max(p.lam, 1e-3)
    cut = data.draw(st.integers(0, p.n), label="rows in the first chunk")
    h, x = p.h, p.xs[0]
    g1, b1 = h[:cut].T @ h[:cut], h[:cut].T @ x[:cut]
    dg, db = h[cut:].T @ h[cut:], h[cut:].T @ x[cut:]
    eye = torch.eye(p.d, dtype=F64)
    w = solve_ridge(g1, b1, lam)
    a = g1 + dg + lam * eye
    update = w + torch.linalg.solve(a, db - dg @ w)
    rhs = b1 + db + lam * eye  # the prior is the identity
    scale = float(a.abs().max()) * (1 + float(update.abs().max())) + float(rhs.abs().max())
    assert float((a @ update - rhs).abs().max()) <= ROUND_C * (p.n + p.d) * EPS * scale
    direct = solve_ridge(g1 + dg, b1 + db, lam)
    cond = float(torch.linalg.cond(a))
    assert float((update - direct).abs().max()) <= ROUND_C * (p.n + p.d) * EPS * cond * (1 + float(direct.abs().max()))
    tally.example()
