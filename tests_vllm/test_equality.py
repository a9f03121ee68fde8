"""The plugin served by vLLM against vLLM's own Llama and against the reference ``ridgefill.prefill``.

Model: the bundled SmolLM2-135M-Instruct (float32 in both). Prompts: three evaluation-text prompts of
700, 520 and 300 tokens, sent in one ``generate`` call; with ``max_num_batched_tokens = 1024`` vLLM
prefills the first alone and then the other two in one step beside the first one's decoding steps,
so the fill serves several prompts and decoding tokens in one batch.
"""

import json

import pytest

from conftest import run_engine

GEN, TOP = 12, 20


def _spec(reference, architecture, ridgefill, **extra):
    return dict({"model_dir": reference["model_dir"], "architecture": architecture, "ridgefill": ridgefill,
                 "prompts": [p["ids"] for p in reference["prompts"]], "gen_tokens": GEN, "top": TOP}, **extra)


@pytest.fixture(scope="module")
def vllm_own(reference, work_dir):
    return run_engine(work_dir, "own", _spec(reference, "LlamaForCausalLM", None))


@pytest.fixture(scope="module")
def fill(reference, work_dir):
    ridgefill = {"maps": reference["maps"], "tail": reference["tail"]}
    log = work_dir / "fill-steps.jsonl"
    log.unlink(missing_ok=True)
    out = run_engine(work_dir, "fill", _spec(reference, "RidgeFillLlamaForCausalLM", ridgefill,
                                              try_prompt_logprobs=True, step_log=str(log)), fresh=True)
    out["steps"] = [json.loads(line) for line in log.read_text().splitlines()]
    return out


def _logprobs(p):
    return dict(zip(p["top_ids"], p["top_logprobs"]))


def test_all_exact_equals_vllm_llama(reference, work_dir, vllm_own):
    """Maps loaded but every prompt token exact (tail ≥ prompt), and no maps at all: vLLM's own outputs."""
    longest = max(len(p["ids"]) for p in reference["prompts"])
    for name, ridgefill in [("all-exact", {"maps": reference["maps"], "tail": longest}), ("no-maps", None)]:
        got = run_engine(work_dir, name, _spec(reference, "RidgeFillLlamaForCausalLM", ridgefill))
        for mine, own in zip(got["prompts"], vllm_own["prompts"]):
            assert mine["greedy"] == own["greedy"], name
            assert mine["top_ids"] == own["top_ids"], name
            for a, b in zip(mine["top_logprobs"], own["top_logprobs"]):
                assert a == pytest.approx(b, abs=1e-5), name


def test_fill_first_token_logprobs_equal_reference(reference, fill):
    """The plugin's first-token log-probabilities equal ``ridgefill.prefill``'s (mode ridge, same maps
    and tail), to float32 rounding of two implementations of the same arithmetic."""
    for mine, ref in zip(fill["prompts"], reference["prompts"]):
        got, want = _logprobs(mine), _logprobs(ref)
        assert mine["top_ids"][0] == ref["top_ids"][0]
        common = [t for t in ref["top_ids"][:10] if t in got]
        assert len(common) >= 8  # the top lists agree up to near-ties at their end
        for t in common:
            assert got[t] == pytest.approx(want[t], abs=5e-4)


def test_fill_greedy_continuation_equals_reference(reference, fill):
    for mine, ref in zip(fill["prompts"], reference["prompts"]):
        assert mine["greedy"] == ref["greedy"]


def test_fill_differs_from_exact(reference, fill, vllm_own):
    """The fill is not the exact model: the first-token log-probabilities move (otherwise the equality
    above would not show that the filled K/V were used)."""
    moved = 0.0
    for mine, own in zip(fill["prompts"], vllm_own["prompts"]):
        got, want = _logprobs(mine), _logprobs(own)
        moved = max(moved, max(abs(got[t] - want[t]) for t in got if t in want))
    assert moved > 1e-2


def test_fill_served_mixed_steps(reference, fill):
    """The steps with filled tokens: the first prompt alone, then the other two prompts beside the first
    one's decoding token; per step, the exact tokens are each prompt's last ``tail`` and the decoding token."""
    tail, lens = reference["tail"], [len(p["ids"]) for p in reference["prompts"]]
    steps = fill["steps"]
    assert [sorted(s["query_lens"]) for s in steps] == [[lens[0]], sorted([1, lens[1], lens[2]])]
    for s in steps:
        assert s["exact"] == sum(min(q, tail) for q in s["query_lens"])
        assert s["filled"] + s["exact"] == sum(s["query_lens"])


def test_prompt_logprobs_refused(fill):
    err = fill["prompt_logprobs_error"]
    assert err is not None and "prompt_logprobs are not available with RidgeFill" in err
