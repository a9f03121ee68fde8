"""The plugin served by vLLM against vLLM's own Llama and against the reference ``ridgefill.prefill``, with
the plain fill (``"select": "off"``; row selection: ``test_selection.py``).

Model: the bundled SmolLM2-135M-Instruct (float32 in both). Prompts: three evaluation-text prompts of
700, 520 and 300 tokens, sent in one ``generate`` call; with ``max_num_batched_tokens = 1024`` vLLM
prefills the first alone and then the other two in one step beside the first one's decoding steps,
so the fill serves several prompts and decoding tokens in one batch. The engines are registered with
``conftest.bundled_engine`` and run with those of ``test_selection.py`` one after another in one process.
"""

import pytest

from conftest import bundled_engine

GEN, TOP = 12, 20


def _spec(reference, architecture, ridgefill, **extra):
    return dict({"model_dir": reference["model_dir"], "architecture": architecture, "ridgefill": ridgefill,
                 "prompts": [p["ids"] for p in reference["prompts"]], "gen_tokens": GEN, "top": TOP}, **extra)


def _fill(reference):
    return {"maps": reference["maps"], "tail": reference["tail"], "select": "off"}


@bundled_engine("own", fresh=False)
def _own_engine(reference, work_dir):
    return _spec(reference, "LlamaForCausalLM", None)


@bundled_engine("fill")
def _fill_engine(reference, work_dir):
    return _spec(reference, "RidgeFillLlamaForCausalLM", _fill(reference), try_prompt_logprobs=True,
                 step_log=str(work_dir / "fill-steps.jsonl"))


@bundled_engine("fill-chunked")
def _fill_chunked_engine(reference, work_dir):
    """The same engine with vLLM's chunked prefill on, 256 tokens per step: the 700-token prompt is prefilled
    in three chunks (the first of filled tokens only), the others beside its chunks and decoding tokens."""
    return _spec(reference, "RidgeFillLlamaForCausalLM", _fill(reference),
                 step_log=str(work_dir / "fill-chunked-steps.jsonl"),
                 engine={"enable_chunked_prefill": True, "max_num_batched_tokens": 256})


@bundled_engine("all-exact", fresh=False)
def _all_exact_engine(reference, work_dir):
    """Maps loaded but every prompt token exact (tail ≥ prompt)."""
    longest = max(len(p["ids"]) for p in reference["prompts"])
    return _spec(reference, "RidgeFillLlamaForCausalLM", {"maps": reference["maps"], "tail": longest})


@bundled_engine("no-maps", fresh=False)
def _no_maps_engine(reference, work_dir):
    return _spec(reference, "RidgeFillLlamaForCausalLM", None)


@pytest.fixture(scope="module")
def vllm_own(bundled):
    return bundled["own"]


@pytest.fixture(scope="module")
def fill(bundled):
    return bundled["fill"]


@pytest.fixture(scope="module")
def fill_chunked(bundled):
    return bundled["fill-chunked"]


def _logprobs(p):
    return dict(zip(p["top_ids"], p["top_logprobs"]))


def test_all_exact_equals_vllm_llama(bundled, vllm_own):
    """Maps loaded but every prompt token exact (tail ≥ prompt), and no maps at all: vLLM's own outputs."""
    for name in ("all-exact", "no-maps"):
        got = bundled[name]
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


def test_chunked_prefill_equals_one_step_per_prompt(reference, fill, fill_chunked):
    """Chunked prefill (256 tokens per step) gives the filled and exact rows of one step per prompt: the
    same greedy tokens, and first-token log-probabilities equal to the unchunked fill's and the reference's
    (float32 rounding of another attention order)."""
    tail, lens = reference["tail"], [len(p["ids"]) for p in reference["prompts"]]
    steps = fill_chunked["steps"]
    assert max(sum(s["query_lens"]) for s in steps) <= 256 and len(steps) >= 3
    assert sum(s["filled"] for s in steps) == sum(n - tail for n in lens)  # every row before each tail, once
    assert any(s["exact"] == 0 for s in steps)  # a chunk of filled tokens only
    assert sum(s["carried"] for s in steps) >= 1  # a later chunk read the previous chunk's last h_S
    for chunked, whole, ref in zip(fill_chunked["prompts"], fill["prompts"], reference["prompts"]):
        assert chunked["greedy"] == whole["greedy"] == ref["greedy"]
        got, one, want = _logprobs(chunked), _logprobs(whole), _logprobs(ref)
        assert chunked["top_ids"][0] == ref["top_ids"][0]
        for t in [t for t in ref["top_ids"][:10] if t in got and t in one]:
            assert got[t] == pytest.approx(one[t], abs=1e-4)
            assert got[t] == pytest.approx(want[t], abs=5e-4)


def _prefix_sequence(reference):
    """Requests sent one after another: A (the 700-token prompt), B (A's first 600 tokens, then 200 others),
    C (A's first 300 tokens: its tail makes exact rows that A filled), D (A again)."""
    a, b = reference["prompts"][0]["ids"], reference["prompts"][1]["ids"]
    return [a, a[:600] + b[1:201], a[:300], a]


def _prefix_engine(caching):
    def build(reference, work_dir):
        spec = _spec(reference, "RidgeFillLlamaForCausalLM", _fill(reference), sequential=True,
                     engine={"enable_prefix_caching": caching, "enable_chunked_prefill": True,
                             "max_num_batched_tokens": 256})
        spec["prompts"] = _prefix_sequence(reference)
        return spec
    return build


for _caching in (True, False):
    bundled_engine(f"prefix-{'on' if _caching else 'off'}")(_prefix_engine(_caching))


@pytest.fixture(scope="module")
def prefix_runs(bundled):
    return {caching: bundled[f"prefix-{'on' if caching else 'off'}"] for caching in (True, False)}


def test_prefix_caching_reuses_blocks_of_the_same_fill_and_equals_caching_off(reference, prefix_runs):
    """With prefix caching on, a request reuses the earlier blocks whose rows it fills the same way, and no
    other: B hits A's wholly filled blocks in their shared 600 tokens; C, whose tail makes rows 236-299
    exact, hits only the wholly filled blocks before row 236; D hits A's blocks. The outputs equal those with
    caching off (greedy tokens; first-token log-probabilities within 1e-4)."""
    on, off = prefix_runs[True], prefix_runs[False]
    bs, tail = on["block_size"], reference["tail"]
    seq = _prefix_sequence(reference)
    cached = [p["num_cached_tokens"] for p in on["prompts"]]
    # B and C: the blocks wholly inside both the shared tokens and their own filled rows (positions < P - tail)
    want_b = min(600, len(seq[1]) - tail) // bs * bs
    want_c = (len(seq[2]) - tail) // bs * bs
    assert cached[0] == 0 and cached[1] == want_b > 0 and cached[2] == want_c > 0, (cached, bs)
    assert cached[3] >= (len(seq[3]) - tail) // bs * bs  # A's filled blocks, and its exact ones
    assert all(p["num_cached_tokens"] == 0 for p in off["prompts"])
    hit_rate = sum(cached) / sum(len(s) for s in seq)
    print(f"prefix-cache hit rate {hit_rate:.3f} (cached tokens {cached}, block size {bs})")
    for mine, plain in zip(on["prompts"], off["prompts"]):
        assert mine["greedy"] == plain["greedy"]
        got, want = _logprobs(mine), _logprobs(plain)
        for t in [t for t in plain["top_ids"][:10] if t in got]:
            assert got[t] == pytest.approx(want[t], abs=1e-4)


def _preemption_engine(name, extra):
    def build(reference, work_dir):
        a, b = reference["prompts"][0]["ids"], reference["prompts"][1]["ids"]
        ridgefill = {"maps": reference["maps"], "tail": reference["tail"], "select": "on"}
        spec = _spec(reference, "RidgeFillLlamaForCausalLM", ridgefill,
                     step_log=str(work_dir / f"preemption-{name}-steps.jsonl"),
                     engine={"enable_chunked_prefill": True, "max_num_batched_tokens": 256,
                             "enable_prefix_caching": False, **extra})
        spec["prompts"] = [a[:640], b[:384]]
        return spec
    return build


PREEMPTION = (("preempted", {"num_gpu_blocks_override": 9}), ("roomy", {}))
for _name, _extra in PREEMPTION:
    bundled_engine(f"preemption-{_name}")(_preemption_engine(_name, _extra))


@pytest.fixture(scope="module")
def preemption_runs(bundled):
    """Two prompts of 640 and 384 tokens (5 and 3 blocks of 128), row selection on (the default), chunked prefill
    at 256 tokens, prefix caching off; with a KV pool of 8 usable blocks (9, one being vLLM's null block) the first prompt's first decoding
    token finds no free block, and vLLM preempts the second request and recomputes it later."""
    runs = {}
    for name, _ in PREEMPTION:
        out = bundled[f"preemption-{name}"]
        runs[name] = dict(out, steps=[s for s in out["steps"] if "query_lens" in s])
    return runs


def test_a_preempted_request_gives_the_output_of_one_not_preempted(reference, preemption_runs):
    """The preempted request is recomputed with the same filled rows (its prompt's) and its generated tokens
    exact: the same greedy tokens and first-token log-probabilities as without preemption."""
    tight, roomy = preemption_runs["preempted"], preemption_runs["roomy"]
    starts = [(c, q) for s in tight["steps"] for c, q in zip(s["num_computed"], s["query_lens"]) if c == 0]
    assert len(starts) > len([(c, q) for s in roomy["steps"] for c, q in zip(s["num_computed"], s["query_lens"])
                              if c == 0]), "no request was preempted and recomputed"
    for mine, plain in zip(tight["prompts"], roomy["prompts"]):
        assert mine["greedy"] == plain["greedy"]
        got, want = _logprobs(mine), _logprobs(plain)
        for t in [t for t in plain["top_ids"][:10] if t in got]:
            assert got[t] == pytest.approx(want[t], abs=1e-4)
