"""Ridge problems drawn by Hypothesis, the objective evaluated on the raw rows, and the fit through the
project's own entry points (:class:`ridgefill.RidgeStats` streaming, :func:`ridgefill.fit_maps`).

A problem is split states ``H`` ``[n, d]``, late-layer inputs ``X`` ``[layers, n, d]`` and ``λ``. ``H`` is
drawn ill-conditioned on purpose: its centred singular values spread over up to 8 decades (so the
centred Gram's condition number reaches 1e16), with a large constant component (up to 1e3, as in a
residual stream), degenerate rows or columns (fewer rows than dimensions, repeated rows, a constant
column), and ``λ`` log-uniform in ``[1e-8, 1e8]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from ridgefill import RidgeStats, fit_maps
from torch import Tensor

F64 = torch.float64
EPS = float(torch.finfo(F64).eps)

lambdas = st.floats(-8, 8).map(lambda e: float(10.0 ** e))
"""``λ`` log-uniform over ``[1e-8, 1e8]``."""


@dataclass
class RidgeProblem:
    """``h`` ``[n, d]``, ``xs`` ``[layers, n, d]`` (float64), ``lam`` and the number of streamed
    chunks ``parts`` the statistics are accumulated in."""

    h: Tensor
    xs: Tensor
    lam: float
    parts: int
    log_cond: float

    @property
    def n(self) -> int:
        return self.h.shape[0]

    @property
    def d(self) -> int:
        return self.h.shape[1]

    def __repr__(self) -> str:  # shown by Hypothesis on failure
        return (f"RidgeProblem(n={self.n}, d={self.d}, layers={self.xs.shape[0]}, lam={self.lam:.3g}, "
                f"parts={self.parts}, log_cond={self.log_cond:.2f}, h={self.h.tolist()}, xs={self.xs.tolist()})")


@st.composite
def ridge_problems(draw, max_rows: int = 32, max_dim: int = 6, lam=lambdas, targets: str = "linear") -> RidgeProblem:
    """A :class:`RidgeProblem`; ``targets="linear"`` draws ``x_l = h A_l + c_l + noise``, ``"inputs"``
    sets ``x_l = h`` (the targets equal the inputs)."""
    n = draw(st.integers(1, max_rows))
    d = draw(st.integers(1, max_dim))
    layers = draw(st.integers(1, 2))
    unit = st.floats(-1, 1, allow_nan=False, allow_infinity=False)
    base = torch.from_numpy(draw(arrays(np.float64, (n, d), elements=unit)))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    g = torch.Generator().manual_seed(seed)
    log_cond = draw(st.floats(0, 8))
    spread = 10.0 ** (-log_cond * torch.arange(d, dtype=F64) / max(d - 1, 1))
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))
    scale = 10.0 ** draw(st.floats(-3, 3))
    offset = 10.0 ** draw(st.floats(-2, 3)) * torch.randn(d, generator=g, dtype=F64)
    h = (base * spread) @ q * scale + offset
    degenerate = draw(st.sampled_from(["none", "none", "repeated_rows", "constant_column"]))
    if degenerate == "repeated_rows" and n > 1:
        h[n // 2:] = h[: n - n // 2].clone()
    elif degenerate == "constant_column":
        h[:, draw(st.integers(0, d - 1))] = offset[0]
    if targets == "inputs":
        xs = h[None].repeat(layers, 1, 1)
    else:
        a = torch.eye(d, dtype=F64) + draw(st.floats(0, 2)) * torch.randn(layers, d, d, generator=g, dtype=F64)
        noise = draw(st.sampled_from([0.0, 1e-6, 0.1, 1.0])) * scale
        xs = (torch.einsum("nd,lde->lne", h, a) + noise * torch.randn(layers, n, d, generator=g, dtype=F64)
              + 10.0 ** draw(st.floats(-2, 3)) * torch.randn(layers, 1, d, generator=g, dtype=F64))
    return RidgeProblem(h, xs, draw(lam), draw(st.integers(1, 4)), log_cond)


def stats_of(p: RidgeProblem, order: Tensor | None = None, parts: int | None = None) -> RidgeStats:
    """Statistics of the problem's rows, streamed in ``parts`` chunks (rows in ``order``)."""
    stats = RidgeStats(p.xs.shape[0], p.d)
    idx = torch.arange(p.n) if order is None else order
    for chunk in idx.chunk(parts or p.parts):
        stats.update(p.h[chunk], p.xs[:, chunk])
    return stats


def fit(p: RidgeProblem, **kw):
    """``ridgefill.fit_maps`` on the problem's streamed statistics: ``(FittedMaps, RidgeStats)``."""
    stats = stats_of(p, **kw)
    return fit_maps(stats, p.lam), stats


def objective(h: Tensor, x: Tensor, w: Tensor, b: Tensor, lam: float) -> float:
    """``J(W, b) = ‖H W + 1 bᵀ − X‖²_F + λ ‖W − I‖²_F`` evaluated on the raw rows (``h``, ``x`` ``[n, d]``)."""
    eye = torch.eye(w.shape[0], dtype=F64)
    return float((h @ w + b - x).square().sum() + lam * (w - eye).square().sum())


def magnitude(h: Tensor, x: Tensor, w: Tensor, b: Tensor, lam: float) -> float:
    """The size of the numbers :func:`objective` adds up, ``‖|H||W| + |b| + |X|‖²_F + λ ‖|W| + I‖²_F``:
    float64 rounding moves ``J`` by at most a small multiple of ``eps`` times this."""
    eye = torch.eye(w.shape[0], dtype=F64)
    return float((h.abs() @ w.abs() + b.abs() + x.abs()).square().sum() + lam * (w.abs() + eye).square().sum())


def reg_spectrum(gram: Tensor, lam: float) -> tuple[float, float]:
    """Smallest and largest eigenvalue of ``G + λI`` (``gram`` ``[d, d]``)."""
    ev = torch.linalg.eigvalsh(gram + lam * torch.eye(gram.shape[0], dtype=F64))
    return float(ev[0]), float(ev[-1])


def condition(gram: Tensor, lam: float) -> float:
    """Condition number of ``G + λI`` (``inf`` when numerically singular)."""
    lo, hi = reg_spectrum(gram, lam)
    return hi / lo if lo > EPS * abs(hi) else float("inf")
