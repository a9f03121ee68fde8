"""Row selection served by vLLM (``"select"`` left at its default, ``"auto"``: the maps' recorded setting, else
``"on"``, one pass) against the reference ``ridgefill.prefill``: with ``select="on"`` (the maps record none) the same
chosen rows, the same first-token log-probabilities and greedy tokens, with and without chunked prefill; with maps that
record the two-pass setting the same for ``select="auto"`` (two passes of the late layers); filled-region needles through
``LLM.generate`` beside the plain fill and the exact model; prefix caching with selection on.

Model: the bundled SmolLM2-135M-Instruct (float32), maps at S = 15 (``scripts/vllm_reference.py``). The engines
are registered with ``conftest.bundled_engine`` and run with those of ``test_equality.py`` one after another in one
process.
"""

import re

import pytest

from conftest import bundled_engine

GEN, TOP = 12, 20


def _spec(reference, ridgefill, prompts, **extra):
    return dict({"model_dir": reference["model_dir"], "architecture": "RidgeFillLlamaForCausalLM",
                 "ridgefill": ridgefill, "prompts": prompts, "gen_tokens": GEN, "top": TOP}, **extra)


def _selected(steps) -> list[list[int]]:
    """The chosen rows the step log recorded, in the order the requests selected."""
    return [rows for s in steps if "selected" in s for rows in s["selected"].values()]


def _engine(name, engine, prompts=None, maps="maps", **extra):
    """Register the bundled-model engine ``name``: selection at its default (``auto``), the reference's maps (or those
    of its entry ``maps``) and tail, ``engine`` settings, ``prompts`` (a function of the reference; default: its three
    prompts), a step log."""
    @bundled_engine(name)
    def build(reference, work_dir):
        ridgefill = {"maps": reference[maps], "tail": reference["tail"]}  # select: the default, auto
        ids = [p["ids"] for p in reference["prompts"]] if prompts is None else prompts(reference)
        return _spec(reference, ridgefill, ids, step_log=str(work_dir / f"{name}-steps.jsonl"), engine=engine, **extra)
    return build


#: Selection on (one pass), chunked prefill off: each prompt in one step (the 700-token one alone, then the other two
#: together beside its decoding).
_engine("select", {}, fill_state=True)
#: Selection on, chunked prefill at 256 tokens per step: the 700-token prompt selects in its third chunk, over rows
#: of the two before; the others are chunked beside it and beside decoding tokens.
_engine("select-chunked", {"enable_chunked_prefill": True, "max_num_batched_tokens": 256})
#: The maps recording the two-pass setting (``select`` at its default, ``auto``), chunked prefill at 256 tokens per step.
_engine("select-two-pass", {"enable_chunked_prefill": True, "max_num_batched_tokens": 256}, maps="maps_two_pass")


@pytest.fixture(scope="module")
def select_whole(bundled):
    return bundled["select"]


@pytest.fixture(scope="module")
def select_chunked(bundled):
    return bundled["select-chunked"]


@pytest.fixture(scope="module")
def select_two_pass(bundled):
    return bundled["select-two-pass"]


def _assert_equals_reference(out, refs, tol=5e-4):
    for mine, ref in zip(out["prompts"], refs):
        want = dict(zip(ref["top_ids"], ref["top_logprobs"]))
        got = dict(zip(mine["top_ids"], mine["top_logprobs"]))
        assert mine["top_ids"][0] == ref["top_ids"][0]
        common = [t for t in ref["top_ids"][:10] if t in got]
        assert len(common) >= 8
        for t in common:
            assert got[t] == pytest.approx(want[t], abs=tol)
        assert mine["greedy"] == ref["greedy"]


def test_selection_chooses_the_reference_rows_and_equals_its_prefill(reference, select_whole):
    """The rows the plugin's selection makes exact are those ``ridgefill.prefill(select="on")`` chooses (one pass), and
    the first-token log-probabilities are within 5e-4 of it, with 12 greedy tokens equal."""
    refs = [p["select"] for p in reference["prompts"]]
    assert sorted(map(tuple, _selected(select_whole["steps"]))) == sorted(tuple(r["selected"]) for r in refs)
    assert all(len(r["selected"]) > 0 for r in refs)  # selection chose rows on every prompt
    assert [s["passes"] for s in select_whole["steps"] if "selected" in s] == [1, 1]  # one pass of the late layers
    _assert_equals_reference(select_whole, refs)


def test_two_pass_selection_the_maps_record_chooses_the_reference_rows(reference, select_two_pass):
    """Maps that record the two-pass setting, ``select`` at its default (``auto``): the plugin chooses the rows
    ``ridgefill.prefill(select="auto")`` chooses with those maps (``TWO_PASS_SELECT``: the attention parts scored in a
    first pass of the late layers; other rows than one-pass on two of the prompts), runs the late layers twice per
    selecting step, chunked at 256 tokens, and its first-token log-probabilities are within 5e-4 of the reference,
    with 12 greedy tokens equal."""
    refs = [p["two_pass"] for p in reference["prompts"]]
    assert sorted(map(tuple, _selected(select_two_pass["steps"]))) == sorted(tuple(r["selected"]) for r in refs)
    assert all(len(r["selected"]) > 0 for r in refs)
    assert sum(r["selected"] != p["select"]["selected"] for r, p in zip(refs, reference["prompts"])) >= 2
    steps = [s for s in select_two_pass["steps"] if "selected" in s]
    assert len(steps) >= 1 and all(s["passes"] == 2 for s in steps)
    _assert_equals_reference(select_two_pass, refs)


def test_selection_with_chunked_prefill_equals_one_step_per_prompt(reference, select_whole, select_chunked):
    """Chunked at 256 tokens, a prompt's selection (in the step of its last prompt token, over rows of earlier
    chunks) chooses the same rows, and the outputs equal one step per prompt."""
    chunked_steps = [s for s in select_chunked["steps"] if "query_lens" in s]
    assert any(c > 0 and q < 700 for s in chunked_steps for c, q in zip(s["num_computed"], s["query_lens"]))
    assert sorted(map(tuple, _selected(select_chunked["steps"]))) == sorted(map(tuple, _selected(select_whole["steps"])))
    refs = [p["select"] for p in reference["prompts"]]
    _assert_equals_reference(select_chunked, refs)
    for a, b in zip(select_chunked["prompts"], select_whole["prompts"]):
        for x, y in zip(a["top_logprobs"], b["top_logprobs"]):
            assert x == pytest.approx(y, abs=1e-4)


NEEDLE_ENGINES = {"exact": ("LlamaForCausalLM", None),
                  "plain fill": ("RidgeFillLlamaForCausalLM", {"select": "off"}),
                  "fill, selection on": ("RidgeFillLlamaForCausalLM", {})}


def _needle_engine(name):
    arch, fill = NEEDLE_ENGINES[name]

    @bundled_engine("needles-" + name.replace(" ", "-").replace(",", ""))
    def build(reference, work_dir):
        engine = {"max_model_len": 2304, "enable_chunked_prefill": True, "max_num_batched_tokens": 1024}
        ridgefill = None if fill is None else {"maps": reference["maps"], "tail": reference["needle_tail"], **fill}
        ids = [n["ids"] for n in reference["needles"]]
        return dict(_spec(reference, ridgefill, [], engine=engine, needles=ids), architecture=arch)
    return build


for _name in NEEDLE_ENGINES:
    _needle_engine(_name)


@pytest.fixture(scope="module")
def needles(bundled):
    """The reference's 8 single-needle prompts of 2,048 tokens (needle in the filled rows, question in the
    tail of 256), answered greedily by vLLM's own Llama, the plain fill and the fill with selection (S = 15,
    chunked prefill on at 1,024 tokens per step)."""
    return {name: bundled["needles-" + name.replace(" ", "-").replace(",", "")] for name in NEEDLE_ENGINES}


def test_needles_through_vllm_with_selection_keep_exact_score(reference, needles):
    """Filled-region single needles at 2K tokens: the fill with selection answers at least 90 % of what the
    exact model answers; the plain fill is run beside it (it loses them at this split)."""
    answers = [n["answer"] for n in reference["needles"]]
    scores = {name: sum(a in text for a, text in zip(answers, run["needles"])) for name, run in needles.items()}
    print("needles answered of", len(answers), scores)
    assert scores["exact"] >= 6
    assert scores["fill, selection on"] >= 0.9 * scores["exact"]
    assert scores["plain fill"] < scores["fill, selection on"]


_engine("prefix-select", {"enable_prefix_caching": True, "enable_chunked_prefill": True, "max_num_batched_tokens": 256},
        prompts=lambda reference: [p["ids"] for p in reference["prefix_sequence"]], sequential=True)


@pytest.fixture(scope="module")
def prefix_select(bundled):
    return bundled["prefix-select"]


def test_prefix_caching_with_selection_shares_no_filled_block_and_equals_the_reference(reference, prefix_select):
    """With selection on, a block holding filled rows is its request's own (the rows selection makes exact
    depend on the whole prompt): requests sharing a prefix hit no block of it, and each output equals the
    reference prefill with selection (prefix caching off)."""
    assert [p["num_cached_tokens"] for p in prefix_select["prompts"]] == [0, 0, 0, 0]
    refs = [p["select"] for p in reference["prefix_sequence"]]
    assert [tuple(r) for r in _selected(prefix_select["steps"])] == [tuple(r["selected"]) for r in refs]
    _assert_equals_reference(prefix_select, refs)


_REQUEST_LINE = re.compile(r"RidgeFill: request (\S+): prompt (\d+) tokens, (\d+) filled rows, (\d+) exact rows "
                           r"\(tail (\d+), chosen (\d+)\)(?:, selection ([\d.]+) ms)?$")


def test_each_request_logs_its_filled_exact_and_chosen_rows(reference, select_whole, bundled):
    """vLLM's log gets one line per request when its prompt is prefilled: its filled and exact rows, the tail and
    the rows selection chose (the reference's count), and the time of the selection step; without selection, no time
    and no chosen rows."""
    tail = reference["tail"]
    for run, refs in ((select_whole, [p["select"] for p in reference["prompts"]]), (bundled["fill"], None)):
        got = sorted((int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]), m[7])
                     for m in map(_REQUEST_LINE.match, run["request_log"]))
        want = []
        for i, p in enumerate(reference["prompts"]):
            n, k = len(p["ids"]), 0 if refs is None else len(refs[i]["selected"])
            want.append((n, n - tail - k, tail + k, tail, k))
        assert [g[:5] for g in got] == sorted(want)
        assert all((g[5] is None) == (refs is None) for g in got)
        assert refs is None or all(float(g[5]) > 0 for g in got)
