"""The maps file: per-late-layer ``W_l``, ``b_l`` and their provenance, in ``safetensors``.

Tensors: ``weights`` ``[layers, d, d]`` and ``biases`` ``[layers, d]`` (float32), where entry ``i`` is
late layer ``S + 1 + i``. Metadata (a JSON string under the key ``ridgefill``): format version, model
name, model hash (config and weight shapes), weight fingerprint, split ``S``, ``λ`` per layer, calibration
token count, text SHA-256 and held-out diagnostics. Files are written atomically: a failed or
interrupted save never replaces an existing file.

Beside a maps file ``<name>.safetensors``, :meth:`RidgeMaps.save` also writes the float64 statistics the
maps were solved on, as ``<name>.stats.safetensors`` (:func:`save_stats`), when it has them (maps from
:func:`ridgefill.calibrate.calibrate` do); ``ridgefill certify`` reads them (:mod:`ridgefill.certify`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from .errors import InputError, MapsFormatError, MapsMismatchError
from .fileio import atomic_write
from .ridge import RidgeStats

FORMAT_VERSION = 1
_CONFIG_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "rope_parameters",
                "rope_theta", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings")


def model_hash(model: torch.nn.Module) -> str:
    """SHA-256 (hex, 16 chars) of the model's architecture config and the names and shapes of its weights."""
    cfg = model.config.to_dict()
    desc = {k: cfg.get(k) for k in _CONFIG_KEYS}
    desc["weights"] = [(n, list(p.shape)) for n, p in model.named_parameters()]
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def weight_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 (hex, 16 chars) of the first 16 values of every weight: tells fine-tunes of one
    architecture apart without reading all weights."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().flatten()[:16].to(torch.float32).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class RidgeMaps:
    """Fitted maps for one model and split.

    Attributes:
        split: ``S``; maps exist for layers ``S+1 .. L-1``.
        weights: ``[L-S-1, d, d]``; biases: ``[L-S-1, d]`` (any float dtype; float32 on disk).
        lambdas: ``λ`` per late layer.
        meta: provenance (see module docstring).
        stats: the float64 statistics the maps were solved on, or ``None`` (not kept by :meth:`to`).
        mean_h, mean_x: calibration means ``h̄`` ``[d]`` and ``x̄_l`` ``[L-S-1, d]`` (stored as tensors
            ``mean_h`` / ``mean_x``; ``None`` in files written before they were added). They give the
            centred identity fill ``W = I, b_l = x̄_l − h̄`` (:meth:`centred_biases`), the ``λ → ∞`` limit
            of the ridge maps with their unpenalised intercept.
    """

    split: int
    weights: Tensor
    biases: Tensor
    lambdas: list[float]
    meta: dict = field(default_factory=dict)
    stats: RidgeStats | None = field(default=None, repr=False, compare=False)
    mean_h: Tensor | None = field(default=None, repr=False, compare=False)
    mean_x: Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        """``"inputs"`` (``W_l`` ``[d, d]`` predicts the layer input ``x_l``) or ``"kv"`` (``W_l``
        ``[d, 2·kv_dim]`` predicts the layer's pre-RoPE keys and values directly: K/V maps)."""
        return self.meta.get("kind", "inputs")

    @property
    def first_layer(self) -> int:
        return self.split + 1

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """``(W_l [d, d], b_l [d])`` for late layer ``layer`` (absolute index, ``> S``)."""
        return self.weights[layer - self.first_layer], self.biases[layer - self.first_layer]

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "RidgeMaps":
        """A copy with the tensors cast (the fill applies the maps in the model's dtype)."""
        cast = (lambda t: None if t is None else t.to(device=device, dtype=dtype))
        return RidgeMaps(self.split, cast(self.weights), cast(self.biases), list(self.lambdas), dict(self.meta),
                         mean_h=cast(self.mean_h), mean_x=cast(self.mean_x))

    def centred_biases(self) -> Tensor:
        """``b_l = x̄_l − h̄`` ``[L-S-1, d]``: the biases of the centred identity fill (``W = I``), the
        limit of the ridge maps as ``λ → ∞`` (Lean: ``KvaLean.Identity``).

        Raises:
            MapsFormatError: the maps file holds no calibration means (written before they were
                stored): refit it with ``ridgefill calibrate``.
        """
        if self.mean_h is None or self.mean_x is None:
            raise MapsFormatError("these maps hold no calibration means, which the centred identity fill needs; "
                                  "refit them with `ridgefill calibrate` (or `ridgefill run`)")
        return self.mean_x - self.mean_h[None, :]

    def check_model(self, model: torch.nn.Module, split: int | None = None) -> None:
        """Check these maps belong to ``model`` (and to ``split`` when given).

        Raises:
            MapsMismatchError: another architecture, other weights, another split, or shapes that do
                not fit the model. The message says which and how to refit.
        """
        fix = "fit maps for this model with `ridgefill calibrate`"
        cfg = model.config
        if self.kind not in ("inputs", "kv"):
            raise MapsMismatchError(f"maps of kind {self.kind!r} are not understood (kinds: 'inputs', 'kv'); {fix}")
        out = cfg.hidden_size
        if self.kind == "kv":
            from .adapters import adapter_for

            ad = adapter_for(model)
            out = 2 * ad.num_kv_heads * ad.head_dim
        expected = (cfg.num_hidden_layers - self.split - 1, cfg.hidden_size, out)
        if split is not None and split != self.split:
            raise MapsMismatchError(f"maps were fitted at split S={self.split}, but split S={split} was "
                                    f"requested; use S={self.split} or {fix} at S={split}")
        if not 0 <= self.split <= cfg.num_hidden_layers - 2:
            raise MapsMismatchError(f"maps split S={self.split} is outside this model's 0..{cfg.num_hidden_layers - 2}; {fix}")
        if tuple(self.weights.shape) != expected or tuple(self.biases.shape) != expected[::2]:
            raise MapsMismatchError(
                f"maps have weights {tuple(self.weights.shape)} and biases {tuple(self.biases.shape)}, but this "
                f"model at S={self.split} needs {expected} and {expected[::2]}; {fix}")
        want = self.meta.get("model_hash")
        if want is not None and want != model_hash(model):
            raise MapsMismatchError(
                f"maps were fitted for model {self.meta.get('model_name')!r} (hash {want}), which has a "
                f"different architecture from this one (hash {model_hash(model)}); {fix}")
        want = self.meta.get("weight_fingerprint")
        if want is not None and want != weight_fingerprint(model):
            raise MapsMismatchError(
                f"maps were fitted for model {self.meta.get('model_name')!r} with other weights "
                f"(fingerprint {want}, this model {weight_fingerprint(model)}); {fix}")

    def save(self, path: str | os.PathLike) -> Path:
        """Write the maps to ``path`` atomically (temp file in the same folder, then rename), and their
        statistics, when present, to :func:`stats_path` ``(path)``."""
        meta = dict(self.meta, format_version=FORMAT_VERSION, split=self.split, lambdas=self.lambdas)
        tensors = {"weights": self.weights.detach().to(torch.float32).contiguous().cpu(),
                   "biases": self.biases.detach().to(torch.float32).contiguous().cpu()}
        if self.mean_h is not None and self.mean_x is not None:
            tensors["mean_h"] = self.mean_h.detach().to(torch.float32).contiguous().cpu()
            tensors["mean_x"] = self.mean_x.detach().to(torch.float32).contiguous().cpu()
        out = atomic_write(path, lambda tmp: save_file(
            tensors, tmp, metadata={"ridgefill": json.dumps(meta, sort_keys=True)}))
        if self.stats is not None:
            save_stats(stats_path(path), self.stats, {
                "maps_sha256": maps_digest(tensors["weights"], tensors["biases"]), "split": self.split,
                "model_hash": self.meta.get("model_hash"), "text_sha256": self.meta.get("text_sha256")})
        return out


def maps_digest(weights: Tensor, biases: Tensor) -> str:
    """SHA-256 (hex) of the maps as stored: float32 ``weights`` ``[layers, d, d]`` then ``biases``
    ``[layers, d]``. Ties a statistics file to the maps solved from it."""
    h = hashlib.sha256()
    for t in (weights, biases):
        h.update(t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def stats_path(maps_path: str | os.PathLike) -> Path:
    """The statistics file beside a maps file: ``<name>.stats.safetensors`` for ``<name>.safetensors``."""
    p = Path(maps_path)
    stem = p.name.removesuffix(".safetensors")
    return p.with_name(stem + ".stats.safetensors")


_STATS_TENSORS = ("shift_h", "shift_x", "sum_h", "gram", "sum_x", "cross", "sq_x")


def save_stats(path: str | os.PathLike, stats: RidgeStats, meta: dict) -> Path:
    """Write :class:`RidgeStats` (float64 tensors, see its docstring for shapes) and ``meta`` (JSON
    metadata, e.g. ``maps_sha256``) to ``path`` atomically."""
    if stats.count == 0:
        raise InputError("cannot save empty statistics (no calibration rows)")
    tensors = {k: getattr(stats, k).detach().to(torch.float64).contiguous().cpu() for k in _STATS_TENSORS}
    meta = dict(meta, format_version=FORMAT_VERSION, count=stats.count, layers=stats.layers,
                hidden=stats.hidden, outputs=stats.outputs, targets=stats.targets)
    return atomic_write(path, lambda tmp: save_file(
        tensors, tmp, metadata={"ridgefill_stats": json.dumps(meta, sort_keys=True)}))


def load_stats(path: str | os.PathLike) -> tuple[RidgeStats, dict]:
    """Read a statistics file written by :func:`save_stats`.

    Returns:
        ``(stats, meta)``: float64 :class:`RidgeStats` on the CPU and the file's metadata.

    Raises:
        InputError: the file does not exist.
        MapsFormatError: not a statistics file, corrupted, or shapes that disagree with the metadata.
    """
    path = Path(path)
    redo = "recalibrate with `ridgefill calibrate`, which writes the statistics beside the maps"
    if not path.is_file():
        raise InputError(f"statistics file {str(path)!r} does not exist; {redo}")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("ridgefill_stats")
        tensors = load_file(str(path))
        meta = json.loads(raw) if raw is not None else None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise MapsFormatError(f"statistics file {str(path)!r} is truncated or corrupted ({e}); {redo}") from e
    if meta is None or set(tensors) != set(_STATS_TENSORS) or meta.get("format_version") != FORMAT_VERSION:
        raise MapsFormatError(f"{str(path)!r} is not a RidgeFill statistics file of format version "
                              f"{FORMAT_VERSION} (tensors {sorted(tensors)}); {redo}")
    n, d = meta.get("layers"), meta.get("hidden")
    targets = meta.get("targets", "inputs")
    if targets not in ("inputs", "kv"):
        raise MapsFormatError(f"statistics file {str(path)!r} has targets {targets!r} (expected 'inputs' or 'kv'); {redo}")
    stats = RidgeStats(n, d, meta.get("count"), tensors["shift_h"], tensors["shift_x"], meta.get("outputs", d),
                       targets)
    for k in _STATS_TENSORS[2:]:
        if tensors[k].shape != getattr(stats, k).shape:
            raise MapsFormatError(f"statistics file {str(path)!r}: tensor {k} has shape {tuple(tensors[k].shape)}, "
                                  f"expected {tuple(getattr(stats, k).shape)} for {n} layers of size {d}; {redo}")
        setattr(stats, k, tensors[k])
    if tensors["shift_h"].shape != (d,) or tensors["shift_x"].shape != (n, stats.outputs):
        raise MapsFormatError(f"statistics file {str(path)!r} has shifts of the wrong shape; {redo}")
    return stats, meta


def load_maps(path: str | os.PathLike) -> RidgeMaps:
    """Read a maps file written by :meth:`RidgeMaps.save`.

    Returns:
        :class:`RidgeMaps` with float32 tensors on the CPU.

    Raises:
        InputError: the file does not exist.
        MapsFormatError: not a safetensors file, truncated or corrupted, missing tensors or metadata,
            an unknown format version, non-finite values, or shapes that disagree with the metadata.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"maps file {str(path)!r} does not exist; create it with `ridgefill calibrate`")
    redo = "refit it with `ridgefill calibrate`"
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("ridgefill")
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise MapsFormatError(f"maps file {str(path)!r} is truncated or corrupted ({e}); {redo}") from e
    if raw is None or set(tensors) not in ({"weights", "biases"}, {"weights", "biases", "mean_h", "mean_x"}):
        raise MapsFormatError(f"{str(path)!r} is a safetensors file but not a RidgeFill maps file "
                              f"(tensors {sorted(tensors)}); {redo}")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as e:
        raise MapsFormatError(f"maps metadata in {str(path)!r} is not valid JSON ({e}); {redo}") from e
    if meta.get("format_version") != FORMAT_VERSION:
        raise MapsFormatError(f"maps file {str(path)!r} has format version {meta.get('format_version')}, "
                              f"this RidgeFill reads version {FORMAT_VERSION}; {redo}")
    w, b = tensors["weights"], tensors["biases"]
    lambdas = meta.pop("lambdas", None)
    split = meta.pop("split", None)
    square = meta.get("kind", "inputs") == "inputs"
    if (w.ndim != 3 or (square and w.shape[1] != w.shape[2]) or b.shape != (w.shape[0], w.shape[2])
            or not isinstance(split, int)
            or not isinstance(lambdas, list) or len(lambdas) != w.shape[0]):
        raise MapsFormatError(f"maps file {str(path)!r} has inconsistent shapes: weights {tuple(w.shape)}, "
                              f"biases {tuple(b.shape)}, {len(lambdas or [])} λ values, split {split!r}; {redo}")
    mean_h, mean_x = tensors.get("mean_h"), tensors.get("mean_x")
    if mean_h is not None and (mean_h.shape != w.shape[1:2] or mean_x.shape != w.shape[::2]):
        raise MapsFormatError(f"maps file {str(path)!r} has calibration means of shapes {tuple(mean_h.shape)} and "
                              f"{tuple(mean_x.shape)}, expected {tuple(w.shape[1:2])} and {tuple(b.shape)}; {redo}")
    if not all(torch.isfinite(t).all() for t in tensors.values()):
        raise MapsFormatError(f"maps file {str(path)!r} holds NaN or Inf values; {redo}")
    return RidgeMaps(split, w, b, [float(v) for v in lambdas], meta, mean_h=mean_h, mean_x=mean_x)
