"""Argument types and options shared by the subcommands. Imports nothing heavy: ``ridgefill --help`` must
not wait for torch or transformers."""

from __future__ import annotations

import argparse

from .. import defaults
from ..data.texts import CALIBRATION_SETS


def parse_lam(value: str) -> float | str:
    """``--lam``: ``'auto'`` or a float (:func:`ridgefill.ridge.fit_maps` checks its sign)."""
    if value == "auto":
        return "auto"
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"λ must be a number or 'auto', got {value!r}") from None


def parse_setting(value: str):
    """``--select`` on the product commands: a named setting (:func:`ridgefill.select.parse_setting`)."""
    from ..errors import InputError
    from ..select import parse_setting as parse  # heavy (torch): imported when a value is parsed

    try:
        return parse(value)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def setting_name(value: str) -> str:
    """``--select`` on ``ridgefill bench``: a named setting, checked (:func:`parse_setting`) and kept as written."""
    parse_setting(value)
    return value.strip()


def parse_spec(value: str):
    """``--select`` on ``ridgefill eval``: the full spec language (:meth:`ridgefill.select.Select.parse`)."""
    from ..errors import InputError
    from ..select import Select  # heavy (torch): imported when a value is parsed

    try:
        return Select.parse(value)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_lengths(value: str) -> tuple[int, ...]:
    """Comma-separated token counts, ``k`` for 1024: ``1k,2k,8000``."""
    out = []
    for part in value.split(","):
        part = part.strip().lower()
        if not part:
            continue
        mult = 1024 if part.endswith("k") else 1
        try:
            out.append(int(float(part[:-1] if mult > 1 else part) * mult))
        except ValueError:
            raise argparse.ArgumentTypeError(f"lengths must be comma-separated integers such as 1k,2k,8000; "
                                             f"got {value!r}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"expected at least one length; got {value!r}")
    return tuple(out)


#: The default split, as the help of ``--split`` and ``--splits`` says it (from :data:`defaults.TUNED_SPLITS`).
SPLIT_DEFAULT_HELP = ("default: " + ", ".join(f"{v} for {k}" for k, v in defaults.TUNED_SPLITS.items())
                      + ", chosen by `ridgefill tune`; else half the layers")

SETTING_HELP = ("row selection: 'auto' (default: the setting the maps record, written by `ridgefill tune`, else "
                "'on'; 'two-pass' with K/V maps), 'on' or 'one-pass' (query-aware: rows the question points at, up to 5%% "
                "of the prompt, scored before the late layers from predicted queries, which then run once; the "
                "question must be in the tail), 'two-pass' (the same, scored after a first pass of the late "
                "layers), 'prompt' (query-agnostic: rows the maps "
                "extrapolate on, for a document whose question comes later), 'off' (the plain fill); optionally "
                "',budget=F', e.g. 'on,budget=0.1'")

SPEC_HELP = ("row selection spec (ridgefill.select.Select.parse): 'on', 'off', 'prompt', 'attention', 'ngram', "
             "key=value pairs such as 'budget=0.05,before=2,after=16,queries=1,heads=induction,top_heads=8,"
             "rounds=1,sink=1,contrast=128,reference=0,floor=1', parts joined by '+' each with its own budget, and "
             "a last 'total=F' capping them together")


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, metavar="MODEL",
                   help="'smollm2' (default: the bundled SmolLM2-135M-Instruct), 'gemma3-270m', a local Hugging Face "
                        "model directory or a .gguf file (a GGUF is converted once and cached)")


def _threads_arg(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of threads; got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be at least 1 (or leave --threads out for torch's choice)")
    return n


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=_threads_arg, default=None, help="torch CPU threads (default: torch's choice)")


def add_context(p: argparse.ArgumentParser, default: int = defaults.CONTEXT) -> None:
    """``--context {0,1}``: what the maps read (:func:`ridgefill.maps.context_features`)."""
    p.add_argument("--context", type=int, choices=(0, 1), default=default,
                   help=f"what the maps read: 1, the row's split state h_S and the previous row's (context maps); "
                        f"0, the row's own h_S only (default {default})")


def add_calib_set(p: argparse.ArgumentParser, extra: str = "") -> None:
    """``--calib-set`` (default ``None``: :data:`ridgefill.defaults.CALIBRATION_SET`, not asked for explicitly)."""
    p.add_argument("--calib-set", choices=CALIBRATION_SETS, default=None,
                   help="the shipped calibration text: 'mix' (the default: four Austen novels, The Debian "
                        "Administrator's Handbook and Python standard-library source, a third of the chunks each) "
                        "or 'novels' (the four novels alone)" + extra)
