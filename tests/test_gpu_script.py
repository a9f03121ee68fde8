"""``scripts/gpu_bench.sh``, the prepared GPU run, runs its benchmark step as written: a smoke run on the CPU
(``CHECK=0`` skips the CUDA-only equality and synchronisation checks) with a tiny random model, so a wrong flag
or module path fails here and not on a lent GPU machine."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_bench_script_runs_its_benchmark_step(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, CHECK="0", DEVICE="cpu", MODEL="tiny-random", LENGTHS="64",
               SPLIT="1", TAIL="8", REPEATS="1")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_bench.sh"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["complete"] and [r["n"] for r in report["rows"]] == [64]
    assert set(report["selects"]) == {"on", "one-pass"}  # the default selection and the one-pass mode
    assert set(report["rows"][0]["selects"]) == {"on", "one-pass"}
