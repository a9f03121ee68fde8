"""Reading a RidgeFill maps file (written by ``ridgefill calibrate``) inside the vLLM environment.

One reader serves both environments: :func:`load_fill_maps` calls :func:`ridgefill.maps.load_maps`, which
reads and checks the format that ``docs/maps-format.md`` specifies (format versions 1 and 2: tensors,
metadata types, shapes, finiteness and the content hashes). ``ridgefill.maps`` imports torch, safetensors, numpy
and tqdm, never ``transformers``, so it runs beside vLLM (whose ``transformers`` pin differs from the
project's); ``scripts/install_vllm.sh`` installs ``ridgefill`` there without its dependencies. This module
adds what the plugin itself refuses (K/V maps) and its checks against the served model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .errors import InputError, MapsFormatError, MapsMismatchError

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
        induction: the model's induction score per layer and head ``[L, H]`` float32 (format version 2; ``None`` in
            version 1 files): the heads row selection scores with (``ridgefill.select.induction_scores``).
    """

    split: int
    weights: Tensor
    biases: Tensor
    meta: dict = field(default_factory=dict)
    induction: Tensor | None = None

    @property
    def context(self) -> int:
        """``1`` for context maps (the previous token's split state is read too), else ``0``."""
        return self.meta.get("context", 0)

    @property
    def select(self) -> str | None:
        """The row selection setting the maps were tuned with (``ridgefill tune``; ``ridgefill.maps.RidgeMaps.select``),
        which ``select: "auto"`` follows; ``None`` when not recorded."""
        return self.meta.get("select")

    def check_shape(self, num_layers: int, hidden: int, heads: int | None = None) -> None:
        """Check the maps fit a model of ``num_layers`` layers of width ``hidden`` (and ``heads`` attention heads per
        layer, when given, against the induction scores).

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
        if heads is not None and self.induction is not None and tuple(self.induction.shape) != (num_layers, heads):
            raise MapsMismatchError(f"maps hold induction scores {tuple(self.induction.shape)}, but this model has "
                                    f"{num_layers} layers of {heads} heads; {fix}")

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
        from ridgefill.maps import same_weights

        fit = getattr(torch, str(self.meta.get("weights_dtype", "float32")), torch.float32)
        dtypes = [dtype] + ([fit] if isinstance(fit, torch.dtype) and fit.is_floating_point else [])
        ok, rel = same_weights(sorted(want), sorted(sample), dtypes)
        if not ok:
            raise MapsMismatchError(f"maps were fitted for model {name!r} with other weights: sampled values differ "
                                    f"by up to {rel:.3g} relative; {fix}")


def resolve_maps_path(path: str | os.PathLike, model_dir: str | os.PathLike | None) -> str:
    """The maps file the ``ridgefill`` setting ``maps`` names: ``~`` expanded; a relative path is the model folder's
    file when ``model_dir`` (the served model's folder) holds it (``ridgefill export-vllm`` writes
    ``"maps": "ridgefill/maps.safetensors"``), otherwise relative to the working directory."""
    p = os.path.expanduser(str(path))
    if not os.path.isabs(p) and model_dir is not None and os.path.isfile(os.path.join(str(model_dir), p)):
        return os.path.join(str(model_dir), p)
    return p


def recorded_select(path: str | os.PathLike) -> str | None:
    """The row selection setting a maps file records (its metadata ``select``, written by ``ridgefill tune``; what
    ``select: "auto"`` follows), read from the file's header alone; ``None`` when it records none or cannot be read
    (the model refuses such a file at load, with the reason)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(os.path.expanduser(str(path)), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("ridgefill") or "{}")
    except (SafetensorError, OSError, ValueError):  # the model's load_fill_maps names the problem
        return None
    select = meta.get("select") if isinstance(meta, dict) else None
    return select if isinstance(select, str) else None


def load_fill_maps(path: str | os.PathLike) -> FillMaps:
    """Read and check a maps file with ``ridgefill``'s reader (:func:`ridgefill.maps.load_maps`; the format:
    ``docs/maps-format.md``).

    Returns:
        :class:`FillMaps` with float32 CPU tensors ``weights`` ``[L-S-1, f, d]``, ``biases`` ``[L-S-1, d]``.

    Raises:
        InputError: the file does not exist, or ``ridgefill`` is not installed beside vLLM.
        MapsFormatError: not a RidgeFill maps file of format version 1 or 2, truncated or corrupted (a tensor or a
            header field that differs from its content hash), bad metadata, tensors that are not float32 or not
            finite, inconsistent shapes, or K/V maps (kind ``"kv"``), which the plugin does not serve yet.
    """
    try:
        from ridgefill import errors as rf_errors
        from ridgefill.maps import load_maps
    except ImportError as e:
        raise InputError(f"the vLLM plugin reads maps files with the ridgefill package, which is not importable "
                         f"here ({e}); install ridgefill-vllm with its dependencies (scripts/install_vllm.sh builds "
                         f"and installs both wheels)") from e
    try:
        maps = load_maps(path)
    except rf_errors.InputError as e:
        raise InputError(str(e)) from None
    except rf_errors.MapsFormatError as e:
        raise MapsFormatError(str(e)) from None
    if maps.kind != "inputs":
        raise MapsFormatError(f"maps file {str(path)!r} holds maps of kind {maps.kind!r}; the vLLM plugin serves input "
                              "maps (kind 'inputs', the default of `ridgefill calibrate`): refit without --targets kv")
    return FillMaps(maps.split, maps.weights, maps.biases, dict(maps.meta, split=maps.split, lambdas=maps.lambdas),
                    induction=maps.induction)
