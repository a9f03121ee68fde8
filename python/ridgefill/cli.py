"""The ``ridgefill`` command line: ``run`` (the main job), ``calibrate``, ``generate``.

Every subcommand calls the same library functions the tests call. User mistakes (bad paths, mismatched
maps, out-of-range sizes) print one ``error:`` line naming the problem and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import RidgeFillError


#: Modules that add their own subcommand: each defines ``add_subcommand(subparsers)``, which registers a
#: parser whose ``func`` default is called with the parsed arguments.
EXTRA_SUBCOMMANDS: tuple[str, ...] = ("certify", "bench", "evaluate.cli")


def parse_lam(value: str) -> float | str:
    """argparse type of ``--lam``: ``'auto'`` or a float (``fit_maps`` checks its sign)."""
    if value == "auto":
        return "auto"
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"λ must be a number or 'auto', got {value!r}") from None


def parse_select(value: str):
    """argparse type of ``--select``: ``'on'``, ``'attention'``, ``'ngram'``, ``'prompt'``, ``'off'``, ``key=value`` pairs, parts
    joined by ``+`` and a last ``total=F`` (:meth:`ridgefill.select.Select.parse`)."""
    from .errors import InputError
    from .select import Select

    try:
        return Select.parse(value)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


SELECT_HELP = ("row selection: 'on' (the default selection: 'ngram,budget=0.02+budget=0.02,reference=63+budget=0.03,"
               "queries=256,before=0,after=3,contrast=0+total=0.05': up to 2 %% of the prompt around rows that end a sequence the "
               "question quotes, then the key-token rule's two attention parts up to 5 %%), 'attention' (query-aware: two passes, rows "
               "chosen by the late layers' attention), 'prompt' (query-agnostic: "
               "rows chosen from the prompt alone by leverage; finds needles only with maps calibrated on text like "
               "the prompt), 'ngram' (rows that end 2- to 5-token sequences the tail's last 64 rows, the question, also hold, scoring "
               "min_score=3 or more; one pass, no model run; needs a question that quotes the prompt), 'off', or key=value pairs such as "
               "'budget=0.05,before=2,after=16,queries=1,heads=induction,top_heads=8,rounds=1,sink=1,contrast=128,reference=0,floor=1' "
               "(the attention rule's values; "
               "budget: a share of the prompt < 1, or rows), also after a preset ('prompt,budget=35'); parts joined "
               "by '+' each choose within their own budget, e.g. 'budget=0.02,reference=63+budget=0.03,queries=256,"
               "before=0,after=3,contrast=0' (needles and key tokens), and a last part 'total=F' caps them together, "
               "each within what the parts that chose before it left (leverage and n-gram parts first, then attention parts; an "
               "attention part with several rounds keeps its later rounds' share), e.g. "
               "'prompt,budget=35+attention+total=0.05'")


def parse_refit(value: str) -> float:
    """argparse type of ``--refit``: a finite number ``≥ 0`` (``0``: off)."""
    from .errors import InputError
    from .validate import check_real

    try:
        return check_real(float(value) if value.strip() else value, "--refit", lo=0.0)
    except (InputError, ValueError):
        raise argparse.ArgumentTypeError(f"--refit must be a number ≥ 0 (the weight of the exact rows, as a multiple "
                                         f"of the calibration rows, in the refit of the maps; 0: off); got {value!r}") from None


REFIT_HELP = ("refit the ridge maps on the prompt's exact rows before each late layer's filled rows write their "
              "K/V, the exact rows together weighing this many times the calibration rows (ridgefill.refit); 0: off")


CALIB_SET_HELP = ("the shipped calibration text: 'mix' (the default: the four calibration novels, The Debian "
                  "Administrator's Handbook and Python standard-library source, a third of the chunks each) or "
                  "'novels' (the four calibration novels alone, the earlier default)")


def add_calib_set(p: argparse.ArgumentParser, extra: str = "") -> None:
    """``--calib-set {mix,novels}`` (default ``None``: :data:`ridgefill.assets.DEFAULT_CALIBRATION_SET`,
    not asked for explicitly)."""
    from .assets import CALIBRATION_SETS

    p.add_argument("--calib-set", choices=CALIBRATION_SETS, default=None,
                   help=CALIB_SET_HELP + extra)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="'smollm2' (default, the bundled SmolLM2-135M-Instruct), a local Hugging Face model "
                        "directory, or a .gguf file")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def add_context(p: argparse.ArgumentParser, default: int) -> None:
    """``--context {0,1}``: what the maps read (:func:`ridgefill.fill.context_features`)."""
    p.add_argument("--context", type=int, choices=(0, 1), default=default,
                   help=f"what the maps read: 1, the row's split state h_S and the previous row's (context maps); "
                        f"0, the row's own h_S only (default {default})")


def build_parser() -> argparse.ArgumentParser:
    from .run import RunConfig

    d = RunConfig()
    parser = argparse.ArgumentParser(prog="ridgefill", description="RidgeFill: late-layer KV-cache fill for faster prefill")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="the main job: calibrate, then compare exact / ridge / identity / none")
    _model_args(p)
    p.add_argument("--split", type=int, default=d.split, help=f"split layer S (default {d.split})")
    p.add_argument("--tail", type=int, default=d.tail, help=f"exact tail rows (default {d.tail})")
    p.add_argument("--calib-tokens", type=int, default=d.calib_tokens, help=f"calibration tokens (default {d.calib_tokens})")
    p.add_argument("--chunk", type=int, default=d.chunk, help=f"calibration chunk length (default {d.chunk})")
    p.add_argument("--lam", type=parse_lam, default=d.lam, help="ridge λ: a number or 'auto' (default)")
    p.add_argument("--docs", type=int, default=d.docs, help=f"evaluation documents (default {d.docs})")
    p.add_argument("--doc-tokens", type=int, default=d.doc_tokens, help=f"prompt length per document (default {d.doc_tokens})")
    p.add_argument("--gen-tokens", type=int, default=d.gen_tokens, help=f"greedy tokens compared (default {d.gen_tokens})")
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"timed prefill repeats per mode (default {d.repeats})")
    p.add_argument("--out", default=d.out, help=f"output folder for maps and report.json (default {d.out})")
    p.add_argument("--maps", default=None, help="maps file to reuse, or to create if it does not exist (a file that does not fit the run is an error, never replaced; default <out>/maps-S<split>.safetensors, which is refitted when it does not fit)")
    p.add_argument("--select", type=parse_select, default=d.select, help=SELECT_HELP + "; the ridge+sel row "
                   "(default 'on')")
    p.add_argument("--needle-trials", type=int, default=d.needle_trials,
                   help=f"filled-region single-needle prompts per system (default {d.needle_trials}; 0: no needle column)")
    p.add_argument("--text", nargs="+", action="extend", default=None, metavar="FILE",
                   help="UTF-8 text files to evaluate on (documents and needle haystack) instead of the bundled "
                        "evaluation novels; documents overlapping the maps' calibration text are refused")
    add_calib_set(p, "; maps fitted on another set are refitted (default maps path) or refused (a --maps file, "
                     "when --calib-set is given)")
    add_context(p, d.context)

    p = sub.add_parser("calibrate", help="fit maps on calibration text and save them")
    _model_args(p)
    p.add_argument("--split", type=int, default=d.split)
    p.add_argument("--tokens", type=int, default=d.calib_tokens, help="calibration tokens (0: all of the text)")
    p.add_argument("--chunk", type=int, default=d.chunk)
    p.add_argument("--lam", type=parse_lam, default="auto")
    p.add_argument("--text", nargs="+", action="extend", default=None, metavar="FILE",
                   help="UTF-8 text files to calibrate on (default: the shipped calibration set, --calib-set); "
                        "each must hold at least one chunk; the maps record their names, token counts and SHA-256")
    add_calib_set(p, "; not with --text")
    p.add_argument("--targets", default="inputs", choices=["inputs", "kv"],
                   help="what the maps predict from h_S: each late layer's input (default) or its pre-RoPE "
                        "keys and values (K/V maps)")
    add_context(p, d.context)
    p.add_argument("--context-penalty", type=float, default=None, metavar="ALPHA",
                   help="context maps only: the ridge penalty on the previous row's block, as a multiple of λ "
                        "(default 1: one λ for both blocks; ridgefill.calibrate.CONTEXT_PENALTY; docs/evaluate.md, "
                        "'Sixteenth session')")
    p.add_argument("--out", required=True, help="maps file to write (.safetensors); written atomically. The "
                   "statistics are checkpointed beside it (<name>.checkpoint.safetensors) every 16 chunks: "
                   "an interrupted run resumes from there when rerun with the same settings")

    p = sub.add_parser("generate", help="prefill a prompt with RidgeFill and continue greedily")
    _model_args(p)
    p.add_argument("--maps", default=None, help="maps file (needed for --mode ridge)")
    p.add_argument("--prompt-file", required=True, help="UTF-8 text file holding the prompt")
    p.add_argument("--tail", type=int, default=d.tail)
    p.add_argument("--split", type=int, default=None, help="split for identity/none without maps")
    p.add_argument("--mode", default="ridge", choices=["ridge", "centred", "identity", "none", "exact"])
    p.add_argument("--select", type=parse_select, default=None, help=SELECT_HELP + " (default off)")
    p.add_argument("--refit", type=parse_refit, default=0.0, help=REFIT_HELP + " (default 0; needs --mode ridge)")
    p.add_argument("--max-new-tokens", type=int, default=64)

    for module in EXTRA_SUBCOMMANDS:
        import importlib

        importlib.import_module(f"ridgefill.{module}").add_subcommand(sub)
    return parser


def _cmd_run(a) -> None:
    from .run import RunConfig, format_table, run

    cfg = RunConfig(model=a.model, split=a.split, tail=a.tail, calib_tokens=a.calib_tokens, chunk=a.chunk,
                    lam=a.lam, docs=a.docs, doc_tokens=a.doc_tokens, gen_tokens=a.gen_tokens,
                    repeats=a.repeats, out=a.out, maps=a.maps, threads=a.threads, select=a.select,
                    needle_trials=a.needle_trials, texts=tuple(a.text or ()), calib_set=a.calib_set,
                    context=a.context)
    report = run(cfg)
    print(format_table(report))
    print(f"report: {Path(cfg.out) / 'report.json'}   maps: {report['maps_path']}")


def _read_text(path: str) -> str:
    from .usertext import read_text_file

    return read_text_file(path)


def _cmd_calibrate(a) -> None:
    from .assets import DEFAULT_CALIBRATION_SET, calibration_texts, load_model
    from .calibrate import calibrate
    from .checkpoint import checkpoint_path

    from .errors import InputError

    if a.text and a.calib_set:
        raise InputError(f"give --text or --calib-set, not both (--calib-set {a.calib_set} names shipped text)")
    from .calibrate import resolve_context_penalty

    resolve_context_penalty(a.context, a.context_penalty)  # a bad value is refused before anything is done
    out = Path(a.out)  # checked before the calibration, which can take hours
    if out.is_dir():
        raise InputError(f"--out {a.out!r} is a folder: give the maps file's path, e.g. {str(out / 'maps.safetensors')!r}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--out {a.out!r}: its folder cannot be created ({e}); choose a writable path") from e
    model, tok, name = load_model(a.model)
    if a.text:
        from .calibrate import special_prefix
        from .usertext import read_text_files

        texts = read_text_files(a.text)
        body = a.chunk - len(special_prefix(tok))
        for path, text in texts.items():  # a file shorter than one chunk would add nothing, silently
            n = len(tok(text, add_special_tokens=False)["input_ids"])
            if n < body:
                raise InputError(f"text file {path!r} has {n} tokens, fewer than one calibration chunk "
                                 f"({body} text tokens with --chunk {a.chunk}): give more text or lower --chunk")
    else:
        texts = calibration_texts(a.calib_set or DEFAULT_CALIBRATION_SET)
    ckpt = checkpoint_path(a.out)
    if ckpt.exists():
        print(f"resuming the calibration from the checkpoint {ckpt}", file=sys.stderr)
    maps = calibrate(model, tok, texts, split=a.split, tokens=a.tokens or None, chunk=a.chunk, lam=a.lam,
                     model_name=name, targets=a.targets, checkpoint=ckpt, context=a.context,
                     context_penalty=a.context_penalty)
    maps.save(a.out)
    ckpt.unlink(missing_ok=True)
    from .overlap import calibration_label

    print(f"wrote {a.out}: S={maps.split}, {maps.meta['calibration_tokens']} tokens, "
          f"λ per layer {[f'{v:.3g}' for v in maps.lambdas]}")
    print(f"calibrated on: {calibration_label(maps.meta)}")
    if maps.meta.get("heldout_rel_error"):
        print("held-out relative error  ridge:    " + " ".join(f"{v:.3f}" for v in maps.meta["heldout_rel_error"]))
        if maps.kind == "inputs":
            print("                         identity: " + " ".join(f"{v:.3f}" for v in maps.meta["heldout_rel_error_identity"]))


def _cmd_generate(a) -> None:
    import torch

    from .assets import load_model
    from .errors import InputError
    from .fill import generate_after, prefill
    from .maps import attach_stats, load_maps

    prompt = _read_text(a.prompt_file)
    maps = attach_stats(load_maps(a.maps), a.maps) if a.maps else None  # stats: means, covariance of older files
    if a.refit > 0:  # before the model loads: a refit needs ridge input maps with their statistics
        from .refit import fit_count

        if a.mode != "ridge" or maps is None:
            raise InputError("--refit refits the ridge maps: use it with --mode ridge and --maps, or --refit 0")
        fit_count(maps)
    model, tok, _ = load_model(a.model)
    if not prompt.strip():
        raise InputError(f"the prompt file {a.prompt_file!r} is empty: put the prompt text in it")
    ids = torch.tensor([tok(prompt, add_special_tokens=True)["input_ids"]])
    res = prefill(model, ids, maps, tail=min(a.tail, ids.shape[1]), mode=a.mode, split=a.split, select=a.select,
                  refit=a.refit)
    new = generate_after(model, ids, res, a.max_new_tokens)
    print(tok.decode(new[0], skip_special_tokens=True))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = getattr(args, "threads", None)
    if threads is not None and threads < 1:
        print(f"error: --threads {threads} must be at least 1 (or leave it out for torch's choice)", file=sys.stderr)
        return 2
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        handlers = {"run": _cmd_run, "calibrate": _cmd_calibrate, "generate": _cmd_generate}
        (handlers.get(args.command) or args.func)(args)
    except RidgeFillError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
