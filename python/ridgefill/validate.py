"""Argument checks shared by the public entry points (``prefill``, ``generate_after``, ``solve_ridge``,
``fit_maps``, ``calibrate``, ``load_maps``): each raises :class:`~ridgefill.errors.InputError` (or the
``error`` type given) naming the argument, the value received and what is expected.

``bool`` is never accepted as a number (``True`` is an ``int`` to Python, never a split or a tail
to RidgeFill).
"""

from __future__ import annotations

import functools
import hashlib
import math
import numbers
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import Tensor

from .errors import InputError


def is_int(value: Any) -> bool:
    """True for Python and NumPy integers, False for ``bool`` and everything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """True for integers and floats (Python or NumPy), False for ``bool``, strings and ``None``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def finite_float(value: Any) -> float | None:
    """``float(value)`` for a finite real number (integers too large for a float, NaN and infinities
    give ``None``), else ``None``."""
    if not is_real(value):
        return None
    try:
        out = float(value)
    except (OverflowError, ValueError):
        return None
    return out if math.isfinite(out) else None


def check_int(value: Any, name: str, *, lo: int | None = None, hi: int | None = None,
              hint: str = "", error: type[Exception] = InputError) -> int:
    """Return ``int(value)`` if it is an integer in ``lo..hi`` (either bound may be ``None``).

    Raises:
        ``error`` (default :class:`InputError`): not an integer (``bool`` and ``2.5`` are refused) or
        out of range; the message names ``name`` and the range, then ``hint``.
    """
    rng = (f" in {lo}..{hi}" if lo is not None and hi is not None else f" ≥ {lo}" if lo is not None
           else f" ≤ {hi}" if hi is not None else "")
    tail = f"; {hint}" if hint else ""
    if not is_int(value):
        raise error(f"{name} must be an integer{rng}; got {value!r} ({type(value).__name__}){tail}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise error(f"{name} must be an integer{rng}; got {value}{tail}")
    return int(value)


def check_real(value: Any, name: str, *, lo: float | None = None, hint: str = "",
               error: type[Exception] = InputError) -> float:
    """Return ``float(value)`` if it is a finite real number ``≥ lo`` (no bound when ``lo`` is ``None``).

    Raises:
        ``error`` (default :class:`InputError`): not a number (``bool``, strings and ``None`` are
        refused), NaN or infinite, or below ``lo``.
    """
    rng = f" ≥ {lo}" if lo is not None else ""
    tail = f"; {hint}" if hint else ""
    out = finite_float(value)
    if out is None or (lo is not None and out < lo):
        shown = repr(value) if len(repr(value)) < 60 else repr(value)[:60] + "..."
        raise error(f"{name} must be a finite number{rng}; got {shown} ({type(value).__name__}){tail}")
    return out


def check_choice(value: Any, name: str, choices: Iterable[str], hint: str = "") -> str:
    """Return ``value`` if it is one of ``choices`` (compared as exact strings). Raises :class:`InputError`."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise InputError(f"{name} must be one of {choices}; got {value!r}" + (f"; {hint}" if hint else ""))
    return value


def check_rows(rows: Any, name: str, num_rows: int) -> list[int]:
    """Return ``rows`` (an iterable of integers or an integer tensor ``[k]``) as a list of ``int`` in
    ``0..num_rows-1``.

    Raises:
        InputError: not iterable, a float, ``bool`` or non-integer tensor entry, or a row out of range.
    """
    if isinstance(rows, Tensor):
        if rows.ndim > 1 or rows.is_floating_point() or rows.is_complex() or rows.dtype == torch.bool:
            raise InputError(f"{name} must be integer row positions [k]; got a {rows.dtype} tensor "
                             f"{tuple(rows.shape)}")
        rows = rows.reshape(-1).tolist()
    try:
        rows = list(rows)
    except TypeError:
        raise InputError(f"{name} must be an iterable of integer row positions; got {type(rows).__name__}") from None
    bad = [r for r in rows if not is_int(r)]
    if bad:
        raise InputError(f"{name} must hold integer row positions; got {bad[:5]!r}")
    out = [int(r) for r in rows]
    if out and (min(out) < 0 or max(out) >= num_rows):
        raise InputError(f"{name} must lie in 0..{num_rows - 1}; got {out}")
    return out


def check_finite(t: Tensor, name: str, error: type[Exception]) -> None:
    """Raise ``error`` naming ``name`` when tensor ``t`` holds a NaN or an infinity."""
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise error(f"{name} holds {bad} NaN or Inf value(s)")


def prompt_digest(input_ids) -> str:
    """SHA-256 (hex) of ``[batch, rows]`` token ids (a tensor or a host NumPy array): their shape and their
    int64 values. Ties a :class:`~ridgefill.fill.PrefillResult` to the prompt it was computed from (one pass
    over the ids, negligible next to a prefill)."""
    if isinstance(input_ids, Tensor):
        input_ids = input_ids.detach().cpu().numpy()
    ids = np.ascontiguousarray(input_ids, dtype=np.int64)
    h = hashlib.sha256(repr(tuple(ids.shape)).encode())
    h.update(ids.tobytes())
    return h.hexdigest()


def check_context(value: Any) -> int:
    """The maps' ``context`` (:func:`ridgefill.fill.context_features`): ``0`` (the row's own ``h_S``) or ``1``
    (also the previous row's). Raises :class:`InputError` for anything else (``bool``, ``1.0``, ``"1"``, ``2``)."""
    return check_int(value, "context", lo=0, hi=1, hint="0: the row's own h_S; 1: also the previous row's")


def check_lam_spec(value: Any, flag: str = "--lam") -> None:
    """A λ setting: ``"auto"`` (per layer, by held-out error) or a finite number ≥ 0. Raises :class:`InputError`."""
    if value != "auto" and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise InputError(f"{flag} {value} must be 'auto' or a finite number ≥ 0 (λ > 0 when the Gram is singular)")
