"""Fixtures of the vLLM plugin tests. They run in the vLLM environment (``bash .ci/test-vllm``).

The reference values come from ``ridgefill`` itself, which needs the project's main environment
(another ``transformers``): ``scripts/vllm_reference.py`` runs once per session under
``$RIDGEFILL_MAIN_PYTHON`` (default: ``.venv/bin/python`` of this checkout, which ``bash .ci/test``
creates) and writes the model folder, small fitted maps and the reference prefill's logits and greedy
tokens to a JSON file. Each vLLM engine runs in its own process (``tests_vllm/run_engine.py``).
``$RIDGEFILL_VLLM_TEST_DIR`` keeps those files between runs (default: a fresh temporary folder).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAIN_PYTHON = Path(os.environ.get("RIDGEFILL_MAIN_PYTHON", REPO / ".venv" / "bin" / "python"))


def _work_dir(tmp_path_factory) -> Path:
    keep = os.environ.get("RIDGEFILL_VLLM_TEST_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return Path(keep)
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory) -> Path:
    return _work_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def reference(work_dir) -> dict:
    """The reference JSON of ``scripts/vllm_reference.py`` (model folder, maps, prompts, logprobs, greedy)."""
    out = work_dir / "reference.json"
    if not out.exists():
        if not MAIN_PYTHON.exists():
            raise RuntimeError(f"the reference needs the project's main environment at {MAIN_PYTHON} (run `bash "
                               ".ci/test` or `python3 -m venv .venv && .venv/bin/pip install -e .` first, or set "
                               "RIDGEFILL_MAIN_PYTHON)")
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        subprocess.run([str(MAIN_PYTHON), str(REPO / "scripts" / "vllm_reference.py"), "--out", str(out),
                        "--maps", str(work_dir / "maps-S15.safetensors")], check=True, env=env)
    return json.loads(out.read_text())


def run_engine(work_dir: Path, name: str, spec: dict, fresh: bool = False) -> dict:
    """Run ``tests_vllm/run_engine.py`` on ``spec`` in a fresh process (its output is cached under ``name``
    and reused for the same spec unless ``fresh``)."""
    out = work_dir / f"engine-{name}.json"
    spec_path = work_dir / f"engine-{name}.spec.json"
    text = json.dumps(spec, sort_keys=True)
    if fresh or not (out.exists() and spec_path.exists() and spec_path.read_text() == text):
        spec_path.write_text(text)
        out.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, str(Path(__file__).with_name("run_engine.py")), str(spec_path), str(out)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"engine {name} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())
