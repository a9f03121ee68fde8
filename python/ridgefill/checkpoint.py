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

A checkpoint also records its origin (:func:`origin`: the versions of RidgeFill, ``transformers`` and
``torch`` and the SHA-256 of the code that computes the statistics) and the content hashes of its tensors
and header (:mod:`ridgefill.integrity`). A resume under another origin is refused, since its sums would
continue other code's; a checkpoint whose hashes do not match is refused as corrupted.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata as _metadata
from pathlib import Path
from typing import Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from .errors import InputError, MapsFormatError
from .fileio import atomic_write
from .integrity import KEY as HASH_KEY, content_hashes, verify
from .ridge import RidgeStats

CHECKPOINT_VERSION = 1
_KEY = "ridgefill_checkpoint"
_SUMS = ("sum_h", "gram", "sum_x", "cross", "sq_x")


def checkpoint_path(maps_path: str | os.PathLike) -> Path:
    """The checkpoint beside a maps file: ``<name>.checkpoint.safetensors`` for ``<name>.safetensors``."""
    p = Path(maps_path)
    return p.with_name(p.name.removesuffix(".safetensors") + ".checkpoint.safetensors")


#: The modules whose code computes the statistics a checkpoint holds (relative to the package).
STATS_CODE = ("calibration.py", "checkpoint.py", "ridge.py", "maps.py", "adapters")


def code_digest() -> str:
    """SHA-256 (hex) of the source of :data:`STATS_CODE` (every ``.py`` file, by name, in order)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in STATS_CODE:
        part = root / name
        for f in sorted(part.rglob("*.py")) if part.is_dir() else [part]:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _version(package: str) -> str:
    try:
        return _metadata.version(package)
    except _metadata.PackageNotFoundError:
        return "unknown"


def origin() -> dict:
    """What a checkpoint records about the code that wrote it: ``{"ridgefill", "transformers", "torch":
    versions, "code_sha256": code_digest()}``."""
    import transformers

    return {"ridgefill": _version("ridgefill"), "transformers": transformers.__version__,
            "torch": torch.__version__, "code_sha256": code_digest()}


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
    meta = {"version": CHECKPOINT_VERSION, "settings": settings, "done": done, "counts": counts, "origin": origin()}
    meta[HASH_KEY] = content_hashes(tensors, _fields(meta))
    return atomic_write(path, safetensors_bytes(tensors, metadata={_KEY: json.dumps(meta)}))


def _fields(meta: dict) -> dict:
    """The header fields a checkpoint's content hash covers."""
    return {k: meta.get(k) for k in ("version", "settings", "done", "counts", "origin")}


def load_checkpoint(path: str | os.PathLike, settings: dict,
                    shapes: dict[int, tuple]) -> tuple[int, dict[int, tuple[RidgeStats, RidgeStats]]]:
    """Read a checkpoint written by :func:`save_checkpoint` for a run with ``settings``.

    Args:
        shapes: ``{split: (late layers, hidden, outputs, targets, context)}`` of the run (see :class:`RidgeStats`).

    Returns:
        ``(done, stats)``: chunks already accumulated and ``{split: (fit, heldout)}``.

    Raises:
        InputError: the checkpoint was written by a run with other settings, or under another origin
            (:func:`origin`: another RidgeFill, ``transformers`` or ``torch`` version, or other statistics
            code); the message names them and says how to start afresh.
        MapsFormatError: the file is not a readable checkpoint, or its tensors or header differ from
            their content hashes (corrupted).
    """
    path = Path(path)
    fix = f"delete {str(path)!r} to start the calibration over"
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(_KEY)
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = json.loads(raw) if raw is not None else None
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, OverflowError, MemoryError) as e:
        raise MapsFormatError(f"calibration checkpoint {str(path)!r} is unreadable ({e}); {fix}") from e
    if not isinstance(meta, dict) or meta.get("version") != CHECKPOINT_VERSION or not isinstance(
            meta.get("settings"), dict):
        raise MapsFormatError(f"{str(path)!r} is not a RidgeFill calibration checkpoint of version "
                              f"{CHECKPOINT_VERSION}; {fix}")
    was, now = meta.get("origin"), origin()
    if was != now:
        diff = ("it records no origin (written by an earlier RidgeFill)" if not isinstance(was, dict) else
                "; ".join(f"{k}: {was.get(k)!r} in the checkpoint, {now[k]!r} now" for k in now if was.get(k) != now[k]))
        raise InputError(f"calibration checkpoint {str(path)!r} was written by other code ({diff}), so its statistics "
                         f"cannot be continued here: resuming would mix sums from two versions; {fix}")
    verify(meta.get(HASH_KEY), tensors, _fields(meta), what=f"calibration checkpoint {str(path)!r}", redo=fix,
           legacy=False)
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
