"""Tensor parallelism: the plugin served with ``tensor_parallel_size=2`` (two worker processes on the CPU)
equals ``tensor_parallel_size=1`` and the reference ``ridgefill.prefill``.

Model: a tiny random Llama with 4 heads and 2 K/V heads (the bundled SmolLM2's 9 heads cannot be split
across 2 ranks), its context maps at S = 2 of 6 layers and the reference values, from
``scripts/vllm_tiny_reference.py`` in the main environment. Three prompts of 300, 200 and 120 tokens (tail 32)
in one ``generate`` call, 512 tokens per step: the first two are prefilled in one step, the third beside
their decoding tokens. Three engines: the plain fill (``select`` ``off``) at 1 and 2 ranks, and row
selection (``on``) at 2 ranks, which the reference's selection (equal to 1 rank's in ``test_selection.py``)
checks; its maps are a copy without the induction scores, so each rank scores its own heads' and the ranks gather
them (as for maps of format version 1). The three engines run one after another in one process (``run_engine.py``, ``runs``; each engine at
2 ranks starts its own two rank processes). The ranks' threads are not bound (``VLLM_CPU_OMP_THREADS_BIND=nobind``:
vLLM's automatic binding needs a NUMA node per rank).
"""

import json
from pathlib import Path

import pytest

from conftest import main_env_reference, run_engine

ARCH = "RidgeFillLlamaForCausalLM"


main_env_reference("tiny", "tiny-reference.json", lambda work_dir: [
    "vllm_tiny_reference.py", "--out", str(work_dir / "tiny-reference.json"), "--dir", str(work_dir)])


@pytest.fixture(scope="module")
def tiny(references) -> dict:
    return references.read("tiny")


def _spec(tiny, work_dir, name, select, tp, maps="maps"):
    log = work_dir / f"{name}-steps.jsonl"
    log.unlink(missing_ok=True)
    engine = {"max_model_len": 512, "max_num_batched_tokens": 512, "tensor_parallel_size": tp}
    return {"model_dir": tiny["model_dir"], "architecture": ARCH, "prompts": [p["ids"] for p in tiny["prompts"]],
            "ridgefill": {"maps": tiny[maps], "tail": tiny["tail"], "select": select}, "gen_tokens": 8, "top": 20,
            "engine": engine, "step_log": str(log), "env": {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}}


#: name, select, ranks, the reference's maps entry
ENGINES = (("tp1-fill", "off", 1, "maps"), ("tp2-fill", "off", 2, "maps"),
           ("tp2-select", "on", 2, "maps_without_induction"))


@pytest.fixture(scope="module")
def tp_runs(tiny, work_dir) -> dict:
    """The three engines one after another in one process (``run_engine.py``, ``runs``; vLLM imported once): each
    engine at 2 ranks still starts its two rank processes, which inherit its step log."""
    specs = [_spec(tiny, work_dir, *engine) for engine in ENGINES]
    outs = run_engine(work_dir, "tensor-parallel", {"runs": specs}, fresh=True)["runs"]
    runs = {}
    for (name, *_), spec, out in zip(ENGINES, specs, outs):
        out["steps"] = [json.loads(line) for line in Path(spec["step_log"]).read_text().splitlines()]
        runs[name] = out
    return runs


@pytest.fixture(scope="module")
def fill_tp1(tp_runs):
    return tp_runs["tp1-fill"]


@pytest.fixture(scope="module")
def fill_tp2(tp_runs):
    return tp_runs["tp2-fill"]


@pytest.fixture(scope="module")
def select_tp2(tp_runs):
    return tp_runs["tp2-select"]


def _logprobs(p):
    return dict(zip(p["top_ids"], p["top_logprobs"]))


def _close(mine, want, tol):
    """The top token agrees and the log-probabilities of the reference's top 10 are within ``tol``; returns
    the largest difference."""
    got, ref = _logprobs(mine), _logprobs(want)
    assert mine["top_ids"][0] == want["top_ids"][0]
    common = [t for t in want["top_ids"][:10] if t in got]
    assert len(common) >= 8  # the top lists agree up to near-ties at their end
    worst = max(abs(got[t] - ref[t]) for t in common)
    assert worst <= tol
    return worst


def test_tensor_parallel_2_fill_equals_tensor_parallel_1(fill_tp1, fill_tp2):
    """Plain fill: greedy tokens equal and first-token log-probabilities within 1e-4 (the two ranks sum their
    heads' outputs in another order than one rank)."""
    for one, two in zip(fill_tp1["prompts"], fill_tp2["prompts"]):
        assert two["greedy"] == one["greedy"]
        _close(two, one, 1e-4)


def test_fill_at_both_sizes_equals_reference(tiny, fill_tp1, fill_tp2):
    """Both equal ``ridgefill.prefill`` (mode ridge, same maps and tail) within 5e-4, greedy tokens equal, and
    differ from exact prefill by more than 1e-3: the equality is the fill's."""
    for out in (fill_tp1, fill_tp2):
        for mine, ref in zip(out["prompts"], tiny["prompts"]):
            assert mine["greedy"] == ref["fill"]["greedy"]
            _close(mine, ref["fill"], 5e-4)
            exact = _logprobs(ref["exact"])
            got = _logprobs(mine)
            assert max(abs(got[t] - exact[t]) for t in got if t in exact) > 1e-3
    # every row before each tail was filled once (268, 168 and 88 rows), logged once by each rank
    for out, ranks in ((fill_tp1, 1), (fill_tp2, 2)):
        filled = sorted(n for s in out["steps"] for n in s["num_filled"] if n)
        assert filled == sorted([len(p["ids"]) - tiny["tail"] for p in tiny["prompts"]] * ranks)


def test_selection_at_tensor_parallel_2_chooses_the_reference_rows(tiny, select_tp2):
    """Row selection with 2 ranks, maps without induction scores (the ranks score and gather them): both ranks choose
    the rows ``ridgefill.prefill(select="on")`` chooses with the maps' scores (each rank logs its choice), and the
    outputs equal the reference's within 5e-4, greedy tokens equal."""
    by_request: dict[str, list] = {}
    for entry in (s["selected"] for s in select_tp2["steps"] if "selected" in s):
        for req, rows in entry.items():
            by_request.setdefault(req, []).append(rows)
    assert len(by_request) == 3 and all(len(v) == 2 and v[0] == v[1] for v in by_request.values())
    want = sorted(sorted(p["select"]["selected"]) for p in tiny["prompts"])
    assert sorted(sorted(v[0]) for v in by_request.values()) == want
    assert all(len(rows) > 0 for rows in want)
    for mine, ref in zip(select_tp2["prompts"], tiny["prompts"]):
        assert mine["greedy"] == ref["select"]["greedy"]
        _close(mine, ref["select"], 5e-4)
