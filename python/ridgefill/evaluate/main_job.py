"""The main job: calibrate maps for a model, then compare exact, RidgeFill, identity and no fill on
held-out long documents (``ridgefill run``): the bundled evaluation novels, or the user's own text files
(``--text``, :attr:`RunConfig.texts`), which must not overlap the maps' calibration text
(:func:`check_evaluation_text`).

Per evaluation document of ``doc_tokens + 1`` tokens the prompt is its first ``doc_tokens`` tokens;
the last ``tail`` rows are exact. Reported per mode:

- NLL: mean negative log-likelihood (nats/token) of the next token at every exact row (the tail's
  ``tail`` predictions, the last one scoring the held-back final token), and ΔNLL vs exact;
- agreement: fraction of the first ``gen_tokens`` greedy continuation tokens equal to exact's, and the
  length of the common prefix;
- prefill seconds: median over ``repeats`` timed prefills (last-row logits only), all modes
  interleaved in the same run after a warm-up; ratio: median over repeats of exact/mode;
- needle: filled-region single-needle retrieval (:mod:`ridgefill.evaluate.needles`), percent of
  ``needle_trials`` prompts of ``doc_tokens`` tokens with a 64-row exact tail, the needle at evenly
  spread depths inside the filled rows. The all-token NLL hides what the fill forgets; this column
  shows it.

Systems: every mode of :data:`ridgefill.fill.MODES`, plus ``ridge+sel``: the ridge fill with the
default row selection (:data:`ridgefill.select.DEFAULT_SELECT`: n-gram match with the question, then the key-token
rule's attention parts, scored in one pass from predicted queries), which makes a few more rows
exact (reported as ``extra rows``, a share of the prompt).
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .. import __version__, defaults
from ..calibration import calibrate, calibration_chunks, resolve_context_penalty, special_prefix
from ..checkpoint import checkpoint_path
from ..data.models import load_model, load_tokenizer
from ..data.overlap import Fingerprint, calibration_label, check_disjoint, fingerprint, sample_for
from ..data.texts import (CALIBRATION_SETS, EVALUATION_BOOKS, calibration_set_of, calibration_texts, load_texts,
                          read_text_files, text_hash, text_sha256)
from ..errors import InputError, MapsFormatError, MapsMismatchError, OverlapError
from ..fileio import write_json
from ..fill import MODES, generate_after, prefill, prefill_instrumented, resolve_select
from ..maps import RidgeMaps, attach_stats, load_maps
from ..select import DEFAULT_SELECT, Select, Selection, check_leverage_stats
from ..validate import check_lam_spec
from .documents import document_room, evaluation_plan
from .needles import answer_case, case_depth, case_rng, haystack_sentences, make_case, score_answer


@dataclass
class RunConfig:
    """Sizes of the main job (defaults finish in about 10 minutes on 2 CPU cores with SmolLM2)."""

    model: str | None = None
    #: ``S``; ``None``: the default split (:func:`ridgefill.defaults.default_split`, 12 for SmolLM2)
    split: int | None = None
    tail: int = defaults.TAIL
    calib_tokens: int = defaults.CALIBRATION_TOKENS
    chunk: int = defaults.CHUNK
    lam: float | str = defaults.LAMBDA
    #: what the maps read (:func:`ridgefill.maps.context_features`): 1, ``[h_S(t), h_S(t−1)]``; 0, ``h_S(t)``
    context: int = defaults.CONTEXT
    docs: int = 4
    doc_tokens: int = 2048
    gen_tokens: int = 16
    repeats: int = 3
    out: str = "ridgefill-out"
    maps: str | None = None
    threads: int | None = None
    seed: int = 0
    modes: tuple[str, ...] = MODES
    #: the ridge+sel system's row selection; ``"auto"`` (the command line's default) is the setting the maps
    #: record, else ``"on"`` (:func:`ridgefill.fill.resolve_select`), fixed once the maps are known
    select: Select | Selection | str | None = DEFAULT_SELECT
    needle_trials: int = 4
    needle_tail: int = 64
    texts: tuple[str, ...] = ()  # evaluation text files (--text); empty: the bundled evaluation novels
    #: the shipped calibration set maps are fitted on (:func:`ridgefill.data.texts.calibration_texts`); ``None``:
    #: the default set, and a ``maps`` file the user names is used whatever text it was fitted on
    calib_set: str | None = None

    def calibration_set(self) -> str:
        """The calibration set to fit on: :attr:`calib_set`, or the default set."""
        return self.calib_set or defaults.CALIBRATION_SET

    def systems(self) -> list[tuple[str, str, Select | Selection | None]]:
        """``(name, mode, select)`` of every system the job compares: the modes, then ``ridge+sel``."""
        out = [(m, m, None) for m in self.modes]
        if self.select is not None:
            out.insert(out.index(("ridge", "ridge", None)) + 1 if "ridge" in self.modes else len(out),
                       ("ridge+sel", "ridge", self.select))
        return out


def source_commit() -> str | None:
    """The git commit of the checkout this package runs from (with ``+dirty`` when it has uncommitted
    changes), or ``None`` outside a git checkout: reports say which code produced them."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def exact_row_nll(logits: torch.Tensor, doc: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """NLL (nats) of token ``p+1`` at each exact row ``p``: ``logits`` ``[1, rows, vocab]``, ``doc``
    ``[N+1]``. Returns ``[rows]`` float64."""
    logp = F.log_softmax(logits[0].double(), dim=-1)
    targets = doc[positions + 1]
    return -logp.gather(1, targets[:, None])[:, 0]


def _timed_prefill(model, ids, maps, mode, tail, split, select=None) -> float:
    t0 = time.perf_counter()
    prefill(model, ids, maps, tail=tail, mode=mode, split=split, select=select)
    return time.perf_counter() - t0


def calibration_mismatch(meta: dict, set_name: str) -> str | None:
    """Why maps with metadata ``meta`` were not fitted on the shipped calibration set ``set_name``
    (:func:`ridgefill.data.texts.calibration_texts`), or ``None`` when they were: their recorded
    ``text_sha256`` (all texts, in order) and, when recorded, their ``calibration_texts`` (each text's
    name and SHA-256) must be those of the set.

    Raises:
        InputError: an unknown ``set_name``.
    """

    texts = calibration_texts(set_name)
    want = [(k, hashlib.sha256(t.encode("utf-8")).hexdigest()) for k, t in texts.items()]
    recs = meta.get("calibration_texts")
    have = ([(r.get("name"), r.get("sha256")) for r in recs if isinstance(r, dict)]
            if isinstance(recs, list) else None)
    if meta.get("text_sha256") == text_hash(list(texts.values())) and have in (None, want):
        return None
    return (f"they were calibrated on {calibration_label(meta)}, not on the shipped {set_name!r} calibration "
            "set (--calib-set)")


def get_maps(model, tokenizer, model_name: str, cfg: RunConfig, progress: bool = True) -> tuple[RidgeMaps, Path, bool]:
    """Load the maps at ``cfg.maps`` (default ``<out>/maps-S<split>.safetensors``) if they fit this run,
    else calibrate on the shipped set :meth:`RunConfig.calibration_set` and save them there.

    They fit when they match the model and split, were fitted with at least about ``cfg.calib_tokens``
    tokens, the same λ spec, chunk and context (:attr:`RunConfig.context`; a file named with ``cfg.maps`` is
    used with its own context), and on the calibration set's texts
    (:func:`calibration_mismatch`); the last is not asked of a file the user named with ``cfg.maps``
    unless ``cfg.calib_set`` is given. A default-path file that does not fit is refitted; a named one is
    refused.

    Returns ``(maps, path, calibrated_now)``.

    Raises:
        InputError: a named maps file that does not fit.
    """

    path = Path(cfg.maps) if cfg.maps else Path(cfg.out) / f"maps-S{cfg.split}.safetensors"
    if path.exists():
        try:
            maps = attach_stats(load_maps(path), path)  # the means of files from before they were stored
            maps.check_model(model, cfg.split)
            if maps.mean_h is None and "centred" in cfg.modes:
                raise MapsFormatError("they hold no calibration means (needed by mode centred) and have no "
                                      "statistics file to take them from")
            same = (maps.meta.get("calibration_tokens", 0) >= cfg.calib_tokens * (1 - 1 / 8)
                    and maps.meta.get("lambda_spec") == str(cfg.lam) and maps.meta.get("chunk") == cfg.chunk
                    and ((maps.context, maps.context_penalty) == (cfg.context, resolve_context_penalty(cfg.context, None))
                         or bool(cfg.maps)))  # a named file keeps its context and penalty
            other_text = (calibration_mismatch(maps.meta, cfg.calibration_set())
                          if not cfg.maps or cfg.calib_set else None)
            if same and other_text is None:
                return maps, path, False
            why = other_text or (f"they were fitted with {maps.meta.get('calibration_tokens')} calibration "
                                 f"tokens, λ {maps.meta.get('lambda_spec')}, chunk {maps.meta.get('chunk')}, "
                                 f"context {maps.context}, context penalty {maps.context_penalty:g}")
        except (MapsFormatError, MapsMismatchError) as e:
            why = str(e)
        if cfg.maps:  # a file the user named is never replaced
            raise InputError(f"the maps file {path} does not fit this run ({why}); pass a new --maps path, "
                             "or delete the file to refit it")
        print(f"existing maps at {path} not usable ({why}); calibrating anew")
    calib = calibration_texts(cfg.calibration_set())
    ckpt = checkpoint_path(path)
    if ckpt.exists():
        print(f"resuming the calibration from the checkpoint {ckpt}")
    maps = calibrate(model, tokenizer, calib, split=cfg.split, tokens=cfg.calib_tokens, chunk=cfg.chunk,
                     lam=cfg.lam, model_name=model_name, progress=progress, checkpoint=ckpt, context=cfg.context)
    maps.save(path)
    ckpt.unlink(missing_ok=True)
    return maps, path, True


def maps_fingerprint(maps, tokenizer, *, required: bool) -> Fingerprint | None:
    """The calibration fingerprint of ``maps``: from their metadata; for files written before it was
    stored, and only when ``required``, recomputed when their ``text_sha256`` shows they were fitted on
    a shipped calibration set (:func:`ridgefill.data.texts.calibration_texts`; the chunks are rebuilt as
    calibration built them).

    Args:
        required: the evaluation text is the user's: a fingerprint is needed, and its absence is an
            error. Otherwise (the bundled evaluation novels) files without one give ``None``.

    Raises:
        OverlapError: ``required`` and the maps record neither a fingerprint nor the bundled text.
        MapsFormatError: a malformed stored fingerprint.
    """
    meta = maps.meta
    if "calibration_fingerprint" in meta:
        return Fingerprint.from_meta(meta["calibration_fingerprint"])
    if not required:  # the bundled evaluation novels: disjoint from every shipped calibration set by design
        return None
    shipped = calibration_set_of(meta)
    tokens, chunk = meta.get("calibration_tokens"), meta.get("chunk")
    if shipped is not None and isinstance(tokens, int) and isinstance(chunk, int):
        calib = list(calibration_texts(shipped).values())
        prefix = len(special_prefix(tokenizer))
        runs = [c[prefix:] for c in calibration_chunks(tokenizer, calib, tokens, chunk)]
        return fingerprint(runs, sample=sample_for(sum(r.numel() for r in runs)))
    if required:
        raise OverlapError("these maps were written before maps recorded their calibration text, and they were "
                           "not fitted on a shipped calibration set, so evaluation text cannot be checked against it; "
                           "refit them (`ridgefill calibrate --text ...`) or let the command fit new ones")
    return None


def check_evaluation_text(maps: RidgeMaps | None, tokenizer, docs: list[torch.Tensor], labels: list[str],
                          haystacks: dict[str, str], *, user_text: bool) -> None:
    """Refuse evaluation documents (and needle haystack texts) that overlap the text ``maps`` were
    calibrated on (:func:`ridgefill.data.overlap.check_disjoint`, against the maps' recorded fingerprint,
    :func:`ridgefill.data.overlap.maps_fingerprint`).

    Args:
        docs, labels: the evaluation documents (each starting with the special prefix) and their labels.
        haystacks: ``{name: text}`` whose whole token streams are checked too (needle prose).
        user_text: the text is the user's (``--text``): maps that cannot be checked are refused.

    Raises:
        OverlapError: an overlap, or unverifiable maps with ``user_text``.
    """
    if maps is None:
        return
    fp = maps_fingerprint(maps, tokenizer, required=user_text)
    if fp is None:
        return
    what = calibration_label(maps.meta)
    check_disjoint(docs, fp, names=labels, calibration=what, prefix_tokens=len(special_prefix(tokenizer)))
    for name, text in haystacks.items():
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        check_disjoint([ids], fp, names=[f"needle haystack text {name!r}"], calibration=what)


def check_config(cfg: RunConfig) -> None:
    """Reject bad sizes before anything is loaded, calibrated or written. Raises :class:`InputError`."""
    positive = {"--tail": cfg.tail, "--docs": cfg.docs, "--doc-tokens": cfg.doc_tokens,
                "--gen-tokens": cfg.gen_tokens, "--repeats": cfg.repeats, "--calib-tokens": cfg.calib_tokens,
                "--chunk": cfg.chunk}
    for flag, value in positive.items():
        if value < 1:
            raise InputError(f"{flag} {value} must be at least 1")
    if cfg.threads is not None and cfg.threads < 1:
        raise InputError(f"--threads {cfg.threads} must be at least 1 (or leave it out for torch's choice)")
    check_lam_spec(cfg.lam)

    if cfg.calib_set is not None and cfg.calib_set not in CALIBRATION_SETS:
        raise InputError(f"--calib-set {cfg.calib_set!r} is not a shipped calibration set: use one of "
                         f"{', '.join(CALIBRATION_SETS)}")
    if cfg.tail >= cfg.doc_tokens:
        raise InputError(f"--tail {cfg.tail} must be shorter than --doc-tokens {cfg.doc_tokens}")
    if cfg.maps:  # a named maps file is used, never fitted or replaced: it must be there
        named = Path(cfg.maps)
        if named.is_dir():
            raise InputError(f"--maps {cfg.maps!r} is a folder: give the maps file's path, or leave --maps out to fit "
                             f"maps in --out")
        if not named.is_file():
            raise InputError(f"--maps {cfg.maps!r} does not exist: fit it with `ridgefill calibrate --out "
                             f"{cfg.maps}`, or leave --maps out to fit maps in --out")


def run(cfg: RunConfig, progress: bool = True) -> dict:
    """Run the main job and return the report (also written to ``<out>/report.json``)."""

    check_config(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    t_start = time.perf_counter()
    # documents first, with the tokenizer alone: a bad size or a short file fails before the model loads
    tok = load_tokenizer(cfg.model)
    if cfg.texts:
        eval_texts = read_text_files(cfg.texts)
    else:
        books = load_texts()
        eval_texts = {k: books[k] for k in EVALUATION_BOOKS}
    docs = cfg.docs
    if cfg.texts:  # the user's text: as many documents as it holds, up to cfg.docs
        docs = min(docs, document_room(tok, eval_texts, cfg.doc_tokens))
        if docs < 1:
            raise InputError(f"the text files {list(cfg.texts)} hold no document of {cfg.doc_tokens + 1} tokens "
                             f"(a {cfg.doc_tokens}-token prompt and the token after it, within one file): give a "
                             "longer text")
        if docs < cfg.docs and progress:
            print(f"evaluating on {docs} document(s) of {cfg.doc_tokens} tokens: as many as the text files hold "
                  f"(up to {cfg.docs})")
    docs, labels = evaluation_plan(tok, eval_texts, docs, cfg.doc_tokens)

    model, tok, model_name = load_model(cfg.model)
    L = model.config.num_hidden_layers
    if cfg.split is None:
        cfg = replace(cfg, split=defaults.default_split(model))
    if not 0 <= cfg.split <= L - 2:
        raise InputError(f"--split {cfg.split} is out of range for a {L}-layer model: use 0..{L - 2}")
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and cfg.doc_tokens + cfg.gen_tokens > max_pos:
        raise InputError(f"--doc-tokens {cfg.doc_tokens} + --gen-tokens {cfg.gen_tokens} exceeds the model's "
                         f"context of {max_pos} tokens")

    t0 = time.perf_counter()
    maps, maps_path, fresh = get_maps(model, tok, model_name, cfg, progress)
    calib_s = time.perf_counter() - t0
    cfg = replace(cfg, select=resolve_select(cfg.select, maps))  # "auto": the maps' setting
    check_leverage_stats(cfg.select, maps)  # before any evaluation, not at the ridge+sel system
    check_evaluation_text(maps, tok, docs, labels, eval_texts if cfg.needle_trials else {},
                          user_text=bool(cfg.texts))
    systems = cfg.systems()
    names = [name for name, _, _ in systems]
    nll = {m: [] for m in names}
    agree = {m: [] for m in names}
    prefix = {m: [] for m in names}
    times = {m: [] for m in names}
    extra_rows = {m: [] for m in names}
    bar = tqdm(total=len(docs) * len(systems) + cfg.repeats + 1 + cfg.needle_trials, desc="evaluate", unit="step",
               disable=not progress)
    for doc in docs:
        ids = doc[None, :-1]
        conts = {}
        for name, mode, sel in systems:
            res = prefill_instrumented(model, ids, maps, tail=cfg.tail, mode=mode, split=cfg.split, logits="exact",
                                         select=sel)
            # scored on the tail rows only: the same tokens for every system (selection adds exact rows)
            nll[name].append(exact_row_nll(res.logits[:, -cfg.tail:], doc, res.exact_positions[-cfg.tail:]))
            if res.selected is not None:
                extra_rows[name].append(res.selected.numel() / ids.shape[1])
            conts[name] = generate_after(model, ids, res, cfg.gen_tokens)[0]
            bar.update()
        for name in names:
            same = (conts[name] == conts["exact"]).double()
            agree[name].append(float(same.mean()))
            prefix[name].append(int(same.cumprod(0).sum()))
    needle = _needle_column(model, tok, maps, cfg, systems, eval_texts, bar)
    # timing: warm-up, then repeats with every system interleaved, on the first document
    ids = docs[0][None, :-1]
    for _, mode, sel in systems:
        _timed_prefill(model, ids, maps, mode, cfg.tail, cfg.split, sel)
    bar.update()
    for _ in range(cfg.repeats):
        for name, mode, sel in systems:
            times[name].append(_timed_prefill(model, ids, maps, mode, cfg.tail, cfg.split, sel))
        bar.update()
    bar.close()

    exact_nll = torch.cat(nll["exact"]).mean().item() if "exact" in nll else math.nan
    per_mode = {}
    for name in names:
        mean = torch.cat(nll[name]).mean().item()
        per_mode[name] = {
            "nll": mean, "delta_nll": mean - exact_nll,
            "nll_per_doc": [float(v.mean()) for v in nll[name]],
            "agreement": statistics.fmean(agree[name]), "common_prefix_tokens": prefix[name],
            "prefill_seconds": statistics.median(times[name]), "prefill_seconds_all": times[name],
            "ratio_exact_over_mode": statistics.median(
                [e / t for e, t in zip(times["exact"], times[name])]) if "exact" in times else None,
            "extra_exact_rows_share": statistics.fmean(extra_rows[name]) if extra_rows[name] else 0.0,
            "needle_score": needle.get(name),
        }
    report = {
        "model": model_name, "model_hash": maps.meta.get("model_hash"), "num_layers": L, "split": cfg.split,
        "tail": cfg.tail, "doc_tokens": cfg.doc_tokens, "documents": len(docs),
        "scored_tokens_per_mode": len(docs) * cfg.tail, "gen_tokens": cfg.gen_tokens, "repeats": cfg.repeats,
        "evaluation_books": [] if cfg.texts else list(EVALUATION_BOOKS),
        "evaluation_texts": [{"name": k, "sha256": text_sha256(t), "characters": len(t)} for k, t in eval_texts.items()],
        "calibrated_on": calibration_label(maps.meta), "calibration_texts": maps.meta.get("calibration_texts"),
        "calibration_set": calibration_set_of(maps.meta),
        "maps_path": str(maps_path),
        "calibrated_this_run": fresh, "calibration_seconds": calib_s,
        "calibration_tokens": maps.meta.get("calibration_tokens"),
        "heldout_tokens": maps.meta.get("heldout_tokens"), "lambda_spec": maps.meta.get("lambda_spec"),
        "lambdas": maps.lambdas, "heldout_rel_error": maps.meta.get("heldout_rel_error"), "context": maps.context,
        "heldout_rel_error_identity": maps.meta.get("heldout_rel_error_identity"),
        "text_sha256": maps.meta.get("text_sha256"), "modes": per_mode,
        "select": None if cfg.select is None else str(cfg.select), "needle_trials": cfg.needle_trials,
        "needle_tail": cfg.needle_tail,
        "threads": torch.get_num_threads(), "machine": platform.machine(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "wall_seconds": time.perf_counter() - t_start,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "commit": source_commit(),
        "ridgefill": __version__,
    }
    write_json(Path(cfg.out) / "report.json", report)
    return report


def _needle_column(model, tok, maps, cfg: RunConfig, systems, texts, bar) -> dict[str, float]:
    """Percent of ``cfg.needle_trials`` single-needle prompts (``doc_tokens`` tokens, needle at evenly
    spread depths of the filled rows, ``cfg.needle_tail`` exact rows; haystack: the evaluation
    ``texts``) each system answers."""

    if cfg.needle_trials == 0:
        return {}
    sentences = haystack_sentences(texts)
    hits = {name: 0 for name, _, _ in systems}
    for t in range(cfg.needle_trials):
        case = make_case(tok, sentences, length=cfg.doc_tokens, tail=cfg.needle_tail, variant="single",
                         rng=case_rng(cfg.seed, "single", cfg.doc_tokens, t),
                         depth=case_depth("single", t, cfg.needle_trials))
        for name, mode, sel in systems:
            ans = answer_case(model, tok, case, mode=mode, maps=maps, split=cfg.split, select=sel)
            hits[name] += score_answer(ans, case.answer) > 0
        bar.update()
    return {name: 100.0 * h / cfg.needle_trials for name, h in hits.items()}


def format_table(report: dict) -> str:
    """The report as a plain-text table (what ``ridgefill run`` prints)."""
    lines = [f"{report['model']}  S={report['split']}/{report['num_layers']}  tail={report['tail']}  "
             f"docs={report['documents']}x{report['doc_tokens']} tokens  "
             f"calibration={report['calibration_tokens']} tokens  λ={report['lambda_spec']}  "
             f"maps read {'[h_S(t), h_S(t-1)]' if report.get('context') else 'h_S(t)'}",
             f"maps calibrated on: {report.get('calibrated_on', 'unrecorded text')}",
             "evaluated on: " + ", ".join(t["name"] for t in report.get("evaluation_texts", [])),
             f"{'mode':<10}{'NLL':>8}{'ΔNLL':>9}{'agree':>8}{'prefix':>8}{'prefill s':>11}{'exact/mode':>12}"
             f"{'extra rows':>12}{'needle':>8}"]
    for mode, r in report["modes"].items():
        ratio = "" if r["ratio_exact_over_mode"] is None else f"{r['ratio_exact_over_mode']:.2f}x"
        needle = "" if r.get("needle_score") is None else f"{r['needle_score']:.0f}%"
        lines.append(f"{mode:<10}{r['nll']:>8.3f}{r['delta_nll']:>+9.3f}{r['agreement']:>8.2f}"
                     f"{statistics.fmean(r['common_prefix_tokens']):>8.1f}{r['prefill_seconds']:>11.3f}{ratio:>12}"
                     f"{100 * r.get('extra_exact_rows_share', 0.0):>11.1f}%{needle:>8}")
    lines.append("NLL, ΔNLL: nats/token over the tail rows; agree: greedy tokens equal to exact's; prefix: "
                 "mean common-prefix length; exact/mode: median ratio of interleaved prefill times; extra rows: "
                 "rows made exact by selection, share of the prompt")
    if report.get("needle_trials"):
        lines.append(f"needle: filled-region single needles answered, of {report['needle_trials']} prompts of "
                     f"{report['doc_tokens']} tokens with a {report.get('needle_tail')}-row exact tail"
                     + (f"; ridge+sel: {report['select']}" if report.get("select") else ""))
    return "\n".join(lines)
