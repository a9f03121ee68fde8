"""The closed-form ridge fit of the RidgeFill maps, on sufficient statistics (paper, "Approach").

For a split ``S`` and each late layer ``l > S`` the map predicts the layer's input ``x_l`` from the
split state ``h_S`` (both ``[tokens, hidden]``):

    W_l, b_l = argmin_{W, b} ‖H W + 1 bᵀ − X_l‖²_F + λ_l ‖W − I‖²_F

The intercept is unpenalised, so it is removed by centring: with centred Gram ``G = Σ (h−h̄)(h−h̄)ᵀ``
and cross term ``B_l = Σ (h−h̄)(x_l−x̄_l)ᵀ`` the optimum is the unique solution of the normal
equations ``(G + λI) W = B_l + λI`` (for ``λ > 0``), and ``b_l = x̄_l − h̄ W_l``. Context maps
(:attr:`RidgeStats.context` ``= 1``) fit the same problem on the feature rows ``[h_S(t), h_S(t−1)]``
``[tokens, 2·hidden]``, with the prior ``[I; 0]`` in place of ``I``. Everything here is
float64 and needs only the statistics, never the activations, so memory does not grow with the
amount of calibration text.

Lean: ``KvaLean.Ridge`` (``ridge_optimal``, ``ridge_unique``, ``normal_eq_of_isMin``, multi-output
form) states that this solve is the minimiser; ``KvaLean.Identity`` (``ridge_tendsto_identity``,
``ridge_identity_rate``, ``ridge_eq_prior_of_exact``) that large ``λ`` gives ``W → I``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .errors import InputError, NonFiniteError, SingularGramError
from .validate import check_finite, check_real, is_real

F64 = torch.float64


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the enclosed float64 solves on one CPU thread, then restore the caller's thread count.

    A multi-threaded BLAS sums in an order that depends on the thread count, so the same solve gives
    bits that differ by about ``κ · eps``; an entry of ``W_64`` near a float32 rounding midpoint then
    rounds the other way, and a map fitted with ``--threads 2`` would fail a certificate recomputed with
    one thread (:func:`ridgefill.certify.layer_certificate`). The final solves of :func:`fit_maps` and
    the certificates run under this, so a certificate recomputed from the saved statistics does not depend
    on the thread count that fitted the maps or on the one that checks them (the statistics themselves
    are summed with the caller's threads, and saved; the held-out choice of ``λ`` runs on the caller's
    threads, and ``λ`` is saved). A ``[2d, d]`` solve at ``d = 576`` takes well under a second on one
    thread; the per-prompt refit (:mod:`ridgefill.refit`), never certified, keeps the caller's threads.
    CUDA solves are not affected. The thread count is per process: do not fit from two Python threads
    at once."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


#: How :func:`solve_ridge` solved, in the order it tries: ``"cholesky"`` of ``A = G + λI``; for ``λ > 0``
#: when that is numerically singular, ``"equilibrated cholesky"`` of ``D A D`` with ``D = diag(A)^(-1/2)`` (a
#: dimension on another scale no longer hides the others' pivots); then ``"eigen"``, ``G = V diag(s) Vᵀ`` and
#: ``W = V diag(1 / (s⁺ + λ)) Vᵀ (B + λW₀)`` with ``s⁺`` the eigenvalues of the positive semi-definite ``G``
#: with their rounding below zero removed.
SOLVE_METHODS = ("cholesky", "equilibrated cholesky", "eigen")


def _cholesky(a: Tensor) -> tuple[Tensor, bool, float]:
    """``(factor, ok, pivot ratio)``: ok when ``a`` is positive definite to working precision (every
    Cholesky pivot above ``d·eps`` of the largest: condition number below ``1/(d·eps)``)."""
    factor, info = torch.linalg.cholesky_ex(a)
    if info.item() != 0:
        return factor, False, 0.0
    pivots = factor.diagonal().square()
    ratio = float(pivots.min() / pivots.max())
    return factor, bool(pivots.min() > a.shape[0] * torch.finfo(a.dtype).eps * pivots.max()), ratio


def solve_ridge(gram: Tensor, cross: Tensor, lam: float, prior: Tensor | None = None, *,
                return_method: bool = False) -> Tensor | tuple[Tensor, str]:
    """Solve the ridge normal equations ``(G + λI) W = B + λ W₀`` by Cholesky; for ``λ > 0`` a badly
    scaled system falls back to an equilibrated Cholesky, then an eigen solve (:data:`SOLVE_METHODS`).

    Args:
        gram: ``G`` ``[d, d]``, symmetric positive semi-definite (the centred Gram of ``h_S``).
        cross: ``B`` ``[d, k]`` (the centred cross term ``Σ (h−h̄)(x−x̄)ᵀ``).
        lam: ``λ ≥ 0``; ``λ = 0`` is ordinary least squares and needs a non-singular ``G``.
        prior: ``W₀`` ``[d, k]``; default the identity (``k = d``), i.e. the identity fill.

        return_method: also return which of :data:`SOLVE_METHODS` solved it.

    Returns:
        ``W`` ``[d, k]`` float64 (``(W, method)`` with ``return_method``), the unique minimiser of ``‖H W − X‖² + λ‖W − W₀‖²`` (Lean, in
        ``KvaLean/Ridge.lean``: ``KvaLean.ridge_optimal``, ``ridge_unique``; multi-output
        ``ridge_multi_optimal``, ``ridge_multi_unique``). On CPU the bits depend on the thread count
        (a multi-threaded BLAS); :func:`fit_maps` and the certificates call it under :func:`one_thread`.

    Raises:
        InputError: not tensors, shapes disagree, or ``λ`` is not a finite number ``≥ 0``.
        NonFiniteError: ``gram``, ``cross`` or ``prior`` holds NaN or Inf (the statistics are broken,
            not singular: check the activations and the dtype).
        SingularGramError: ``λ = 0`` and ``G`` is singular to working precision: use ``λ > 0``.
    """
    for name, t in (("gram", gram), ("cross", cross), ("prior", prior)):
        if not (isinstance(t, Tensor) or (t is None and name == "prior")):
            raise InputError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if gram.ndim != 2 or cross.ndim != 2 or gram.shape[0] != gram.shape[1] or cross.shape[0] != gram.shape[0]:
        raise InputError(f"gram must be [d, d] and cross [d, k]; got {tuple(gram.shape)} and "
                         f"{tuple(cross.shape)}")
    gram, cross = gram.to(F64), cross.to(F64)
    d = gram.shape[0]
    lam = check_real(lam, "ridge λ", lo=0.0)
    if prior is None:
        if cross.shape[1] != d:
            raise InputError(f"the identity prior needs a square cross term; got {tuple(cross.shape)}")
        prior = torch.eye(d, dtype=F64, device=gram.device)
    elif prior.shape != cross.shape:
        raise InputError(f"prior must have the shape of cross {tuple(cross.shape)}; got {tuple(prior.shape)}")
    prior = prior.to(F64)
    for name, t in (("the Gram matrix G", gram), ("the cross term B", cross), ("the prior W₀", prior)):
        check_finite(t, f"{name} given to solve_ridge", NonFiniteError)
    eye = torch.eye(d, dtype=F64, device=gram.device)
    a, rhs = gram + lam * eye, cross + lam * prior
    factor, ok, ratio = _cholesky(a)
    if ok:
        w, method = torch.cholesky_solve(rhs, factor), SOLVE_METHODS[0]
    elif lam == 0:
        raise SingularGramError(
            f"G + λI is not positive definite at λ = {lam} (numerically singular: Cholesky pivot ratio "
            f"{ratio:.2e}); the Gram matrix is singular or has too little calibration data for this hidden "
            "size: use λ > 0 (or λ = 'auto'), or calibrate on more tokens")
    else:  # λ > 0: A is positive definite; the scale of its dimensions is what defeats the plain Cholesky
        scale = a.diagonal().clamp_min(lam).rsqrt()  # diag(A) ≥ λ for a positive semi-definite G
        factor, ok, _ = _cholesky(a * scale[:, None] * scale[None, :])
        if ok:
            w, method = scale[:, None] * torch.cholesky_solve(scale[:, None] * rhs, factor), SOLVE_METHODS[1]
        else:
            s, v = torch.linalg.eigh(gram)
            w, method = v @ ((v.T @ rhs) / (s.clamp_min(0) + lam)[:, None]), SOLVE_METHODS[2]
    return (w, method) if return_method else w


@dataclass
class RidgeStats:
    """Float64 sufficient statistics of ``(h_S, x_l)`` pairs for one split, all late layers at once.

    The sums are taken about a fixed shift (the first batch's means), which keeps the centring
    ``G − n h̄ h̄ᵀ`` accurate when the residual stream has large constant components. Memory is
    ``O(layers · hidden²)``, independent of the number of tokens.

    Attributes:
        layers: number of late layers; hidden: ``d``, the width of ``h_S``.
        context: earlier rows in each feature row (:func:`ridgefill.fill.context_features`): ``0``, the
            maps read ``h_S(t)`` (``d`` features); ``1``, context maps, ``[h_S(t), h_S(t−1)]`` (``2d``).
        count: number of token rows seen.
        outputs: size ``k`` of each target row (``hidden`` for the layer inputs ``x_l``; ``2·kv_dim``
            for K/V maps, whose targets are a layer's pre-RoPE keys and values).
        targets: ``"inputs"`` (the late layers' inputs: ridge prior ``W₀ = I``) or ``"kv"`` (their
            pre-RoPE keys and values: prior ``W₀ = 0``); see :func:`default_prior`.
        shift_h: ``[f]`` (``f`` = :attr:`features`; ``h`` below is a feature row); shift_x: ``[layers, k]``.
        sum_h: ``Σ (h − shift_h)`` ``[f]``; gram: ``Σ (h−shift)(h−shift)ᵀ`` ``[f, f]``.
        sum_x: ``[layers, k]``; cross: ``Σ (h−shift_h)(x_l−shift_x)ᵀ`` ``[layers, f, k]``;
        sq_x: ``Σ ‖x_l − shift_x‖²`` ``[layers]``.
    """

    layers: int
    hidden: int
    count: int = 0
    shift_h: Tensor | None = None
    shift_x: Tensor | None = None
    outputs: int | None = None
    targets: str = "inputs"
    context: int = 0
    sum_h: Tensor = field(init=False)
    gram: Tensor = field(init=False)
    sum_x: Tensor = field(init=False)
    cross: Tensor = field(init=False)
    sq_x: Tensor = field(init=False)

    @property
    def features(self) -> int:
        """Width of a feature row: ``hidden · (1 + context)``."""
        return self.hidden * (1 + self.context)

    def __post_init__(self):
        if self.outputs is None:
            self.outputs = self.hidden
        if self.targets not in ("inputs", "kv") or (self.targets == "inputs" and self.outputs != self.hidden):
            raise InputError(f"RidgeStats targets must be 'inputs' (outputs = hidden = {self.hidden}) or 'kv'; got "
                             f"{self.targets!r} with {self.outputs} outputs")
        if self.context not in (0, 1):
            raise InputError(f"RidgeStats context must be 0 (the row's own h_S) or 1 (also the previous row's); "
                             f"got {self.context!r}")
        d, n, k = self.features, self.layers, self.outputs
        self.sum_h = torch.zeros(d, dtype=F64)
        self.gram = torch.zeros(d, d, dtype=F64)
        self.sum_x = torch.zeros(n, k, dtype=F64)
        self.cross = torch.zeros(n, d, k, dtype=F64)
        self.sq_x = torch.zeros(n, dtype=F64)

    def update(self, h: Tensor, xs: Tensor) -> None:
        """Add rows: ``h`` ``[rows, f]`` (feature rows: the split state, and with ``context`` the previous
        row's, :func:`ridgefill.fill.context_features`) and ``xs`` ``[layers, rows, k]`` (the targets:
        late-layer inputs, or K/V for K/V maps).

        Raises:
            NonFiniteError: a value is NaN or Inf.
            InputError: shapes do not match the statistics.
        """
        if h.ndim != 2 or h.shape[1] != self.features or xs.shape != (self.layers, h.shape[0], self.outputs):
            raise InputError(f"expected h [rows, {self.features}] and xs [{self.layers}, rows, {self.outputs}]; "
                             f"got {tuple(h.shape)} and {tuple(xs.shape)}")
        h, xs = h.to(F64), xs.to(F64)
        if not (torch.isfinite(h).all() and torch.isfinite(xs).all()):
            raise NonFiniteError("NaN or Inf in the calibration activations (h_S or a late-layer input); "
                                 "check the model weights and dtype (float16 overflows in some models: use "
                                 "float32 or bfloat16)")
        if self.shift_h is None:
            self.shift_h, self.shift_x = h.mean(0), xs.mean(1)
        h = h - self.shift_h
        xs = xs - self.shift_x[:, None, :]
        self.count += h.shape[0]
        self.sum_h += h.sum(0)
        self.gram += h.T @ h
        self.sum_x += xs.sum(1)
        self.cross += torch.einsum("rd,lre->lde", h, xs)
        self.sq_x += xs.square().sum((1, 2))

    def with_context_scale(self, scale: float) -> "RidgeStats":
        """These statistics for the feature rows ``[h_S(t), scale · h_S(t−1)]`` (context statistics only):
        the previous row's block of every sum scaled by ``scale`` (no pass over the text; bit-exact when
        ``scale`` is a power of two). A
        ridge on these features with one ``λ`` is the ridge on the raw features with the previous row's
        block penalised ``λ / scale²`` (:func:`fit_maps`, ``context_penalty``)."""
        if not self.context:
            raise InputError("with_context_scale needs context statistics (context = 1)")
        d, out = self.hidden, RidgeStats(self.layers, self.hidden, self.count, None, self.shift_x.clone(),
                                         self.outputs, self.targets, self.context)
        g = torch.ones(self.features, dtype=F64)
        g[d:] = scale
        out.shift_h = None if self.shift_h is None else self.shift_h * g
        out.sum_h, out.gram = self.sum_h * g, self.gram * g[:, None] * g[None, :]
        out.sum_x, out.cross, out.sq_x = self.sum_x.clone(), self.cross * g[None, :, None], self.sq_x.clone()
        return out

    def merged(self, other: "RidgeStats") -> "RidgeStats":
        """Statistics of both row sets (re-expressed about this object's shift)."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        if (other.outputs, other.targets, other.context) != (self.outputs, self.targets, self.context):
            raise InputError(f"cannot merge statistics of {other.targets!r} targets ({other.outputs} outputs, context "
                             f"{other.context}) into {self.targets!r} ones ({self.outputs}, context {self.context})")
        out = RidgeStats(self.layers, self.hidden, self.count + other.count, self.shift_h, self.shift_x, self.outputs,
                         self.targets, self.context)
        # shift other's sums from its shift to ours: v' = v + δ with δ = other.shift − self.shift
        dh = other.shift_h - self.shift_h
        dx = other.shift_x - self.shift_x
        n = other.count
        out.sum_h = self.sum_h + other.sum_h + n * dh
        out.gram = (self.gram + other.gram + torch.outer(other.sum_h, dh) + torch.outer(dh, other.sum_h)
                    + n * torch.outer(dh, dh))
        out.sum_x = self.sum_x + other.sum_x + n * dx
        out.cross = (self.cross + other.cross + other.sum_h[None, :, None] * dx[:, None, :]
                     + dh[None, :, None] * other.sum_x[:, None, :] + n * dh[None, :, None] * dx[:, None, :])
        out.sq_x = self.sq_x + other.sq_x + 2 * (other.sum_x * dx).sum(1) + n * dx.square().sum(1)
        return out

    def means(self) -> tuple[Tensor, Tensor]:
        """``(h̄ [f], x̄ [layers, k])`` in the original (unshifted) coordinates (``h̄[:d]`` is the mean of ``h_S``)."""
        return self.shift_h + self.sum_h / self.count, self.shift_x + self.sum_x / self.count

    def moments(self, layer: int, mean_h: Tensor, mean_x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Second moments about given points: ``Σ (h−m_h)(h−m_h)ᵀ``, ``Σ (h−m_h)(x_l−m_x)ᵀ`` and
        ``Σ ‖x_l − m_x‖²`` (``[f, f]``, ``[f, k]``, scalar)."""
        n = self.count
        ph, px = mean_h - self.shift_h, mean_x - self.shift_x[layer]
        # Σ (h' − p)(h' − p)ᵀ = G' − s pᵀ − p sᵀ + n p pᵀ, with s = Σ h' (h' shifted values)
        shh = self.gram - torch.outer(self.sum_h, ph) - torch.outer(ph, self.sum_h) + n * torch.outer(ph, ph)
        shx = (self.cross[layer] - torch.outer(self.sum_h, px) - torch.outer(ph, self.sum_x[layer])
               + n * torch.outer(ph, px))
        sxx = self.sq_x[layer] - 2 * (self.sum_x[layer] @ px) + n * (px @ px)
        return shh, shx, sxx

    def centred(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """Centred ``G``, ``B_l`` and ``Σ‖x_l − x̄_l‖²`` (the statistics the ridge solve uses)."""
        mh, mx = self.means()
        return self.moments(layer, mh, mx[layer])


#: The context penalties :func:`fit_maps` accepts: a wider range makes the scaled Gram singular or overflow.
CONTEXT_PENALTY_RANGE = (1e-6, 1e6)


def check_context_penalty(penalty, context: int) -> float:
    """``penalty`` as a float, checked: a finite number in :data:`CONTEXT_PENALTY_RANGE`, and ``1`` for
    maps without context.

    Raises:
        InputError: naming the value and what to give instead.
    """
    lo, hi = CONTEXT_PENALTY_RANGE
    if not is_real(penalty) or not lo <= float(penalty) <= hi:
        raise InputError(f"context penalty {penalty!r}: give a number from {lo:g} to {hi:g} (a multiple of λ on "
                         "the previous row's block of context maps; 1 penalises both blocks alike)")
    if float(penalty) != 1 and not context:
        raise InputError(f"context penalty {penalty!r}: it weighs the previous row's block of context maps; maps "
                         "without context (--context 0) take none: leave it out")
    return float(penalty)


def lambda_grid(gram: Tensor, points: int = 25) -> Tensor:
    """Candidate ``λ`` values for ``auto``: ``tr(G)/d · 10^k`` for ``k`` from −7 to +3."""
    scale = (torch.trace(gram) / gram.shape[0]).clamp_min(1e-30)
    return scale * torch.logspace(-7, 3, points, dtype=F64)


def default_prior(stats: RidgeStats) -> Tensor | None:
    """The ridge prior ``W₀`` of these statistics: the identity for layer-input targets (``[I; 0]``
    ``[f, d]`` with context: the row's own ``h_S`` carried through, the previous row's not read), ``None``
    (zero) for K/V targets (:attr:`RidgeStats.targets`)."""
    if stats.targets != "inputs":
        return None
    d = stats.hidden
    return torch.cat([torch.eye(d, dtype=F64), torch.zeros(stats.features - d, d, dtype=F64)])


class HeldoutDecomposition:
    """One eigendecomposition of the fit statistics' centred feature Gram, shared by every late layer.

    The Gram ``G = Σ (h−h̄)(h−h̄)ᵀ`` ``[f, f]`` and the held-out feature moments about the fit means are the
    same for every late layer of a split (only the cross terms differ), so one ``eigh`` of ``G`` serves the
    choice of ``λ`` and the held-out report of every layer (:func:`heldout_errors`, :func:`fit_maps`):
    ``O(f³)`` once per split, then ``O(f²·k)`` per layer and ``O(f)`` per ``λ``.

    Attributes:
        evals: ``[f]`` float64 eigenvalues of ``G`` (clamped at 0); q: ``[f, f]`` eigenvectors.
        m: ``[f, f]`` ``Qᵀ S_hh Q``, the held-out feature moments in the eigenbasis.
    """

    def __init__(self, fit: RidgeStats, heldout: RidgeStats):
        self.fit, self.heldout = fit, heldout
        self.mh, mx = fit.means()
        self.mx = mx
        zero = torch.zeros(fit.outputs, dtype=F64)
        self.gram = fit.moments(0, self.mh, zero)[0]  # the feature block does not depend on the layer
        evals, self.q = torch.linalg.eigh(self.gram)
        self.evals = evals.clamp_min(0)
        self.shh = heldout.moments(0, self.mh, zero)[0]
        self.m = self.q.T @ self.shh @ self.q

    def errors(self, layer: int, lams: Tensor, prior: Tensor | None | str = "default") -> Tensor:
        """Held-out squared error of layer ``layer`` for every ``λ`` in ``lams`` ``[k]`` (see
        :func:`heldout_errors`). Returns ``[k]`` float64."""
        fit, heldout, q, gram, shh = self.fit, self.heldout, self.q, self.gram, self.shh
        if isinstance(prior, str):
            prior = default_prior(fit)
        mh, mx = self.mh, self.mx[layer]
        _, cross, _ = fit.moments(layer, mh, mx)
        _, shx, sxx = heldout.moments(layer, mh, mx)  # held-out moments about the fit means
        if prior is None:
            c = q.T @ cross                           # W = Q diag(1/(e+λ)) C
            srr, p = sxx, q.T @ shx
        else:
            c = q.T @ (cross - gram @ prior)          # W = W₀ + Q diag(1/(e+λ)) C
            # held-out residual target r = (x − m_x) − (h − m_h) W₀; features z = (h − m_h) Q
            srr = sxx - 2 * torch.trace(prior.T @ shx) + torch.trace(prior.T @ shh @ prior)
            p = q.T @ (shx - shh @ prior)             # Σ zᵀ r
        a = (c * p).sum(1)                            # tr(Cᵀ D P) = Σ_i D_i a_i
        k = self.m * (c @ c.T)                        # tr(Cᵀ D M D C) = Dᵀ K D
        d = 1.0 / (self.evals[None, :] + lams[:, None])    # [k, d]
        return srr - 2 * d @ a + ((d @ k) * d).sum(1)


def heldout_errors(fit: RidgeStats, heldout: RidgeStats, layer: int, lams: Tensor,
                   prior: Tensor | None | str = "default",
                   decomposition: HeldoutDecomposition | None = None) -> Tensor:
    """Held-out squared error ``Σ ‖x_l − (h W_λ + b_λ)‖²`` of the ridge with prior ``W₀`` (default
    :func:`default_prior`: the identity for layer inputs, zero for K/V targets) fitted on ``fit``, for
    every ``λ`` in ``lams`` ``[k]``. Cost: one eigendecomposition (none when ``decomposition``, a
    :class:`HeldoutDecomposition` of ``fit`` and ``heldout``, is given) and a few ``f²·k`` products per
    layer, then ``O(f²)`` per ``λ``. Returns ``[k]`` float64."""
    if decomposition is None:
        decomposition = HeldoutDecomposition(fit, heldout)
    elif decomposition.fit is not fit or decomposition.heldout is not heldout:
        raise InputError("heldout_errors: the decomposition was made from other statistics")
    return decomposition.errors(layer, lams, prior)


def context_block_scaled(weights: Tensor, hidden: int, scale: float) -> Tensor:
    """A new tensor: ``weights`` ``[..., 2d, k]`` with the previous row's block (rows ``d:``, ``d = hidden``)
    times ``scale``. A map ``W'`` on the features ``[h(t), c · h(t−1)]`` reads the same as
    ``context_block_scaled(W', d, c)`` on ``[h(t), h(t−1)]``: the one mapping between the penalised fit's
    scaled features (:meth:`RidgeStats.with_context_scale`) and the raw ones, used one way by
    :func:`fit_maps` and the other by :func:`ridgefill.certify.as_solved`."""
    out = weights.clone()
    out[..., hidden:, :] *= scale
    return out


@dataclass
class FittedMaps:
    """Result of :func:`fit_maps`: ``weights`` ``[layers, d, k]`` and ``biases`` ``[layers, k]`` (float64;
    ``k = d`` for layer-input maps, ``2·kv_dim`` for K/V maps),
    ``lambdas`` (one per late layer), diagnostics (held-out relative errors, or ``None``) and ``stats``,
    the statistics the final maps were solved on (for certificates, :mod:`ridgefill.certify`; on the raw
    features ``[h_S(t), h_S(t−1)]`` even when ``context_penalty ≠ 1``: the solve read them scaled by
    :meth:`RidgeStats.with_context_scale` ``(context_penalty ** -0.5)``) and ``context_penalty``."""

    weights: Tensor
    biases: Tensor
    lambdas: list[float]
    heldout_rel_error: list[float] | None
    heldout_rel_error_identity: list[float] | None
    stats: RidgeStats | None = None
    context_penalty: float = 1.0
    #: how each layer was solved (:data:`SOLVE_METHODS`)
    solve_methods: list[str] | None = None


def fit_maps(stats: RidgeStats, lam: float | str | list[float] = "auto",
             heldout: RidgeStats | None = None, context_penalty: float = 1.0, progress: bool = False) -> FittedMaps:
    """Fit every late layer's map from calibration statistics.

    Args:
        stats: statistics of the fitting rows.
        lam: a number ``≥ 0`` for every layer, a list (one per late layer), or ``"auto"``: per layer the
            ``λ`` of :func:`lambda_grid` with the lowest held-out error (:func:`heldout_errors`); the final
            map is then refitted on ``stats`` and ``heldout`` together with that ``λ``.
        heldout: statistics of held-out rows; required for ``"auto"``, used for diagnostics otherwise.
        progress: show a progress bar per late layer for the choice of ``λ``, the solve and the held-out report
            (on stderr).
        context_penalty: context maps only: the previous row's block of ``W_l`` is penalised
            ``context_penalty · λ`` (the row's own block ``λ``), i.e. the objective is
            ``‖F W − X‖² + λ‖W_h − I‖² + α λ‖W_p‖²`` with ``α = context_penalty``. It is solved as the
            one-``λ`` ridge on the features ``[h_S(t), h_S(t−1)/√α]`` (:meth:`RidgeStats.with_context_scale`,
            the same Lean theorems), whose previous-row block of ``W`` is then divided by ``√α`` back to
            the raw features; ``"auto"`` chooses ``λ`` on those scaled features. ``1`` is the plain ridge
            on ``[h_S(t), h_S(t−1)]``; larger values lean the maps toward reading ``h_S(t)`` alone
            (research/log.md, "Context maps").

    Returns:
        :class:`FittedMaps`; ``W_l`` solves ``(G + λI) W = B_l + λW₀`` on centred statistics and
        ``b_l = x̄_l − h̄ W_l``, with the prior ``W₀ = I`` for layer-input targets and ``W₀ = 0`` for K/V
        targets (:func:`default_prior`) (Lean: ``KvaLean.ridge_multi_optimal`` for ``W_l``,
        ``KvaLean.fit_maps_optimal`` for the intercept by centring; for input maps, as ``λ → ∞``,
        ``(W_l, b_l)`` tends to ``(I, x̄_l − h̄)``, the centred identity fill, ``KvaLean.fit_maps_tendsto_centred``).

    Raises:
        InputError: no statistics, a bad ``λ`` spec (``bool``, a string other than ``"auto"``, NaN,
            Inf, a negative number or a list of the wrong length), ``"auto"`` without held-out
            statistics, or a ``context_penalty`` outside :data:`CONTEXT_PENALTY_RANGE` (or not ``1`` for
            statistics without context).
        NonFiniteError, SingularGramError: see :func:`solve_ridge`.
    """
    if not isinstance(stats, RidgeStats) or (heldout is not None and not isinstance(heldout, RidgeStats)):
        raise InputError("stats (and heldout, when given) must be RidgeStats; got "
                         f"{type(stats).__name__} and {type(heldout).__name__}")
    if stats.count == 0:
        raise InputError("no calibration rows: the calibration text produced no tokens")
    if heldout is not None and (heldout.layers, heldout.features) != (stats.layers, stats.features):
        raise InputError(f"heldout statistics are for {heldout.layers} layers of {heldout.features} features, "
                         f"stats for {stats.layers} of {stats.features}: they must come from one split and context")
    for which, st in (("stats", stats), ("heldout", heldout)):
        for k in ("sum_h", "gram", "sum_x", "cross", "sq_x") if st is not None else ():
            check_finite(getattr(st, k), f"calibration statistics {which}.{k}", NonFiniteError)
    penalty = check_context_penalty(context_penalty, stats.context)
    raw, heldout_raw = stats, heldout
    if penalty != 1:  # the one-λ ridge on [h(t), h(t−1)/√α]
        scale = penalty ** -0.5
        stats = stats.with_context_scale(scale)
        heldout = heldout.with_context_scale(scale) if heldout is not None and heldout.count else heldout
    n = stats.layers
    spec = f"λ must be a finite number ≥ 0, a list of {n} such numbers, or 'auto'; got {lam!r}"
    if isinstance(lam, (list, tuple)):
        if len(lam) != n or not all(is_real(v) for v in lam):
            raise InputError(spec)
        for v in lam:
            check_real(v, "every λ in the list", lo=0.0)
    elif lam != "auto":
        check_real(lam, "λ", lo=0.0, hint=f"or a list of {n} numbers, or 'auto'")
    dec, best = None, None  # one decomposition of the fit Gram, for the choice of λ and the held-out report
    if lam == "auto":
        if heldout is None or heldout.count == 0:
            raise InputError("λ = 'auto' needs held-out statistics (calibrate on more than one chunk)")
        dec = _decompose(stats, heldout, progress)
        grid = lambda_grid(dec.gram)  # the centred Gram: the same for every late layer
        lams, best = [], []  # the chosen λ's held-out error, reused by the report
        for layer in tqdm(range(n), desc="choose λ (held-out error)", unit="layer", disable=not progress):
            errs = dec.errors(layer, grid)
            i = int(torch.argmin(errs))
            lams.append(float(grid[i]))
            best.append(errs[i])
        final_raw = raw.merged(heldout_raw)
    elif isinstance(lam, (list, tuple)):
        lams, final_raw = [float(v) for v in lam], raw
    else:
        lams, final_raw = [float(lam)] * n, raw
    # merged before scaling, as ridgefill.certify.as_solved rebuilds it from the saved raw statistics
    final = final_raw.with_context_scale(scale) if penalty != 1 else final_raw

    mh, mx = final.means()
    prior = default_prior(final)
    if prior is None:
        prior = torch.zeros(final.features, final.outputs, dtype=F64)
    weights, biases, methods = [], [], []
    with one_thread():  # the bits the certificate recomputes, whatever the caller's thread count
        for layer in tqdm(range(n), desc="solve the maps", unit="layer", disable=not progress):
            gram, cross, _ = final.centred(layer)
            w, method = solve_ridge(gram, cross, lams[layer], prior, return_method=True)
            weights.append(w)
            methods.append(method)
            biases.append(mx[layer] - mh @ w)
    rel = rel_id = None
    if heldout is not None and heldout.count:
        if dec is None:
            dec = _decompose(stats, heldout, progress)
        # predictions, hence errors, do not depend on the scale
        rel, rel_id = _heldout_report(stats, heldout, lams, dec, progress, best)
    weights = torch.stack(weights)
    if penalty != 1:  # back to the raw features: b = x̄ − h̄' W' = x̄ − h̄ W already
        weights = context_block_scaled(weights, stats.hidden, scale)
    return FittedMaps(weights, torch.stack(biases), lams, rel, rel_id, final_raw, penalty, methods)


def _decompose(stats: RidgeStats, heldout: RidgeStats, progress: bool) -> HeldoutDecomposition:
    """:class:`HeldoutDecomposition` of ``stats`` and ``heldout``, timed on stderr when ``progress``."""
    t0 = time.perf_counter()
    if progress:
        print(f"decompose the {stats.features}×{stats.features} feature Gram (once for all {stats.layers} late "
              "layers) ...", file=sys.stderr, flush=True)
    dec = HeldoutDecomposition(stats, heldout)
    if progress:
        print(f"decomposed in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return dec


def _heldout_report(stats: RidgeStats, heldout: RidgeStats, lams: list[float],
                    dec: HeldoutDecomposition | None = None, progress: bool = False, errors: list | None = None):
    """Held-out relative errors of the chosen ridge and of the identity fill (``W = I``, ``b = 0``);
    ``errors``: the chosen ridge's squared errors per layer when already computed (the choice of ``λ``)."""
    rel, rel_id = [], []
    mh_out, mx_out = heldout.means()
    dec = HeldoutDecomposition(stats, heldout) if dec is None else dec
    for layer, lam in enumerate(tqdm(lams, desc="held-out report", unit="layer", disable=not progress)):
        err = errors[layer] if errors is not None else dec.errors(layer, torch.tensor([lam], dtype=F64))[0]
        _, _, total = heldout.moments(layer, mh_out, mx_out[layer])
        if stats.targets != "inputs":  # K/V targets: no identity fill to compare with
            rel.append(float(err / total))
            rel_id.append(None)
            continue
        shh, shx, sxx = heldout.moments(layer, torch.zeros_like(mh_out), torch.zeros_like(mx_out[layer]))
        d = stats.hidden  # raw moments of the h_S block: identity error Σ‖x − h‖²
        ident = sxx - 2 * torch.trace(shx[:d]) + torch.trace(shh[:d, :d])
        rel.append(float(err / total))
        rel_id.append(float(ident / total))
    return rel, rel_id
