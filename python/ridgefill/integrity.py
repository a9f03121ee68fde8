"""Content hashes that make a maps, statistics or checkpoint file verify itself.

A writer stores, in the file's JSON metadata under :data:`KEY`, the SHA-256 of every tensor (its dtype,
shape and bytes, :func:`tensor_sha256`) and of the header fields that change results (λ, split, context,
penalty, counts: :func:`fields_sha256`). A reader recomputes them (:func:`verify`) and raises
:class:`~ridgefill.errors.MapsFormatError` naming the file and the tensor or fields that differ. A file
without hashes (written before they were stored) is used with an
:class:`~ridgefill.errors.UnverifiedFileWarning` where the reader allows it.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Mapping

import torch
from torch import Tensor

from .errors import MapsFormatError, UnverifiedFileWarning

#: The metadata key holding ``{"tensors": {name: hex}, "fields": hex}``.
KEY = "content_sha256"


def tensor_sha256(t: Tensor) -> str:
    """SHA-256 (hex) of a tensor's dtype, shape and bytes (C order, on the CPU)."""
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{str(t.dtype).removeprefix('torch.')}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def fields_sha256(fields: Mapping) -> str:
    """SHA-256 (hex) of header fields, as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def content_hashes(tensors: Mapping[str, Tensor], fields: Mapping) -> dict:
    """What a writer stores under :data:`KEY`: every tensor's :func:`tensor_sha256` and the fields'
    :func:`fields_sha256`."""
    return {"tensors": {k: tensor_sha256(t) for k, t in sorted(tensors.items())}, "fields": fields_sha256(fields)}


def verify(stored, tensors: Mapping[str, Tensor], fields: Mapping, *, what: str, redo: str,
           legacy: bool = True) -> bool:
    """Check ``tensors`` and ``fields`` against the hashes a file stored (``stored``: the value under
    :data:`KEY`, ``None`` when the file has none).

    Args:
        what: the file as the message names it, e.g. ``"maps file 'm.safetensors'"``.
        redo: what to do about a mismatch (e.g. how to regenerate the file).
        legacy: a file without hashes is used with an :class:`UnverifiedFileWarning` (``True``) or refused.

    Returns:
        ``True`` when verified; ``False`` for a file without hashes (after the warning).

    Raises:
        MapsFormatError: the hashes are malformed, a tensor has none or differs (named), a hash names a
            tensor the file lacks, or the header fields differ from those hashed.
    """
    if stored is None:
        if not legacy:
            raise MapsFormatError(f"{what} carries no content hashes, so its contents cannot be verified; {redo}")
        warnings.warn(f"{what} carries no content hashes (written before RidgeFill stored them): its tensors "
                      f"are used unverified; {redo} to add them", UnverifiedFileWarning, stacklevel=3)
        return False
    if (not isinstance(stored, dict) or not isinstance(stored.get("tensors"), dict)
            or not isinstance(stored.get("fields"), str)
            or not all(isinstance(v, str) for v in stored["tensors"].values())):
        raise MapsFormatError(f"{what} has malformed content hashes (metadata key {KEY!r}); {redo}")
    missing = sorted(set(tensors) - set(stored["tensors"]))
    extra = sorted(set(stored["tensors"]) - set(tensors))
    if missing or extra:
        raise MapsFormatError(f"{what} does not match its content hashes: "
                              + ", ".join([f"tensor {k} has no hash" for k in missing]
                                          + [f"tensor {k} is missing" for k in extra]) + f"; {redo}")
    for k in sorted(tensors):
        if tensor_sha256(tensors[k]) != stored["tensors"][k]:
            raise MapsFormatError(f"{what} is corrupted: tensor {k} differs from its SHA-256 recorded when the "
                                  f"file was written; {redo}")
    if fields_sha256(fields) != stored["fields"]:
        raise MapsFormatError(f"{what} is corrupted: its header fields ({', '.join(sorted(fields))}) differ from "
                              f"those hashed when the file was written; {redo}")
    return True
