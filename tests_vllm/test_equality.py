"""The plugin served by vLLM against vLLM's own Llama and against the reference ``ridgefill.prefill``, with
the plain fill (``"select": "off"``; row selection: ``test_selection.py``).

Model: the bundled SmolLM2-135M-Instruct (float32 in both). Prompts: three evaluation-text prompts of
700, 520 and 300 tokens, sent in one ``generate`` call; with ``max_num_batched_tokens = 1024`` vLLM
prefills the first alone and then the other two in one step beside the first one's decoding steps,
so the fill serves several prompts and decoding tokens in one batch. The engines are registered with
``conftest.bundled_engine`` and run with those of ``test_selection.py`` one after another in one process.
"""

import json
from pathlib import Path

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
                 step_log=str(work_dir / "fill-steps.jsonl"), fill_state=True)


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


def test_the_kv_pool_shrinks_by_what_the_fill_keeps(reference, bundled, vllm_own, fill):
    """vLLM sizes the KV pool from the memory it gives the KV cache (``VLLM_CPU_KVCACHE_SPACE``: 1 GiB): ``⌊M / B⌋``
    blocks of ``B`` bytes for vLLM's own Llama; with the fill each block counts ``B + E``, ``E`` what the fill keeps per
    block (the plain fill: one carried ``h_S`` of ``d`` float32 values and an int64 slot; row selection: ``h_S`` of
    each of its 128 slots), and the fill allocates exactly ``E`` per block of the pool it got."""
    cfg = json.loads((Path(reference["model_dir"]) / "config.json").read_text())
    d, head_dim = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    memory, bs = vllm_own["kv_cache_memory_bytes"], vllm_own["block_size"]
    kv = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * bs * 4  # B: float32 K/V per block
    assert memory == 2 ** 30 and vllm_own["num_blocks"] == memory // kv
    for run, extra in ((fill, d * 4 + 8), (bundled["select"], bs * d * 4)):
        assert run["kv_cache_memory_bytes"] == memory
        assert run["num_blocks"] == memory // (kv + extra) < memory // kv
        assert run["fill_state_bytes"] == run["num_blocks"] * extra


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


def _preemption_engine(name, extra, prompts, gen=GEN):
    def build(reference, work_dir):
        ridgefill = {"maps": reference["maps"], "tail": reference["tail"], "select": "on"}
        spec = _spec(reference, "RidgeFillLlamaForCausalLM", ridgefill,
                     step_log=str(work_dir / f"preemption-{name}-steps.jsonl"),
                     engine={"enable_chunked_prefill": True, "max_num_batched_tokens": 256,
                             "enable_prefix_caching": False, **extra})
        spec["prompts"], spec["gen_tokens"] = prompts(reference), gen
        return spec
    return build


def _before_selection(reference):
    """640 and 384 tokens (5 and 3 blocks of 128)."""
    return [reference["prompts"][0]["ids"][:640], reference["prompts"][1]["ids"][:384]]


def _while_decoding(reference):
    """Two prompts of 640 tokens (the 700-token prompt's first 640; the 520- and 300-token prompts joined)."""
    p = reference["prompts"]
    return [p[0]["ids"][:640], (p[1]["ids"] + p[2]["ids"])[:640]]


#: name -> (engine settings, prompts, generated tokens). With a KV pool of 8 usable blocks of 128 (9, one being
#: vLLM's null block) the first prompt's first decoding token finds no free block and vLLM preempts the second
#: request after its first chunk, before it selects. With 11 usable blocks two requests of 640 + 64 tokens (6 blocks
#: each) do not fit: the second is preempted while decoding, after it selected, and recomputed from position 0; its
#: last prompt chunk then also schedules the tokens it had generated.
PREEMPTION = {"preempted": ({"num_gpu_blocks_override": 9}, _before_selection, GEN),
              "roomy": ({}, _before_selection, GEN),
              "preempted-decoding": ({"num_gpu_blocks_override": 12}, _while_decoding, 64),
              "roomy-decoding": ({}, _while_decoding, 64)}
for _name, (_extra, _prompts, _gen) in PREEMPTION.items():
    bundled_engine(f"preemption-{_name}")(_preemption_engine(_name, _extra, _prompts, _gen))


@pytest.fixture(scope="module")
def preemption_runs(bundled):
    """The engines of :data:`PREEMPTION`: row selection on (the default), chunked prefill at 256 tokens, prefix
    caching off; ``steps``: the step log's lines of the steps with filled tokens, ``selections``: its lines of the
    steps in which requests selected."""
    runs = {}
    for name in PREEMPTION:
        out = bundled[f"preemption-{name}"]
        runs[name] = dict(out, steps=[s for s in out["steps"] if "query_lens" in s],
                          selections=[s for s in out["steps"] if "selected" in s])
    return runs


def _recomputed(run) -> int:
    """How many times a request's tokens were scheduled from position 0 (once per request, more after preemption)."""
    return len([c for s in run["steps"] for c in s["num_computed"] if c == 0])


def _assert_same_outputs(mine_run, plain_run):
    """Per prompt, the same greedy tokens and first-token log-probabilities within 1e-4."""
    for mine, plain in zip(mine_run["prompts"], plain_run["prompts"], strict=True):
        assert mine["greedy"] == plain["greedy"]
        got, want = _logprobs(mine), _logprobs(plain)
        for t in [t for t in plain["top_ids"][:10] if t in got]:
            assert got[t] == pytest.approx(want[t], abs=1e-4)


def test_a_preempted_request_gives_the_output_of_one_not_preempted(reference, preemption_runs):
    """The preempted request is recomputed with the same filled rows (its prompt's) and its generated tokens
    exact: the same greedy tokens and first-token log-probabilities as without preemption."""
    tight, roomy = preemption_runs["preempted"], preemption_runs["roomy"]
    assert _recomputed(tight) > _recomputed(roomy), "no request was preempted and recomputed"
    _assert_same_outputs(tight, roomy)


def test_a_request_preempted_while_decoding_gives_the_output_of_one_not_preempted(reference, preemption_runs):
    """A request preempted after it selected is recomputed with the rows it chose; its last prompt chunk also
    schedules its generated tokens (the step log: a chunk from position 512 past the prompt's end), which run the
    late layers after the selection: the 64 greedy tokens and first-token log-probabilities of a run with room."""
    tight, roomy = preemption_runs["preempted-decoding"], preemption_runs["roomy-decoding"]
    assert _recomputed(tight) > _recomputed(roomy), "no request was preempted and recomputed"
    assert any(c < 640 < c + q for s in tight["steps"] for c, q in zip(s["num_computed"], s["query_lens"])), \
        "no recomputed prompt chunk scheduled generated tokens"
    assert any(s["reused"] for s in tight["selections"]), "the recomputed request did not reuse its chosen rows"
    _assert_same_outputs(tight, roomy)


@bundled_engine("fill-abort")
def _abort_engine(reference, work_dir):
    """The engine of ``fill-chunked`` (chunked prefill at 256 tokens), first given a request of the 700-token prompt
    that is aborted after its first chunk (256 filled tokens, whose last ``h_S`` the next chunk would read), then the
    three prompts."""
    spec = _fill_chunked_engine(reference, work_dir)
    return dict(spec, step_log=str(work_dir / "fill-abort-steps.jsonl"), fill_state=True,
                abort={"prompt": reference["prompts"][0]["ids"], "steps": 1})


def test_a_request_aborted_mid_prefill_leaves_no_state_and_no_trace(reference, bundled, fill_chunked):
    """The aborted request's first chunk ran (the step log's first step: 256 filled tokens from position 0); what the
    fill keeps for it lives in the states allocated once for the KV pool (one carried ``h_S`` per block: nothing per
    request to free), and the requests after it, which reuse its KV blocks, give the outputs of the engine without it
    (greedy tokens; first-token log-probabilities within 1e-4)."""
    aborted = bundled["fill-abort"]
    first = aborted["steps"][0]
    assert first["query_lens"] == [256] and first["num_computed"] == [0] and first["filled"] == 256
    assert sum(s["filled"] for s in aborted["steps"]) == 256 + sum(s["filled"] for s in fill_chunked["steps"])
    d = json.loads((Path(reference["model_dir"]) / "config.json").read_text())["hidden_size"]
    assert aborted["fill_state_bytes"] == aborted["num_blocks"] * (d * 4 + 8)
    _assert_same_outputs(aborted, fill_chunked)


def _shared_prefix(reference):
    """Two prompts sharing a needle prompt's 2,046 tokens, then 200 tokens of the 520- or the 300-token prompt."""
    prefix = reference["needles"][0]["ids"]
    return [prefix + reference["prompts"][1]["ids"][:200], prefix + reference["prompts"][2]["ids"][:200]]


@bundled_engine("shared-prefix")
def _shared_prefix_engine(reference, work_dir):
    """The plain fill (selection off), prefix caching on, one step of up to 4,096 tokens: the two prompts are sent in
    one call, then again one after another from an empty prefix cache."""
    spec = _spec(reference, "RidgeFillLlamaForCausalLM", _fill(reference), then_sequential=True,
                 step_log=str(work_dir / "shared-prefix-steps.jsonl"),
                 engine={"enable_prefix_caching": True, "max_model_len": 2560, "max_num_batched_tokens": 4096})
    spec["prompts"] = _shared_prefix(reference)
    return spec


def test_prompts_sharing_a_prefix_admitted_in_one_step_equal_one_at_a_time(reference, bundled):
    """vLLM admits both prompts in one step, the second on a prefix-cache hit on the whole blocks of the shared
    prefix (15 blocks of 128, 1,920 tokens; their rows are filled alike in both) that the first computes in that same
    step: the second's first filled token reads the split state of the first's token 1,919 from that step. The
    outputs equal those of the prompts sent one after another (greedy tokens; first-token log-probabilities within
    1e-4), where the second hits the blocks a step before computed."""
    run = bundled["shared-prefix"]
    prompts = _shared_prefix(reference)
    n, hit = len(prompts[0]), len(reference["needles"][0]["ids"]) // run["block_size"] * run["block_size"]
    together = [s for s in run["steps"] if len(s["query_lens"]) == 2]
    assert len(together) == 1 and sorted(zip(together[0]["num_computed"], together[0]["query_lens"])) == [
        (0, n), (hit, n - hit)] and together[0]["carried"] == 1
    assert [p["num_cached_tokens"] for p in run["prompts"]] == [0, hit] == [p["num_cached_tokens"] for p in
                                                                           run["sequential"]]
    _assert_same_outputs(run, {"prompts": run["sequential"]})
