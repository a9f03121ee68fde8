"""Reading a RidgeFill maps file (written by ``ridgefill calibrate``) inside the vLLM environment.

The format is the one :mod:`ridgefill.maps` writes (format version 1): a ``safetensors`` file with
``weights`` ``[L-S-1, d, d]`` and ``biases`` ``[L-S-1, d]`` (float32; entry ``i`` is late layer
``S + 1 + i``), optionally ``mean_h``/``mean_x`` and ``cov_h`` (not used here), and a JSON metadata
string under the key ``ridgefill`` holding at least ``format_version``, ``split`` and ``lambdas``. This reader checks the
same things :func:`ridgefill.maps.load_maps` checks that the plugin relies on, without importing
``ridgefill`` (whose ``transformers`` pin differs from vLLM's).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from .errors import InputError, MapsFormatError, MapsMismatchError

FORMAT_VERSION = 1
#: Values taken from the start of every weight in the maps' ``weight_sample`` (``ridgefill.maps.SAMPLE_VALUES``).
SAMPLE_VALUES = 4


@dataclass
class FillMaps:
    """Input maps for late layers ``split+1 .. L-1``.

    Attributes:
        split: ``S``.
        weights: ``W_l`` ``[L-S-1, f, d]`` float32 (``f = d``, or ``2d`` for context maps, which read
            ``[h_S(t), h_S(t−1)]``: ``ridgefill.fill.context_features``); biases: ``b_l`` ``[L-S-1, d]`` float32.
        meta: the file's metadata (model name, weight sample, λ, ``context``, ...).
    """

    split: int
    weights: Tensor
    biases: Tensor
    meta: dict = field(default_factory=dict)

    @property
    def context(self) -> int:
        """``1`` for context maps (the previous token's split state is read too), else ``0``."""
        return self.meta.get("context", 0)

    def check_shape(self, num_layers: int, hidden: int) -> None:
        """Check the maps fit a model of ``num_layers`` layers of width ``hidden``.

        Raises:
            MapsMismatchError: another split range or other sizes; the message says which.
        """
        fix = "fit maps for this model with `ridgefill calibrate --model <this model's folder>`"
        if not 0 <= self.split <= num_layers - 2:
            raise MapsMismatchError(f"maps split S={self.split} is outside this model's 0..{num_layers - 2}; {fix}")
        want = (num_layers - self.split - 1, hidden * (1 + self.context), hidden)
        if tuple(self.weights.shape) != want:
            raise MapsMismatchError(f"maps have weights {tuple(self.weights.shape)}, but this model ({num_layers} "
                                    f"layers, hidden size {hidden}) at S={self.split} needs {want}; {fix}")

    def check_weight_sample(self, sample: list[float], dtype: torch.dtype) -> None:
        """Check the model's weights are the ones the maps were fitted on.

        ``sample`` holds the first :data:`SAMPLE_VALUES` values of every checkpoint weight (any order);
        the maps' ``weight_sample`` holds the same values in the fitting model's parameter order.
        Both are compared as sorted lists, to the rounding of the coarser of ``dtype`` and the fitting
        dtype (the same weights loaded in bfloat16 pass). Maps without a sample are accepted.

        Raises:
            MapsMismatchError: the counts or the values differ.
        """
        want = self.meta.get("weight_sample")
        if want is None:
            return
        name = self.meta.get("model_name")
        fix = "fit maps for this model with `ridgefill calibrate --model <this model's folder>`"
        if len(want) != len(sample):
            raise MapsMismatchError(f"maps were fitted for model {name!r} with {len(want)} sampled weight values, "
                                    f"this checkpoint gives {len(sample)}: another architecture or weight layout; {fix}")
        fit = getattr(torch, str(self.meta.get("weights_dtype", "float32")), torch.float32)
        dtypes = [dtype] + ([fit] if isinstance(fit, torch.dtype) and fit.is_floating_point else [])
        eps = max(torch.finfo(d).eps for d in dtypes)
        tiny = max(torch.finfo(d).smallest_normal for d in dtypes)
        a = torch.tensor(sorted(want), dtype=torch.float64)
        b = torch.tensor(sorted(sample), dtype=torch.float64)
        diff = (a - b).abs()
        if a.numel() and not bool((diff <= eps * torch.maximum(a.abs(), b.abs()) + tiny).all()):
            rel = float((diff / torch.maximum(a.abs(), b.abs()).clamp_min(tiny)).max())
            raise MapsMismatchError(f"maps were fitted for model {name!r} with other weights: sampled values differ "
                                    f"by up to {rel:.3g} relative; {fix}")


def _verify_hashes(path: Path, meta, tensors: dict[str, Tensor], redo: str) -> None:
    """Verify the content hashes ``ridgefill`` stores in a maps file (every tensor and the header fields
    that change results), with ``ridgefill``'s own check when it is installed beside vLLM (as
    ``scripts/install_vllm.sh`` installs it); a file without hashes is used with ``ridgefill``'s warning."""
    try:
        from ridgefill.errors import MapsFormatError as RidgeFillFormatError
        from ridgefill.integrity import KEY, verify
        from ridgefill.maps import maps_fields
    except ImportError:
        return
    if not isinstance(meta, dict):
        return
    fields = {k: v for k, v in meta.items() if k != KEY}
    try:
        verify(meta.get(KEY), tensors, maps_fields(fields), what=f"maps file {str(path)!r}", redo=redo)
    except RidgeFillFormatError as e:
        raise MapsFormatError(str(e)) from None


def load_fill_maps(path: str | os.PathLike) -> FillMaps:
    """Read and check a maps file.

    Returns:
        :class:`FillMaps` with float32 CPU tensors.

    Raises:
        InputError: the file does not exist.
        MapsFormatError: not a RidgeFill maps file of format version 1, truncated or corrupted (a tensor or
            a header field that differs from its content hash, with ``ridgefill`` installed beside vLLM), bad
            metadata, tensors that are not float32 or not finite, inconsistent shapes, or K/V maps
            (kind ``"kv"``), which the plugin does not serve yet.
    """
    path = Path(path)
    redo = "refit it with `ridgefill calibrate`"
    if not path.is_file():
        raise InputError(f"maps file {str(path)!r} does not exist; create it with `ridgefill calibrate`")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("ridgefill")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, OverflowError, MemoryError) as e:
        raise MapsFormatError(f"maps file {str(path)!r} is truncated or corrupted ({type(e).__name__}: {e}); {redo}") from e
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError as e:
        raise MapsFormatError(f"the metadata of maps file {str(path)!r} is not valid JSON ({e}); {redo}") from e
    _verify_hashes(path, meta, tensors, redo)
    if not isinstance(meta, dict) or not {"weights", "biases"} <= set(tensors) \
            or not set(tensors) <= {"weights", "biases", "mean_h", "mean_x", "cov_h"}:
        raise MapsFormatError(f"{str(path)!r} is not a RidgeFill maps file (tensors {sorted(tensors)}); {redo}")
    version, split, lambdas = meta.get("format_version"), meta.get("split"), meta.get("lambdas")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise MapsFormatError(f"maps file {str(path)!r} has format version {version!r}; this plugin reads "
                              f"version {FORMAT_VERSION}; {redo}")
    if not isinstance(split, int) or isinstance(split, bool) or split < 0 or not isinstance(lambdas, list):
        raise MapsFormatError(f"maps file {str(path)!r} has bad metadata: split={split!r} (an integer ≥ 0), "
                              f"lambdas of type {type(lambdas).__name__} (a list); {redo}")
    kind = meta.get("kind", "inputs")
    if kind != "inputs":
        raise MapsFormatError(f"maps file {str(path)!r} holds maps of kind {kind!r}; the vLLM plugin serves input "
                              "maps (kind 'inputs', the default of `ridgefill calibrate`): refit without --targets kv")
    context = meta.get("context", 0)
    if context not in (0, 1) or isinstance(context, bool):
        raise MapsFormatError(f"maps file {str(path)!r} has context {context!r} (0 or 1); {redo}")
    w, b = tensors["weights"], tensors["biases"]
    if any(t.dtype != torch.float32 for t in tensors.values()):
        raise MapsFormatError(f"maps file {str(path)!r} holds weights {w.dtype} and biases {b.dtype}; the format "
                              f"stores float32; {redo}")
    if w.ndim != 3 or w.shape[1] != w.shape[2] * (1 + context) or tuple(b.shape) != (w.shape[0], w.shape[2]) or len(lambdas) != w.shape[0]:
        raise MapsFormatError(f"maps file {str(path)!r} has inconsistent shapes: weights {tuple(w.shape)}, biases "
                              f"{tuple(b.shape)}, {len(lambdas)} λ values; {redo}")
    if not (torch.isfinite(w).all() and torch.isfinite(b).all()):
        raise MapsFormatError(f"maps file {str(path)!r} holds NaN or Inf values; {redo}")
    return FillMaps(split, w, b, meta)
