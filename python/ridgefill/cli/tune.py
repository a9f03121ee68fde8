"""``ridgefill tune``: choose the shallowest split that keeps quality (:mod:`ridgefill.evaluate.tune`)."""

from __future__ import annotations

import argparse
import math
import sys

from .. import defaults
from ..errors import InputError
from .args import add_context, add_model, add_threads, parse_lam


def _splits(value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"splits must be comma-separated integers such as 8,11,15; got {value!r}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"expected at least one split; got {value!r}")
    return out


def _selects(value: str) -> tuple[str, ...]:
    from ..errors import InputError as _InputError
    from ..evaluate.tune import check_selects  # heavy (torch): imported when a value is parsed

    out = tuple(v.strip() for v in value.split(",") if v.strip())
    try:
        check_selects(out)
    except _InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return out


def add_subcommand(sub) -> None:
    """Register ``ridgefill tune``."""
    p = sub.add_parser("tune", help="choose the shallowest split that keeps quality, and write its maps",
                       description="One pass over calibration text fits maps at every candidate split; each is "
                       "evaluated with each row selection setting (--selects: the plain fill, one-pass and two-pass "
                       "selection) on held-out documents (key-token and all-token ΔNLL, filled-region needles, FLOP "
                       "bound and a measured ratio). Among the candidates meeting the budget the one with the highest "
                       "FLOP bound is chosen; its maps go to --maps with the selection setting recorded in them "
                       "(which --select auto follows), the table and a plot to --out.")
    add_model(p)
    p.add_argument("--text", nargs="+", action="extend", default=None, metavar="FILE",
                   help="UTF-8 text files to evaluate on (default: the bundled held-out novels)")
    p.add_argument("--calib-text", nargs="+", action="extend", default=None, metavar="FILE",
                   help="UTF-8 text files to calibrate on (default: the shipped calibration mix)")
    p.add_argument("--splits", type=_splits, default=(), metavar="S,S,...",
                   help="candidate splits (default: every other layer from depth 1/4 to 3/4)")
    p.add_argument("--min-needles", type=float, default=0.95, metavar="F",
                   help="budget: every needle score at least this share of exact's (default 0.95)")
    p.add_argument("--max-key-dnll", type=float, default=0.5, metavar="NATS",
                   help="budget: key-token ΔNLL vs exact at most this, nats/token (default 0.5)")
    p.add_argument("--calib-tokens", type=int, default=32768, help="calibration tokens (default 32768)")
    p.add_argument("--lam", type=parse_lam, default=defaults.LAMBDA, help="ridge λ: a number or 'auto' (default)")
    add_context(p)
    p.add_argument("--docs", type=int, default=4, help="held-out documents (default 4)")
    p.add_argument("--doc-tokens", type=int, default=2048, help="tokens per document and needle prompt (default 2048)")
    p.add_argument("--tail", type=int, default=defaults.TAIL, help=f"exact rows of a document (default {defaults.TAIL})")
    p.add_argument("--needle-trials", type=int, default=8, help="needle prompts per variant (default 8; 0: none)")
    p.add_argument("--no-multikey", action="store_true", help="single needles only")
    p.add_argument("--selects", type=_selects, default=None, metavar="SETTING,...",
                   help="row selection settings evaluated at every split, the cheapest that meets the budget at the "
                        "fastest split is recorded in the maps (default off,one-pass,two-pass; "
                        "off,one-pass on models with recurrent-state layers)")
    p.add_argument("--repeats", type=int, default=2, help="timed prefill pairs per split (default 2)")
    p.add_argument("--max-memory", type=float, default=None, metavar="GIB",
                   help="memory the statistics may take, GiB (default: the memory available now)")
    p.add_argument("--out", default="ridgefill-tune", help="folder for the candidates' maps and the report "
                   "(default ridgefill-tune)")
    p.add_argument("--maps", default=None, metavar="FILE", help="the chosen split's maps file (default "
                   "<out>/maps.safetensors)")
    add_threads(p)
    p.set_defaults(func=_cmd_tune)


def _cmd_tune(a) -> None:
    if a.max_memory is not None and not (math.isfinite(a.max_memory) and a.max_memory * 2**30 >= 1):
        raise InputError(f"--max-memory {a.max_memory} must be a finite positive number of GiB (at least one byte)")
    from ..evaluate.tune import CHECKPOINT_EVERY, Budget, TuneConfig, format_table, pass_checkpoint, tune  # heavy

    cfg = TuneConfig(model=a.model, splits=a.splits, texts=tuple(a.text or ()), calib_texts=tuple(a.calib_text or ()),
                     calib_tokens=a.calib_tokens, context=a.context, lam=a.lam, docs=a.docs, doc_tokens=a.doc_tokens,
                     tail=a.tail, needle_trials=a.needle_trials, multikey=not a.no_multikey, repeats=a.repeats,
                     budget=Budget(a.min_needles, a.max_key_dnll), out=a.out, maps=a.maps,
                     max_memory=None if a.max_memory is None else int(a.max_memory * 2**30), threads=a.threads,
                     **({} if a.selects is None else {"selects": a.selects}))
    try:
        report = tune(cfg)
    except KeyboardInterrupt:
        ckpt = pass_checkpoint(a.out)
        where = (f"the pass's statistics so far are in {str(ckpt)!r}: run the same command again to resume"
                 if ckpt.exists() else f"no pass checkpoint exists (one is saved every {CHECKPOINT_EVERY} calibration "
                 "chunks and removed once the maps are fitted; fitted maps are in --out as maps-S<S>.safetensors)")
        print(f"\ninterrupted; {where}", file=sys.stderr)
        raise SystemExit(130) from None
    print(format_table(report))
    print(f"chosen split: S={report['chosen_split']}; maps: {report['maps_path']}; report: {a.out}/tune.md")
