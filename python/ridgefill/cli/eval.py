"""``ridgefill eval {needle,loss,splice,depth}`` (write JSON) and ``ridgefill report`` (JSON -> markdown + PNG).

Every subcommand loads the model with :func:`ridgefill.data.models.load_model` (any model with an adapter),
fits or reuses maps per split (:func:`ridgefill.evaluate.depth.maps_for_splits`, cached as
``<out>/maps-S<S>.safetensors``), runs the library functions the tests call and writes one JSON file
atomically (:func:`ridgefill.fileio.write_json`).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from .. import defaults
from ..errors import InputError
from .args import SPEC_HELP, SPLIT_DEFAULT_HELP, add_calib_set, add_context, parse_lam, parse_spec


def _ints(text: str) -> list[int]:
    out = []
    for part in str(text).split(","):
        part = part.strip().lower()
        if not part:
            continue
        mult = 1
        if part.endswith("k"):
            part, mult = part[:-1], 1024
        try:
            out.append(int(float(part) * mult))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1k,2k,8000; got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"expected at least one integer; got {text!r}")
    return out


def _words(text: str) -> list[str]:
    out = [w.strip() for w in str(text).split(",") if w.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list; got {text!r}")
    return out


def _modes_or_empty(text: str) -> list[str]:
    """``_words``, or ``[]`` for ``''`` (eval needle: only the ``--select`` systems)."""
    return [] if not str(text).strip() else _words(text)


def _lam_factors(text: str) -> list[float]:
    try:
        out = [float(w) for w in _words(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers; got {text!r}") from None
    if not all(v > 0 for v in out):
        raise argparse.ArgumentTypeError(f"λ factors must be > 0; got {text!r}")
    return out


def _select_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--select", type=parse_spec, action="append", default=[], help="also answer with "
                   + SPEC_HELP + " (repeatable: one system each)")
    p.add_argument("--select-modes", type=_words, default=["ridge"], help="fill modes run with each --select "
                   "(default ridge; also centred, identity)")


def _common(p: argparse.ArgumentParser, json_default: str) -> None:
    p.add_argument("--model", default=None, help="'smollm2' (default), a local Hugging Face model directory, or a .gguf file")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    p.add_argument("--out", default="ridgefill-out", help="folder for cached maps (default ridgefill-out)")
    p.add_argument("--json", default=None, help=f"JSON file to write (default <out>/{json_default})")
    p.add_argument("--calib-tokens", type=int, default=65536, help="calibration tokens for maps fitted here (default 65536)")
    p.add_argument("--chunk", type=int, default=1024, help="calibration chunk length (default 1024)")
    p.add_argument("--lam", type=parse_lam, default="auto", help="ridge λ for maps fitted here: a number or 'auto' (default)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_context(p)
    p.add_argument("--maps", default=None, metavar="FILE", help="a maps file to evaluate (its split must be the "
                   "one asked); default: fit or reuse <out>/maps-S<S>.safetensors on the shipped calibration set "
                   "(--calib-set)")
    add_calib_set(p, "; for maps fitted or reused in --out and key scales (a --maps file is used as it is, "
                     "unless --calib-set is given: then it must be of that set)")
    p.add_argument("--text", nargs="+", action="extend", default=None, metavar="FILE",
                   help="UTF-8 text files to evaluate on (documents, needle haystack) instead of the bundled "
                        "evaluation novels; documents overlapping the maps' calibration text are refused")


def _loss_args(p: argparse.ArgumentParser, docs: int, novel: int) -> None:
    p.add_argument("--docs", type=int, default=docs, help=f"plain evaluation documents (default {docs})")
    p.add_argument("--novel-docs", type=int, default=novel, help=f"novel-text (renamed) documents (default {novel})")
    p.add_argument("--doc-tokens", type=int, default=2048, help="prompt tokens per document (default 2048)")
    p.add_argument("--tail", type=int, default=256, help="exact tail rows, the scored tokens (default 256)")
    p.add_argument("--window", type=int, default=64, help="local window W for key tokens: each scored token "
                   "sees W+1..2W tokens (default 64)")
    p.add_argument("--tau", type=float, default=1.0, help="key-token threshold τ in nats (default 1.0)")
    p.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples (default 10000)")


def _needle_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--needle-tail", type=int, default=64, help="exact tail rows of needle prompts; must hold "
                   "the question (default 64)")
    p.add_argument("--chat", action="store_true", help="wrap needle prompts in the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=12, help="greedy answer tokens (default 12)")


def add_subcommand(subparsers) -> None:
    """Register ``eval`` (with ``needle``, ``loss``, ``splice``, ``depth``) and ``report``."""
    ev = subparsers.add_parser("eval", help="evaluation measurements (needles, key-token loss, splice, depth table)",
                               description="The evaluation's measurements. Defaults are sized for a small model on "
                               "2 CPU cores (minutes); docs/evaluate.md gives the commands and sizes of its results.")
    sub = ev.add_subparsers(dest="eval_command", required=True)

    p = sub.add_parser("needle", help="filled-region needle retrieval, RULER-style, by context length")
    _common(p, "needle.json")
    _needle_args(p)
    p.add_argument("--lengths", type=_ints, default=[1024, 2048], help="context lengths (default 1k,2k: minutes on "
                   "2 CPU cores with SmolLM2; docs/evaluate.md measures 1k,2k,4k,8000 with --trials 16)")
    p.add_argument("--trials", type=int, default=4, help="trials per variant and length (default 4)")
    p.add_argument("--variants", type=_words, default=["single", "multikey"], help="single,multikey (default both)")
    p.add_argument("--modes", type=_modes_or_empty, default=["exact", "ridge", "identity", "none"],
                   help="exact,ridge,centred,identity,none (default exact,ridge,identity,none); '' with --select: "
                   "only the selection systems (the cases, seeds and depths are the same in every run, so a new "
                   "selection can be set beside an earlier run's exact answers)")
    p.add_argument("--splits", type=_ints, default=None, help=f"fill splits ({SPLIT_DEFAULT_HELP})")
    p.add_argument("--splices", type=_words, default=[], help="also answer with the ridge fill with these "
                   "splice components, e.g. k,v,k_scale (needs mode exact; default none)")
    p.add_argument("--key-scale-tokens", type=int, default=0, help="also answer with ridge plus a key-scale "
                   "correction fitted on this many calibration tokens (default 0: off)")
    _select_args(p)
    p.set_defaults(func=_cmd_needle)

    p = sub.add_parser("loss", help="ΔNLL vs exact on all, key and novel-text tokens, with bootstrap CIs")
    _common(p, "loss.json")
    _loss_args(p, 2, 2)
    p.add_argument("--modes", type=_words, default=["ridge", "identity", "none"])
    p.add_argument("--splits", type=_ints, default=None, help=f"fill splits ({SPLIT_DEFAULT_HELP})")
    _select_args(p)
    p.set_defaults(func=_cmd_loss)

    p = sub.add_parser("splice", help="fill with exact K, V, key scale or recurrent state spliced into the late layers")
    _common(p, "splice.json")
    _loss_args(p, 2, 2)
    p.add_argument("--splits", type=_ints, default=None, help=f"fill splits ({SPLIT_DEFAULT_HELP})")
    p.add_argument("--mode", default="ridge", choices=["ridge", "identity"])
    p.add_argument("--components", type=_words, default=None, help="splice components (default: all that apply: "
                   "fill,k,v,kv,k_scale,k_direction; fill,state on models with recurrent-state layers)")
    p.add_argument("--key-scale-tokens", type=int, default=0, help="also evaluate ridge with a key-scale "
                   "correction fitted on this many calibration tokens (default 0: off)")
    p.add_argument("--lam-factors", type=_lam_factors, default=[], help="also evaluate ridge re-solved with "
                   "every λ multiplied by these factors, e.g. 10,100 (default none)")
    p.set_defaults(func=_cmd_splice)

    p = sub.add_parser("depth", help="the seed's table: key-token ΔNLL and needle score by split depth")
    _common(p, "depth.json")
    _loss_args(p, 2, 2)
    _needle_args(p)
    p.add_argument("--depths", type=_words, default=["1/4", "3/8", "1/2", "5/8"], help="split depths (default 1/4,3/8,1/2,5/8)")
    p.add_argument("--modes", type=_words, default=["ridge", "identity", "none"])
    p.add_argument("--needle-length", type=int, default=2048, help="needle context length (default 2048)")
    p.add_argument("--needle-trials", type=int, default=4, help="single-needle trials per split (default 4; 0 skips)")
    _select_args(p)
    p.set_defaults(func=_cmd_depth)

    p = subparsers.add_parser("report", help="turn eval JSON files into a markdown report with PNG plots")
    p.add_argument("inputs", nargs="+", help="JSON files written by `ridgefill eval ...`")
    p.add_argument("--out", default="ridgefill-out/report", help="report folder (default ridgefill-out/report)")
    p.set_defaults(func=_cmd_report)


# --------------------------------------------------------------------------------------------------

def _special_prefix(tok) -> list[int]:
    from ..calibration import special_prefix  # heavy (torch)

    return special_prefix(tok)


def _say(a, msg: str) -> None:
    if not getattr(a, "quiet", False):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _setup(a):
    import torch

    from ..adapters import adapter_for
    from ..data.models import load_model

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model, tok, name = load_model(a.model)
    adapter_for(model)  # unsupported architectures fail here, before any work
    return model, tok, name


def _splits(a, model) -> list[int]:
    L = model.config.num_hidden_layers
    splits = a.splits if a.splits else [defaults.default_split(model)]
    for s in splits:
        if not 0 <= s <= L - 2:
            raise InputError(f"split {s} is out of range for a {L}-layer model: use 0..{L - 2}")
    return splits


def _needs_maps(a, selects) -> bool:
    """Whether any system of the command (``--modes``, and ``--select-modes`` with each ``--select``) needs maps."""
    from ..select import needs_maps  # heavy (torch)

    return any(needs_maps(m) for m in a.modes) or any(needs_maps(m, s) for m in a.select_modes for s in selects)


def _maps(a, model, tok, name, splits, needed: bool):
    from ..evaluate.depth import maps_for_splits

    if not needed:
        return {s: None for s in splits}
    if a.maps:  # the user's maps file, at its own split
        from ..maps import attach_stats, load_maps

        maps = attach_stats(load_maps(a.maps), a.maps)
        if a.calib_set is not None:  # asked for explicitly: the file must be of that set (as in `ridgefill run`)
            from ..evaluate.main_job import calibration_mismatch

            why = calibration_mismatch(maps.meta, a.calib_set)
            if why is not None:
                raise InputError(f"--maps {a.maps!r} does not fit --calib-set {a.calib_set}: {why}; leave out "
                                 "--calib-set to evaluate the file as it is, or pass maps of that set")
        if list(splits) != [maps.split]:
            raise InputError(f"--maps {a.maps!r} is fitted at split S={maps.split}, but the splits asked are "
                             f"{list(splits)}; pass --splits {maps.split} (eval depth: a matching --depths), or "
                             "leave --maps out to fit maps in --out")
        maps.check_model(model, maps.split)
        return {maps.split: maps}
    return maps_for_splits(model, tok, name, splits, out=a.out, calib_tokens=a.calib_tokens, chunk=a.chunk,
                           lam=a.lam, progress=not a.quiet, calib_set=a.calib_set, context=a.context)


def _load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (``None`` where the platform has none)."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _start(a) -> float:
    """Mark a command's start: records the load average on ``a`` (the header is built after the run) and
    returns the ``perf_counter`` reading for :func:`_finish`."""
    a.load_average_start = _load_average()
    return time.perf_counter()


def _header(a, name, model, kind: str) -> dict:
    import torch

    return {"kind": kind, "model": name, "model_type": model.config.model_type,
            "num_layers": model.config.num_hidden_layers,
            "max_position_embeddings": getattr(model.config, "max_position_embeddings", None), "seed": a.seed,
            "argv": sys.argv[1:], "threads": torch.get_num_threads(), "machine": platform.machine(),
            "load_average_start": a.load_average_start}  # read by _start, before the run


def _maps_meta(maps_by_split) -> dict:
    from ..data.overlap import calibration_label

    return {str(s): None if m is None else {"calibration_tokens": m.meta.get("calibration_tokens"),
                                            "lambda_spec": m.meta.get("lambda_spec"), "lambdas": m.lambdas,
                                            "heldout_rel_error": m.meta.get("heldout_rel_error"),
                                            "heldout_rel_error_identity": m.meta.get("heldout_rel_error_identity"),
                                            "calibrated_on": calibration_label(m.meta), "context": m.context,
                                            "kind": m.kind}
            for s, m in maps_by_split.items()}


def _finish(a, report: dict, t0: float, default: str) -> None:
    from ..fileio import write_json

    report["wall_seconds"] = time.perf_counter() - t0
    report["load_average_end"] = _load_average()
    path = Path(a.json) if a.json else Path(a.out) / default
    write_json(path, report)
    print(f"wrote {path} ({report['wall_seconds']:.0f} s)")


def _eval_texts(a) -> dict[str, str]:
    """``{name: text}`` to evaluate on: the ``--text`` files, else the bundled evaluation novels."""
    from ..data.texts import EVALUATION_BOOKS, load_texts
    from ..data.texts import read_text_files

    if a.text:
        return read_text_files(a.text)
    books = load_texts()
    return {k: books[k] for k in EVALUATION_BOOKS}


def _source(a) -> str:
    from ..data.texts import EVALUATION_BOOKS

    return f"text files {list(a.text)}" if a.text else f"evaluation books {list(EVALUATION_BOOKS)}"


def _documents(a, tok):
    """``(documents, set names, labels, info)``: the plain and novel (renamed) evaluation documents."""
    from ..evaluate.documents import evaluation_plan, novel_documents

    if a.tail >= a.doc_tokens:
        raise InputError(f"--tail {a.tail} must be shorter than --doc-tokens {a.doc_tokens}")
    if a.docs < 0 or a.novel_docs < 0 or a.docs + a.novel_docs == 0:
        raise InputError("give at least one document (--docs and/or --novel-docs)")
    texts = _eval_texts(a)
    docs, sets, labels = [], [], []
    if a.docs:
        plain, where = evaluation_plan(tok, texts, a.docs, a.doc_tokens)
        docs += plain
        labels += [f"plain {w}" for w in where]
        sets += ["plain"] * a.docs
    mapping = {}
    if a.novel_docs:
        novel, mapping = novel_documents(tok, texts, a.novel_docs, a.doc_tokens, seed=a.seed)
        docs += novel
        labels += [f"novel-text document {i + 1} (renamed from the second half of {list(texts)})"
                   for i in range(a.novel_docs)]
        sets += ["novel"] * a.novel_docs
    info = {"plain": {"source": f"{_source(a)}, evenly spaced", "documents": a.docs},
            "novel": {"source": f"the {_source(a)} with recurring proper names replaced by invented names, "
                                "from the paragraph nearest each text's middle", "documents": a.novel_docs,
                      "renamed": {k: len(v) for k, v in mapping.items()},
                      "examples": {k: dict(list(v.items())[:8]) for k, v in mapping.items()}}}
    if a.text:
        from ..data.texts import text_sha256

        info["texts"] = [{"name": k, "sha256": text_sha256(t), "characters": len(t)} for k, t in texts.items()]
    few = [f"{n} {name}" for name, n in (("plain", a.docs), ("novel-text", a.novel_docs)) if n == 1]
    if few:  # the intervals resample documents: one document gives an interval of zero width
        warning = (f"only {' and '.join(few)} document: its 95 % interval (a bootstrap over documents) has zero "
                   "width and says nothing about the spread; use 2 or more documents per set")
        info["warning"] = warning
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return docs, sets, labels, info


def _check_overlap(a, tok, maps_by_split, docs, labels, haystacks: dict[str, str]) -> None:
    """Refuse documents and needle haystacks that overlap any maps' calibration text
    (:func:`ridgefill.evaluate.main_job.check_evaluation_text`)."""
    from ..evaluate.main_job import check_evaluation_text

    for maps in maps_by_split.values():
        check_evaluation_text(maps, tok, docs, labels, haystacks, user_text=bool(a.text))


def _loss_header(a, model) -> dict:
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and a.doc_tokens > max_pos:
        raise InputError(f"--doc-tokens {a.doc_tokens} exceeds the model's context of {max_pos} tokens")
    return {"doc_tokens": a.doc_tokens, "tail": a.tail, "window": a.window, "tau": a.tau,
            "local_context": [a.window + 1, 2 * a.window], "resamples": a.resamples}


def _key_scales(a, model, tok, maps, splits) -> dict:
    """Key-scale corrections fitted on ``--key-scale-tokens`` tokens of the shipped calibration set
    (``--calib-set``; chunks spread evenly over its texts, as for the maps)."""
    from ..data.texts import DEFAULT_CALIBRATION_SET, calibration_texts
    from ..calibration import calibration_chunks
    from ..evaluate.splice import fit_key_scales

    texts = calibration_texts(a.calib_set or DEFAULT_CALIBRATION_SET)
    chunks = calibration_chunks(tok, texts, a.key_scale_tokens, a.chunk)
    out = {}
    for s in splits:
        _say(a, f"fitting key scales at S={s} on {len(chunks)} chunks of {a.chunk} tokens")
        out[s] = fit_key_scales(model, maps[s], chunks)
    return out


def _cmd_needle(a) -> None:
    from ..evaluate.needles import VARIANTS, haystack_sentences, run_needles

    t0 = _start(a)
    for v in a.variants:
        if v not in VARIANTS:
            raise InputError(f"unknown needle variant {v!r}; use {','.join(VARIANTS)}")
    selects = [s for s in a.select if s is not None]
    if not a.modes and not selects:
        raise InputError("--modes '' leaves nothing to run: give --select (the selection systems), or modes")
    model, tok, name = _setup(a)
    splits = _splits(a, model)
    maps = _maps(a, model, tok, name, splits, _needs_maps(a, selects) or a.splices or a.key_scale_tokens)
    scales = _key_scales(a, model, tok, maps, splits) if a.key_scale_tokens else {}
    texts = _eval_texts(a)
    _check_overlap(a, tok, maps, [], [], texts)
    sentences = haystack_sentences(texts)
    res = run_needles(model, tok, sentences, lengths=a.lengths, trials=a.trials, variants=a.variants,
                      modes=a.modes, maps_by_split=maps, splits=splits, tail=a.needle_tail, seed=a.seed,
                      chat=a.chat, max_new_tokens=a.max_new_tokens, splices=a.splices, key_scales=scales,
                      selects=selects, select_modes=a.select_modes, progress=lambda m: _say(a, m))
    report = _header(a, name, model, "needle")
    report.update({"splices": a.splices, "key_scale_tokens": a.key_scale_tokens,
                   "selects": [str(s) for s in selects], "select_modes": a.select_modes,
                   "key_scales": {str(s): v.tolist() for s, v in scales.items()}})
    report["haystack"] = _source(a)
    report.update({"lengths": a.lengths, "trials_per_cell": a.trials, "variants": a.variants, "modes": a.modes,
                   "splits": splits, "tail": a.needle_tail, "chat": a.chat, "maps": _maps_meta(maps), **res})
    _finish(a, report, t0, "needle.json")


def _cmd_loss(a) -> None:
    from dataclasses import asdict

    from ..evaluate.loss import fill_variants, key_token_stats, score_documents, summarise

    t0 = _start(a)
    model, tok, name = _setup(a)
    splits = _splits(a, model)
    report = _header(a, name, model, "loss")
    report.update(_loss_header(a, model))
    docs, sets, labels, info = _documents(a, tok)
    selects = [s for s in a.select if s is not None]
    maps = _maps(a, model, tok, name, splits, _needs_maps(a, selects))
    _check_overlap(a, tok, maps, docs, labels, {})
    recs = score_documents(model, docs, sets, tail=a.tail, window=a.window,
                           variants=fill_variants(model, maps, a.modes, tail=a.tail, selects=selects,
                                                  select_modes=a.select_modes),
                           prefix_tokens=len(_special_prefix(tok)), progress=lambda m: _say(a, m))
    report.update({"splits": splits, "modes": a.modes, "document_sets": info, "maps": _maps_meta(maps),
                   "selects": [str(s) for s in selects], "select_modes": a.select_modes,
                   "key_tokens": key_token_stats(recs, a.tau),
                   "summary": summarise(recs, tau=a.tau, resamples=a.resamples, seed=a.seed),
                   "documents": [asdict(r) for r in recs]})
    _finish(a, report, t0, "loss.json")


def _cmd_splice(a) -> None:
    from dataclasses import asdict

    from ..evaluate.loss import key_token_stats, score_documents, summarise
    from ..evaluate.splice import ALL_COMPONENTS, check_components, components_for, fix_variants, splice_variants

    t0 = _start(a)
    for c in a.components or []:
        if c not in ALL_COMPONENTS:
            raise InputError(f"unknown splice component {c!r}; use {','.join(ALL_COMPONENTS)}")
    model, tok, name = _setup(a)
    comps = list(a.components or components_for(model))
    check_components(model, comps)
    splits = _splits(a, model)
    report = _header(a, name, model, "splice")
    report.update(_loss_header(a, model))
    docs, sets, labels, info = _documents(a, tok)
    fixes = bool(a.key_scale_tokens or a.lam_factors)
    maps = _maps(a, model, tok, name, splits, a.mode == "ridge" or fixes)
    _check_overlap(a, tok, maps, docs, labels, {})
    variants = splice_variants(model, maps, tail=a.tail, mode=a.mode, components=comps)
    scales = _key_scales(a, model, tok, maps, splits) if a.key_scale_tokens else {}
    variants.update(fix_variants(model, maps, tail=a.tail, key_scales=scales, lam_factors=a.lam_factors))
    recs = score_documents(model, docs, sets, tail=a.tail, window=a.window, variants=variants,
                           prefix_tokens=len(_special_prefix(tok)), progress=lambda m: _say(a, m))
    report["state_errors"] = _state_errors(a, model, docs, maps, splits)
    report.update({"key_scales": {str(s): v.tolist() for s, v in scales.items()},
                   "key_scale_tokens": a.key_scale_tokens, "lam_factors": a.lam_factors})
    report.update({"splits": splits, "mode": a.mode, "components": comps, "document_sets": info,
                   "maps": _maps_meta(maps), "key_tokens": key_token_stats(recs, a.tau),
                   "summary": summarise(recs, tau=a.tau, resamples=a.resamples, seed=a.seed),
                   "documents": [asdict(r) for r in recs]})
    _finish(a, report, t0, "splice.json")


def _state_errors(a, model, docs, maps, splits) -> dict | None:
    """Hybrid models: per split and late recurrent layer, the mean over documents (and each
    document's value) of the filled state's relative errors (:func:`ridgefill.evaluate.splice.state_errors`);
    ``None`` for attention-only models."""
    from ..adapters import adapter_for
    from ..evaluate.splice import state_errors

    if not adapter_for(model).recurrent_layers:
        return None
    device = next(model.parameters()).device
    out = {}
    for s in splits:
        per_doc = [state_errors(model, doc[None, :-1].to(device), tail=a.tail, mode=a.mode, split=s,
                                maps=maps[s] if a.mode == "ridge" else None) for doc in docs]
        layers = {}
        for layer in (per_doc[0] if per_doc else {}):
            keys = per_doc[0][layer]
            layers[str(layer)] = {k: {"mean": sum(d[layer][k] for d in per_doc) / len(per_doc),
                                      "documents": [d[layer][k] for d in per_doc]} for k in keys}
        out[str(s)] = layers
    _say(a, "state errors done")
    return out


def _cmd_depth(a) -> None:
    from ..evaluate.depth import parse_depth, run_depth, split_for_depth
    from ..evaluate.needles import haystack_sentences

    t0 = _start(a)
    depths = [parse_depth(d) for d in a.depths]
    model, tok, name = _setup(a)
    L = model.config.num_hidden_layers
    splits = [split_for_depth(d, L) for d in depths]
    report = _header(a, name, model, "depth")
    report.update(_loss_header(a, model))
    docs, sets, labels, info = _documents(a, tok)
    selects = [s for s in a.select if s is not None]
    maps = _maps(a, model, tok, name, splits, _needs_maps(a, selects))
    texts = _eval_texts(a) if a.needle_trials else {}
    _check_overlap(a, tok, maps, docs, labels, texts)
    sentences = haystack_sentences(texts) if a.needle_trials else []
    res = run_depth(model, tok, maps, docs=docs, sets=sets, sentences=sentences, tail=a.tail, window=a.window,
                    tau=a.tau, needle_length=a.needle_length, needle_trials=a.needle_trials,
                    needle_tail=a.needle_tail, modes=a.modes, seed=a.seed, chat=a.chat, resamples=a.resamples,
                    progress=lambda m: _say(a, m), selects=selects, select_modes=a.select_modes)
    report.update({"depths": [str(d) for d in depths], "splits": splits, "modes": a.modes,
                   "selects": [str(s) for s in selects], "select_modes": a.select_modes,
                   "needle_length": a.needle_length, "needle_tail": a.needle_tail, "chat": a.chat,
                   "document_sets": info, "maps": _maps_meta(maps), **res})
    _finish(a, report, t0, "depth.json")


def _cmd_report(a) -> None:
    from ..evaluate.report import write_report

    path = write_report(a.inputs, a.out)
    print(f"wrote {path}")
