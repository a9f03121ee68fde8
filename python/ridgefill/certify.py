"""Certificates that the stored maps are the ridge minimisers of their calibration statistics.

Two kinds, both read by ``crossval/`` (see ``crossval/README.md``):

**Numeric certificates** (``ridgefill certify MAPS``): one JSON file per late layer ``l``, from the
float64 statistics saved beside the maps (:func:`ridgefill.maps.stats_path`). With the centred Gram
``G`` ``[d, d]``, cross term ``B_l`` ``[d, d]`` and ``A = G + λI``, the normal equations of the ridge
minimiser ``W★`` are ``A W★ = B_l + λI``. For the float64 solve ``W_64`` of those equations the residual
``R = A W_64 − (B_l + λI)`` and a lower bound ``μ > 0`` on the spectrum of ``A`` give, by the gap identity
``J(W) = J(W★) + ‖X(W − W★)‖² + λ‖W − W★‖² = J(W★) + ⟨W − W★, A (W − W★)⟩`` (``KvaLean.ridge_gap``):

    ‖W_64 − W★‖_F ≤ ‖R‖_F / μ        and        J(W_64) − J(W★) = ⟨R, A⁻¹R⟩ ≤ ‖R‖²_F / μ,

and ``W★`` is unique (``ridge_unique``: ``μ > 0``). The stored float32 map ``W_s`` is then certified by
its distance to ``W_64`` (it must be ``W_64`` rounded) and an upper bound on the spectrum
(:func:`layer_certificate`). A certificate records ``λ``, ``‖R‖_F`` relative to ``‖B_l + λI‖_F``, the
Gram spectrum bounds, these bounds, the objective ``J(W_s)`` and the SHA-256 of the statistics it was
computed from (the calibration hash); :func:`check_certificate` checks it against the criterion and,
given the statistics and maps, recomputes it.

**Exact certificates** (:class:`ExactInstance`, the Lean ``KvaLean.RidgeInstance``): small rational
instances (``m ≈ 8`` rows, ``d ≈ 4``) whose minimiser is computed exactly with :class:`fractions.Fraction`;
:func:`export_lean_certificate` writes them as a Lean file in which the kernel runs the
``KvaLean.Certificate`` checker by ``decide +kernel``, and :func:`check_exact` (also reached through
:func:`check_certificate`) is the Python mirror of that checker.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import torch
from torch import Tensor

from .errors import InputError, RidgeFillError
from .fileio import atomic_write, write_json
from .maps import RidgeMaps, load_maps, load_stats, maps_digest, stats_path
from .ridge import RidgeStats, context_block_scaled, one_thread

F64 = torch.float64
EPS = float(torch.finfo(F64).eps)
CERT_FORMAT = "ridgefill-certificate"
CERT_VERSION = 1
#: Default criterion: the certified excess ``J(W) − J(W★)`` is at most this fraction of ``J(W)`` (plus
#: the float32 storage floor, see :func:`layer_certificate`).
MAX_EXCESS_REL = 1e-4
F32_UNIT = 2.0 ** -24   # float32 rounding: |fl(x) − x| ≤ 2⁻²⁴ |x| for normal numbers
F32_TINY = 2.0 ** -149  # ... plus half the smallest subnormal


class CertificateError(RidgeFillError):
    """A certificate failed its check, or could not be made (statistics missing or not matching)."""


# --------------------------------------------------------------------------------------------------
# numeric certificates
# --------------------------------------------------------------------------------------------------

def stats_digest(stats: RidgeStats) -> str:
    """SHA-256 (hex) of a :class:`RidgeStats`' count and float64 tensors: the calibration hash."""
    h = hashlib.sha256(str(stats.count).encode())
    for t in (stats.shift_h, stats.shift_x, stats.sum_h, stats.gram, stats.sum_x, stats.cross, stats.sq_x):
        h.update(t.detach().to(F64).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def as_solved(stats: RidgeStats, maps: RidgeMaps) -> tuple[RidgeStats, Tensor]:
    """The statistics and weights ``[layers, f, d]`` of the one-``λ`` ridge the maps solve: for context maps
    fitted with ``context_penalty = α ≠ 1`` (:func:`ridgefill.ridge.fit_maps`) the features
    ``[h_S(t), h_S(t−1)/√α]`` (:meth:`RidgeStats.with_context_scale`) and the stored weights with their
    previous row's block times ``√α``; otherwise both as they are. For ``α = 4`` the scaling is by a power
    of two, exact in float32."""
    penalty = maps.context_penalty
    if penalty == 1:
        return stats, maps.weights
    w = context_block_scaled(maps.weights.detach().to(F64), stats.hidden, penalty ** 0.5)
    return stats.with_context_scale(penalty ** -0.5), w


@one_thread()  # the recomputed W_64 and residual do not depend on the caller's thread count
def layer_certificate(stats: RidgeStats, index: int, weight: Tensor, lam: float, *, layer: int | None = None,
                      max_excess_rel: float = MAX_EXCESS_REL, provenance: dict | None = None) -> dict:
    """The numeric certificate of one late layer's stored map.

    The stored ``W_s`` (float32 on disk) is certified through ``W_64``, the project's float64 solve
    (:func:`ridgefill.solve_ridge`) of the same statistics: with ``A = G + λI``, ``R = A W_64 − (B + λI)``,
    ``μ ≤ λ_min(A)`` and ``Λ ≥ λ_max(A)``, and ``‖V‖_A² = ⟨V, A V⟩``,

        J(W_s) − J(W★) = ‖W_s − W★‖_A² ≤ (√Λ ‖W_s − W_64‖_F + ‖R‖_F / √μ)²     (the gap identity),

    since ``‖W_64 − W★‖_A² = ⟨R, A⁻¹R⟩ ≤ ‖R‖²/μ``. The criterion: ``μ > 0`` (unique minimiser), ``W_s`` is
    ``W_64`` rounded to float32 (each entry within ``2⁻²⁴`` relative), and that excess is at most
    ``max_excess_rel · J(W_s)`` plus what storing ``W★`` in float32 alone can cost (``Λ (2 ‖2⁻²⁴ W_64‖_F)²``)
    plus the rounding of ``J`` itself.

    Args:
        stats: the statistics the map was solved on (all late layers).
        index: the layer's index in ``stats`` (``0`` for layer ``S + 1``).
        weight: ``W_s`` ``[f, d]`` as stored (any float dtype; used in float64); ``f = d``, or ``2d`` for
            context maps, whose prior is ``[I; 0]`` in place of ``I`` (:func:`ridgefill.ridge.default_prior`).
        lam: ``λ_l ≥ 0``.
        layer: absolute layer number, recorded as is.
        max_excess_rel: the criterion's bound on ``(J(W_s) − J(W★)) / J(W_s)``.
        provenance: extra fields copied into the certificate (hashes, model name).

    Returns:
        A JSON-able dict; ``passed`` says whether the criterion holds.
    """
    from .errors import SingularGramError
    from .ridge import solve_ridge

    from .ridge import default_prior

    d = stats.features  # feature width: hidden, or 2·hidden for context maps
    gram, cross, sxx = stats.centred(index)
    w = weight.detach().to(F64).cpu()
    if stats.targets != "inputs" or tuple(w.shape) != (d, stats.hidden):
        raise InputError(f"weight must be [{d}, {stats.hidden}] for these statistics (layer-input maps); got "
                         f"{tuple(w.shape)} for {stats.targets!r} targets")
    prior = default_prior(stats)  # I, or [I; 0] for context maps
    try:
        w64 = solve_ridge(gram, cross, lam, prior)
    except SingularGramError:
        w64 = w  # no unique minimiser: μ ≤ 0 below fails the certificate
    eye = torch.eye(d, dtype=F64)
    rhs = cross + lam * prior
    residual = (gram + lam * eye) @ w64 - rhs
    stored_residual = (gram + lam * eye) @ w - rhs
    evals = torch.linalg.eigvalsh(gram)
    eig_min, eig_max = float(evals[0]), float(evals[-1])
    # eigvalsh is backward stable: its eigenvalues are those of G + E with ‖E‖₂ ≤ c d eps ‖G‖₂
    eig_error = 4 * d * EPS * max(abs(eig_min), abs(eig_max))
    mu, big = lam + eig_min - eig_error, lam + eig_max + eig_error
    res_fro, rhs_fro = float(residual.norm()), float(rhs.norm())
    ulp = F32_UNIT * w64.abs()
    storage = float((w - w64).norm())
    terms = [float((w * (gram @ w)).sum()), -2 * float((w * cross).sum()), float(sxx),
             lam * float((w - prior).square().sum())]
    objective = math.fsum(terms)
    cert = {
        "format": CERT_FORMAT, "version": CERT_VERSION, "layer": layer, "index": index, "hidden": d,
        "rows": stats.count, "lambda": float(lam),
        "residual_fro": res_fro, "rhs_fro": rhs_fro, "residual_rel": res_fro / rhs_fro if rhs_fro else res_fro,
        "stored_residual_rel": float(stored_residual.norm()) / rhs_fro if rhs_fro else float(stored_residual.norm()),
        "gram_eig_min": eig_min, "gram_eig_max": eig_max, "eig_error": eig_error,
        "reg_eig_lower": mu, "reg_eig_upper": big,
        "weight_fro": float(w.norm()), "storage_fro": storage, "storage_ulp_fro": float(ulp.norm()),
        "storage_is_rounding": bool(((w - w64).abs() <= ulp * (1 + 1e-12) + F32_TINY).all()),
        "objective": objective,
        # J(W) is a sum of terms that cancel; its rounding error is about eps times this
        "objective_rounding": 8 * d * EPS * sum(abs(t) for t in terms),
        "weight_error_bound": storage + res_fro / mu if mu > 0 else math.inf,
        "excess_bound": (math.sqrt(big) * storage + res_fro / math.sqrt(mu)) ** 2 if mu > 0 else math.inf,
        "storage_floor": big * (2 * float(ulp.norm())) ** 2,
        "max_excess_rel": max_excess_rel,
        "calibration_sha256": stats_digest(stats),
    }
    cert["excess_rel"] = cert["excess_bound"] / objective if objective > 0 else math.inf
    cert.update(provenance or {})
    cert["passed"] = not _criterion_failures(cert)
    return cert


_NUMBERS = ("lambda", "residual_fro", "rhs_fro", "residual_rel", "stored_residual_rel", "gram_eig_min",
            "gram_eig_max", "eig_error", "reg_eig_lower", "reg_eig_upper", "weight_fro", "storage_fro",
            "storage_ulp_fro", "objective", "objective_rounding", "weight_error_bound", "excess_bound",
            "storage_floor", "excess_rel", "max_excess_rel")


def _criterion_failures(cert: dict) -> list[str]:
    """What the certificate's own numbers fail of the criterion (empty when it holds)."""
    bad = []
    lam, mu, big = cert["lambda"], cert["reg_eig_lower"], cert["reg_eig_upper"]
    if not lam >= 0:
        bad.append(f"λ = {lam} is negative")
    if not mu > 0:
        bad.append(f"no positive lower bound on the spectrum of G + λI (μ = {mu}): the minimiser is not "
                   "certified unique (ridge_unique needs λ > 0 or a non-singular Gram)")
    rebuilt = lam + cert["gram_eig_min"] - cert["eig_error"]
    if mu > rebuilt and not math.isclose(mu, rebuilt, rel_tol=1e-12):
        bad.append(f"μ = {mu} is not implied by λ + eig_min − eig_error = {rebuilt}")
    rebuilt = lam + cert["gram_eig_max"] + cert["eig_error"]
    if big < rebuilt and not math.isclose(big, rebuilt, rel_tol=1e-12):
        bad.append(f"Λ = {big} is not implied by λ + eig_max + eig_error = {rebuilt}")
    if cert.get("storage_is_rounding") is not True:
        bad.append("the stored W is not the float32 rounding of the float64 solve of its statistics "
                   f"(‖W_s − W_64‖_F = {cert['storage_fro']:.3e}, float32 units {cert['storage_ulp_fro']:.3e})")
    if mu > 0:
        r, st = cert["residual_fro"], cert["storage_fro"]
        if not cert["weight_error_bound"] >= (st + r / mu) * (1 - 1e-12):
            bad.append(f"weight error bound {cert['weight_error_bound']} is below ‖W_s − W_64‖ + ‖R‖/μ")
        if not cert["excess_bound"] >= (math.sqrt(big) * st + r / math.sqrt(mu)) ** 2 * (1 - 1e-12):
            bad.append(f"excess bound {cert['excess_bound']} is below (√Λ ‖W_s − W_64‖ + ‖R‖/√μ)²")
        if not cert["storage_floor"] <= big * (2 * cert["storage_ulp_fro"]) ** 2 * (1 + 1e-12):
            bad.append(f"storage floor {cert['storage_floor']} is above Λ (2 ‖2⁻²⁴ W_64‖)²")
        if not _excess_ok(cert, cert["max_excess_rel"]):
            bad.append(f"certified excess J(W) − J(W★) ≤ {cert['excess_bound']:.3e} is more than "
                       f"{cert['max_excess_rel']:g} of J(W) = {cert['objective']:.6e} plus the float32 storage "
                       f"floor {cert['storage_floor']:.1e} and the rounding of J {cert['objective_rounding']:.1e}")
    return bad


def _excess_ok(cert: dict, max_excess_rel: float) -> bool:
    """The criterion on the excess (see :func:`layer_certificate`)."""
    return cert["excess_bound"] <= (max_excess_rel * max(cert["objective"], 0.0) + cert["storage_floor"]
                                    + cert["objective_rounding"])


@dataclass
class CertificateCheck:
    """Result of :func:`check_certificate`: ``passed`` and the ``failures`` (empty when passed)."""

    layer: int | None
    passed: bool
    failures: list[str] = field(default_factory=list)


def check_certificate(cert: dict | ExactInstance, stats: RidgeStats | None = None, maps: RidgeMaps | None = None,
                      *, max_excess_rel: float | None = None) -> CertificateCheck:
    """Check a certificate: a numeric one against the criterion of ``KvaLean.Ridge`` (see module
    docstring), an exact one with the mirror of the Lean checker (:func:`check_exact`).

    Args:
        cert: a dict written by :func:`layer_certificate` (or read back from its JSON), or an
            :class:`ExactInstance`.
        stats, maps: when both are given, the certificate is recomputed from them (:func:`as_solved`) and must agree
            (same calibration hash and maps hash, same numbers to 1e-8 relative).
        max_excess_rel: a stricter (or other) criterion than the one recorded in the certificate.

    Returns:
        :class:`CertificateCheck`.
    """
    if isinstance(cert, ExactInstance):
        ok = check_exact(cert)
        return CertificateCheck(None, ok, [] if ok else [
            f"{cert.name}: the shapes, λ ≥ 0 or the exact normal equations (XᵀX + λI) W = XᵀY + λ W₀ fail"])
    layer = cert.get("layer") if isinstance(cert, dict) else None
    fail = []
    if not isinstance(cert, dict) or cert.get("format") != CERT_FORMAT or cert.get("version") != CERT_VERSION:
        return CertificateCheck(layer, False, [f"not a {CERT_FORMAT} version {CERT_VERSION} certificate"])
    for k in _NUMBERS:
        v = cert.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v):
            fail.append(f"field {k!r} is missing or not a number ({v!r})")
    if fail:
        return CertificateCheck(layer, False, fail)
    fail += _criterion_failures(cert)
    if cert.get("passed") is not (not fail):
        fail.append(f"the certificate says passed={cert.get('passed')!r}, its numbers say {not fail}")
    if max_excess_rel is not None and not _excess_ok(cert, max_excess_rel):
        fail.append(f"certified excess {cert['excess_bound']:.3e} is more than {max_excess_rel:g} of J(W) = "
                    f"{cert['objective']:.6e}")
    if stats is not None and maps is not None:
        index = cert["index"]
        if not isinstance(index, int) or not 0 <= index < len(maps.lambdas):
            fail.append(f"layer index {index!r} is not one of the maps' {len(maps.lambdas)} late layers")
        else:
            solved, weights = as_solved(stats, maps)
            fresh = layer_certificate(solved, index, weights[index], maps.lambdas[index], layer=layer,
                                      max_excess_rel=cert["max_excess_rel"])
            if fresh["calibration_sha256"] != cert.get("calibration_sha256"):
                fail.append("calibration hash differs: the certificate was made from other statistics")
            want = cert.get("maps_sha256")
            if want is not None and want != maps_digest(maps.weights, maps.biases):
                fail.append("maps hash differs: the certificate was made for other maps")
            for k in _NUMBERS:
                a, b = cert[k], fresh[k]
                scale = {"gram_eig_min": fresh["eig_error"] + abs(fresh["gram_eig_max"]) * 1e-8}.get(k, 0.0)
                if not math.isclose(a, b, rel_tol=1e-8, abs_tol=max(scale, 1e-300)) and a != b:
                    fail.append(f"{k}: certificate says {a!r}, recomputed {b!r}")
    return CertificateCheck(layer, not fail, fail)


def _maps_and_stats(maps_path: Path, stats_file: str | Path | None):
    """The maps at ``maps_path`` and the statistics they were solved from (``stats_file``, default beside
    them). Raises :class:`CertificateError` when the statistics belong to other maps."""
    maps = load_maps(maps_path)
    stats, smeta = load_stats(stats_file or stats_path(maps_path))
    digest = maps_digest(maps.weights, maps.biases)
    if smeta.get("maps_sha256") != digest or stats.layers != len(maps.lambdas):
        raise CertificateError(
            f"the statistics file was written for other maps (maps hash {smeta.get('maps_sha256')}, these "
            f"maps {digest}); recalibrate with `ridgefill calibrate`, which writes both together")
    return maps, stats


def certify_maps(maps_path: str | Path, out_dir: str | Path | None = None, *, stats_file: str | Path | None = None,
                 max_excess_rel: float = MAX_EXCESS_REL) -> list[Path]:
    """Write one certificate per late layer of the maps at ``maps_path``.

    Args:
        maps_path: a maps file; its statistics are read from ``stats_file`` (default
            :func:`ridgefill.maps.stats_path` of it).
        out_dir: folder for ``layer-<l>.json`` (default ``<maps name>.certs`` beside the maps).

    Returns:
        The paths written (atomically), in layer order.

    Raises:
        InputError, MapsFormatError: a file is missing or unreadable.
        CertificateError: the statistics belong to other maps.
    """
    maps_path = Path(maps_path)
    maps, stats = _maps_and_stats(maps_path, stats_file)
    if out_dir is None:
        name = maps_path.name.removesuffix(".safetensors")
        out_dir = maps_path.with_name(name + ".certs")
    prov = {"split": maps.split, "maps_sha256": maps_digest(maps.weights, maps.biases), "model_name": maps.meta.get("model_name"),
            "model_hash": maps.meta.get("model_hash"), "text_sha256": maps.meta.get("text_sha256"),
            **({"context_penalty": maps.context_penalty} if maps.context else {})}
    paths = []
    solved, weights = as_solved(stats, maps)
    for i, lam in enumerate(maps.lambdas):
        layer = maps.split + 1 + i
        cert = layer_certificate(solved, i, weights[i], lam, layer=layer, max_excess_rel=max_excess_rel,
                                 provenance=prov)
        paths.append(write_json(Path(out_dir) / f"layer-{layer:03d}.json", cert))
    return paths


def read_certificate(path: str | Path) -> dict:
    """Read a certificate JSON file (see :func:`layer_certificate`)."""
    return json.loads(Path(path).read_text())


# --------------------------------------------------------------------------------------------------
# exact rational certificates
# --------------------------------------------------------------------------------------------------

Matrix = list[list[Fraction]]


def _eye(d: int, k: int | None = None) -> Matrix:
    return [[Fraction(int(i == j)) for j in range(d if k is None else k)] for i in range(d)]


def _matmul(a: Matrix, b: Matrix) -> Matrix:
    return [[sum((a[i][t] * b[t][j] for t in range(len(b))), Fraction(0)) for j in range(len(b[0]))]
            for i in range(len(a))]


def _transpose(a: Matrix) -> Matrix:
    return [list(r) for r in zip(*a)]


def exact_solve(gram: Matrix, cross: Matrix, lam: Fraction, prior: Matrix | None = None) -> Matrix:
    """The exact solution ``W`` ``[d, k]`` of ``(G + λI) W = B + λ W₀`` (Gauss–Jordan on fractions;
    ``gram`` ``[d, d]``, ``cross`` and ``prior`` ``[d, k]``, prior default the identity).

    Raises:
        InputError: ``G + λI`` is singular.
    """
    d, k = len(gram), len(cross[0])
    prior = prior or _eye(d, k)
    a = [[gram[i][j] + (lam if i == j else 0) for j in range(d)] + [cross[i][j] + lam * prior[i][j] for j in range(k)]
         for i in range(d)]
    for c in range(d):
        p = next((r for r in range(c, d) if a[r][c] != 0), None)
        if p is None:
            raise InputError(f"G + λI is singular (λ = {lam}); use λ > 0")
        a[c], a[p] = a[p], a[c]
        piv = a[c][c]
        a[c] = [v / piv for v in a[c]]
        for r in range(d):
            if r != c and a[r][c] != 0:
                f = a[r][c]
                a[r] = [v - f * u for v, u in zip(a[r], a[c])]
    return [row[d:] for row in a]


@dataclass(frozen=True)
class ExactInstance:
    """One exact instance of the multi-output ridge problem and a claimed minimiser: the Lean
    ``KvaLean.RidgeInstance`` (``min_V ‖X V − Y‖²_F + λ‖V − W₀‖²_F``).

    Attributes:
        name: a Lean identifier for the instance.
        x: ``X`` ``[m, d]``; y: ``Y`` ``[m, p]``; prior: ``W₀`` ``[d, p]`` (identity columns in RidgeFill).
        lam: ``λ``; weight: the claimed minimiser ``W`` ``[d, p]``.
        source: where the numbers came from, in a phrase (written into the Lean docstring).
    """

    name: str
    x: Matrix
    y: Matrix
    prior: Matrix
    lam: Fraction
    weight: Matrix
    source: str = ""

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(m, d, p)``."""
        return len(self.x), len(self.prior), len(self.prior[0]) if self.prior else 0


def solved_instance(name: str, x: Matrix, y: Matrix, lam: Fraction, *, prior: Matrix | None = None,
                    source: str = "") -> ExactInstance:
    """The instance for data ``x`` ``[m, d]``, targets ``y`` ``[m, p]`` and ``λ`` (prior: the first ``p``
    identity columns), with its exact minimiser ``W = (XᵀX + λI)⁻¹ (XᵀY + λ W₀)``."""
    x = [[Fraction(v) for v in row] for row in x]
    y = [[Fraction(v) for v in row] for row in y]
    d, p = len(x[0]), len(y[0])
    prior = prior or _eye(d, p)
    xt = _transpose(x)
    w = exact_solve(_matmul(xt, x), _matmul(xt, y), Fraction(lam), prior)
    return ExactInstance(name, x, y, prior, Fraction(lam), w, source)


def stats_slice(stats: RidgeStats, index: int, lam: float, *, dims: int = 4,
                outputs: int = 2) -> tuple[Tensor, Tensor, float]:
    """A tiny slice of real calibration statistics in the data form the Lean checker takes.

    Takes the leading ``dims × dims`` block ``G_s`` of the centred Gram and the ``dims × outputs`` block
    ``B_s`` of the centred cross term of late layer ``index``, both divided by ``max diag(G_s)`` (and
    ``λ`` alike), and returns ``(X, Y, λ_s)`` with ``X = R`` ``[dims, dims]`` the Cholesky factor
    (``G_s = RᵀR``) and ``Y = R⁻ᵀ B_s`` ``[dims, outputs]``, so that ``XᵀX = G_s`` and ``XᵀY = B_s``
    (float64).

    Raises:
        InputError: the block is zero or not positive definite (try other ``dims``).
    """
    gram, cross, _ = stats.centred(index)
    g = gram[:dims, :dims]
    scale = float(g.diagonal().max())
    if not scale > 0:
        raise InputError(f"the leading {dims}×{dims} block of the Gram is zero")
    g, b = g / scale, cross[:dims, :outputs] / scale
    factor, info = torch.linalg.cholesky_ex(g, upper=True)
    if info.item() != 0:
        raise InputError(f"the leading {dims}×{dims} block of the Gram is not positive definite")
    return factor, torch.linalg.solve_triangular(factor.T, b, upper=False), lam / scale


def instance_from_stats(name: str, stats: RidgeStats, index: int, lam: float, *, dims: int = 4, outputs: int = 2,
                        denominator: int = 1000, source: str = "") -> ExactInstance:
    """An exact instance from real calibration statistics: :func:`stats_slice`, with ``X``, ``Y`` and
    ``λ_s`` rounded to multiples of ``1/denominator`` (``λ`` at least ``1/denominator``), solved exactly."""
    x, y, lam_s = stats_slice(stats, index, lam, dims=dims, outputs=outputs)

    def q(v: float) -> Fraction:
        return Fraction(round(v * denominator), denominator)

    return solved_instance(name, [[q(v) for v in row] for row in x.tolist()],
                           [[q(v) for v in row] for row in y.tolist()], max(q(lam_s), Fraction(1, denominator)),
                           source=source)


def _shape_ok(a: Matrix, rows: int, cols: int) -> bool:
    return len(a) == rows and all(len(r) == cols for r in a)


def check_exact(inst: ExactInstance) -> bool:
    """Python mirror of ``KvaLean.RidgeInstance.check``: the shapes agree, ``λ ≥ 0``, and the normal
    equations ``(XᵀX + λI) W = XᵀY + λ W₀`` hold exactly. Then ``W`` is a minimiser
    (``optimal_of_check``), the only one when ``λ > 0`` (``unique_of_check``)."""
    m, d, p = inst.shape
    if not (_shape_ok(inst.x, m, d) and _shape_ok(inst.y, m, p) and _shape_ok(inst.prior, d, p)
            and _shape_ok(inst.weight, d, p) and inst.lam >= 0):
        return False
    xt = _transpose(inst.x) if m else [[] for _ in range(d)]
    lhs = _matmul(xt, _matmul(inst.x, inst.weight)) if m else [[Fraction(0)] * p for _ in range(d)]
    rhs = _matmul(xt, inst.y) if m else [[Fraction(0)] * p for _ in range(d)]
    return all(lhs[i][j] + inst.lam * inst.weight[i][j] == rhs[i][j] + inst.lam * inst.prior[i][j]
               for i in range(d) for j in range(p))


def perturbed(inst: ExactInstance, name: str, delta: Fraction = Fraction(1, 1000)) -> ExactInstance:
    """A deliberately wrong certificate: ``inst`` with ``W[0][0]`` moved by ``delta``."""
    w = [list(r) for r in inst.weight]
    w[0][0] += delta
    return ExactInstance(name, inst.x, inst.y, inst.prior, inst.lam, w,
                         f"A wrong certificate: `{inst.name}` with W[0][0] moved by {delta}.")


def lean_rational(v: Fraction) -> str:
    """``v`` as a Lean ``Rat`` literal expression: ``3``, ``-7/4``."""
    v = Fraction(v)
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def _lean_matrix(a: Matrix) -> str:
    return "[" + ", ".join("[" + ", ".join(lean_rational(v) for v in row) + "]" for row in a) + "]"


LEAN_NAMESPACE = "KvaLean.CertExamples"


def lean_certificate_source(instances: Sequence[ExactInstance], *, wrong: Sequence[ExactInstance] = (),
                            header: str = "") -> str:
    """The Lean text :func:`export_lean_certificate` writes (a module importing ``KvaLean.Certificate``)."""
    for inst in list(instances) + list(wrong):
        if not inst.name.isidentifier():
            raise InputError(f"instance name {inst.name!r} is not a Lean identifier")
    out = ["module", "", "public import KvaLean.Certificate", "",
           "/-! # Exact ridge certificates checked by the kernel", "",
           "Generated by `ridgefill.certify.export_lean_certificate`; do not edit by hand. Each instance below",
           "is checked with `KvaLean.RidgeInstance.check` by `decide +kernel`: for an accepted one",
           "`optimal_of_check` then makes its `W` the ridge minimiser (and, when `λ > 0`, `unique_of_check`",
           "the only one); a wrong one must be rejected (`check = false`). Each check is a named theorem",
           "(`<name>_optimal`, `<name>_rejected`), so the axiom audit of `.ci/check-lean` covers it."]
    if header:
        out += [""] + header.strip().splitlines()
    out += ["-/", "", "public section", "", f"namespace {LEAN_NAMESPACE}", ""]
    for inst in list(instances) + list(wrong):
        m, d, p = inst.shape
        doc = (inst.source or inst.name).replace("-/", "- /")
        out += [f"/-- {doc} -/", f"@[expose] def {inst.name} : RidgeInstance where",
                f"  m := {m}", f"  d := {d}", f"  p := {p}", f"  X := {_lean_matrix(inst.x)}",
                f"  Y := {_lean_matrix(inst.y)}", f"  W0 := {_lean_matrix(inst.prior)}",
                f"  lam := {lean_rational(inst.lam)}", f"  W := {_lean_matrix(inst.weight)}", ""]
    for inst in instances:
        n = inst.name
        if inst.lam > 0:
            out += [f"/-- The kernel accepts `{n}`: its `W` is the ridge minimiser, and the only one.",
                    "Constrains `ridgefill.certify.check_certificate`. -/",
                    f"theorem {n}_optimal : (∀ V, {n}.obj {n}.Wf ≤ {n}.obj V) ∧",
                    f"    (∀ {{V}}, NormalEqMulti {n}.Xf {n}.Yf {n}.W0f {n}.lam V → V = {n}.Wf) :=",
                    f"  have h : {n}.check = true := by decide +kernel",
                    f"  ⟨{n}.optimal_of_check h, fun hV => {n}.unique_of_check h (by decide +kernel) hV⟩", ""]
        else:
            out += [f"/-- The kernel accepts `{n}`: its `W` is a ridge minimiser.",
                    "Constrains `ridgefill.certify.check_certificate`. -/",
                    f"theorem {n}_optimal : ∀ V, {n}.obj {n}.Wf ≤ {n}.obj V :=",
                    f"  {n}.optimal_of_check (by decide +kernel)", ""]
    for inst in wrong:
        out += [f"/-- The kernel rejects the wrong certificate `{inst.name}`.",
                "Constrains `ridgefill.certify.check_certificate`. -/",
                f"theorem {inst.name}_rejected : {inst.name}.check = false := by decide +kernel", ""]
    out += [f"end {LEAN_NAMESPACE}", "", "end", ""]
    return "\n".join(out)


#: The most matrix entries (``x``, ``y``, prior and weight together) one exported instance may hold: the
#: kernel checks it by ``decide``, whose time grows with the entries and their digits.
MAX_INSTANCE_ENTRIES = 1024
#: The largest Lean file :func:`export_lean_certificate` writes, in bytes (UTF-8).
MAX_LEAN_BYTES = 1_000_000


def _entries(inst: ExactInstance) -> int:
    return sum(len(row) for m in (inst.x, inst.y, inst.prior, inst.weight) for row in m)


def export_lean_certificate(instances: Sequence[ExactInstance], path: str | Path, *,
                            wrong: Sequence[ExactInstance] = (), header: str = "",
                            max_bytes: int = MAX_LEAN_BYTES) -> Path:
    """Write a Lean file in which the kernel checks each instance with the ``KvaLean.Certificate``
    checker by ``decide +kernel`` (``check = true`` and optimality for ``instances``, ``check = false``
    for ``wrong``). Every instance must pass (and every wrong one fail) :func:`check_exact` first.

    Returns:
        ``path``, written atomically.

    Raises:
        CertificateError: an instance holds more than :data:`MAX_INSTANCE_ENTRIES` entries (checked first),
            an instance fails, or a wrong one passes, the Python mirror of the checker, or the Lean text
            would exceed ``max_bytes`` (default :data:`MAX_LEAN_BYTES`); nothing is written then.
    """
    for inst in [*instances, *wrong]:
        if _entries(inst) > MAX_INSTANCE_ENTRIES:
            raise CertificateError(f"instance {inst.name} holds {_entries(inst)} matrix entries, more than the "
                                   f"{MAX_INSTANCE_ENTRIES} a kernel check takes: export a smaller slice "
                                   "(stats_slice with fewer dims or outputs)")
    for inst in instances:
        if not check_exact(inst):
            raise CertificateError(f"instance {inst.name} fails the checker: refusing to export it as valid")
    for inst in wrong:
        if check_exact(inst):
            raise CertificateError(f"instance {inst.name} passes the checker: it is not a wrong certificate")
    data = lean_certificate_source(instances, wrong=wrong, header=header).encode("utf-8")
    if len(data) > max_bytes:
        raise CertificateError(f"the Lean certificate would be {len(data):,} bytes, more than the limit of "
                               f"{max_bytes:,}: export fewer or smaller instances (their rationals' digits count "
                               "too), or raise max_bytes")
    return atomic_write(path, data)


# --------------------------------------------------------------------------------------------------
# rigorous certificates (enclosures: float64 matrices with proven error bounds, scalars as balls)
# --------------------------------------------------------------------------------------------------

#: Working precision (bits) of the scalar ball arithmetic in :func:`rigorous_certificate`.
ARB_PREC = 128
_U = 2.0 ** -53       # the unit roundoff of float64 (round to nearest)
_ETA = 2.0 ** -1074   # the smallest subnormal: what an underflowing product may lose
#: The absolute allowance per matrix entry for underflow (at least ``4nη`` for any inner dimension ``n`` here),
#: kept in the normal range: subnormal radii would make the float64 products of the radii very slow.
_TINY = 2.0 ** -800
_UP = 1 + 16 * _U     # inflates a bound computed in a few float64 operations to an upper bound


def _gamma(n: int) -> float:
    """An upper bound on ``γ_n = n u / (1 − n u)``: for any order of summation (blocked, with or without FMA)
    ``|fl(xᵀy) − xᵀy| ≤ γ_n |x|ᵀ|y|`` (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1), which
    is all the error analysis below assumes of the float64 matrix product (IEEE 754 binary64, round to nearest,
    no Strassen-like product)."""
    return n * _U / (1 - n * _U) * _UP


class _Box:
    """A matrix of exact reals ``X`` known by ``|X − v| ≤ r`` elementwise (``v``, ``r`` float64 ``[rows, cols]``;
    ``r = None``: ``X = v`` exactly, as for stored float32/float64 data, every float being a dyadic rational)."""

    def __init__(self, v: Tensor, r: Tensor | None = None):
        self.v = v.detach().to(F64).cpu()
        self.r = r
        if not bool(torch.isfinite(self.v).all()) or (r is not None and not bool(torch.isfinite(r).all())):
            raise CertificateError("a non-finite value in the certificate's arithmetic (overflow or NaN in the "
                                   "statistics or the maps)")

    def rad(self) -> Tensor:
        return torch.zeros_like(self.v) if self.r is None else self.r


def _box_add(a: _Box, b: _Box, sign: float = 1.0) -> _Box:
    """``A ± B``: the float sum and its error (``|fl(x + y) − (x + y)| ≤ 2u |fl(x + y)|``; sums do not underflow)."""
    v = a.v + sign * b.v
    return _Box(v, (a.rad() + b.rad() + 2 * _U * v.abs()) * _UP)


def _box_mm(a: _Box, b: _Box) -> _Box:
    """``A B`` (inner dimension ``n``): ``|fl(A_v B_v) − A_v B_v| ≤ γ_n |A_v||B_v| + n η`` plus the radii's share
    ``|A_v| r_B + r_A (|B_v| + r_B)``, i.e. at most ``(γ|A_v| + r_A)|B_v| + (|A_v| + r_A) r_B``; each product of
    nonnegative matrices is bounded from its float value (``exact ≤ fl / (1 − γ_n)``), and ``n η`` by
    :data:`_TINY`."""
    n = a.v.shape[1]
    g = _gamma(n + 1)
    av = a.v.abs()
    v = a.v @ b.v
    left = g * av if a.r is None else g * av + a.r
    bound = left @ b.v.abs()
    if b.r is not None:
        bound = bound + (av if a.r is None else av + a.r) @ b.r
    return _Box(v, (bound / (1 - g) + _TINY) * _UP)


def _sum_up(t: Tensor) -> float:
    """An upper bound on the exact sum of the nonnegative floats ``t`` (any order: ``fl ≥ (1 − γ_N) exact``)."""
    return float(t.sum()) / (1 - _gamma(t.numel())) * _UP


def _interval(lo: float, hi: float):
    from flint import arb

    return arb(lo).union(arb(hi))


def _sum_sq(a: _Box):
    """A ball holding ``Σ X_ij²`` (the squared Frobenius norm) of the exact matrix ``X``: between the sums of
    ``max(|v| − r, 0)²`` and ``(|v| + r)²``, each square and sum rounded outwards."""
    v, n = a.v.abs(), a.v.numel()
    hi = v if a.r is None else v + a.r
    hi = _sum_up(hi * hi) * (1 + 4 * _U) + 2 * n * _ETA
    lo = v if a.r is None else (v - a.r).clamp(min=0)
    lo = max(float((lo * lo).sum()) * (1 - _gamma(n + 4)) - 2 * n * _ETA, 0.0)
    return _interval(lo, hi)


def _sum_prod(a: _Box, b: _Box):
    """A ball holding ``Σ X_ij Y_ij`` (``⟨X, Y⟩``) of the exact matrices ``X``, ``Y`` of one shape:
    ``|fl(Σ v_X v_Y) − Σ v_X v_Y| ≤ γ_{N+1} Σ |v_X v_Y| + N η`` plus the radii's share."""
    from flint import arb

    prods = a.v * b.v
    n = prods.numel()
    base = float(prods.sum())
    rad = _gamma(n + 1) * _sum_up(prods.abs()) + 2 * n * _ETA
    if a.r is not None or b.r is not None:
        av, bv = a.v.abs(), b.v.abs()
        rad += _sum_up(av * b.rad() + a.rad() * (bv + b.rad())) * (1 + 4 * _U)
    return arb(base) + arb(0, rad * _UP)


def _sqrt(x):
    """A ball holding ``√y`` for every ``y ≥ 0`` of the ball ``x`` (the part below 0 that outward rounding adds
    to an enclosure of a sum of squares is dropped: arb's square root of it would be indeterminate)."""
    from flint import arb

    lo, hi = max(_lower(x), 0.0), _upper(x)
    return arb(lo).sqrt().union(arb(hi).sqrt())


def _upper(x) -> float:
    """A float at least every point of the ball ``x`` (for reports; decisions compare balls)."""
    from flint import arb

    u = x.mid() + x.rad()
    f = float(u)
    while not arb(f) >= u:
        f = math.nextafter(f, math.inf)
    return f


def _lower(x) -> float:
    """A float at most every point of the ball ``x``."""
    from flint import arb

    lo = x.mid() - x.rad()
    f = float(lo)
    while not arb(f) <= lo:
        f = math.nextafter(f, -math.inf)
    return f


@one_thread()
def rigorous_certificate(stats: RidgeStats, index: int, weight: Tensor, lam: float, *, layer: int | None = None,
                         max_excess_rel: float = MAX_EXCESS_REL, bias: Tensor | None = None) -> dict:
    """A rigorous certificate of one late layer's stored map: every number below is an enclosure, not a float
    estimate. Matrix products run in float64 with a proven elementwise bound on their error (:func:`_gamma`:
    ``|fl(xᵀy) − xᵀy| ≤ γ_n |x|ᵀ|y|`` for IEEE 754 binary64 in any order of summation, plus the radii of the
    operands), and so do sums of their entries (``γ_N`` for ``N`` terms); every square root, quotient and
    comparison of the resulting scalars runs in ball arithmetic (python-flint ``arb``, :data:`ARB_PREC` bits).

    The ridge problem certified is the one the solve read: the objective
    ``J(W) = ⟨W, G W⟩ − 2⟨W, B⟩ + Σ‖x − x̄‖² + λ‖W − W₀‖²`` with ``G``, ``B`` the float64 centred statistics of
    :meth:`RidgeStats.centred` (with :func:`as_solved`'s context scaling), ``λ`` the float64 stored, prior
    ``W₀`` = ``I`` (``[I; 0]`` for context maps). Each float64 is an exact rational; ``J`` reads only the
    symmetric part of ``G`` (the float64 centring leaves it asymmetric in the last bits), so
    ``A = ½(G + Gᵀ) + λI`` and ``B + λW₀`` are exact balls. For the stored map ``W_s`` (float32, exact in the balls):

    1. ``μ``: a float Cholesky ``L`` of ``A − σI`` and the ball enclosure of ``E = A − σI − LLᵀ`` give
       ``λ_min(A) ≥ σ − ‖E‖_F =: μ`` (``LLᵀ ⪰ 0``); ``μ > 0`` must hold certainly.
    2. ``R_s = A W_s − (B + λW₀)`` enclosed entrywise; ``‖R_s‖_F`` upper bound ``r``. By
       **``KvaLean.gram_err_le_residual``** (``μ²‖W − W★‖²_F ≤ ‖R‖²_F`` for this ``A``, all output columns):
       ``‖W_s − W★‖_F ≤ r / μ``, with ``W★`` the exact minimiser.
    3. The objective gap, by **``KvaLean.gram_gap_le``** (from ``KvaLean.gram_gap``, ``J(W) − J(W★) =
       ‖W − W★‖²_A`` for this Gram-form ``J``, and the triangle inequality in the ``A``-norm) through the
       float64 solve ``W_64`` (any point would do; it is not trusted): ``J(W_s) − J(W★) ≤ (p + q)²`` with
       ``p² ≥ ‖D‖²_A = ⟨D, A D⟩`` enclosed (``D = W_s − W_64``) and ``q² ≥ ‖R_64‖²_F / μ`` (which bounds
       ``‖W_64 − W★‖²_A``).
    4. The bias (when ``bias`` is given): the optimal intercept of ``W★`` is ``b★ = x̄ − h̄ W★`` (the float64
       means of :meth:`RidgeStats.means`, as the fit reads them); by **``KvaLean.bias_err_le``**
       ``‖b_s − b★‖ ≤ ‖b_s − (x̄ − h̄ W_s)‖ + ‖h̄‖ ‖W_s − W★‖_F``, with the first term enclosed and the last
       from step 2.

    The criterion (``passed``): ``μ > 0``; the gap bound at most ``max_excess_rel · J(W_s)`` (the lower
    end of ``J``'s ball) plus the float32 storage allowance ``‖A‖_F (2⁻²³ ‖W_64‖_F)²`` (what rounding ``W★``
    to float32 alone may cost); and ``‖b_s − (x̄ − h̄ W_s)‖`` at most ``2⁻²² (‖b_s‖ + ‖ |h̄| |W_s| ‖)`` (the
    float32 rounding of ``b`` and of ``W``), all compared as balls. Not certified: the rounding in forming
    the centred ``G``, ``B`` and the means from the saved sums (the certificate is about the problem with
    those float64 matrices, the one the solve used).

    Returns:
        A JSON-able dict of float upper (``*_upper``) and lower (``*_lower``) ends and ``passed``.

    Raises:
        InputError: ``weight`` not ``[f, hidden]`` for layer-input statistics, or ``bias`` not ``[hidden]``.
    """
    from flint import arb, ctx

    from .errors import SingularGramError
    from .ridge import default_prior, solve_ridge

    old_prec = ctx.prec
    ctx.prec = ARB_PREC
    try:
        f = stats.features
        gram, cross, sxx = stats.centred(index)
        w = weight.detach().to(F64).cpu()
        if stats.targets != "inputs" or tuple(w.shape) != (f, stats.hidden):
            raise InputError(f"weight must be [{f}, {stats.hidden}] for these statistics (layer-input maps); got "
                             f"{tuple(w.shape)} for {stats.targets!r} targets")
        if bias is not None and tuple(bias.shape) != (stats.hidden,):
            raise InputError(f"bias must be [{stats.hidden}] for these statistics; got {tuple(bias.shape)}")
        prior = default_prior(stats)
        eye = torch.eye(f, dtype=F64)
        lam_b = arb(float(lam))
        # the centring rounds G's two triangles in different orders, so the float64 G is not exactly symmetric;
        # the objective reads only its symmetric part (⟨W, G W⟩ = ⟨W, ½(G + Gᵀ) W⟩), which is the A certified
        sym = _box_add(_Box(gram), _Box(gram.T))
        sym = _Box(sym.v * 0.5, sym.r * 0.5)  # halving is exact but where it underflows (covered by _TINY)
        a = _box_add(sym, _Box(lam * eye))
        a.r = a.r + _TINY
        rhs = _box_add(_Box(cross), _Box(lam * prior))  # λW₀: λ times entries 0 and 1, exact
        # 1. a certified lower bound on the spectrum of A
        evals = torch.linalg.eigvalsh(gram + lam * eye)
        sigma = 0.5 * float(evals[0]) if float(evals[0]) > 0 else 0.0
        factor, info = torch.linalg.cholesky_ex(gram + (lam - sigma) * eye)
        if info.item() != 0 or not sigma > 0:
            mu = arb(0)
            eps_up = math.inf
        else:
            llt = _box_mm(_Box(factor), _Box(factor.T))
            e = _box_add(_box_add(a, _Box(sigma * eye), -1.0), llt, -1.0)  # E = A − σI − LLᵀ
            eps = _sqrt(_sum_sq(e))
            eps_up = _upper(eps)
            mu = arb(sigma) - eps
        mu_ok = bool(mu > 0)
        # 2. the stored map's residual
        ws = _Box(w)
        aws = _box_mm(a, ws)
        res_s = _box_add(aws, rhs, -1.0)
        r_s = _sqrt(_sum_sq(res_s))
        # 3. the gap, through the float64 solve
        try:
            w64 = solve_ridge(gram, cross, lam, prior)
        except SingularGramError:
            w64 = w
        d_ = _box_add(ws, _Box(w64), -1.0)
        ad = _box_mm(a, d_)
        res_64 = _box_add(_box_add(aws, ad, -1.0), rhs, -1.0)  # A W_64 − (B + λW₀)
        r_64sq = _sum_sq(res_64)
        dad = _sum_prod(d_, ad)
        if mu_ok:
            # ⟨D, A D⟩ ≥ 0 as A ⪰ μI: its ball's upper end (a float, exact as a ball) bounds it
            gap = (arb(max(_upper(dad), 0.0)).sqrt() + _sqrt(r_64sq / mu)) ** 2
            err = r_s / mu
        else:
            gap = err = None
        # J(W_s) = ⟨W, G W⟩ − 2⟨W, B⟩ + Σ‖x − x̄‖² + λ‖W − W₀‖², with G W = A W − λ W
        objective = (_sum_prod(ws, aws) - lam_b * _sum_sq(ws) - 2 * _sum_prod(ws, _Box(cross))
                     + arb(float(sxx)) + lam_b * _sum_sq(_box_add(ws, _Box(prior), -1.0)))
        a_fro = _sqrt(_sum_sq(a))
        floor = a_fro * (arb(2.0 ** -23) * _sqrt(_sum_sq(_Box(w64)))) ** 2
        gap_ok = bool(mu_ok and gap is not None and gap <= arb(max_excess_rel) * objective + floor)
        passed = gap_ok
        # 4. the bias: b★ = x̄ − h̄ W★ (KvaLean.bias_err_le)
        bias_fields = {}
        if bias is not None:
            mh, mx = stats.means()
            b_s = _Box(bias.reshape(1, -1))
            hbar = _Box(mh.reshape(1, -1))
            cons = _sqrt(_sum_sq(_box_add(b_s, _box_add(_Box(mx[index].reshape(1, -1)), _box_mm(hbar, ws), -1.0),
                                    -1.0)))
            eta = _sqrt(_sum_sq(hbar))
            spread = _sqrt(_sum_sq(_box_mm(_Box(mh.abs().reshape(1, -1)), _Box(w.abs()))))
            allowance = arb(2.0 ** -22) * (_sqrt(_sum_sq(b_s)) + spread)
            bias_ok = bool(cons <= allowance)
            passed = passed and bias_ok
            bias_fields = {
                "bias_residual_upper": _upper(cons), "bias_allowance_lower": _lower(allowance),
                "bias_error_bound": _upper(cons + eta * err) if err is not None else math.inf,
                "bias_passed": bias_ok,
            }
        cert = {
            "layer": layer, "index": index, "features": f, "lambda": float(lam), "precision_bits": ARB_PREC,
            "sigma": sigma, "cholesky_error_fro_upper": eps_up,
            "reg_eig_lower": _lower(mu) if mu_ok else 0.0,
            "residual_fro_upper": _upper(r_s), "residual_fro_lower": _lower(r_s),
            "residual64_fro_upper": _upper(_sqrt(r_64sq)),
            "storage_a_norm_upper": math.sqrt(max(_upper(dad), 0.0)) * (1 + 2 * EPS),
            "weight_error_bound": _upper(err) if err is not None else math.inf,
            "excess_bound": _upper(gap) if gap is not None else math.inf,
            "objective_lower": _lower(objective), "objective_upper": _upper(objective),
            "storage_floor_upper": _upper(floor), "max_excess_rel": max_excess_rel, "gap_passed": gap_ok,
            "passed": passed,
            **bias_fields,
        }
        obj_lo = cert["objective_lower"]
        cert["excess_rel_upper"] = cert["excess_bound"] / obj_lo if obj_lo > 0 else math.inf
        return cert
    finally:
        ctx.prec = old_prec


def rigorous_failures(cert: dict) -> list[str]:
    """What a :func:`rigorous_certificate` fails, in words (empty when it passed)."""
    if cert["passed"]:
        return []
    if not cert["reg_eig_lower"] > 0:
        return [f"the enclosure gives no positive lower bound on the spectrum of G + λI (Cholesky shift σ = "
                f"{cert['sigma']:.3e}, error ‖E‖_F ≤ {cert['cholesky_error_fro_upper']:.3e}): the minimiser is not "
                "certified unique; refit with a larger λ (`ridgefill calibrate --lam`)"]
    out = []
    if not cert.get("gap_passed", False):
        out.append(f"the certified objective gap J(W) − J(W★) ≤ {cert['excess_bound']:.3e} is more than "
                   f"{cert['max_excess_rel']:g} of J(W) ≥ {cert['objective_lower']:.6e} plus the float32 storage "
                   f"allowance {cert['storage_floor_upper']:.1e} (‖R‖_F ≤ {cert['residual_fro_upper']:.3e}): the "
                   "stored map is not the ridge solve of these statistics; recalibrate with `ridgefill calibrate`")
    if not cert.get("bias_passed", True):
        out.append(f"the stored bias is {cert['bias_residual_upper']:.3e} from x̄ − h̄ W (more than the float32 "
                   f"allowance {cert['bias_allowance_lower']:.3e}): the stored bias is not the intercept of the stored "
                   "map; recalibrate with `ridgefill calibrate`")
    return out


def rigorous_certify_maps(maps_path: str | Path, *, stats_file: str | Path | None = None,
                          max_excess_rel: float = MAX_EXCESS_REL, layers: Sequence[int] | None = None) -> list[dict]:
    """:func:`rigorous_certificate` of every late layer (or the late-layer indices ``layers``) of the maps at
    ``maps_path``, weights and biases, with the same file checks as :func:`certify_maps`."""
    maps_path = Path(maps_path)
    maps, stats = _maps_and_stats(maps_path, stats_file)
    solved, weights = as_solved(stats, maps)
    chosen = range(len(maps.lambdas)) if layers is None else layers
    return [rigorous_certificate(solved, i, weights[i], maps.lambdas[i], layer=maps.split + 1 + i,
                                 max_excess_rel=max_excess_rel, bias=maps.biases[i]) for i in chosen]
