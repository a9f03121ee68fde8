"""Prompt-processing speed of llama.cpp, exact against RidgeFill, in the same (patched) build, beside the FLOP
bound (ridgefill.costs.ideal_ratio) and PyTorch's exact prefill (ridgefill.prefill, float32 copy of the GGUF).

    python engines/llamacpp/bench.py --maps MAPS.safetensors [--lengths 2048 4096 8192] [--repeats 3]
                                     [--tail 256] [--threads 2] [--torch-repeats 1] [--build DIR]

Builds (or reuses) the engines with build.sh, exports the maps to GGUF beside a temporary folder, then for
each length runs, ``--repeats`` times in turn, one process per measurement: llama.cpp exact (RIDGEFILL_MAPS
unset), llama.cpp fill, and PyTorch exact and fill (``--torch-repeats`` of them). Prompts are held-out text
(Persuasion). Prints a Markdown table of median seconds and tokens/s, and the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def llama(build: Path, which: str, prompt: list[int], tmp: Path, threads: int, maps: Path | None, tail: int) -> float:
    req = {"build": str(build / which), "model": str(build / "SmolLM2-135M-Instruct.Q4_1.gguf"), "prompts": [prompt],
           "n_ubatch": 512, "n_batch": 2048, "gen": 0, "threads": threads}
    (tmp / "req.json").write_text(json.dumps(req))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIDGEFILL_") or k == "RIDGEFILL_CACHE"}
    if maps is not None:
        env.update(RIDGEFILL_MAPS=str(maps), RIDGEFILL_TAIL=str(tail))
    subprocess.run([sys.executable, str(HERE / "driver.py"), str(tmp / "req.json"), str(tmp / "out.npz")],
                   env=env, check=True, capture_output=True)
    with np.load(tmp / "out.npz") as z:
        return float(z["seconds"][0, 0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--maps", required=True, help="maps file (.safetensors) from `ridgefill calibrate`")
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-repeats", type=int, default=1)
    ap.add_argument("--tail", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=None, help="folder build.sh printed (default: run build.sh)")
    a = ap.parse_args()

    import torch

    from ridgefill import load_maps, prefill
    from ridgefill.costs import ideal_ratio
    from ridgefill.data.models import load_model
    from ridgefill.data.texts import load_texts
    from ridgefill.export_gguf import export_gguf

    torch.set_num_threads(a.threads)
    if a.build:
        build = Path(a.build)
    else:
        out = subprocess.run(["bash", str(HERE / "build.sh")], check=True, capture_output=True, text=True,
                             env=dict(os.environ, PYTHON=sys.executable))
        build = Path(out.stdout.strip().splitlines()[-1])
    model, tok, _ = load_model("smollm2")
    maps = load_maps(a.maps)
    ids = tok(load_texts()["Persuasion"], add_special_tokens=False)["input_ids"]
    load0 = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        gguf_maps = export_gguf(maps, tmp / "maps.gguf", model=build / "SmolLM2-135M-Instruct.Q4_1.gguf", tail=a.tail)
        for n in a.lengths:
            prompt = ids[1000:1000 + n]
            t = {"ll_exact": [], "ll_fill": [], "pt_exact": [], "pt_fill": []}
            for r in range(a.repeats):
                t["ll_exact"].append(llama(build, "ridgefill", prompt, tmp, a.threads, None, a.tail))
                t["ll_fill"].append(llama(build, "ridgefill", prompt, tmp, a.threads, gguf_maps, a.tail))
                if r < a.torch_repeats:
                    x = torch.tensor([prompt])
                    for mode, key in (("exact", "pt_exact"), ("ridge", "pt_fill")):
                        t0 = time.perf_counter()
                        prefill(model, x, maps, tail=a.tail, select="off", mode=mode)
                        t[key].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in t.items()}
            bound = ideal_ratio(model.config, n, maps.split, a.tail, context=maps.context)
            rows.append((n, med, bound, t))
            print(f"N={n}: {json.dumps({k: [round(x, 3) for x in v] for k, v in t.items()})}", file=sys.stderr)
    load1 = os.getloadavg()
    print("| N | llama.cpp exact tok/s | llama.cpp fill tok/s | ratio | FLOP bound | ratio / bound "
          "| PyTorch exact tok/s | PyTorch fill tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for n, m, bound, _ in rows:
        ratio = m["ll_exact"] / m["ll_fill"]
        print(f"| {n} | {n / m['ll_exact']:.0f} | {n / m['ll_fill']:.0f} | {ratio:.2f} | {bound:.2f} | "
              f"{ratio / bound:.2f} | {n / m['pt_exact']:.0f} | {n / m['pt_fill']:.0f} |")
    print(f"\nload average (1, 5, 15 min): before {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}, "
          f"after {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}; {a.threads} threads, tail {a.tail}, "
          f"{a.repeats} llama.cpp repeats (median), {a.torch_repeats} PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
