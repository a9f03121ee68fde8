"""The ``ridgefill`` command line.

Product commands: ``run`` (the main job: calibrate, then compare exact prefill, the fill and its baselines on
held-out text), ``calibrate`` (fit maps), ``generate`` (prefill a prompt with the fill and continue),
``bench`` (time exact against fill prefill), ``certify`` (check the maps' ridge solve), ``convert`` (the
float32 Hugging Face copy of a model, for vLLM), ``export-gguf`` and ``export-vllm`` (the maps for llama.cpp, a model
folder vLLM serves with the fill). Evaluation commands
live under ``ridgefill eval`` (:mod:`ridgefill.cli.eval`).

Every command calls the library functions the tests call, checks its inputs before loading a model, and
turns a user mistake (:class:`~ridgefill.errors.RidgeFillError`) into one ``error:`` line and exit status 2.
Heavy modules (torch, transformers) are imported inside the handlers, so ``--help`` is immediate.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .. import defaults
from ..errors import InputError, RidgeFillError
from .args import (SETTING_HELP, SPLIT_DEFAULT_HELP, add_context, add_model, add_threads, parse_lam, parse_lengths,
                   parse_setting, setting_name)


class _Parser(argparse.ArgumentParser):
    """argparse with one ``error:`` line (and the command's ``--help`` to read) for a bad argument."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ridgefill", description="RidgeFill: training-free late-layer KV-cache "
                                     "fill for faster prefill")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="the main job: fit maps, then compare exact, the fill and its baselines",
                       description="Fit maps on the shipped calibration text (or reuse them from --out), then "
                       "compare exact prefill, the fill with and without row selection, and the baselines on "
                       "held-out documents: ΔNLL, greedy agreement, filled-region needles and prefill time.")
    add_model(p)
    p.add_argument("--text", nargs="+", action="extend", default=None, metavar="FILE",
                   help="UTF-8 text files to evaluate on instead of the bundled held-out novels (at least 2,049 "
                        "tokens; up to 4 documents of 2,048 tokens are taken, as many as fit)")
    p.add_argument("--split", type=int, default=None, help=f"split S ({SPLIT_DEFAULT_HELP})")
    p.add_argument("--tail", type=int, default=defaults.TAIL, help=f"exact rows at the end (default {defaults.TAIL})")
    p.add_argument("--select", type=parse_setting, default=defaults.SELECT, metavar="SETTING",
                   help=SETTING_HELP + "; the ridge+sel row")
    p.add_argument("--maps", default=None, metavar="FILE", help="maps file to use (never overwritten); default: "
                   "<out>/maps-S<split>.safetensors, fitted when missing or when it does not fit the run")
    p.add_argument("--out", default="ridgefill-out", help="output folder (default ridgefill-out)")
    add_threads(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("calibrate", help="fit maps on calibration text and save them",
                       description="One pass over calibration text collects float64 statistics at the split; a "
                       "closed-form ridge solve per late layer gives the maps. Interrupted runs resume from a "
                       "checkpoint beside --out.")
    add_model(p)
    p.add_argument("--text", nargs="+", action="extend", default=None, metavar="FILE",
                   help="UTF-8 text files to calibrate on (default: the shipped calibration mix)")
    p.add_argument("--split", type=int, default=None, help=f"split S ({SPLIT_DEFAULT_HELP})")
    p.add_argument("--tokens", type=int, default=defaults.CALIBRATION_TOKENS,
                   help=f"calibration tokens (default {defaults.CALIBRATION_TOKENS}; 0: all of the text)")
    p.add_argument("--lam", type=parse_lam, default=defaults.LAMBDA,
                   help="ridge λ: a number, or 'auto' (default: one per layer by held-out error)")
    add_context(p)
    p.add_argument("--out", required=True, metavar="FILE", help="maps file to write (.safetensors), atomically; "
                   "the statistics go beside it (<name>.stats.safetensors)")
    add_threads(p)
    p.set_defaults(func=_cmd_calibrate)

    p = sub.add_parser("generate", help="prefill a prompt with the fill and continue greedily",
                       description="Prefill the prompt with the fill (layers 0..S exact, late layers' K/V of the "
                       "filled rows from the maps), then decode greedily with the full model. Prints the "
                       "continuation; the prefill time and the filled, exact and chosen rows go to stderr.")
    add_model(p)
    p.add_argument("--maps", default=None, metavar="FILE",
                   help="maps file from `ridgefill calibrate` or `ridgefill run` (needed unless --mode exact)")
    p.add_argument("--prompt-file", required=True, metavar="FILE", help="UTF-8 text file holding the prompt")
    p.add_argument("--tail", type=int, default=defaults.TAIL, help=f"exact rows at the end (default {defaults.TAIL})")
    p.add_argument("--select", type=parse_setting, default=defaults.SELECT, metavar="SETTING",
                   help=SETTING_HELP)
    p.add_argument("--mode", default="ridge", choices=["ridge", "exact"],
                   help="ridge (default): the fill; exact: the plain prefill, for comparison")
    p.add_argument("--max-new-tokens", type=int, default=defaults.MAX_NEW_TOKENS,
                   help=f"tokens to generate (default {defaults.MAX_NEW_TOKENS})")
    add_threads(p)
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("bench", help="time exact against fill prefill at several lengths, beside the FLOP bound",
                       description="Exact and fill prefill of random token ids in one process, interleaved, with "
                       "random maps (they cost what fitted maps cost); the ratio is printed beside the bound of "
                       "ridgefill.costs. CPU default: SmolLM2, 1K-8K tokens; CUDA default: the Llama-3.1-8B shape "
                       "with random weights, bfloat16, 8K-128K tokens.")
    p.add_argument("--model", default=None, metavar="MODEL",
                   help="'smollm2' (CPU default), a random-weight shape ('llama3-8b-random', the CUDA default; "
                        "'smollm2-random', 'tiny-random'), or a model as for `run`")
    p.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda or cuda:N")
    p.add_argument("--lengths", type=parse_lengths, default=None, help="prompt lengths, e.g. 1k,2k,4k,8k")
    p.add_argument("--split", type=int, default=None, help=f"split S ({SPLIT_DEFAULT_HELP})")
    p.add_argument("--tail", type=int, default=None, help="exact rows (default 256 on CPU, 2048 on CUDA)")
    p.add_argument("--select", type=setting_name, action="append", default=None, metavar="SETTING",
                   help="also time the fill with this row selection (repeat the flag to time several; default "
                        "auto, which is 'on' for the bench's random maps): " + SETTING_HELP)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per length (default 3)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the report to this JSON file")
    add_threads(p)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("certify", help="check the ridge solve of every late layer of a maps file",
                       description="For each late layer, a certificate from the saved statistics: the residual of "
                       "the normal equations and the bound it gives on the ridge objective's gap "
                       "(KvaLean.ridge_err_le_residual).")
    p.add_argument("maps", help="maps file (.safetensors) written by `ridgefill calibrate` or `ridgefill run`")
    p.add_argument("--stats", default=None, metavar="FILE",
                   help="statistics file (default: <maps name>.stats.safetensors beside it)")
    p.add_argument("--out", default=None, metavar="DIR", help="folder for the certificates (default: <maps name>.certs)")
    p.add_argument("--rigorous", action="store_true",
                   help="also enclose the residual (G + λI)W − (B + λW₀) and the objective gap in ball arithmetic "
                   "(python-flint arb_mat): bounds that hold for the exact ridge minimiser, not float estimates")
    p.set_defaults(func=_cmd_certify)

    p = sub.add_parser("convert", help="make the float32 Hugging Face copy of a model once and print its folder",
                       description="Make (once, cached) the float32 Hugging Face copy of a bundled model or a .gguf "
                       "file and print its folder: what `vllm serve`, transformers and every ridgefill command "
                       "load, without converting again. A Hugging Face directory is printed as it is.")
    add_model(p)
    p.set_defaults(func=_cmd_convert)

    from ..export_gguf import add_command as add_export_gguf
    from ..export_vllm import add_command as add_export_vllm
    from . import eval as eval_cli

    add_export_gguf(sub)
    add_export_vllm(sub)

    eval_cli.add_subcommand(sub)
    from . import tune as tune_cli

    tune_cli.add_subcommand(sub)
    return parser


def _threads(threads: int | None) -> None:
    if threads is None:
        return
    if threads < 1:
        raise InputError(f"--threads {threads} must be at least 1 (or leave it out for torch's choice)")
    import torch  # heavy: only when a command runs

    torch.set_num_threads(threads)


def _cmd_convert(a) -> None:
    from ..data.models import model_folder  # heavy

    print(model_folder(a.model))


def _cmd_run(a) -> None:
    from ..evaluate.main_job import RunConfig, format_table, run  # heavy

    cfg = RunConfig(model=a.model, split=a.split, tail=a.tail, out=a.out, maps=a.maps, threads=a.threads,
                    select=a.select, texts=tuple(a.text or ()))
    report = run(cfg)
    print(format_table(report))
    print(f"report: {Path(cfg.out) / 'report.json'}   maps: {report['maps_path']}")


def _check_out_file(out: str, flag: str) -> Path:
    path = Path(out)
    if path.is_dir():
        raise InputError(f"{flag} {out!r} is a folder: give the file's path, e.g. {str(path / 'maps.safetensors')!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{flag} {out!r}: its folder cannot be created ({e}); choose a writable path") from e
    return path


def _cmd_calibrate(a) -> None:
    out = _check_out_file(a.out, "--out")  # checked before the pass, which can take hours
    if a.tokens < 0:
        raise InputError(f"--tokens {a.tokens} must be ≥ 0 (0: all of the text)")
    texts = None
    if a.text:
        from ..data.texts import read_text_files

        texts = read_text_files(a.text)
    _threads(a.threads)
    from ..calibration import calibrate, calibration_chunks, special_prefix  # heavy
    from ..checkpoint import checkpoint_path
    from ..data.models import load_model, load_tokenizer
    from ..data.overlap import calibration_label

    if texts is not None:  # a file too short for one chunk would add nothing: refused before the model loads
        tok = load_tokenizer(a.model)
        body = defaults.CHUNK - len(special_prefix(tok))
        for path, text in texts.items():
            n = len(tok(text, add_special_tokens=False)["input_ids"])
            if n < body:
                raise InputError(f"text file {path!r} has {n} tokens, fewer than one calibration chunk ({body} text "
                                 f"tokens of {defaults.CHUNK}): give a longer file, or leave it out")
        calibration_chunks(tok, texts, a.tokens or None, defaults.CHUNK)
    model, tok, name = load_model(a.model)
    ckpt = checkpoint_path(out)
    if ckpt.exists():
        print(f"resuming the calibration from the checkpoint {ckpt}", file=sys.stderr)
    maps = calibrate(model, tok, texts, split=a.split, tokens=a.tokens or None, chunk=defaults.CHUNK, lam=a.lam,
                     context=a.context, model_name=name, checkpoint=ckpt)
    maps.save(out)
    ckpt.unlink(missing_ok=True)
    print(f"wrote {out}: S={maps.split}, {maps.meta['calibration_tokens']} tokens, "
          f"λ per layer {[f'{v:.3g}' for v in maps.lambdas]}")
    print(f"calibrated on: {calibration_label(maps.meta)}")
    if maps.meta.get("heldout_rel_error"):
        print("held-out relative error  ridge:    " + " ".join(map(fixed3, maps.meta["heldout_rel_error"])))
        if maps.kind == "inputs":
            print("                         identity: " + " ".join(map(fixed3, maps.meta["heldout_rel_error_identity"])))


def fixed3(v: float) -> str:
    """``v`` to 3 decimals, with no sign on a value that rounds to zero (a held-out error of ``-1e-5``, a
    float64 rounding of ``0``, prints ``0.000``, not ``-0.000``)."""
    out = f"{v:.3f}"
    return out[1:] if out == "-0.000" else out


def _cmd_generate(a) -> None:
    from ..data.texts import read_text_file

    if a.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {a.max_new_tokens} must be at least 1")
    if a.tail < 1:
        raise InputError(f"--tail {a.tail} must be at least 1")
    prompt = read_text_file(a.prompt_file)
    if not prompt.strip():
        raise InputError(f"the prompt file {a.prompt_file!r} is empty: put the prompt text in it")
    if a.mode == "ridge" and not a.maps:
        raise InputError("--maps FILE is needed for the fill: fit maps with `ridgefill calibrate --out "
                         "maps.safetensors` (or take the ones `ridgefill run` wrote), or pass --mode exact")
    _threads(a.threads)
    import torch  # heavy

    from ..data.models import load_model, load_tokenizer
    from ..adapters import adapter_for
    from ..fill import generate_after, prefill, resolve_select
    from ..maps import load_maps
    from ..select import setting_name

    maps = load_maps(a.maps) if a.maps and a.mode == "ridge" else None
    ids = torch.tensor([load_tokenizer(a.model)(prompt, add_special_tokens=True)["input_ids"]])
    n = ids.shape[1]
    if a.mode == "ridge" and a.tail >= n:
        raise InputError(f"the prompt has {n} tokens and --tail is {a.tail}: the fill needs a prompt longer than "
                         f"the tail (filled rows before it); lower --tail below {n}, or pass --mode exact")
    model, tok, _ = load_model(a.model)
    if maps is not None:
        maps.check_model(model)
    # resolved once (auto: the maps' recorded setting, else the default), run and printed as resolved
    select = None if a.mode == "exact" else resolve_select(a.select, maps, bool(adapter_for(model).recurrent_layers),
                                                           a.mode)
    t0 = time.perf_counter()
    res = prefill(model, ids, maps, tail=a.tail if a.mode == "ridge" else n, mode=a.mode, select=select)
    seconds = time.perf_counter() - t0
    chosen = 0 if res.selected is None else res.selected.numel()
    setting = setting_name(select)
    print(f"prefill: {n} tokens in {seconds:.2f} s, mode {a.mode}: {res.num_filled} filled rows, "
          f"{res.exact_positions.numel()} exact rows ({a.tail if a.mode == 'ridge' else n} tail, {chosen} chosen by "
          f"selection {setting})", file=sys.stderr)
    new = generate_after(model, ids, res, a.max_new_tokens)
    print(tok.decode(new[0], skip_special_tokens=True))


def recorded_command(args: list[str]) -> str:
    """The command line a result file records: ``ridgefill`` and ``args``, the ``--json`` file given by its
    name only (a folder on the machine that ran it says nothing about the result)."""
    out, after_json = [], False
    for arg in args:
        if after_json:
            arg, after_json = Path(arg).name, False
        elif arg == "--json":
            after_json = True
        elif arg.startswith("--json="):
            arg = "--json=" + Path(arg.removeprefix("--json=")).name
        out.append(arg)
    return " ".join(["ridgefill", *out])


def _cmd_bench(a) -> None:
    from ..bench import BenchConfig, bench, format_table  # heavy

    cfg = BenchConfig(model=a.model, device=a.device, lengths=a.lengths, split=a.split, tail=a.tail,
                      repeats=a.repeats, threads=a.threads, json=a.json,
                      selects=tuple(a.select or (defaults.SELECT,)),
                      command=recorded_command(sys.argv[1:]) if sys.argv else "ridgefill bench")
    print(format_table(bench(cfg)))


def _cmd_certify(a) -> None:
    from ..certify import CertificateError, check_certificate, certify_maps, read_certificate  # heavy

    paths = certify_maps(a.maps, a.out, stats_file=a.stats)
    failed = []
    print(f"{'layer':>5} {'λ':>10} {'resid rel':>10} {'eig min':>11} {'eig max':>11} {'μ':>10} {'excess rel':>10}  ok")
    for path in paths:
        c = read_certificate(path)
        check = check_certificate(c)
        print(f"{c['layer']:>5} {c['lambda']:>10.3g} {c['residual_rel']:>10.2e} {c['gram_eig_min']:>11.3e} "
              f"{c['gram_eig_max']:>11.3e} {c['reg_eig_lower']:>10.3e} {c['excess_rel']:>10.2e}  "
              f"{'yes' if check.passed else 'NO'}")
        if not check.passed:
            failed.append((c["layer"], check.failures))
    print(f"certificates: {paths[0].parent if paths else a.out}")
    if a.rigorous:
        failed += _rigorous_report(a)
    if failed:
        raise CertificateError("; ".join(f"layer {layer}: {', '.join(f)}" for layer, f in failed))


def _rigorous_report(a) -> list[tuple[int, list[str]]]:
    """Print the ball-arithmetic certificate of every late layer; return the failures."""
    import time
    from pathlib import Path

    from ..certify import rigorous_certify_maps, rigorous_failures  # heavy
    from ..fileio import write_json

    start = time.perf_counter()
    print("rigorous (enclosures; KvaLean.gram_err_le_residual, KvaLean.gram_gap_le, KvaLean.bias_err_le):")
    print(f"{'layer':>5} {'‖R‖_F ≤':>10} {'μ ≥':>10} {'‖W−W★‖ ≤':>10} {'gap ≤':>10} {'gap/J ≤':>10} "
          f"{'‖b−b★‖ ≤':>10}  ok")
    failed = []
    certs = rigorous_certify_maps(a.maps, stats_file=a.stats)
    for c in certs:
        print(f"{c['layer']:>5} {c['residual_fro_upper']:>10.3e} {c['reg_eig_lower']:>10.3e} "
              f"{c['weight_error_bound']:>10.3e} {c['excess_bound']:>10.3e} {c['excess_rel_upper']:>10.2e} "
              f"{c['bias_error_bound']:>10.3e}  {'yes' if c['passed'] else 'NO'}")
        if not c["passed"]:
            failed.append((c["layer"], rigorous_failures(c)))
    out = Path(a.out) if a.out else Path(a.maps).with_name(Path(a.maps).name.removesuffix(".safetensors") + ".certs")
    write_json(out / "rigorous.json", certs)
    print(f"rigorous certificates: {out / 'rigorous.json'} ({time.perf_counter() - start:.1f} s)")
    return failed


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad argument (2, one error: line printed)
        return e.code if isinstance(e.code, int) else 2
    try:
        args.func(args)
    except RidgeFillError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        if e.name not in FULL_MODULES:
            raise
        print(f"error: `ridgefill {args.command}` needs {e.name}, which ridgefill installs with its `full` extra: "
              "pip install 'ridgefill[full]' (from the repository: pip install -e '.[full]')", file=sys.stderr)
        return 2
    return 0


#: The modules of the ``full`` extra's packages (pyproject.toml): without them ``ridgefill`` holds the maps reader
#: and row selection only.
FULL_MODULES = {"transformers", "tokenizers", "gguf", "matplotlib", "accelerate", "flint"}


if __name__ == "__main__":
    sys.exit(main())
