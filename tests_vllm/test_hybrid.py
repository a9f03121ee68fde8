"""The hybrid family Qwen3-Next (``RidgeFillQwen3NextForCausalLM``: linear-attention and full-attention layers,
MoE) served by the plugin, against the reference ``ridgefill.prefill`` and vLLM's own ``Qwen3NextForCausalLM``,
with the plain fill (``"select": "off"``).

Model: a tiny random Qwen3-Next checkpoint saved in bfloat16 from a ``transformers`` config (4 layers: linear,
full, linear, full attention; hidden 128; linear-attention heads of 128, one key head and two value heads; 4 query
heads of 32, 2 KV heads; 4 experts, top 2, and a shared expert), with context maps at split S = 1 fitted by
``ridgefill``'s calibration (``scripts/vllm_family_reference.py --families qwen3_next``, main environment): the
late layers are a linear-attention layer (2) and a full-attention layer (3). vLLM's CPU build runs the
linear-attention kernel in bfloat16 only, so every engine here serves bfloat16; the reference runs in float32 on
the same (bfloat16-valued) weights. Prompts: 300 and 200 tokens (tail 32: filled rows 0-267 and 0-167) and 32 tokens
(all exact), in one ``generate`` call. Engines, one after another in one process: vLLM's own class, the RidgeFill
class with chunked prefill at 128 tokens per step (the prompts filled in chunks beside each other and decoding
tokens), and the RidgeFill class with each prompt in one step.
"""

import json

import pytest

from conftest import main_env_reference, run_engine

NAME, ORACLE, GEN, TOP = "qwen3_next", "qwen3_next_oracle", 8, 10
#: bfloat16 serving against the float32 reference: vLLM's own class (the exact model, no fill) differs from the
#: reference's exact prefill by up to 0.115 in these log-probabilities (measured; bfloat16 rounding of activations
#: and recurrent states, amplified by the LM head), and the fill is held to the same bound plus a margin
TOL_REF = 0.15
#: under one scheduling, how far the fill may depart from the reference's fill beyond how far vLLM's own class
#: departs from the reference's exact prefill under the same scheduling (bfloat16 states between chunks depend on
#: the CPU's bfloat16 kernels: on an AVX2-only CPU vLLM's own class departs by 0.61 chunked and 0.20 in one step on the
#: oracle model's second prompt)
TOL_EXTRA = 0.05
#: the first decoding step against the reference's: its states carry the prompt and one more bfloat16 step (measured
#: up to 0.157, prompt 2 in one step; the fill still moves the first token by more than 2 * TOL_REF, below)
TOL_DECODE = 0.2
#: the plugin against vLLM's own class where the fill is exact (identity maps of the oracle model) under the same
#: scheduling: the same bfloat16 kernels on the same rows (measured: identical)
TOL_SAME = 1e-5
CHUNKED = {"enable_chunked_prefill": True, "max_num_batched_tokens": 128, "max_num_seqs": 8}


main_env_reference("hybrid_reference", "hybrid.json", lambda work_dir: [
    "vllm_family_reference.py", "--out", str(work_dir / "hybrid.json"), "--dir", str(work_dir / "hybrid"),
    "--families", f"{NAME},{ORACLE}"])


@pytest.fixture(scope="module")
def hybrid_reference(references) -> dict:
    return references.read("hybrid_reference")


@pytest.fixture(scope="module")
def hybrid_runs(hybrid_reference, work_dir) -> dict:
    """Nine engines in one process. The model: ``own`` (vLLM's class), ``chunked`` (RidgeFill, 128 tokens per
    step, with its step log), ``whole`` (RidgeFill, each prompt in one step), ``own_chunked`` (vLLM's class, 128
    tokens per step). The oracle model, each scheduling
    (``whole``, ``chunked``): ``oracle_own_*`` (vLLM's class) and ``oracle_fill_*`` (RidgeFill, identity maps);
    ``oracle_shifted`` (RidgeFill, shifted maps, chunked)."""
    tail = hybrid_reference["tail"]
    runs = []
    for name in (NAME, ORACLE):
        fam = hybrid_reference["families"][name]
        base = {"model_dir": fam["model_dir"], "prompts": [p["ids"] for p in fam["prompts"]], "gen_tokens": GEN,
                "top": TOP, "architecture": fam["architecture"], "ridgefill": None}
        whole, chunked = {"dtype": fam["dtype"]}, dict(CHUNKED, dtype=fam["dtype"])
        fill = dict(base, architecture="RidgeFill" + fam["architecture"],
                    ridgefill={"maps": fam["maps"], "tail": tail, "select": "off"})
        if name == NAME:
            log = work_dir / "hybrid-steps.jsonl"
            log.unlink(missing_ok=True)
            runs += [dict(base, engine=whole), dict(fill, engine=chunked, step_log=str(log)), dict(fill, engine=whole),
                     dict(base, engine=chunked)]
        else:
            shifted = dict(fill, ridgefill=dict(fill["ridgefill"], maps=fam["maps_shifted"]))
            runs += [dict(base, engine=whole), dict(base, engine=chunked), dict(fill, engine=whole),
                     dict(fill, engine=chunked), dict(shifted, engine=chunked)]
    out = [r["prompts"] for r in run_engine(work_dir, "hybrid", {"runs": runs}, fresh=True)["runs"]]
    names = ["own", "chunked", "whole", "own_chunked", "oracle_own_whole", "oracle_own_chunked", "oracle_fill_whole",
             "oracle_fill_chunked", "oracle_shifted"]
    return dict(zip(names, out), steps=[json.loads(line) for line in log.read_text().splitlines()])


def _logprobs(p):
    return dict(zip(p["top_ids"], p["top_logprobs"]))


def _max_diff(got: dict, want: dict) -> float:
    """Largest difference over the wanted top 10 found in the got top 10 (at least 8 of them); the top tokens
    must be equal."""
    assert got["top_ids"][0] == want["top_ids"][0]
    g, w = _logprobs(got), _logprobs(want)
    common = [t for t in want["top_ids"][:10] if t in g]
    assert len(common) >= 8
    return max(abs(g[t] - w[t]) for t in common)


def _bound(own: dict, exact: dict) -> float:
    """The fill's tolerance against the reference under one scheduling: 0.15, or vLLM's own class's departure from
    the reference's exact prefill under that scheduling plus 0.05 where that is larger."""
    return max(TOL_REF, _max_diff(own, exact) + TOL_EXTRA)


def test_fill_equals_reference(hybrid_reference, hybrid_runs):
    """Both RidgeFill engines (chunked and one step per prompt) give ``ridgefill.prefill``'s first token and its
    first-token log-probabilities within 0.15 (or within vLLM's own class's departure from the reference's exact
    prefill under the same scheduling plus 0.05, where that is larger), on both filled prompts, and the log-probabilities of the first
    decoding step (the second token), which reads the linear-attention states after the whole prompt, within 0.2
    plus how far vLLM's own class's first decoding step moves between that scheduling and one step. Greedy tokens
    beyond the first are not compared: the reference's top-2 logit gaps along them (0.2-0.3) are within the
    bfloat16 noise, and vLLM's own class already departs from the reference's exact greedy tokens on one prompt; the
    oracle test below compares greedy tokens exactly."""
    ref = hybrid_reference["families"][NAME]["prompts"]
    for engine, own in (("chunked", "own_chunked"), ("whole", "own")):
        for i in (0, 1):
            got, want = hybrid_runs[engine][i], ref[i]["fill"]
            assert _max_diff(got, want) < _bound(hybrid_runs[own][i], ref[i]["exact"]), (engine, i)
            assert got["greedy"][0] == want["greedy"][0], (engine, i)
            # the reference has no exact decoding step: vLLM's own class's departure between its schedulings stands in
            drift = _max_diff(hybrid_runs[own][i]["decode"], hybrid_runs["own"][i]["decode"])
            assert _max_diff(got["decode"], want["decode"]) < TOL_DECODE + drift, (engine, i, drift)


def test_vllm_own_class_equals_reference_exact_prefill(hybrid_reference, hybrid_runs):
    """The tolerance's basis: vLLM's own ``Qwen3NextForCausalLM`` in bfloat16 gives the reference's exact prefill
    (float32, the same weights) within 0.15 on all three prompts, with its first greedy token."""
    for i, ref in enumerate(hybrid_reference["families"][NAME]["prompts"]):
        assert _max_diff(hybrid_runs["own"][i], ref["exact"]) < TOL_REF, i
        assert hybrid_runs["own"][i]["greedy"][0] == ref["exact"]["greedy"][0], i


def test_fill_ran_and_differs_from_exact(hybrid_reference, hybrid_runs):
    """The chunked engine filled every row before each long prompt's tail once (its step log), in steps of at most
    128 tokens, a later chunk reading the carried split state, and the fill's first-token log-probabilities differ
    from the exact model's by more than twice the reference tolerance (so the equality above is the fill's)."""
    tail = hybrid_reference["tail"]
    lens = [len(p["ids"]) for p in hybrid_reference["families"][NAME]["prompts"]]
    steps = hybrid_runs["steps"]
    assert sum(s["filled"] for s in steps) == sum(n - tail for n in lens if n > tail)
    assert max(sum(s["query_lens"]) for s in steps) <= 128 and sum(s["carried"] for s in steps) >= 1
    moved = 0.0
    for mine, own in zip(hybrid_runs["chunked"][:2], hybrid_runs["own"][:2]):
        got, want = _logprobs(mine), _logprobs(own)
        moved = max(moved, max(abs(got[t] - want[t]) for t in got if t in want))
    assert moved > 2 * TOL_REF, moved


def test_exact_fill_equals_vllm_own_class_chunked_and_whole(hybrid_reference, hybrid_runs):
    """The oracle model (late layers 2, full attention and the identity, and 3, linear attention; identity maps
    predict both late layers' inputs exactly, so the fill is the exact model: the reference's fill equals its exact
    prefill) served by the plugin equals vLLM's own class under the same scheduling, one step per prompt and
    chunked prefill at 128 tokens per step: greedy tokens equal and log-probabilities of the first token and of the
    first decoding step within 1e-5, on all three prompts. So the filled rows advance layer 3's conv and recurrent
    states as the exact model does, chunked prefill carries them across chunks as vLLM does, and a prompt within its
    tail (the 32-token one, in steps beside filled rows) is vLLM's own. (vLLM's own class gives other outputs with
    chunked prefill than in one step, by up to 0.16 here: bfloat16 states between chunks; the plugin follows it.)"""
    for i, ref in enumerate(hybrid_reference["families"][ORACLE]["prompts"]):
        if "fill" in ref:
            assert ref["fill"]["top_logprobs"] == pytest.approx(ref["exact"]["top_logprobs"], abs=1e-5), i
            assert ref["fill"]["greedy"] == ref["exact"]["greedy"], i
        for mode in ("whole", "chunked"):
            got, own = hybrid_runs[f"oracle_fill_{mode}"][i], hybrid_runs[f"oracle_own_{mode}"][i]
            assert got["greedy"] == own["greedy"], (mode, i)
            assert _max_diff(got, own) <= TOL_SAME, (mode, i)
            assert _max_diff(got["decode"], own["decode"]) <= TOL_SAME, (mode, i)


def test_filled_rows_states_reach_the_exact_rows(hybrid_reference, hybrid_runs):
    """The same oracle model with shifted maps (each filled row's layer input predicted as the previous row's split
    state): layer 3's states after the filled rows differ, and its first-token log-probabilities move from vLLM's
    own class by more than 0.05 on both filled prompts (so the exact equality above is not the tail's alone); they
    equal the reference's fill with the same maps within 0.15 (or vLLM's own class's departure, chunked, from the
    reference's exact prefill plus 0.05, where that is larger)."""
    ref = hybrid_reference["families"][ORACLE]["prompts"]
    for i in (0, 1):
        got = hybrid_runs["oracle_shifted"][i]
        own = _logprobs(hybrid_runs["oracle_own_chunked"][i])
        assert max(abs(v - own[t]) for t, v in _logprobs(got).items() if t in own) > 0.05, i
        assert _max_diff(got, ref[i]["shifted"]) < _bound(hybrid_runs["oracle_own_chunked"][i], ref[i]["exact"]), i
