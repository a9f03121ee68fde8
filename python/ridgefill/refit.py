"""The maps refitted on the prompt's own exact rows (``prefill(..., refit=ρ)``).

The exact rows run every late layer, so while the prefill runs, each of them gives a true pair
``(h_S, x_l)`` from *this* prompt. Before a late layer's filled rows write their K/V, the layer's map is
refitted in closed form on the calibration statistics plus those pairs, each exact row counted ``α``
times (a weighted ridge; ``α = 0`` is the calibration map itself). ``prefill`` takes the share
``ρ = α T / n`` instead (``T`` exact rows, ``n`` calibration rows): the exact rows together weigh ``ρ``
times the calibration text, whatever their number (``ρ = 4`` is what docs/evaluate.md, "Eighth session",
measures):

    W'_l, b'_l = argmin_{W, b} Σ_calib ‖x − hW − b‖² + α Σ_exact ‖x − hW − b‖² + λ_l ‖W − I‖²_F

with the calibration map's own ``λ_l``. This is :func:`ridgefill.ridge.fit_maps` on the merged
statistics (the calibration rows and ``α`` copies of each exact row, :meth:`RidgeStats.merged`), so
the optimality and uniqueness theorems of the fit apply to it unchanged (Lean:
``KvaLean.ridge_multi_optimal``, ``KvaLean.fit_maps_optimal``); ``KvaLean.ridge_update`` states the
generic update (a solution of the old normal equations plus a correction solves the merged ones); the
pooled-centring algebra below is checked by the crossval property ``test_refit_props.py``. It needs no
calibration activations: with the calibration Gram ``G = n·cov_h`` and the map ``W_l`` solving
``(G + λI)W_l = B_l + λI``, the refitted map is

    W'_l = W_l + (G + ΔG + λ_l I)⁻¹ (α H_cᵀ R_c − c·δ r̄ᵀ),    b'_l = x̄' − h̄' W'_l

where ``H_c`` are the exact rows' centred split states, ``R_c`` their centred residuals
``x − h W_l − b_l``, ``r̄`` the mean residual, ``δ = h̄ − h̄_t`` (calibration mean minus the rows'
mean), ``c = n m / (n + m)`` with ``m = α T``, ``ΔG = α H_cᵀ H_c + c δ δᵀ``, and ``x̄'``, ``h̄'`` the
pooled means. ``ΔG`` and one factorisation per layer (``λ_l`` differs) are the cost: ``O(T d²)`` once
plus ``O(d³ + T d²)`` per late layer, in float64.

Filled rows' K/V then depend on the exact rows that come after them: the fill stays a function of
the prompt (no token after the prompt is read), but a filled row's cache is no longer a function of
its own prefix alone (``KvaLean.filled_causal`` holds for a fixed plan, and refitting makes the plan
depend on the exact rows, as row selection does).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import InputError
from .maps import RidgeMaps
from .ridge import solve_ridge
from .validate import check_real

F64 = torch.float64


def fit_count(maps: RidgeMaps) -> int:
    """Rows the maps were solved on (``n``): the fitting and held-out tokens with ``λ = 'auto'`` (the
    final maps are solved on both), the fitting tokens alone with a given ``λ``.

    Raises:
        InputError: context maps (:attr:`RidgeMaps.context`), or maps that record no calibration token
            counts, means or covariance (maps written before they were stored, K/V maps, or maps built by
            hand): refit them with ``ridgefill calibrate`` (``--context 0``).
    """
    meta = maps.meta
    if maps.context:
        raise InputError("refit refits maps that read the row's own h_S; these are context maps (context 1): use "
                         "maps calibrated with --context 0, or refit=0 (--refit 0)")
    if (maps.kind != "inputs" or maps.mean_h is None or maps.mean_x is None or maps.cov_h is None
            or not isinstance(meta.get("calibration_tokens"), int)):
        raise InputError("refit needs input maps that store their calibration means, covariance and token "
                         "counts (a maps file of `ridgefill calibrate --targets inputs`); these maps lack "
                         "them: refit them with `ridgefill calibrate`, or use refit=0 (--refit 0)")
    total = meta["calibration_tokens"]
    held = meta.get("heldout_tokens", 0) if isinstance(meta.get("heldout_tokens", 0), int) else 0
    return total if meta.get("lambda_spec", "auto") == "auto" else total - held


class PromptRefit:
    """The refitted maps of one prompt (:mod:`ridgefill.refit`): built from the exact rows' split
    states, then asked for each late layer's map with that layer's exact-row inputs.

    Args:
        maps: the calibration input maps (:func:`fit_count` lists what they must hold).
        h: ``[T, d]`` the exact rows' split states ``h_S`` (any float dtype; computed in float64).
        alpha: ``α > 0``, the weight of each exact row against one calibration row.

    Raises:
        InputError: ``alpha`` not a finite number ``> 0``, ``h`` not ``[T ≥ 1, d]``, or maps without
            the statistics (:func:`fit_count`).
    """

    def __init__(self, maps: RidgeMaps, h: Tensor, alpha: float):
        self.alpha = check_real(alpha, "refit weight α", lo=0.0)
        if not self.alpha > 0:
            raise InputError("refit weight α must be > 0 (0 means no refit: pass refit=0 to prefill)")
        n = fit_count(maps)
        d = maps.weights.shape[1]
        if maps.cov_h.dtype not in (torch.float32, F64):
            raise InputError(f"refit needs the maps' calibration covariance in float32 or float64; these maps hold it "
                             f"in {maps.cov_h.dtype} (cast by RidgeMaps.to?): load the maps file again, or use refit=0 "
                             "(--refit 0)")
        if h.ndim != 2 or h.shape[0] < 1 or h.shape[1] != d:
            raise InputError(f"refit needs the exact rows' split states as [rows ≥ 1, {d}]; got {tuple(h.shape)}")
        dev = h.device
        self.maps, self.n, self.m = maps, n, self.alpha * h.shape[0]
        self.h = h.to(F64)
        mean_h = maps.mean_h.to(device=dev, dtype=F64)
        h_mean = self.h.mean(0)
        self.hc = self.h - h_mean
        self.delta = mean_h - h_mean
        self.c = n * self.m / (n + self.m)
        self.gram = (n * maps.cov_h.to(device=dev, dtype=F64) + self.alpha * self.hc.T @ self.hc
                     + self.c * torch.outer(self.delta, self.delta))
        self.mean_h = (n * mean_h + self.m * h_mean) / (n + self.m)

    def layer(self, index: int, x: Tensor) -> tuple[Tensor, Tensor]:
        """The refitted map of late layer ``index`` (0 = layer ``S+1``) from the exact rows' inputs
        ``x`` ``[T, d]`` of that layer: ``(W' [d, d], b' [d])`` float64."""
        w = self.maps.weights[index].to(device=self.h.device, dtype=F64)
        b = self.maps.biases[index].to(device=self.h.device, dtype=F64)
        r = x.to(F64) - self.h @ w - b            # residuals of the calibration map on the exact rows
        r_mean = r.mean(0)
        rhs = self.alpha * self.hc.T @ (r - r_mean) - self.c * torch.outer(self.delta, r_mean)
        # (G + ΔG + λI) U = rhs with the fit's own checked solve (SingularGramError when not positive definite)
        w2 = w + solve_ridge(self.gram, rhs, self.maps.lambdas[index], torch.zeros_like(rhs)).to(w.device)
        mean_x = self.maps.mean_x[index].to(device=w.device, dtype=F64)
        x_mean = x.to(F64).mean(0)
        mean_x2 = (self.n * mean_x + self.m * x_mean) / (self.n + self.m)
        return w2, mean_x2 - self.mean_h @ w2
