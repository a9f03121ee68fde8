"""The dense families other than Llama served by the plugin (``RidgeFill<Arch>ForCausalLM``), against the
reference ``ridgefill.prefill`` and against vLLM's own class, with the plain fill (``"select": "off"``) and with
the default row selection (``"select": "on"``; Gemma 3 with vLLM's hybrid KV-cache manager off).

Models: per family a tiny random checkpoint saved from a ``transformers`` config, with context maps at split
S = 1 fitted by ``ridgefill``'s calibration (``scripts/vllm_family_reference.py``, run once in the main
environment). Prompts: 300 and 200 tokens (tail 32: filled rows 0-267 and 0-167) and one of 32 tokens (all
exact), sent in one ``generate`` call to an engine with chunked prefill at 128 tokens per step, so the fill runs
in chunks, beside the other prompts and decoding tokens; with selection on, each long prompt selects in the step
of its last chunk, over rows of the chunks before. All engines run one after another in one process
(``tests_vllm/run_engine.py``, ``runs``).
"""

import json

import pytest

from conftest import main_env_reference, run_engine

FAMILIES = ["qwen2", "qwen3", "qwen3_moe", "mistral", "phi3", "gemma3_text", "gemma3_groups"]
#: models whose late layers are in several KV-cache groups of one spec (vLLM's hybrid KV-cache manager, on by default:
#: Gemma 3 with three sliding layers to one full, its late layers 2 and 3 sliding), served with vLLM's CPU attention
#: builder reusing one group's metadata for the others as FlashAttention's does (``run_engine.py``,
#: ``update_block_table``)
GROUPS = ["gemma3_groups"]
#: the families whose row selection runs here (all but the groups model); Gemma 3's needs vLLM's hybrid KV-cache
#: manager off
SELECT = [f for f in FAMILIES if f not in GROUPS]
SELECT_ENGINE = {"gemma3_text": {"disable_hybrid_kv_cache_manager": True}}
#: families also run with every head scoring (``heads=sum``): the default keeps the 8 heads of highest induction
#: score, all in the tiny Gemma 3's full layers, so only this scores in its sliding layer (within the window)
SUM_HEADS, SUM_SPEC = ["gemma3_text"], "heads=sum"
GEN, TOP = 8, 10
#: fill against the reference: float32 rounding of two implementations of the same arithmetic (as the Llama
#: test); the all-exact prompt against vLLM's own class: the same kernels, another batch
TOL_REF, TOL_OWN = 5e-4, 5e-5
#: the late layers' sliding windows (S = 1: layers 2 and 3; Gemma 3's layer 2 slides, window 48), None: full
WINDOWS = {"gemma3_text": [48, None], "gemma3_groups": [48, 48]}


main_env_reference("family_reference", "families.json", lambda work_dir: [
    "vllm_family_reference.py", "--out", str(work_dir / "families.json"), "--dir", str(work_dir / "families"),
    "--families", ",".join(FAMILIES), "--select", ",".join(SELECT), "--sum-heads", ",".join(SUM_HEADS)])


@pytest.fixture(scope="module")
def family_reference(references) -> dict:
    return references.read("family_reference")


@pytest.fixture(scope="module")
def family_runs(family_reference, work_dir) -> dict:
    """Per family: ``own`` (vLLM's class, no maps), ``fill`` (the RidgeFill class, selection off) with its step
    log ``steps``, for the families of ``SELECT`` ``select`` (selection on) and of ``SUM_HEADS`` ``select_sum``
    (``heads=sum``), each with its step log ``<run>_steps``."""
    tail, runs, keys, logs = family_reference["tail"], [], [], {}
    engine = {"enable_chunked_prefill": True, "max_num_batched_tokens": 128, "max_num_seqs": 8}
    for name in FAMILIES:
        fam = family_reference["families"][name]
        base = {"model_dir": fam["model_dir"], "prompts": [p["ids"] for p in fam["prompts"]], "gen_tokens": GEN,
                "top": TOP, **({"update_block_table": True} if name in GROUPS else {})}
        runs.append(dict(base, architecture=fam["architecture"], ridgefill=None))
        keys.append((name, "own"))
        for run, select in (("fill", "off"), ("select", "on"), ("select_sum", SUM_SPEC)):
            if (run == "select" and name not in SELECT) or (run == "select_sum" and name not in SUM_HEADS):
                continue
            logs[name, run] = work_dir / f"families-{name}-{run}-steps.jsonl"
            logs[name, run].unlink(missing_ok=True)
            runs.append(dict(base, architecture="RidgeFill" + fam["architecture"], step_log=str(logs[name, run]),
                             ridgefill={"maps": fam["maps"], "tail": tail, "select": select},
                             engine=dict(engine, **SELECT_ENGINE.get(name, {})) if run != "fill" else engine))
            keys.append((name, run))
    out = run_engine(work_dir, "families", {"runs": runs}, fresh=True)["runs"]
    got = {name: {} for name in FAMILIES}
    for (name, run), result in zip(keys, out):
        got[name][run] = result
    for (name, run), log in logs.items():
        got[name]["steps" if run == "fill" else run + "_steps"] = [json.loads(x) for x in log.read_text().splitlines()]
    return got


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


@pytest.mark.parametrize("name", GROUPS)
def test_late_layers_in_several_kv_cache_groups_write_their_own_slots(name, family_runs):
    """Under vLLM's hybrid KV-cache manager the late sliding layers 2 and 3 are in two KV-cache groups of one spec,
    each with its own block table. vLLM's own class ran with the metadata of one group copied to the others
    (``block_table_updates``, as on a GPU with FlashAttention); the RidgeFill engine built each group's own row plan
    and slots, so its fill equals the reference (``test_fill_equals_reference``, which fails when the late layers'
    builder lets vLLM copy the first group's plan: the second group's layer then writes its filled K/V at the first
    group's slots)."""
    assert family_runs[name]["own"]["block_table_updates"] > 0
    assert family_runs[name]["fill"]["block_table_updates"] == 0  # only the late layers' groups have two of a spec


@pytest.mark.parametrize("name,run", [(n, "select") for n in SELECT] + [(n, "select_sum") for n in SUM_HEADS])
def test_selection_chooses_the_reference_rows_and_equals_its_prefill(name, run, family_reference, family_runs):
    """With ``"select": "on"`` (and ``heads=sum``) the plugin makes exact the rows ``ridgefill.prefill`` chooses with
    that selection (10 to 15 rows on each filled prompt: the lexical part's and the attention parts', scored with the
    family's queries), in the step of each prompt's last chunk; its first-token log-probabilities are within 5e-4 of
    the reference's and the greedy tokens equal; the chosen rows move the outputs away from the plain fill's."""
    ref = family_reference["families"][name]["prompts"]
    got = family_runs[name][run]["prompts"]
    selected = [rows for s in family_runs[name][run + "_steps"] if "selected" in s for rows in s["selected"].values()]
    assert sorted(map(tuple, selected)) == sorted(tuple(ref[i][run]["selected"]) for i in (0, 1))
    moved = 0.0
    for i in (0, 1):
        assert len(ref[i][run]["selected"]) > 0, (name, i)
        _assert_close(got[i], ref[i][run], TOL_REF, f"{name} prompt {i}, {run}")
        assert got[i]["greedy"] == ref[i][run]["greedy"], (name, i)
        assert ref[i][run]["margin"] > 20 * TOL_REF, (name, i, ref[i][run]["margin"])
        plain, sel = _logprobs(family_runs[name]["fill"]["prompts"][i]), _logprobs(got[i])
        moved = max(moved, max(abs(sel[t] - plain[t]) for t in sel if t in plain))
    assert moved > 20 * TOL_REF, (name, moved)
