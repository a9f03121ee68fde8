"""The maps file: per-late-layer ``W_l``, ``b_l`` and their provenance, in ``safetensors``.

Tensors: ``weights`` ``[layers, f, k]`` and ``biases`` ``[layers, k]`` (float32), where entry ``i`` is
late layer ``S + 1 + i``; ``f = d`` (or ``2d`` for context maps, metadata ``context`` = 1, whose input is
``[h_S(t), h_S(t−1)]``), ``k = d`` (input maps) or ``2·kv_dim`` (K/V maps, metadata ``kind`` = ``"kv"``). Metadata (a JSON string under the key ``ridgefill``): format version, model
name, model hash (config and weight shapes), weight fingerprint (exact, in the fitting dtype), weight sample
(the first values of every weight, which recognise the same weights loaded in another dtype), the fitting
dtype and device, split ``S``, ``λ`` per layer, calibration token count, text SHA-256 and held-out
diagnostics. :func:`load_maps` checks the types of the keys it reads and keeps any other keys as they are. Files are written atomically: a failed or
interrupted save never replaces an existing file.

Beside a maps file ``<name>.safetensors``, :meth:`RidgeMaps.save` also writes the float64 statistics the
maps were solved on, as ``<name>.stats.safetensors`` (:func:`save_stats`), when it has them (maps from
:func:`ridgefill.calibration.calibrate` do); ``ridgefill certify`` reads them (:mod:`ridgefill.certify`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from .errors import InputError, MapsFormatError, MapsMismatchError
from .fileio import atomic_write, atomic_write_all, file_lock
from .integrity import KEY as HASH_KEY, content_hashes, verify
from .ridge import CONTEXT_PENALTY_RANGE, RidgeStats, check_context_penalty
from .select import as_select
from .validate import check_context, finite_float, is_int

#: The maps file's format: version 2 adds the tensor ``induction`` and the metadata ``select``; version 1
#: files are still read (:data:`READ_VERSIONS`).
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
#: The statistics file's format.
STATS_FORMAT_VERSION = 1
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


#: Values taken from the start of every weight for :func:`weight_sample`.
SAMPLE_VALUES = 4


def weight_sample(model: torch.nn.Module) -> list[float]:
    """The first :data:`SAMPLE_VALUES` values of every weight, as Python floats, in parameter order.

    Stored in the maps' metadata so :meth:`RidgeMaps.check_model` can recognise the same weights loaded
    in another dtype (the values then agree to that dtype's rounding) or on another device."""
    out: list[float] = []
    for _, p in model.named_parameters():
        out.extend(p.detach().flatten()[:SAMPLE_VALUES].to(device="cpu", dtype=torch.float64).tolist())
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def model_provenance(model: torch.nn.Module) -> dict:
    """What a maps file records about the model it was fitted on: ``model_hash`` (:func:`model_hash`),
    ``weight_fingerprint`` (:func:`weight_fingerprint`, exact in that dtype), ``weight_sample``
    (:func:`weight_sample`), ``weights_dtype`` (e.g. ``"float32"``) and ``weights_device`` (e.g. ``"cpu"``)."""
    p = next(model.parameters())
    return {"model_hash": model_hash(model), "weight_fingerprint": weight_fingerprint(model),
            "weight_sample": weight_sample(model), "weights_dtype": _dtype_name(p.dtype),
            "weights_device": str(p.device)}


def same_weights(want: list[float], have: list[float], dtypes: list[torch.dtype]) -> tuple[bool, float]:
    """Whether two :func:`weight_sample` lists (Python floats, same order and length) agree to the rounding
    of the coarsest of ``dtypes``, elementwise: ``|a − b| ≤ eps·max(|a|, |b|) + tiny``; also the largest
    relative difference seen (``inf`` for lists of other lengths). The vLLM plugin uses it too."""
    if len(want) != len(have):
        return False, float("inf")
    a = torch.tensor(want, dtype=torch.float64)
    b = torch.tensor(have, dtype=torch.float64)
    eps = max(torch.finfo(d).eps for d in dtypes)
    tiny = max(torch.finfo(d).smallest_normal for d in dtypes)
    diff = (a - b).abs()
    ok = bool((diff <= eps * torch.maximum(a.abs(), b.abs()) + tiny).all()) if a.numel() else True
    rel = float((diff / torch.maximum(a.abs(), b.abs()).clamp_min(tiny)).max()) if a.numel() else 0.0
    return ok, rel


def predict_inputs(h_split: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """The RidgeFill prediction ``x̂_l = h_S W_l + b_l``.

    Args:
        h_split: ``[batch, rows, f]`` split state of the filled rows (``f = d``), or for context maps their
            :func:`context_features` (``f = 2d``).
        weight: ``W_l`` ``[f, k]``; bias: ``b_l`` ``[k]`` (same dtype as ``h_split``); ``k = d`` for
            input maps, ``2·kv_dim`` for K/V maps (whose prediction is the pre-RoPE keys and values).

    Returns:
        ``[batch, rows, k]``. With ``W = I`` and ``b = 0`` it is ``h_S`` itself, the identity fill
        (Lean: ``KvaLean.Identity.identity_fill_eq``).
    """
    out = torch.addmm(bias, h_split.reshape(-1, h_split.shape[-1]), weight)
    return out.view(*h_split.shape[:-1], weight.shape[-1])


def context_features(h_split: Tensor, context: int) -> Tensor:
    """The input rows of the maps: ``h_S`` itself (``context = 0``), or for context maps (``context = 1``)
    each row's split state beside the previous row's, ``[h_S(t), h_S(t−1)]``, with zeros before row 0.

    Row ``t``'s features read rows ``t − 1`` and ``t`` only, so a filled row's prediction stays causal
    (Lean: ``KvaLean.Decoder.fillCache_ofContextMap``, ``KvaLean.Decoder.filled_causal``). The first row of
    every calibration chunk (position 0) gets zeros as its previous state, as row 0 of a prompt does.

    Args:
        h_split: ``[..., rows, d]`` split states of consecutive rows from position 0 (any float dtype).
        context: ``0`` or ``1``.

    Returns:
        ``[..., rows, d]`` (``h_split`` itself) or ``[..., rows, 2d]``, in the dtype of ``h_split``.

    Raises:
        InputError: ``context`` not 0 or 1.
    """
    context = check_context(context)
    if context == 0:
        return h_split
    prev = torch.nn.functional.pad(h_split.narrow(-2, 0, h_split.shape[-2] - 1), (0, 0, 1, 0))
    return torch.cat([h_split, prev], -1)


def context_rows(h_split: Tensor, rows: Tensor, context: int) -> Tensor:
    """``context_features(h_split, context)[:, rows]`` without building the features of the other rows.

    Args:
        h_split: ``[batch, N, d]`` split states of the rows ``0..N-1``.
        rows: ``[k]`` int64 positions (device index).
        context: ``0`` or ``1`` (:func:`context_features`).

    Returns:
        ``[batch, k, d]`` or ``[batch, k, 2d]`` (``[h_S(t), h_S(t−1)]``, zeros before row 0).
    """
    cur = h_split.index_select(1, rows)
    if context == 0:
        return cur
    prev = h_split.index_select(1, (rows - 1).clamp(min=0)) * (rows > 0).to(h_split.dtype)[:, None]
    return torch.cat([cur, prev], -1)


@dataclass
class RidgeMaps:
    """Fitted maps for one model and split.

    Attributes:
        split: ``S``; maps exist for layers ``S+1 .. L-1``.
        weights: ``[L-S-1, f, k]``; biases: ``[L-S-1, k]`` (any float dtype; float32 on disk); ``f = d``, or
            ``2d`` for context maps (:attr:`context`); ``k = d`` for input maps, ``2·kv_dim`` for K/V maps.
        lambdas: ``λ`` per late layer.
        meta: provenance (see module docstring).
        stats: the float64 statistics the maps were solved on, or ``None`` (not kept by :meth:`to`).
        mean_h, mean_x: calibration means ``h̄`` ``[d]`` and ``x̄_l`` ``[L-S-1, d]`` (stored as tensors
            ``mean_h`` / ``mean_x``; ``None`` in files written before they were added). They give the
            centred identity fill ``W = I, b_l = x̄_l − h̄`` (:meth:`centred_biases`), the ``λ → ∞`` limit
            of the ridge maps with their unpenalised intercept.
        cov_h: calibration covariance of ``h_S`` ``[d, d]`` (tensor ``cov_h``; ``None`` in older files):
            the query-agnostic row selection ranks rows by their leverage under it
            (:func:`ridgefill.select.leverage_scores`).
        induction: the model's induction score per layer and head ``[L, heads]`` (tensor ``induction``,
            format version 2; ``None`` in older files): the heads row selection scores with
            (:func:`ridgefill.select.induction_scores`), computed once at calibration.
    """

    split: int
    weights: Tensor
    biases: Tensor
    lambdas: list[float]
    meta: dict = field(default_factory=dict)
    stats: RidgeStats | None = field(default=None, repr=False, compare=False)
    mean_h: Tensor | None = field(default=None, repr=False, compare=False)
    mean_x: Tensor | None = field(default=None, repr=False, compare=False)
    cov_h: Tensor | None = field(default=None, repr=False, compare=False)
    induction: Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def select(self) -> str | None:
        """The row selection setting these maps were tuned with (metadata ``select``, written by
        ``ridgefill tune``: ``"off"``, ``"one-pass"``, ``"two-pass"`` or a spec of
        :meth:`ridgefill.select.Select.parse`), which ``select="auto"`` follows; ``None`` when not recorded."""
        return self.meta.get("select")

    @property
    def kind(self) -> str:
        """``"inputs"`` (``W_l`` ``[d, d]`` predicts the layer input ``x_l``) or ``"kv"`` (``W_l``
        ``[d, 2·kv_dim]`` predicts the layer's pre-RoPE keys and values directly: K/V maps)."""
        return self.meta.get("kind", "inputs")

    @property
    def context(self) -> int:
        """Earlier rows each prediction reads (metadata ``context``; ``0`` in files written before it was
        added): ``0``, ``W_l`` ``[d, k]`` reads the row's own ``h_S``; ``1``, context maps, ``W_l``
        ``[2d, k]`` reads ``[h_S(t), h_S(t−1)]`` (:func:`ridgefill.fill.context_features`)."""
        return self.meta.get("context", 0)

    @property
    def context_penalty(self) -> float:
        """The ridge penalty the previous row's block of context maps was fitted with, as a multiple of
        ``λ`` (metadata ``context_penalty``; ``1`` when absent: maps without context, or context maps
        written before it was recorded; :func:`ridgefill.ridge.fit_maps`)."""
        return float(self.meta.get("context_penalty", 1.0))

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
                         mean_h=cast(self.mean_h), mean_x=cast(self.mean_x), cov_h=cast(self.cov_h),
                         induction=self.induction)

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
        if self.context not in (0, 1):
            raise MapsMismatchError(f"maps with context {self.context!r} are not understood (0 or 1); {fix}")
        expected = (cfg.num_hidden_layers - self.split - 1, cfg.hidden_size * (1 + self.context), out)
        if split is not None and split != self.split:
            raise MapsMismatchError(f"maps were fitted at split S={self.split}, but split S={split} was "
                                    f"requested; use S={self.split} or {fix} at S={split}")
        if not 0 <= self.split <= cfg.num_hidden_layers - 2:
            raise MapsMismatchError(f"maps split S={self.split} is outside this model's 0..{cfg.num_hidden_layers - 2}; {fix}")
        if tuple(self.weights.shape) != expected or tuple(self.biases.shape) != expected[::2]:
            raise MapsMismatchError(
                f"maps have weights {tuple(self.weights.shape)} and biases {tuple(self.biases.shape)}, but this "
                f"model at S={self.split} needs {expected} and {expected[::2]}; {fix}")
        heads = (cfg.num_hidden_layers, cfg.num_attention_heads)
        if self.induction is not None and tuple(self.induction.shape) != heads:
            raise MapsMismatchError(f"maps hold induction scores {tuple(self.induction.shape)}, but this model has "
                                    f"{heads[0]} layers of {heads[1]} heads; {fix}")
        want = self.meta.get("model_hash")
        if want is not None and want != model_hash(model):
            raise MapsMismatchError(
                f"maps were fitted for model {self.meta.get('model_name')!r} (hash {want}), which has a "
                f"different architecture from this one (hash {model_hash(model)}); {fix}")
        want = self.meta.get("weight_fingerprint")
        if want is None or want == weight_fingerprint(model):
            return  # no fingerprint recorded, or the same weights in the same dtype
        p = next(model.parameters())
        fit_dtype = self.meta.get("weights_dtype", "float32")
        fit_device = self.meta.get("weights_device", "cpu")
        here = f"{_dtype_name(p.dtype)} on {p.device}"
        there = f"{fit_dtype} on {fit_device}"
        name = self.meta.get("model_name")
        sample = self.meta.get("weight_sample")
        if sample is None:  # a file from before weight samples were stored: exact check only
            if fit_dtype != _dtype_name(p.dtype):
                raise MapsMismatchError(
                    f"maps were fitted for model {name!r} with its weights in {fit_dtype}, and this model is "
                    f"loaded in {_dtype_name(p.dtype)}: the dtype differs, so this maps file (which records "
                    f"only an exact fingerprint) cannot confirm the weights are the same; load the model with "
                    f"dtype=torch.{fit_dtype}, or {fix} (new maps files accept any dtype)")
            raise MapsMismatchError(
                f"maps were fitted for model {name!r} with other weights "
                f"(fingerprint {want}, this model {weight_fingerprint(model)}); {fix}")
        fit_t = getattr(torch, fit_dtype, None)
        dtypes = [p.dtype] + ([fit_t] if isinstance(fit_t, torch.dtype) and fit_t.is_floating_point else [])
        ok, rel = same_weights(sample, weight_sample(model), dtypes)
        if ok:
            return  # the same weights, loaded in another dtype or on another device
        differs = "" if there == here else f" (fitted in {there}, this model is {here}: beyond that rounding)"
        raise MapsMismatchError(
            f"maps were fitted for model {name!r} with other weights: sampled values differ by up to "
            f"{rel:.3g} relative{differs} (fingerprint {want}, this model {weight_fingerprint(model)}); {fix}")

    def save(self, path: str | os.PathLike) -> Path:
        """Write the maps to ``path`` atomically (temp file in the same folder, then rename), and their
        statistics, when present, to :func:`stats_path` ``(path)`` (a stale statistics file there is
        removed when there are none). Both are written under the lock :func:`pair_lock_path` ``(path)``,
        so concurrent saves to one path leave one save's maps and statistics, never a mix; the lock file is
        removed when the save ends."""
        w = self.weights
        if self.context not in (0, 1) or w.ndim != 3 or w.shape[1] % (1 + self.context) or (
                self.kind == "inputs" and w.shape[1] != w.shape[2] * (1 + self.context)):
            raise InputError(f"these maps' weights {tuple(w.shape)} do not fit their kind {self.kind!r} and context "
                             f"{self.context!r} (context maps read [h_S(t), h_S(t-1)]: weights [layers, 2d, k]; set "
                             "meta['context'] to what the weights read)")
        if "context_penalty" in self.meta:  # what load_maps would refuse is not written
            check_context_penalty(self.meta["context_penalty"], self.context)
        meta = dict(self.meta, format_version=FORMAT_VERSION, split=self.split, lambdas=self.lambdas)
        meta.pop(HASH_KEY, None)
        tensors = {"weights": self.weights.detach().to(torch.float32).contiguous().cpu(),
                   "biases": self.biases.detach().to(torch.float32).contiguous().cpu()}
        if self.mean_h is not None and self.mean_x is not None:
            tensors["mean_h"] = self.mean_h.detach().to(torch.float32).contiguous().cpu()
            tensors["mean_x"] = self.mean_x.detach().to(torch.float32).contiguous().cpu()
            if self.cov_h is not None:
                tensors["cov_h"] = self.cov_h.detach().to(torch.float32).contiguous().cpu()
        if self.induction is not None:
            tensors["induction"] = self.induction.detach().to(torch.float32).contiguous().cpu()
        path = Path(path)
        if path.is_dir():
            raise InputError(f"cannot write maps to {str(path)!r}: it is a folder; give a file name such as "
                             f"{str(path / 'maps.safetensors')!r}")
        try:  # fail before anything is written when the metadata cannot be stored
            meta[HASH_KEY] = content_hashes(tensors, maps_fields(meta))
            text = json.dumps(meta, sort_keys=True)
        except (TypeError, ValueError) as e:
            raise InputError(f"maps metadata cannot be written as JSON ({e}); use plain numbers and strings") from e
        writes = []
        if self.stats is not None:  # statistics first, maps last: both written before either is renamed
            stats_tensors, stats_text = _stats_payload(self.stats, {
                "maps_sha256": maps_digest(tensors["weights"], tensors["biases"]), "split": self.split,
                "model_hash": self.meta.get("model_hash"), "text_sha256": self.meta.get("text_sha256")})
            writes.append((stats_path(path), safetensors_bytes(stats_tensors, metadata={"ridgefill_stats": stats_text})))
        writes.append((path, safetensors_bytes(tensors, metadata={"ridgefill": text})))
        # two runs saving here cannot leave a mixed maps/stats pair; the lock file is removed after
        with file_lock(pair_lock_path(path), remove=True):
            if self.stats is None:  # statistics of earlier maps at this path would not belong to these
                stats_path(path).unlink(missing_ok=True)
            return atomic_write_all(writes)[-1]


def attach_stats(maps: RidgeMaps, path: str | os.PathLike) -> RidgeMaps:
    """Give ``maps`` (loaded from ``path``) the statistics saved beside it, when there are some, and the
    calibration means those hold if the maps file has none (files written before the means were
    stored). Returns ``maps``.

    Raises:
        MapsFormatError: the statistics file is unreadable, or belongs to other maps.
    """
    spath = stats_path(path)
    if not spath.exists():
        return maps
    stats, smeta = load_stats(spath)
    if smeta.get("maps_sha256") not in (None, maps_digest(maps.weights, maps.biases)):
        raise MapsFormatError(f"statistics file {str(spath)!r} belongs to other maps than {str(path)!r}; "
                              "refit them with `ridgefill calibrate`")
    maps.stats = stats
    if maps.mean_h is None and maps.kind == "inputs":
        mean_h, mean_x = stats.means()
        maps.mean_h, maps.mean_x = mean_h[:stats.hidden].float(), mean_x.float()
    if maps.cov_h is None and maps.kind == "inputs":
        maps.cov_h = calibration_cov(stats).float()
    return maps


def calibration_cov(stats: RidgeStats) -> Tensor:
    """The calibration covariance of ``h_S``, ``Σ (h − h̄)(h − h̄)ᵀ / n`` ``[d, d]`` float64, from the
    streaming statistics (the ``h_S(t)`` block of context maps' features)."""
    mean_h, mean_x = stats.means()
    d = stats.hidden
    return stats.moments(0, mean_h, mean_x[0])[0][:d, :d] / stats.count


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


def pair_lock_path(maps_path: str | os.PathLike) -> Path:
    """The lock file guarding a maps file and its statistics: ``.<name>.lock`` beside them, there only while
    a save holds it (:func:`ridgefill.fileio.file_lock` with ``remove``)."""
    p = Path(maps_path)
    return p.with_name("." + p.name.removesuffix(".safetensors") + ".lock")


_STATS_TENSORS = ("shift_h", "shift_x", "sum_h", "gram", "sum_x", "cross", "sq_x")


def save_stats(path: str | os.PathLike, stats: RidgeStats, meta: dict) -> Path:
    """Write :class:`RidgeStats` (float64 tensors, see its docstring for shapes) and ``meta`` (JSON
    metadata, e.g. ``maps_sha256``) to ``path`` atomically."""
    tensors, text = _stats_payload(stats, meta)
    return atomic_write(path, safetensors_bytes(tensors, metadata={"ridgefill_stats": text}))


def _stats_payload(stats: RidgeStats, meta: dict) -> tuple[dict[str, Tensor], str]:
    """The tensors and JSON metadata of a statistics file. Raises :class:`InputError` for empty
    statistics or metadata that is not JSON."""
    if stats.count == 0:
        raise InputError("cannot save empty statistics (no calibration rows)")
    tensors = {k: getattr(stats, k).detach().to(torch.float64).contiguous().cpu() for k in _STATS_TENSORS}
    meta = dict(meta, format_version=STATS_FORMAT_VERSION, count=stats.count, layers=stats.layers,
                hidden=stats.hidden, outputs=stats.outputs, targets=stats.targets, context=stats.context)
    meta.pop(HASH_KEY, None)
    try:
        meta[HASH_KEY] = content_hashes(tensors, stats_fields(meta))
        return tensors, json.dumps(meta, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise InputError(f"statistics metadata cannot be written as JSON ({e}); use plain numbers and strings") from e


#: The maps file's header fields that change what the maps compute, covered by its content hash (version 2
#: also ``select``, the selection setting ``select="auto"`` follows).
MAPS_FIELDS = ("format_version", "split", "lambdas", "kind", "context", "context_penalty")
#: The statistics file's header fields covered by its content hash.
STATS_FIELDS = ("format_version", "count", "layers", "hidden", "outputs", "targets", "context", "split", "maps_sha256")


def maps_fields(meta: dict) -> dict:
    """The :data:`MAPS_FIELDS` of a maps file's metadata (``None`` where absent), as hashed; from format
    version 2 also ``select``."""
    keys = MAPS_FIELDS + (("select",) if meta.get("format_version", 1) >= 2 else ())
    return {k: meta.get(k) for k in keys}


def stats_fields(meta: dict) -> dict:
    """The :data:`STATS_FIELDS` of a statistics file's metadata (``None`` where absent), as hashed."""
    return {k: meta.get(k) for k in STATS_FIELDS}


def _read(path: Path, key: str, what: str, redo: str) -> tuple[dict | None, dict[str, Tensor]]:
    """Metadata entry ``key`` (parsed JSON; ``None`` when absent) and all tensors of a safetensors file,
    from one open of the file (a file replaced meanwhile is read whole, old or new, never mixed).

    Raises:
        MapsFormatError: not a safetensors file, truncated, corrupted, or metadata that is not a JSON object.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(key)
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, OverflowError, MemoryError) as e:
        raise MapsFormatError(f"{what} {str(path)!r} is truncated or corrupted ({type(e).__name__}: {e}); "
                              f"{redo}") from e
    if raw is None:
        return None, tensors
    try:
        meta = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, or a number too long to parse
        raise MapsFormatError(f"the metadata of {what} {str(path)!r} is not valid JSON ({e}); {redo}") from e
    if not isinstance(meta, dict):
        raise MapsFormatError(f"the metadata of {what} {str(path)!r} is a JSON {type(meta).__name__}, not "
                              f"an object; {redo}")
    return meta, tensors


def _bad_meta(meta: dict, schema: dict[str, Callable[[object], bool]]) -> list[str]:
    """The keys of ``meta`` present in ``schema`` whose value fails its check (other keys are allowed)."""
    return [f"{k}={meta[k]!r}"[:80] for k, ok in schema.items() if k in meta and not ok(meta[k])]


def _finite_real(v: object) -> bool:
    return finite_float(v) is not None


def _count(v: object) -> bool:
    return is_int(v) and v >= 0


def _opt_reals(v: object) -> bool:
    return v is None or (isinstance(v, list) and all(_finite_real(x) for x in v))


#: Checks of the metadata keys RidgeFill reads from a maps file; unknown keys are kept as they are.
_MAPS_SCHEMA: dict[str, Callable[[object], bool]] = {
    "split": _count,
    "lambdas": lambda v: isinstance(v, list) and all(_finite_real(x) and x >= 0 for x in v),
    "model_name": lambda v: isinstance(v, str), "model_hash": lambda v: isinstance(v, str),
    "weight_fingerprint": lambda v: isinstance(v, str), "weight_sample": _opt_reals,
    "weights_dtype": lambda v: isinstance(v, str), "weights_device": lambda v: isinstance(v, str),
    "calibration_tokens": _count, "heldout_tokens": _count, "chunk": _count,
    "text_sha256": lambda v: isinstance(v, str), "lambda_spec": lambda v: isinstance(v, str),
    "heldout_rel_error": _opt_reals,
    # K/V maps have no identity fill to compare with: None per layer
    "heldout_rel_error_identity": lambda v: v is None or (isinstance(v, list) and all(x is None or _finite_real(x) for x in v)),
    "solve_method": lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "context": lambda v: is_int(v) and v in (0, 1),
    "context_penalty": lambda v: _finite_real(v) and CONTEXT_PENALTY_RANGE[0] <= v <= CONTEXT_PENALTY_RANGE[1],
    "select": lambda v: v is None or isinstance(v, str),
}
#: The same for a statistics file.
_STATS_SCHEMA: dict[str, Callable[[object], bool]] = {
    "layers": lambda v: is_int(v) and v >= 1, "hidden": lambda v: is_int(v) and v >= 1,
    "context": lambda v: is_int(v) and v in (0, 1),
    "count": lambda v: is_int(v) and v >= 1, "split": _count,
    "maps_sha256": lambda v: isinstance(v, str), "model_hash": lambda v: v is None or isinstance(v, str),
    "text_sha256": lambda v: v is None or isinstance(v, str),
}


def load_stats(path: str | os.PathLike) -> tuple[RidgeStats, dict]:
    """Read a statistics file written by :func:`save_stats`.

    Returns:
        ``(stats, meta)``: float64 :class:`RidgeStats` on the CPU and the file's metadata.

    Raises:
        InputError: the file does not exist.
        MapsFormatError: not a statistics file, truncated or corrupted, metadata of the wrong type,
            tensors that are not finite float64, or shapes that disagree with the metadata.
    """
    path = Path(path)
    redo = "recalibrate with `ridgefill calibrate`, which writes the statistics beside the maps"
    if not path.is_file():
        raise InputError(f"statistics file {str(path)!r} does not exist; {redo}")
    meta, tensors = _read(path, "ridgefill_stats", "statistics file", redo)
    if (meta is None or set(tensors) != set(_STATS_TENSORS) or not is_int(meta.get("format_version"))
            or meta.get("format_version") != STATS_FORMAT_VERSION):
        raise MapsFormatError(f"{str(path)!r} is not a RidgeFill statistics file of format version "
                              f"{STATS_FORMAT_VERSION} (tensors {sorted(tensors)}); {redo}")
    bad = _bad_meta(meta, _STATS_SCHEMA) + [f"{k} missing" for k in ("layers", "hidden", "count") if k not in meta]
    if bad:
        raise MapsFormatError(f"statistics file {str(path)!r} has bad metadata: {', '.join(bad)}; {redo}")
    for k, t in tensors.items():
        if t.dtype != torch.float64:
            raise MapsFormatError(f"statistics file {str(path)!r}: tensor {k} is {t.dtype}, not float64; {redo}")
    verify(meta.pop(HASH_KEY, None), tensors, stats_fields(meta), what=f"statistics file {str(path)!r}", redo=redo)
    for k, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            raise MapsFormatError(f"statistics file {str(path)!r}: tensor {k} holds NaN or Inf; {redo}")
    n, d = meta.get("layers"), meta.get("hidden")
    targets = meta.get("targets", "inputs")
    if targets not in ("inputs", "kv"):
        raise MapsFormatError(f"statistics file {str(path)!r} has targets {targets!r} (expected 'inputs' or 'kv'); {redo}")
    outputs = meta.get("outputs", d)
    if not is_int(outputs) or outputs < 1 or (targets == "inputs" and outputs != d):
        raise MapsFormatError(f"statistics file {str(path)!r} has outputs {outputs!r} for {targets!r} targets of "
                              f"hidden size {d}; {redo}")
    context = meta.get("context", 0)
    f = d * (1 + context)  # feature width
    # the tensors' shapes before any allocation sized by the metadata
    want = {"shift_h": (f,), "sum_h": (f,), "gram": (f, f), "shift_x": (n, outputs), "sum_x": (n, outputs),
            "cross": (n, f, outputs), "sq_x": (n,)}
    bad = [f"{k} {tuple(tensors[k].shape)} (expected {v})" for k, v in want.items() if tuple(tensors[k].shape) != v]
    if bad:
        raise MapsFormatError(f"statistics file {str(path)!r}: tensors of the wrong shape for {n} layers of size {d} "
                              f"and {outputs} outputs: {', '.join(bad)}; {redo}")
    if meta["count"] > 2 ** 53:
        raise MapsFormatError(f"statistics file {str(path)!r} claims {meta['count']} rows, beyond float64 counts; {redo}")
    stats = RidgeStats(n, d, meta.get("count"), tensors["shift_h"], tensors["shift_x"], outputs, targets, context)
    for k in _STATS_TENSORS[2:]:
        if tensors[k].shape != getattr(stats, k).shape:
            raise MapsFormatError(f"statistics file {str(path)!r}: tensor {k} has shape {tuple(tensors[k].shape)}, "
                                  f"expected {tuple(getattr(stats, k).shape)} for {n} layers of size {d}; {redo}")
        setattr(stats, k, tensors[k])
    if tensors["shift_h"].shape != (f,) or tensors["shift_x"].shape != (n, stats.outputs):
        raise MapsFormatError(f"statistics file {str(path)!r} has shifts of the wrong shape; {redo}")
    return stats, meta


def load_maps(path: str | os.PathLike) -> RidgeMaps:
    """Read a maps file written by :meth:`RidgeMaps.save`.

    Returns:
        :class:`RidgeMaps` with float32 tensors on the CPU.

    Raises:
        InputError: the file does not exist.
        MapsFormatError: not a safetensors file, truncated or corrupted, missing tensors or metadata,
            metadata that is not a JSON object or has values of the wrong type (``split`` an integer
            ``≥ 0``, not ``bool``; ``lambdas`` finite numbers ``≥ 0``; the provenance keys RidgeFill
            reads; other keys are kept unchecked), an unknown format version, tensors that are not
            float32, non-finite values, or shapes that disagree with the metadata.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"maps file {str(path)!r} is a folder, not a file: give the maps file's path, e.g. "
                         f"{str(path / 'maps.safetensors')!r}")
    if not path.is_file():
        raise InputError(f"maps file {str(path)!r} does not exist; create it with `ridgefill calibrate`")
    redo = "refit it with `ridgefill calibrate`"
    meta, tensors = _read(path, "ridgefill", "maps file", redo)
    core = set(tensors) - {"induction"}
    if meta is None or core not in ({"weights", "biases"}, {"weights", "biases", "mean_h", "mean_x"},
                                    {"weights", "biases", "mean_h", "mean_x", "cov_h"}):
        raise MapsFormatError(f"{str(path)!r} is a safetensors file but not a RidgeFill maps file "
                              f"(tensors {sorted(tensors)}); {redo}")
    version = meta.get("format_version")
    if not is_int(version) or version not in READ_VERSIONS:
        raise MapsFormatError(f"maps file {str(path)!r} has format version {version!r}, "
                              f"this RidgeFill reads versions {', '.join(map(str, READ_VERSIONS))}; {redo}")
    if version < 2 and ("induction" in tensors or "select" in meta):
        raise MapsFormatError(f"maps file {str(path)!r} of format version {version} holds the induction scores or "
                              f"the selection setting of version 2; {redo}")
    bad = _bad_meta(meta, _MAPS_SCHEMA) + [f"{k} missing" for k in ("split", "lambdas") if k not in meta]
    if bad:
        raise MapsFormatError(f"maps file {str(path)!r} has bad metadata: {', '.join(bad)} (split: an integer "
                              f"≥ 0; lambdas: finite numbers ≥ 0); {redo}")
    w, b = tensors["weights"], tensors["biases"]
    if any(t.dtype != torch.float32 for t in tensors.values()):
        raise MapsFormatError(f"maps file {str(path)!r} holds weights {w.dtype} and biases {b.dtype}"
                              + "".join(f", {k} {t.dtype}" for k, t in tensors.items() if k not in ("weights", "biases"))
                              + f"; the format stores float32; {redo}")
    stored = meta.pop(HASH_KEY, None)
    fields = maps_fields(meta)
    lambdas = meta.pop("lambdas")
    split = meta.pop("split")
    kind = meta.get("kind", "inputs")
    if kind not in ("inputs", "kv"):
        raise MapsFormatError(f"maps file {str(path)!r} has kind {kind!r}; expected 'inputs' or 'kv'; {redo}")
    context = meta.get("context", 0)
    if meta.get("context_penalty", 1) != 1 and not context:
        raise MapsFormatError(f"maps file {str(path)!r} records context_penalty {meta['context_penalty']!r} without "
                              f"context: the penalty weighs the previous row's block of context maps; {redo}")
    if (w.ndim != 3 or (kind == "inputs" and w.shape[1] != w.shape[2] * (1 + context))
            or w.shape[1] % (1 + context) or b.shape != (w.shape[0], w.shape[2]) or len(lambdas) != w.shape[0]):
        raise MapsFormatError(f"maps file {str(path)!r} has inconsistent shapes: weights {tuple(w.shape)}, "
                              f"biases {tuple(b.shape)}, {len(lambdas)} λ values, split {split!r}; {redo}")
    d = w.shape[1] // (1 + context)  # the width of h_S
    mean_h, mean_x = tensors.get("mean_h"), tensors.get("mean_x")
    if mean_h is not None and (mean_h.shape != (d,) or mean_x.shape != w.shape[::2]):
        raise MapsFormatError(f"maps file {str(path)!r} has calibration means of shapes {tuple(mean_h.shape)} and "
                              f"{tuple(mean_x.shape)}, expected {(d,)} and {tuple(b.shape)}; {redo}")
    cov_h = tensors.get("cov_h")
    if cov_h is not None and cov_h.shape != (d, d):
        raise MapsFormatError(f"maps file {str(path)!r} has a calibration covariance of shape {tuple(cov_h.shape)}, "
                              f"expected {(d, d)}; {redo}")
    verify(stored, tensors, fields, what=f"maps file {str(path)!r}", redo=redo)
    induction = tensors.get("induction")
    if induction is not None and (induction.ndim != 2 or induction.shape[0] != split + 1 + w.shape[0]):
        raise MapsFormatError(f"maps file {str(path)!r} has induction scores of shape {tuple(induction.shape)}, "
                              f"expected [{split + 1 + w.shape[0]} layers, heads]; {redo}")
    if not all(torch.isfinite(t).all() for t in tensors.values()):
        raise MapsFormatError(f"maps file {str(path)!r} holds NaN or Inf values; {redo}")
    if "select" in meta:
        try:  # a recorded setting that does not parse is refused on load, not at prefill
            as_select(meta["select"])
        except InputError as e:
            raise MapsFormatError(f"maps file {str(path)!r} records the selection setting {meta['select']!r}, "
                                  f"which does not parse ({e}); {redo}") from e
    return RidgeMaps(split, w, b, [float(v) for v in lambdas], meta, mean_h=mean_h, mean_x=mean_x, cov_h=cov_h,
                     induction=induction)
