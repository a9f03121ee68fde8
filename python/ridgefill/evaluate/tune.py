"""``ridgefill tune``: the shallowest split that keeps quality, for the user's own model and text.

One streaming pass over the calibration text accumulates the statistics of every candidate split at once
(:func:`ridgefill.calibration.calibrate_many`; default: every other layer from depth 1/4 to 3/4,
:func:`default_splits`); each candidate's maps (context maps by default) are fitted and saved as soon as
they are ready. Each candidate split is then evaluated with each row selection setting of
:data:`TUNE_SELECTS` (the plain fill, one-pass and two-pass selection; ``--selects``) on held-out documents,
with the evaluation code of :mod:`ridgefill.evaluate.loss` and :mod:`ridgefill.evaluate.needles`:

- key-token and all-token ΔNLL vs exact (nats/token, 95 % bootstrap interval over documents);
- filled-region needles (single, and multikey unless turned off) at the documents' length, in percent of
  trials, beside exact's score;
- the FLOP bound (:func:`ridgefill.costs.ideal_ratio`, with the rows the selection chose on the first
  document) and a short measured ratio (exact over fill prefill time, interleaved, median).

The choice (:func:`choose`) is, among the (split, setting) candidates whose every needle score is at least
``needle_fraction`` of exact's and whose key-token ΔNLL (point estimate) is at most ``max_key_dnll``
(:class:`Budget`), the one with the highest FLOP bound (for one setting: the shallowest split; the plain fill
only where it meets the budget on multikey needles too, else the cheapest selection that does). Its maps are
written to the maps file (the format ``ridgefill calibrate`` writes) with the setting recorded in them
(``RidgeMaps.select``, which ``select="auto"`` follows in ``prefill``, the command line and the vLLM plugin),
and a report (``tune.json``, ``tune.md``, ``tune.png``: quality against speed per candidate, the chosen one
marked) to the output folder.

The statistics of all candidates are held in memory together: :func:`pass_memory` gives the figure,
printed before the pass; a pass that would not fit is refused (:func:`check_memory`).
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Sequence

import torch

from .. import defaults
from ..errors import InputError
from ..fileio import atomic_write, write_json
from ..validate import check_int, check_lam_spec, check_real

#: Bytes per float64 value of the statistics.
_F64 = 8

#: The row selection settings ``ridgefill tune`` evaluates at every candidate split (``--selects``), from the
#: cheapest: the plain fill, one-pass and two-pass selection (:func:`ridgefill.select.parse_setting`).
TUNE_SELECTS = ("off", "one-pass", "two-pass")


@dataclass(frozen=True)
class Budget:
    """The quality a split must keep to be chosen.

    Attributes:
        needle_fraction: every needle variant's score must be at least this fraction of exact's (0 to 1).
        max_key_dnll: the key-token ΔNLL vs exact (nats/token, point estimate) must be at most this.
    """

    needle_fraction: float = 0.95
    max_key_dnll: float = 0.5

    def __post_init__(self):
        if check_real(self.needle_fraction, "the needle fraction (--min-needles)", lo=0.0) > 1:
            raise InputError(f"the needle fraction (--min-needles) is a share of exact's score from 0 to 1; got "
                             f"{self.needle_fraction}")
        check_real(self.max_key_dnll, "the key-token ΔNLL bound (--max-key-dnll)", lo=0.0,
                   hint="in nats per token, e.g. 0.5")


@dataclass
class TuneConfig:
    """Settings of :func:`tune` (the defaults finish in under 30 minutes on 2 CPU cores with SmolLM2).

    ``splits``: candidates (``()``: :func:`default_splits`); ``texts``: evaluation text files (``()``: the
    bundled evaluation novels); ``calib_texts``: calibration text files (``()``: the shipped mix);
    ``max_memory``: bytes the statistics may take (``None``: the memory available now); ``selects``: the
    row selection settings evaluated at every split (:data:`TUNE_SELECTS`).
    """

    model: str | None = None
    splits: tuple[int, ...] = ()
    texts: tuple[str, ...] = ()
    calib_texts: tuple[str, ...] = ()
    calib_tokens: int = 32768
    chunk: int = defaults.CHUNK
    context: int = defaults.CONTEXT
    lam: float | str = defaults.LAMBDA
    docs: int = 4
    doc_tokens: int = 2048
    tail: int = defaults.TAIL
    window: int = 64
    tau: float = 1.0
    needle_trials: int = 8
    needle_tail: int = 64
    multikey: bool = True
    repeats: int = 2
    resamples: int = 2000
    budget: Budget = field(default_factory=Budget)
    out: str = "ridgefill-tune"
    maps: str | None = None
    max_memory: int | None = None
    threads: int | None = None
    seed: int = 0
    selects: tuple[str, ...] | None = None


def default_splits(num_layers: int) -> list[int]:
    """Every other layer from depth 1/4 to 3/4: ``S = round(L/4), +2, …, ≤ round(3L/4)`` (half up), kept
    within ``0..L-2`` (SmolLM2, 30 layers: 8, 10, …, 22).

    Raises:
        InputError: a model with fewer than 2 layers.
    """
    if num_layers < 2:
        raise InputError(f"a {num_layers}-layer model has no split to tune (it needs at least 2 layers)")
    lo = int(Fraction(num_layers, 4) + Fraction(1, 2))
    hi = min(int(Fraction(3 * num_layers, 4) + Fraction(1, 2)), num_layers - 2)
    return list(range(min(lo, hi), hi + 1, 2))


def check_splits(splits: Sequence[int], num_layers: int) -> list[int]:
    """``splits`` sorted and checked: integers in ``0..L-2``, no repeats. Raises :class:`InputError`."""
    out = [check_int(s, "split S", lo=0, hi=num_layers - 2, hint=f"this model has {num_layers} layers")
           for s in splits]
    _check_no_repeats(splits)
    if not out:
        raise InputError("no candidate split: give at least one (or leave --splits out for the default)")
    return sorted(out)


def _check_no_repeats(splits: Sequence[int]) -> None:
    if len(set(splits)) != len(splits):
        raise InputError(f"the candidate splits {list(splits)} repeat a split: list each once")


def stats_bytes(num_layers: int, hidden: int, split: int, context: int) -> int:
    """Bytes of one split's fit and held-out statistics (:class:`ridgefill.ridge.RidgeStats`, float64):
    ``2 · 8 · (f + f² + late · (k + f·k + 1) + late·k)`` with ``f = hidden·(1+context)``, ``k = hidden``."""
    f, k, late = hidden * (1 + context), hidden, num_layers - split - 1
    one = f + f * f + late * (2 * k + f * k + 1) + f
    return 2 * _F64 * one


def pass_memory(num_layers: int, hidden: int, splits: Sequence[int], context: int) -> int:
    """Peak bytes of the multi-split pass and fit: every candidate's statistics together (the pass), plus
    four more copies of the largest split's (merged, scaled and solved copies during its fit, and the
    maps' own statistics). Model weights and activations are not counted."""
    each = [stats_bytes(num_layers, hidden, s, context) for s in splits]
    return sum(each) + 2 * max(each)


def available_memory() -> int | None:
    """Bytes of memory available now (``MemAvailable`` of ``/proc/meminfo``; ``None`` where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(num_layers: int, hidden: int, splits: Sequence[int], context: int, limit: int | None,
                 limit_name: str = "available") -> int:
    """The pass's memory (:func:`pass_memory`), refused when over ``limit`` bytes.

    Returns:
        the bytes needed.

    Raises:
        InputError: over the limit; the message gives both figures and a smaller list of candidates that
            fits (every other one, repeatedly), or says that even one split does not fit.
    """
    need = pass_memory(num_layers, hidden, splits, context)
    if limit is None or need <= limit:
        return need
    fewer = list(splits)
    while len(fewer) > 1 and pass_memory(num_layers, hidden, fewer, context) > limit:
        fewer = fewer[::2]
    gib = 2 ** 30
    if pass_memory(num_layers, hidden, fewer, context) > limit:
        hint = ("even one split does not fit: free memory, raise --max-memory if more is available, or use "
                "--context 0 (half the features)")
    else:
        hint = f"give fewer candidates, e.g. --splits {','.join(map(str, fewer))}, or run tune more than once"
    shown = f"{limit / gib:.2f}" if limit >= gib / 100 else f"{limit / gib:.3g}"
    raise InputError(f"the statistics of {len(splits)} candidate splits {list(splits)} need {need / gib:.2f} GiB, "
                     f"more than the {shown} GiB {limit_name}; {hint}")


def _meets(r: dict, budget: Budget) -> bool:
    """Whether candidate row ``r`` meets ``budget`` (a missing key-token ΔNLL fails it)."""
    if r.get("key_dnll") is None or not r["key_dnll"] <= budget.max_key_dnll:
        return False
    return all(r["needles"][v] >= budget.needle_fraction * r["exact_needles"][v] - 1e-9 for v in r["exact_needles"])


def choose(rows: Sequence[dict], budget: Budget) -> dict | None:
    """The candidate meeting ``budget`` with the highest FLOP bound (ties: the shallower split, then the row
    listed first), or ``None``.

    Args:
        rows: one per candidate: ``{"split", "key_dnll", "needles": {variant: score %}, "exact_needles":
            {variant: score %}, "flop_bound"}`` (and ``"select"``, the setting); a missing key-token ΔNLL
            (``None``: no key tokens) fails the rule. Without ``"flop_bound"`` the shallowest split wins.

    Returns:
        the chosen row: ``key_dnll ≤ max_key_dnll`` and, for every needle variant,
        ``score ≥ needle_fraction · exact score``.
    """
    ok = [(i, r) for i, r in enumerate(rows) if _meets(r, budget)]
    if not ok:
        return None
    return max(ok, key=lambda ir: (ir[1].get("flop_bound", 0.0), -ir[1]["split"], -ir[0]))[1]


def choose_split(rows: Sequence[dict], budget: Budget) -> int | None:
    """The split of :func:`choose`'s candidate, or ``None``."""
    row = choose(rows, budget)
    return None if row is None else row["split"]


def check_config(cfg: TuneConfig) -> None:
    """Reject bad sizes before anything is loaded. Raises :class:`InputError`."""
    for flag, value in {"--calib-tokens": cfg.calib_tokens, "--docs": cfg.docs, "--doc-tokens": cfg.doc_tokens,
                        "--tail": cfg.tail, "--window": cfg.window, "--needle-tail": cfg.needle_tail,
                        "--repeats": cfg.repeats, "--resamples": cfg.resamples}.items():
        check_int(value, flag, lo=1)
    check_int(cfg.needle_trials, "--needle-trials", lo=0)
    check_real(cfg.tau, "the key-token threshold τ", lo=0.0, hint="in nats, e.g. 1.0")
    if cfg.tail >= cfg.doc_tokens:
        raise InputError(f"--tail {cfg.tail} must be shorter than --doc-tokens {cfg.doc_tokens}")
    if cfg.needle_tail >= cfg.doc_tokens:
        raise InputError(f"--doc-tokens {cfg.doc_tokens} must be longer than the needle prompts' exact tail of "
                         f"{cfg.needle_tail} tokens")
    if cfg.threads is not None:
        check_int(cfg.threads, "--threads", lo=1, hint="or leave it out for torch's choice")
    check_lam_spec(cfg.lam)
    if cfg.lam == "auto" and cfg.calib_tokens < 2 * cfg.chunk:
        raise InputError(f"--lam auto chooses λ on held-out chunks of {cfg.chunk} tokens, so --calib-tokens "
                         f"{cfg.calib_tokens} must be at least {2 * cfg.chunk}; raise --calib-tokens or give --lam")
    _check_no_repeats(cfg.splits)
    if cfg.selects is not None:
        check_selects(cfg.selects)
    if cfg.max_memory is not None:
        check_int(cfg.max_memory, "--max-memory", lo=1)
    if not isinstance(cfg.budget, Budget):
        raise InputError("budget must be a ridgefill.evaluate.tune.Budget")
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {cfg.out!r} is a file: give a folder for the candidates' maps and the report")
    _check_creatable(out, "--out")
    if cfg.maps is not None:
        if Path(cfg.maps).is_dir():
            raise InputError(f"--maps {cfg.maps!r} is a folder: give the file's path, e.g. "
                             f"{str(Path(cfg.maps) / 'maps.safetensors')!r}")
        _check_creatable(Path(cfg.maps).parent, "--maps")


def check_selects(selects: Sequence[str]) -> dict:
    """``{name: Select, Selection or None}`` of the named selection settings ``ridgefill tune`` evaluates: at least
    one, each a name of :func:`ridgefill.select.parse_setting` other than ``auto``, no two the same selection; keyed
    by the setting a maps file records (:func:`_recorded_name`). Raises :class:`InputError`."""
    from ..select import parse_setting

    if not selects or not all(isinstance(s, str) for s in selects):
        raise InputError(f"--selects {selects!r}: give at least one selection setting, e.g. off,one-pass,two-pass")
    if len(set(selects)) != len(selects):
        raise InputError(f"--selects {list(selects)} repeats a setting: list each once")
    parsed = []
    for name in selects:
        if name.strip() == "auto":
            raise InputError("--selects: 'auto' follows the maps' recorded setting, which tune is choosing; name "
                             "the settings to compare, e.g. off,one-pass,two-pass")
        sel = parse_setting(name)
        twin = next((given for given, other in parsed if other == sel), None)
        if twin is not None:
            raise InputError(f"--selects {','.join(selects)}: {name!r} is the same selection as {twin!r} "
                             "('on' is 'one-pass'): list each once")
        parsed.append((name, sel))
    return {_recorded_name(name, sel): sel for name, sel in parsed}


def _recorded_name(name: str, sel) -> str:
    """The setting a maps file records for ``name`` (parsed: ``sel``), as the maps reader parses it
    (:func:`ridgefill.select.as_select`): ``on`` as what it is, ``one-pass``, so that the file keeps its meaning if
    the default changes; a name the spec language reads as ``sel`` as given; else ``sel``'s spec (a named
    selection with ``,budget=F``)."""
    from ..select import as_select

    head, sep, rest = name.partition(",")
    if head.strip() == "on":
        name = f"one-pass{sep}{rest}"
    try:
        return name if as_select(name) == sel else str(sel)
    except InputError:
        return str(sel)


def selects_for(model, selects: Sequence[str] | None) -> dict:
    """:func:`check_selects` of ``selects`` on ``model``; ``None``: :data:`TUNE_SELECTS`, less the settings that run
    two passes of the late layers on a model with recurrent-state layers (their state cannot rerun rows).

    Raises:
        InputError: as :func:`check_selects`; a named setting that runs two passes on a model with
        recurrent-state layers (checked before the calibration pass).
    """
    from ..adapters import adapter_for
    from ..select import runs_on_recurrent

    recurrent = bool(adapter_for(model).recurrent_layers)
    if selects is None:
        return {name: sel for name, sel in check_selects(TUNE_SELECTS).items()
                if not recurrent or runs_on_recurrent(sel)}
    settings = check_selects(selects)
    refused = [name for name, sel in settings.items() if recurrent and not runs_on_recurrent(sel)]
    if refused:
        raise InputError(f"--selects {','.join(selects)}: {', '.join(refused)} runs two passes of the late layers, "
                         "which a model with recurrent-state layers cannot (its state advances once over the rows): "
                         "leave it out, e.g. --selects off,one-pass")
    return settings


def _check_creatable(folder: Path, flag: str) -> None:
    """Refuse a folder that cannot be created or written (checked before the model loads, nothing created)."""
    p = folder.absolute()
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        raise InputError(f"{flag} {str(folder)!r} cannot be created: {str(p)!r} is a file; choose another path")
    if not os.access(p, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {str(folder)!r} cannot be written: no write permission on {str(p)!r}; "
                         "choose another path")


#: the multi-split pass saves its checkpoint every this many calibration chunks (and after the last)
CHECKPOINT_EVERY = 16


def pass_checkpoint(out: str | os.PathLike) -> Path:
    """The multi-split pass's checkpoint in the folder ``out``: ``<out>/tune.checkpoint.safetensors``."""
    from ..checkpoint import checkpoint_path

    return checkpoint_path(Path(out) / "tune.safetensors")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measured_ratio(model, ids: torch.Tensor, maps, tail: int, select, repeats: int) -> tuple[float, list[int]]:
    """Median over ``repeats`` of exact / fill (with ``select``) prefill seconds on ``ids`` ``[1, N]``, the two
    interleaved after a warm-up; and the positions of the rows the selection chose."""
    from ..fill import prefill

    chosen = prefill(model, ids, maps, tail=tail, mode="ridge", select=select).selected
    prefill(model, ids, None, tail=ids.shape[1], mode="exact")
    ratios = []
    for _ in range(repeats):
        e = _timed(lambda: prefill(model, ids, None, tail=ids.shape[1], mode="exact"))
        f = _timed(lambda: prefill(model, ids, maps, tail=tail, mode="ridge", select=select))
        ratios.append(e / f)
    return statistics.median(ratios), [] if chosen is None else chosen.tolist()


def system_suffixes(selects: dict) -> dict[str, str]:
    """The evaluation's system suffix of each setting (``{name: Select, Selection or None}``): ``"ridge"`` for the
    plain fill, ``"ridge+sel"`` (``"ridge+sel<i>"`` for several) for the others, as
    :func:`ridgefill.evaluate.loss.fill_variants` and :func:`ridgefill.evaluate.needles.run_needles` name them."""
    on = [name for name, sel in selects.items() if sel is not None]
    return {name: "ridge" if sel is None else "ridge+sel" + (str(on.index(name)) if len(on) > 1 else "")
            for name, sel in selects.items()}


def candidate_rows(summary: list[dict], needles: dict | None, splits: Sequence[int],
                   suffixes: dict[str, str] | None = None) -> list[dict]:
    """Per split and selection setting (``suffixes``: ``{name: system suffix}``, :func:`system_suffixes`;
    default ``{"on": "ridge+sel"}``): key-token and all-token ΔNLL with intervals (from
    :func:`ridgefill.evaluate.loss.summarise` rows of variant ``"<S>/<suffix>"``) and needle scores
    (:func:`ridgefill.evaluate.needles.run_needles` scores) beside exact's."""
    suffixes = suffixes or {"on": "ridge+sel"}
    rows = []
    exact = {}
    for r in (needles or {}).get("scores", []):
        if r["system"] == "exact":
            exact[r["variant"]] = r["score"]
    for s in splits:
        for name, suffix in suffixes.items():
            system = f"{s}/{suffix}"
            row = {"split": s, "select": name, "needles": {}, "needle_ci": {}, "exact_needles": dict(exact)}
            for tokens, key in (("key", "key_dnll"), ("all", "all_dnll")):
                hit = [r for r in summary if r["tokens"] == tokens and r["variant"] == system
                       and r["set"] == "heldout"]
                row[key] = hit[0]["delta_nll"]["mean"] if hit else None
                row[key + "_ci"] = hit[0]["delta_nll"]["ci"] if hit else None
            for r in (needles or {}).get("scores", []):
                if r["system"] == system:
                    row["needles"][r["variant"]] = r["score"]
                    row["needle_ci"][r["variant"]] = r["ci"]
            rows.append(row)
    return rows


def tune(cfg: TuneConfig, progress: bool = True) -> dict:
    """Run ``ridgefill tune`` and return the report (also written to ``<out>/tune.json``, ``tune.md`` and
    ``tune.png``); the chosen split's maps are written to ``cfg.maps`` (default ``<out>/maps.safetensors``).

    Raises:
        InputError: bad settings, texts too short, candidates out of range or over the memory limit (all
            before the pass), or no candidate meeting the budget (after the report is written: the message
            names the report and what to loosen).
        OverlapError: evaluation text (documents or needle prose) overlapping the calibration text, before
            the model loads.
    """
    from ..calibration import calibrate_many, calibration_chunks, special_prefix
    from ..costs import ideal_ratio
    from ..data.models import load_model, load_tokenizer
    from ..data.overlap import check_disjoint, fingerprint, sample_for
    from ..data.texts import EVALUATION_BOOKS, calibration_texts, load_texts, read_text_files
    from ..select import as_selection
    from .depth import maps_path
    from .loss import fill_variants, key_token_stats, score_documents, summarise
    from .documents import document_room, evaluation_plan
    from .main_job import source_commit
    from .needles import haystack_sentences, run_needles

    check_config(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    tok = load_tokenizer(cfg.model)
    eval_texts = read_text_files(cfg.texts) if cfg.texts else {k: v for k, v in load_texts().items()
                                                              if k in EVALUATION_BOOKS}
    calib = read_text_files(cfg.calib_texts) if cfg.calib_texts else calibration_texts(defaults.CALIBRATION_SET)
    docs = cfg.docs
    if cfg.texts:
        docs = min(docs, document_room(tok, eval_texts, cfg.doc_tokens))
        if docs < 1:
            raise InputError(f"the text files {list(cfg.texts)} hold no document of {cfg.doc_tokens + 1} tokens: "
                             "give a longer text or lower --doc-tokens")
        if docs < cfg.docs:
            say(f"the text files hold {docs} document(s) of {cfg.doc_tokens + 1} tokens, fewer than --docs "
                f"{cfg.docs}: evaluating on {docs}" + ("; one document gives no confidence interval" if docs == 1 else ""))
    docs, labels = evaluation_plan(tok, eval_texts, docs, cfg.doc_tokens)
    # too little text, or evaluation text overlapping the calibration text, fails before the model loads
    chunks = calibration_chunks(tok, calib, cfg.calib_tokens, cfg.chunk)
    prefix = len(special_prefix(tok))
    runs = [c[prefix:] for c in chunks]
    fp = fingerprint(runs, sample=sample_for(sum(r.numel() for r in runs)))
    what = "the calibration text files" if cfg.calib_texts else f"the shipped calibration set {defaults.CALIBRATION_SET!r}"
    remedy = "evaluate on other text (--text) or calibrate on text without it (--calib-text)"
    check_disjoint(docs, fp, names=labels, calibration=what, prefix_tokens=prefix, remedy=remedy)
    for name, text in (eval_texts.items() if cfg.needle_trials else ()):
        check_disjoint([tok(text, add_special_tokens=False)["input_ids"]], fp,
                       names=[f"needle haystack text {name!r}"], calibration=what, remedy=remedy)
    if cfg.needle_trials:  # a needle tail too short for the question, or too little prose, fails here too
        from .needles import case_depth, case_rng, make_case

        for variant in ["single", "multikey"] if cfg.multikey else ["single"]:
            make_case(tok, haystack_sentences(eval_texts), length=cfg.doc_tokens, tail=cfg.needle_tail,
                      variant=variant, rng=case_rng(cfg.seed, variant, cfg.doc_tokens, 0),
                      depth=case_depth(variant, 0, cfg.needle_trials))

    model, tok, model_name = load_model(cfg.model)
    L, d = model.config.num_hidden_layers, model.config.hidden_size
    settings = selects_for(model, cfg.selects)
    splits = check_splits(cfg.splits, L) if cfg.splits else default_splits(L)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and cfg.doc_tokens + 16 > max_pos:
        raise InputError(f"--doc-tokens {cfg.doc_tokens} leaves no room to answer within the model's context of "
                         f"{max_pos} tokens")
    limit = cfg.max_memory if cfg.max_memory is not None else available_memory()
    limit_name = "available" if cfg.max_memory is None else "that --max-memory allows"
    need = check_memory(L, d, splits, cfg.context, limit, limit_name)
    say(f"candidate splits {splits} of {L} layers; their statistics need {need / 2**30:.2f} GiB"
        + ("" if limit is None else f" (of {limit / 2**30:.2f} GiB {limit_name})"))

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    maps_file = Path(cfg.maps) if cfg.maps else out / "maps.safetensors"
    ckpt = pass_checkpoint(out)
    if ckpt.exists():
        say(f"resuming the pass from the checkpoint {ckpt}")
    t0 = time.perf_counter()
    fitted = calibrate_many(model, tok, calib, splits=splits, tokens=cfg.calib_tokens, chunk=cfg.chunk, lam=cfg.lam,
                            context=cfg.context, model_name=model_name, progress=progress, checkpoint=ckpt,
                            checkpoint_every=CHECKPOINT_EVERY,
                            on_maps=lambda s, m: m.save(maps_path(out, s)))
    calib_s = time.perf_counter() - t0
    ckpt.unlink(missing_ok=True)
    first = fitted[splits[0]]

    suffixes = system_suffixes(settings)
    selections = [sel for sel in settings.values() if sel is not None]
    modes = ("ridge",) if any(sel is None for sel in settings.values()) else ()
    say(f"evaluating {len(splits)} splits × {len(settings)} selection settings ({', '.join(settings)}) on "
        f"{len(docs)} documents of {cfg.doc_tokens} tokens")
    records = score_documents(model, docs, ["heldout"] * len(docs), tail=cfg.tail, window=cfg.window,
                              variants=fill_variants(model, fitted, modes, tail=cfg.tail, selects=selections),
                              prefix_tokens=prefix, progress=say)
    summary = summarise(records, tau=cfg.tau, resamples=cfg.resamples, seed=cfg.seed)
    needles = None
    if cfg.needle_trials:
        needles = run_needles(model, tok, haystack_sentences(eval_texts), lengths=[cfg.doc_tokens],
                              trials=cfg.needle_trials, variants=["single", "multikey"] if cfg.multikey else ["single"],
                              modes=["exact", *modes], maps_by_split=fitted, splits=splits, tail=cfg.needle_tail,
                              seed=cfg.seed, selects=selections, select_modes=("ridge",), progress=say)
    rows = candidate_rows(summary, needles, splits, suffixes)
    ids = docs[0][None, :-1]
    for row in rows:
        s, select = row["split"], settings[row["select"]]
        ratio, rows_chosen = measured_ratio(model, ids, fitted[s], cfg.tail, select, cfg.repeats)
        args = {} if select is None else as_selection(select).cost_args(cfg.tail)
        row["flop_bound"] = ideal_ratio(model.config, ids.shape[1], s, cfg.tail, selected=rows_chosen,
                                        context=cfg.context, **args)
        row["measured_ratio"] = ratio
        row["selected_rows"] = len(rows_chosen)
        say(f"S={s}, select {row['select']}: bound {row['flop_bound']:.2f}x, measured {ratio:.2f}x")
    chosen = choose(rows, cfg.budget)
    chosen_split = None if chosen is None else chosen["split"]
    save_error = None
    if chosen is not None:
        try:
            maps = fitted[chosen_split]
            maps.meta["select"] = chosen["select"]  # what select="auto" follows
            maps.save(maps_file)
        except Exception as e:  # the report is still written, then the error is raised
            save_error = e
    stale = chosen_split is None and maps_file.exists()
    if stale:  # an earlier run's choice must not pass for this run's
        maps_file.unlink()
        from ..maps import stats_path

        stats_path(maps_file).unlink(missing_ok=True)
    report = {
        "kind": "tune", "model": model_name, "num_layers": L, "hidden": d, "splits": splits,
        "chosen_split": chosen_split, "chosen_select": None if chosen is None else chosen["select"],
        "maps_path": str(maps_file) if chosen_split is not None and save_error is None else None,
        "budget": {"needle_fraction": cfg.budget.needle_fraction, "max_key_dnll": cfg.budget.max_key_dnll},
        "rows": rows, "selects": {name: None if sel is None else str(sel) for name, sel in settings.items()},
        "context": cfg.context, "lambda_spec": str(cfg.lam),
        "calibration_tokens": first.meta.get("calibration_tokens"), "calibration_seconds": calib_s,
        "statistics_bytes": need, "documents": len(docs), "doc_tokens": cfg.doc_tokens, "tail": cfg.tail,
        "window": cfg.window, "tau": cfg.tau, "needle_trials": cfg.needle_trials, "needle_tail": cfg.needle_tail,
        "key_tokens": key_token_stats(records, cfg.tau), "repeats": cfg.repeats,
        "evaluation_texts": list(eval_texts), "threads": torch.get_num_threads(), "machine": platform.machine(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "wall_seconds": time.perf_counter() - t_start,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "commit": source_commit(),
    }
    write_report(report, out)
    if save_error is not None:
        raise save_error
    if chosen_split is None:
        needle_rule = f"needles ≥ {cfg.budget.needle_fraction:.0%} of exact, " if cfg.needle_trials else ""
        loosen = "--min-needles / --max-key-dnll" if cfg.needle_trials else "--max-key-dnll"
        removed = f"; the earlier {str(maps_file)!r} was removed" if stale else ""
        raise InputError(f"no candidate split in {splits} meets the budget with any selection setting "
                         f"({', '.join(settings)}; {needle_rule}key-token ΔNLL ≤ {cfg.budget.max_key_dnll}); the table "
                         f"is in {out / 'tune.md'}{removed}: add deeper splits (--splits), other settings (--selects) "
                         f"or loosen {loosen}")
    return report


def format_table(report: dict) -> str:
    """The report's table in markdown: one row per split and selection setting, the chosen one marked."""
    variants = list(report["rows"][0]["exact_needles"]) if report["rows"] else []
    head = ["S", "depth", "selection", "FLOP bound", "measured", "key-token ΔNLL [95 % CI]", "all-token ΔNLL [95 % CI]"]
    head += [f"{v} needles (exact)" for v in variants] + ["meets budget", "chosen"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    budget = Budget(**report["budget"])
    for r in report["rows"]:
        def ci(key):
            if r.get(key) is None:
                return "n/a"
            lo, hi = r[key + "_ci"]
            return f"{r[key]:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        cells = [str(r["split"]), f"{r['split'] / report['num_layers']:.2f}", r.get("select", "on"),
                 f"{r['flop_bound']:.2f}x",
                 f"{r['measured_ratio']:.2f}x", ci("key_dnll"), ci("all_dnll")]
        cells += [f"{r['needles'].get(v, math.nan):.0f}% ({r['exact_needles'][v]:.0f}%)" for v in variants]
        chosen = r["split"] == report["chosen_split"] and r.get("select", "on") == report.get("chosen_select", "on")
        cells += ["yes" if _meets(r, budget) else "no", "**chosen**" if chosen else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(report: dict, out: str | os.PathLike) -> None:
    """Write ``tune.json``, ``tune.md`` (the table and the settings) and ``tune.png`` (key-token ΔNLL and
    needle score against the FLOP bound per split, the chosen split marked) into ``out``, atomically."""
    from .report import _plt

    out = Path(out)
    write_json(out / "tune.json", report)
    b = report["budget"]
    text = (f"# ridgefill tune: {report['model']}\n\n"
            f"{report['num_layers']} layers; candidates {report['splits']}; chosen: "
            + (f"S = {report['chosen_split']}, selection {report['chosen_select']}" if report['chosen_split'] is not None
               else "none meets the budget") + ".\n\n"
            f"Budget: every needle variant ≥ {b['needle_fraction']:.0%} of exact's score, key-token ΔNLL ≤ "
            f"{b['max_key_dnll']} nats/token; among the candidates that meet it, the highest FLOP bound is chosen. "
            f"Row selection settings: "
            + ", ".join(f"{k} ({v})" if v else k for k, v in report["selects"].items()) + ". "
            f"{report['documents']} documents of {report['doc_tokens']} tokens (exact tail {report['tail']}); "
            f"needles: {report['needle_trials']} trials per variant at {report['doc_tokens']} tokens, exact tail "
            f"{report['needle_tail']}; measured ratio: median of {report['repeats']} interleaved prefills of the "
            f"first document; calibration: {report['calibration_tokens']} tokens.\n\n"
            + format_table(report) + "\n\n![quality against speed](tune.png)\n")
    atomic_write(out / "tune.md", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    rows = report["rows"]
    x = [r["flop_bound"] for r in rows]
    series = list(dict.fromkeys(r.get("select", "on") for r in rows))  # one line per selection setting
    for ax, key, label in ((ax1, "key_dnll", "key-token ΔNLL (nats/token)"), (ax2, None, "needles (% of trials)")):
        for name in series:
            part = [r for r in rows if r.get("select", "on") == name]
            px = [r["flop_bound"] for r in part]
            if key:
                y = [math.nan if r[key] is None else r[key] for r in part]
                err = [[0 if r[key] is None else r[key] - r[key + "_ci"][0] for r in part],
                       [0 if r[key] is None else r[key + "_ci"][1] - r[key] for r in part]]
                ax.errorbar(px, y, yerr=err, marker="o", capsize=3, label=f"select {name}")
            else:
                for v in (rows[0]["exact_needles"] if rows else {}):
                    ax.plot(px, [r["needles"].get(v, math.nan) for r in part], marker="o", label=f"{v}, select {name}")
        if key:
            ax.axhline(b["max_key_dnll"], color="grey", linestyle="--", label="budget")
        else:
            for v in (rows[0]["exact_needles"] if rows else {}):
                ax.axhline(b["needle_fraction"] * rows[0]["exact_needles"][v], linestyle="--", color="grey")
        for r, xv in zip(rows, x):
            yv = r[key] if key else min(r["needles"].values(), default=math.nan)
            if yv is not None:
                ax.annotate(f"S={r['split']} {r.get('select', '')}".strip(), (xv, yv), textcoords="offset points",
                            xytext=(4, 4), fontsize=8)
            if (r["split"], r.get("select", "on")) == (report["chosen_split"], report.get("chosen_select", "on")) \
                    and yv is not None:
                ax.plot([xv], [yv], marker="*", markersize=16, color="red", linestyle="none", label="chosen")
        ax.set_xlabel("FLOP bound (exact / fill)")
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"ridgefill tune: {report['model']}, quality against speed per split and selection")
    fig.tight_layout()
    atomic_write(out / "tune.png", lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)
