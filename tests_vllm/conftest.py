"""Fixtures of the vLLM plugin tests. They run in the vLLM environment (``bash .ci/test-vllm``).

The reference values come from ``ridgefill`` itself, which needs the project's main environment
(another ``transformers``): scripts of ``scripts/`` run once per pytest run under ``$RIDGEFILL_MAIN_PYTHON``
(default: ``.venv/bin/python`` of this checkout, which ``bash .ci/test`` creates) and write JSON files;
``scripts/vllm_reference.py`` writes the model folder, small fitted maps and the reference prefill's logits
and greedy tokens. They run in a background thread (:class:`References`), and the tests on the bundled model,
which read ``reference``, run last, so that the engines of the other tests run beside it. The vLLM engines run in
processes of ``tests_vllm/run_engine.py``; the engines on the bundled model (``test_equality.py``,
``test_selection.py``) register their specs with :func:`bundled_engine` and run one after another in one process
(the fixture ``bundled``: vLLM imported once). ``$RIDGEFILL_VLLM_TEST_DIR`` keeps those files between
runs (default: a fresh temporary folder).
"""

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
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


#: The reference JSON files the scripts in the main environment write: fixture name -> (file name in the work
#: folder, arguments ``(work_dir) -> [script, ...]``), registered with :func:`main_env_reference`.
REFERENCES: dict[str, tuple[str, Callable[[Path], list[str]]]] = {}


def main_env_reference(fixture: str, file: str, args: Callable[[Path], list[str]]) -> None:
    """Register the reference ``file`` that the fixture named ``fixture`` reads: ``$RIDGEFILL_MAIN_PYTHON`` runs
    ``args(work_dir)`` (a script of ``scripts/`` and its arguments) to write it (see :class:`References`)."""
    if fixture in REFERENCES:
        raise ValueError(f"reference {fixture!r} registered twice")
    REFERENCES[fixture] = (file, args)


main_env_reference("reference", "reference.json", lambda work_dir: [
    "vllm_reference.py", "--out", str(work_dir / "reference.json"), "--maps", str(work_dir / "maps-S15.safetensors")])


#: The registered references the tests pytest runs read, in the order they first read them.
WANTED: list[str] = []


@pytest.hookimpl(trylast=True)  # after the deselection of -k and -m
def pytest_collection_modifyitems(config, items):
    """The tests on the bundled model (they read ``reference``) run last, so that ``scripts/vllm_reference.py``
    (the longest reference script) runs in the main environment beside the engines of the other tests (the
    order of the other tests, and of the tests within a module, is kept); notes the references they read."""
    items.sort(key=lambda item: "reference" in item.fixturenames)
    WANTED[:] = dict.fromkeys(name for item in items for name in item.fixturenames if name in REFERENCES)


class References:
    """The registered references the collected tests read (:data:`REFERENCES`), computed one after another in a
    background thread in the order the tests first read them, each unless its file exists (kept in
    ``$RIDGEFILL_VLLM_TEST_DIR``): the engines of the first tests run beside the references of the later ones."""

    def __init__(self, work_dir: Path, wanted: list[str]):
        self.work_dir, self.done, self.logs, self.errors = work_dir, {}, {}, {}
        self.proc, self.stopped = None, False
        for name in wanted:
            self.done[name] = threading.Event()
        threading.Thread(target=self._compute_all, args=(wanted,), daemon=True).start()

    def _compute_all(self, wanted: list[str]) -> None:
        for name in wanted:
            if self.stopped:
                break
            try:
                self._compute(name)
            except Exception as e:  # raised in the test that reads this reference
                self.errors[name] = e
            finally:
                self.done[name].set()

    def _compute(self, name: str) -> None:
        file, args = REFERENCES[name]
        if (self.work_dir / file).exists():
            return
        if not MAIN_PYTHON.exists():
            raise RuntimeError(f"the reference needs the project's main environment at {MAIN_PYTHON} (run `bash "
                               ".ci/test` or `python3 -m venv .venv && .venv/bin/pip install -e '.[full]'` first, or set "
                               "RIDGEFILL_MAIN_PYTHON)")
        argv = args(self.work_dir)
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        self.proc = subprocess.Popen([str(MAIN_PYTHON), str(REPO / "scripts" / argv[0]), *argv[1:]], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.logs[name] = self.proc.communicate()[0]
        proc, self.proc = self.proc, None
        if proc.returncode != 0:
            raise RuntimeError(f"scripts/{argv[0]} failed (exit {proc.returncode}):\n{self.logs[name][-6000:]}")

    def read(self, name: str) -> dict:
        """The reference ``name`` (waits until it is written)."""
        if name not in self.done:  # not foreseen at collection (e.g. a fixture read outside the collected tests)
            self.done[name] = threading.Event()
            self._compute_all([name])
        self.done[name].wait()
        if self.logs.get(name):
            print(self.logs.pop(name))  # the script's output, in the captured output of the test that waited
        if name in self.errors:
            raise self.errors[name]
        return json.loads((self.work_dir / REFERENCES[name][0]).read_text())

    def stop(self) -> None:
        """Start no further script, and stop the one still running (pytest ends before it was read)."""
        self.stopped = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="session")
def references(work_dir):
    refs = References(work_dir, list(WANTED))
    yield refs
    refs.stop()


@pytest.fixture(scope="session")
def reference(references) -> dict:
    """The reference JSON of ``scripts/vllm_reference.py`` (model folder, maps, prompts, logprobs, greedy)."""
    return references.read("reference")


def _launch(work_dir: Path, name: str, spec: dict) -> dict:
    """Run ``tests_vllm/run_engine.py`` on ``spec`` in a new process; its output is kept under ``name``."""
    out = work_dir / f"engine-{name}.json"
    spec_path = work_dir / f"engine-{name}.spec.json"
    spec_path.write_text(json.dumps(spec, sort_keys=True))
    out.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("run_engine.py")), str(spec_path), str(out)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"engine {name} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


def _cached(work_dir: Path, name: str, spec: dict) -> dict | None:
    """The kept output of engine ``name`` when it ran on this very ``spec``, else ``None``."""
    out, spec_path = work_dir / f"engine-{name}.json", work_dir / f"engine-{name}.spec.json"
    if out.exists() and spec_path.exists() and spec_path.read_text() == json.dumps(spec, sort_keys=True):
        return json.loads(out.read_text())
    return None


def run_engine(work_dir: Path, name: str, spec: dict, fresh: bool = False) -> dict:
    """Run ``tests_vllm/run_engine.py`` on ``spec`` in a fresh process (its output is cached under ``name``
    and reused for the same spec unless ``fresh``). A spec ``{"runs": [...]}`` fails if any of its engines failed."""
    out = None if fresh else _cached(work_dir, name, spec)
    if out is None:
        out = _launch(work_dir, name, spec)
    failed = [f"run {i}: {r['error']}" for i, r in enumerate(out.get("runs", [])) if "error" in r]
    if failed:
        raise RuntimeError(f"engine {name} failed:\n" + "\n".join(failed))
    return out


#: The engines on the bundled model: name -> (spec builder ``(reference, work_dir) -> spec``, fresh), registered by
#: the test modules with :func:`bundled_engine` when pytest collects them.
BUNDLED: dict[str, tuple[Callable[[dict, Path], dict], bool]] = {}


def bundled_engine(name: str, fresh: bool = True):
    """Register the decorated spec builder ``(reference, work_dir) -> spec`` as the bundled-model engine ``name``
    (its output: ``bundled[name]``). ``fresh``: run it on every pytest run (engines with a step log), else reuse
    the kept output of the same spec (``$RIDGEFILL_VLLM_TEST_DIR``)."""
    def register(build):
        if name in BUNDLED:
            raise ValueError(f"bundled engine {name!r} registered twice")
        BUNDLED[name] = (build, fresh)
        return build
    return register


class EngineOutputs(dict):
    """Engine outputs by name; an engine that failed raises its error when its output is read."""

    def __init__(self, outputs: dict, errors: dict):
        super().__init__(outputs)
        self.errors = errors

    def __getitem__(self, name: str) -> dict:
        if name in self.errors:
            raise RuntimeError(f"engine {name} failed:\n{self.errors[name]}")
        return super().__getitem__(name)


@pytest.fixture(scope="session")
def bundled(reference, work_dir) -> EngineOutputs:
    """Every registered bundled-model engine (:data:`BUNDLED`) not kept from an earlier run, one after another in
    one process (``run_engine.py``, ``runs``), each with its own settings; per engine its output, with ``steps``
    (the lines of its step log) when its spec has ``step_log``."""
    specs = {name: build(reference, work_dir) for name, (build, _) in BUNDLED.items()}
    outputs = {}
    for name, spec in specs.items():
        kept = None if BUNDLED[name][1] else _cached(work_dir, name, spec)
        if kept is not None:
            outputs[name] = kept
    todo = [name for name in specs if name not in outputs]
    for name in todo:  # the plugin appends to a step log: each engine starts its own afresh
        if specs[name].get("step_log"):
            Path(specs[name]["step_log"]).unlink(missing_ok=True)
    errors = {}
    if todo:
        runs = _launch(work_dir, "bundled", {"runs": [specs[name] for name in todo]})["runs"]
        for name, out in zip(todo, runs, strict=True):
            if "error" in out:
                errors[name] = out["error"]
                continue
            outputs[name] = out
            (work_dir / f"engine-{name}.spec.json").write_text(json.dumps(specs[name], sort_keys=True))
            (work_dir / f"engine-{name}.json").write_text(json.dumps(out))
    for name, out in outputs.items():
        log = specs[name].get("step_log")
        if log and name not in errors:
            out["steps"] = [json.loads(line) for line in Path(log).read_text().splitlines()]
    return EngineOutputs(outputs, errors)
