"""Calibration checkpoints: the statistics of a calibration pass, saved every few chunks so that an
interrupted calibration resumes where it stopped.

A checkpoint is a ``safetensors`` file holding, for every split, the fit and held-out
:class:`~ridgefill.ridge.RidgeStats` (float64, exactly as accumulated) after the first ``done``
chunks, and under the metadata key ``ridgefill_checkpoint`` the settings of the run: model hash,
weight fingerprint, dtype, splits, held-out period, number of chunks and the SHA-256 of every chunk's
token ids (which covers the text, the tokenizer, ``tokens`` and ``chunk``). A run resumes only from a
checkpoint with identical settings, so the resumed statistics, and hence the maps, equal those of an
uninterrupted run bit for bit (the float64 sums continue in the same order). Files are written
atomically (:func:`ridgefill.fileio.atomic_write`): a kill during a write leaves the previous checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from .errors import InputError, MapsFormatError
from .fileio import atomic_write
from .ridge import RidgeStats

CHECKPOINT_VERSION = 1
_KEY = "ridgefill_checkpoint"
_SUMS = ("sum_h", "gram", "sum_x", "cross", "sq_x")


def checkpoint_path(maps_path: str | os.PathLike) -> Path:
    """The checkpoint beside a maps file: ``<name>.checkpoint.safetensors`` for ``<name>.safetensors``."""
    p = Path(maps_path)
    return p.with_name(p.name.removesuffix(".safetensors") + ".checkpoint.safetensors")


def chunks_digest(chunks: Sequence[Tensor]) -> str:
    """SHA-256 (hex) of the calibration chunks' int64 token ids, in order."""
    h = hashlib.sha256()
    for c in chunks:
        h.update(str(c.numel()).encode() + b":")
        h.update(c.detach().to(device="cpu", dtype=torch.long).contiguous().numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(path: str | os.PathLike, settings: dict, done: int,
                    stats: dict[int, tuple[RidgeStats, RidgeStats]]) -> Path:
    """Write the statistics after ``done`` chunks, with the run's ``settings``, to ``path`` atomically."""
    tensors, counts = {}, {}
    for split, pair in stats.items():
        for part, st in zip(("fit", "held"), pair):
            counts[f"{split}.{part}"] = st.count
            if st.count == 0:
                continue
            for k in ("shift_h", "shift_x") + _SUMS:
                tensors[f"{split}.{part}.{k}"] = getattr(st, k).detach().to(torch.float64).contiguous().cpu()
    meta = {"version": CHECKPOINT_VERSION, "settings": settings, "done": done, "counts": counts}
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={_KEY: json.dumps(meta)}))


def load_checkpoint(path: str | os.PathLike, settings: dict,
                    shapes: dict[int, tuple]) -> tuple[int, dict[int, tuple[RidgeStats, RidgeStats]]]:
    """Read a checkpoint written by :func:`save_checkpoint` for a run with ``settings``.

    Args:
        shapes: ``{split: (late layers, hidden, outputs, targets, context)}`` of the run (see :class:`RidgeStats`).

    Returns:
        ``(done, stats)``: chunks already accumulated and ``{split: (fit, heldout)}``.

    Raises:
        InputError: the checkpoint was written by a run with other settings (the message names them).
        MapsFormatError: the file is not a readable checkpoint.
    """
    path = Path(path)
    fix = f"delete {str(path)!r} to start the calibration over"
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(_KEY)
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = json.loads(raw) if raw is not None else None
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as e:
        raise MapsFormatError(f"calibration checkpoint {str(path)!r} is unreadable ({e}); {fix}") from e
    if not isinstance(meta, dict) or meta.get("version") != CHECKPOINT_VERSION or not isinstance(
            meta.get("settings"), dict):
        raise MapsFormatError(f"{str(path)!r} is not a RidgeFill calibration checkpoint of version "
                              f"{CHECKPOINT_VERSION}; {fix}")
    old = meta["settings"]
    changed = [f"{k}: {old.get(k)!r} in the checkpoint, {settings.get(k)!r} now"
               for k in sorted(set(old) | set(settings)) if old.get(k) != settings.get(k)]
    if changed:
        changed = [c if len(c) < 200 else c[:200] + "..." for c in changed]
        raise InputError(f"calibration checkpoint {str(path)!r} was written by a run with other settings ("
                         + "; ".join(changed) + f"), so it cannot be resumed: rerun with the same settings to "
                         f"resume it, or {fix}")
    done, counts = meta.get("done"), meta.get("counts") or {}
    stats = {}
    try:
        for split, (layers, hidden, outputs, targets, context) in shapes.items():
            pair = []
            for part in ("fit", "held"):
                count = int(counts[f"{split}.{part}"])
                st = RidgeStats(layers, hidden, outputs=outputs, targets=targets, context=context)
                if count:
                    st.count = count
                    for k in ("shift_h", "shift_x") + _SUMS:
                        t = tensors[f"{split}.{part}.{k}"]
                        if t.dtype != torch.float64 or t.shape != (getattr(st, k).shape if k in _SUMS else (
                                (st.features,) if k == "shift_h" else (layers, outputs))):
                            raise ValueError(f"tensor {split}.{part}.{k} has {t.dtype} {tuple(t.shape)}")
                        setattr(st, k, t)
                pair.append(st)
            stats[split] = tuple(pair)
        done = int(done)
    except (KeyError, ValueError, TypeError) as e:
        raise MapsFormatError(f"calibration checkpoint {str(path)!r} is incomplete or inconsistent ({e}); "
                              f"{fix}") from e
    return done, stats
