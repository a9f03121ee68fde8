"""The dense families other than Llama served by the plugin (``RidgeFill<Arch>ForCausalLM``), against the
reference ``ridgefill.prefill`` and against vLLM's own class, with the plain fill (``"select": "off"``: row
selection is served for Llama only).

Models: per family a tiny random checkpoint saved from a ``transformers`` config, with context maps at split
S = 1 fitted by ``ridgefill``'s calibration (``scripts/vllm_family_reference.py``, run once in the main
environment). Prompts: 300 and 200 tokens (tail 32: filled rows 0-267 and 0-167) and one of 32 tokens (all
exact), sent in one ``generate`` call to an engine with chunked prefill at 128 tokens per step, so the fill runs
in chunks, beside the other prompts and decoding tokens. All engines run one after another in one process
(``tests_vllm/run_engine.py``, ``runs``).
"""

import json
import os
import subprocess

import pytest

from conftest import MAIN_PYTHON, REPO, run_engine

FAMILIES = ["qwen2", "qwen3", "qwen3_moe", "mistral", "phi3", "gemma3_text"]
GEN, TOP = 8, 10
#: fill against the reference: float32 rounding of two implementations of the same arithmetic (as the Llama
#: test); the all-exact prompt against vLLM's own class: the same kernels, another batch
TOL_REF, TOL_OWN = 5e-4, 5e-5
#: the late layers' sliding windows (S = 1: layers 2 and 3; Gemma 3's layer 2 slides, window 48), None: full
WINDOWS = {"gemma3_text": [48, None]}


@pytest.fixture(scope="module")
def family_reference(work_dir) -> dict:
    out = work_dir / "families.json"
    if not out.exists():
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        subprocess.run([str(MAIN_PYTHON), str(REPO / "scripts" / "vllm_family_reference.py"), "--out", str(out),
                        "--dir", str(work_dir / "families"), "--families", ",".join(FAMILIES)], check=True, env=env)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def family_runs(family_reference, work_dir) -> dict:
    """Per family: ``own`` (vLLM's class, no maps) and ``fill`` (the RidgeFill class, with its step log)."""
    tail, runs, logs = family_reference["tail"], [], {}
    for name in FAMILIES:
        fam = family_reference["families"][name]
        base = {"model_dir": fam["model_dir"], "prompts": [p["ids"] for p in fam["prompts"]], "gen_tokens": GEN,
                "top": TOP}
        logs[name] = work_dir / f"families-{name}-steps.jsonl"
        logs[name].unlink(missing_ok=True)
        runs.append(dict(base, architecture=fam["architecture"], ridgefill=None))
        runs.append(dict(base, architecture="RidgeFill" + fam["architecture"], step_log=str(logs[name]),
                         ridgefill={"maps": fam["maps"], "tail": tail, "select": "off"},
                         engine={"enable_chunked_prefill": True, "max_num_batched_tokens": 128, "max_num_seqs": 8}))
    out = run_engine(work_dir, "families", {"runs": runs}, fresh=True)["runs"]
    return {name: {"own": out[2 * i], "fill": out[2 * i + 1],
                   "steps": [json.loads(line) for line in logs[name].read_text().splitlines()]}
            for i, name in enumerate(FAMILIES)}


def _logprobs(p):
    return dict(zip(p["top_ids"], p["top_logprobs"]))


def _assert_close(got: dict, want: dict, tol: float, what: str):
    """The top token agrees; at least 8 of the wanted top 10 are in the got list, each within ``tol``."""
    assert got["top_ids"][0] == want["top_ids"][0], what
    g, w = _logprobs(got), _logprobs(want)
    common = [t for t in want["top_ids"][:10] if t in g]
    assert len(common) >= 8, what
    for t in common:
        assert g[t] == pytest.approx(w[t], abs=tol), (what, t)


@pytest.mark.parametrize("name", FAMILIES)
def test_fill_equals_reference(name, family_reference, family_runs):
    """The plugin's first-token log-probabilities equal ``ridgefill.prefill``'s (mode ridge, the same maps and
    tail) within 5e-4, and the greedy tokens are equal, on both filled prompts; the greedy steps' top-2 logit
    gap in the reference is above 20x that tolerance (the equality of greedy tokens is not a near-tie's luck)."""
    ref = family_reference["families"][name]["prompts"]
    got = family_runs[name]["fill"]["prompts"]
    for i in (0, 1):
        _assert_close(got[i], ref[i]["fill"], TOL_REF, f"{name} prompt {i}")
        assert got[i]["greedy"] == ref[i]["fill"]["greedy"], (name, i)
        assert ref[i]["fill"]["margin"] > 20 * TOL_REF, (name, i, ref[i]["fill"]["margin"])


@pytest.mark.parametrize("name", FAMILIES)
def test_tail_covering_the_prompt_equals_vllm_own_class(name, family_reference, family_runs):
    """A prompt no longer than the tail (every row exact) gives vLLM's own class's outputs in the RidgeFill
    engine (greedy tokens, log-probabilities within 5e-5); vLLM's own class equals the reference's exact
    prefill (the checkpoint means the same in both environments)."""
    own, fill = family_runs[name]["own"]["prompts"], family_runs[name]["fill"]["prompts"]
    _assert_close(fill[2], own[2], TOL_OWN, f"{name} all-exact prompt")
    assert fill[2]["greedy"] == own[2]["greedy"]
    for i, ref in enumerate(family_reference["families"][name]["prompts"]):
        _assert_close(own[i], ref["exact"], TOL_REF, f"{name} vLLM own, prompt {i}")
        assert own[i]["greedy"] == ref["exact"]["greedy"], (name, i)


@pytest.mark.parametrize("name", FAMILIES)
def test_fill_ran_and_differs_from_exact(name, family_reference, family_runs):
    """The RidgeFill engine filled every row before each long prompt's tail (its step log), in chunks of at most
    128 tokens, writing in Gemma 3's sliding layer only the rows its exact rows see, and its first-token log-probabilities differ from the exact model's by more than 20x the
    reference tolerance (an engine that silently ran exact would fail the reference test above)."""
    tail = family_reference["tail"]
    lens = [len(p["ids"]) for p in family_reference["families"][name]["prompts"]]
    steps = family_runs[name]["steps"]
    assert sum(s["filled"] for s in steps) == sum(n - tail for n in lens if n > tail)
    # each late layer wrote every filled row, or in a sliding layer (window w) the w - 1 before each tail
    written = [sum(s["written"][j] for s in steps) for j in range(2)]
    assert written == [sum(min(w - 1, n - tail) if w else n - tail for n in lens if n > tail)
                       for w in WINDOWS.get(name, [None, None])]
    assert max(sum(s["query_lens"]) for s in steps) <= 128 and sum(s["carried"] for s in steps) >= 1
    moved = 0.0
    for mine, own in zip(family_runs[name]["fill"]["prompts"][:2], family_runs[name]["own"]["prompts"][:2]):
        got, want = _logprobs(mine), _logprobs(own)
        moved = max(moved, max(abs(got[t] - want[t]) for t in got if t in want))
    assert moved > 20 * TOL_REF, (name, moved)
