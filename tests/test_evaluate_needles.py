"""Needle prompts: placement inside the filled rows, reproducibility, scoring, the runner."""

import numpy as np
import pytest
import torch

import ridgefill.evaluate.needles as needles
from ridgefill import InputError
from ridgefill.evaluate.needles import (HEADER, NEEDLE, case_rng, haystack_sentences, make_case, run_needles,
                                        score_answer, summarise_needles)
from evaluate_helpers import ByteTokenizer, byte_llama

PROSE = {"book": "\n\n".join(
    f"Chapter {i}\n\nThe morning of day {i} was grey, and the party walked along the shore. "
    f"Nobody spoke of the letter! Was it lost, or only mislaid on the {i}th? They could not tell." for i in range(300))}


@pytest.fixture(scope="module")
def sentences():
    return haystack_sentences(PROSE)


def test_haystack_sentences_drop_headings(sentences):
    assert not any(s.startswith("Chapter") for s in sentences)
    assert sentences[:3] == ["The morning of day 0 was grey, and the party walked along the shore.",
                             "Nobody spoke of the letter!", "Was it lost, or only mislaid on the 0th?"]


@pytest.mark.parametrize("variant", ["single", "multikey"])
@pytest.mark.parametrize("chat", [False, True])
def test_needles_lie_in_the_filled_rows(sentences, variant, chat):
    tok = ByteTokenizer()
    for trial in range(12):
        length, tail = [900, 1500, 2600][trial % 3], [200, 260][trial % 2]
        depth = (trial + 0.5) / 12 if variant == "single" else None
        case = make_case(tok, sentences, length=length, tail=tail, variant=variant,
                         rng=case_rng(0, variant, length, trial), depth=depth, chat=chat)
        n = case.input_ids.numel()
        assert length - 200 <= n <= length and case.filled_rows == n - tail
        assert case.needle_in_filled_rows() and len(case.spans) == (1 if variant == "single" else 4)
        assert case.question_tokens <= tail
        for (s, e), key, value, d in zip(case.spans, case.keys, case.values, case.depths):
            assert tok.decode(case.input_ids[s:e]) == " " + NEEDLE.format(key=key, value=value)
            assert d == pytest.approx(s / case.filled_rows) and 0 <= d < 1
            assert len(value) == 7 and value.isdigit() and len(key.split("-")) == 2
        if variant == "single":  # the requested depth (or just after the header), to within half a sentence
            header = len(tok(HEADER)["input_ids"]) + (len("<user>") if chat else 0)
            assert abs(case.spans[0][0] - max(depth * case.filled_rows, header)) <= 50
        else:
            assert len(set(case.keys)) == 4 and len(set(case.values)) == 4
        question = tok.decode(case.input_ids[-case.question_tokens:])
        assert case.keys[case.asked] in question and case.answer not in question
        assert question.endswith("mentioned in the provided text is")
        if chat:
            assert tok.decode(case.input_ids[:6]) == "<user>"


def test_cases_are_reproducible(sentences):
    tok = ByteTokenizer()
    a = make_case(tok, sentences, length=1200, tail=200, variant="multikey", rng=case_rng(7, "multikey", 1200, 3))
    b = make_case(tok, sentences, length=1200, tail=200, variant="multikey", rng=case_rng(7, "multikey", 1200, 3))
    c = make_case(tok, sentences, length=1200, tail=200, variant="multikey", rng=case_rng(8, "multikey", 1200, 3))
    assert torch.equal(a.input_ids, b.input_ids) and a.spans == b.spans and a.values == b.values
    assert not torch.equal(a.input_ids, c.input_ids)


def test_bad_needle_input(sentences):
    tok = ByteTokenizer()
    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match="question must be in the exact tail"):
        make_case(tok, sentences, length=1200, tail=20, variant="single", rng=rng)
    with pytest.raises(InputError, match="no filled prose"):
        make_case(tok, sentences, length=300, tail=200, variant="single", rng=rng)
    with pytest.raises(InputError, match="variant"):
        make_case(tok, sentences, length=1200, tail=200, variant="triple", rng=rng)
    model = byte_llama()
    with pytest.raises(InputError, match="context"):
        run_needles(model, tok, sentences, lengths=[600], trials=1, tail=200)  # max_position_embeddings 512
    with pytest.raises(InputError, match="needs maps"):
        run_needles(model, tok, sentences, lengths=[480], trials=1, tail=200, modes=["ridge"], splits=[2])


def test_score_answer():
    assert score_answer(" 4829173.\n\nThe", "4829173") == 100.0
    assert score_answer("The number is 482917", "4829173") == 0.0
    assert score_answer("KEY-Ab", "key-ab") == 100.0


def test_runner_records_and_scores(sentences, monkeypatch):
    """Tiny random model; generation is replaced by one that answers the asked value for exact and
    identity and garbage for none, so the scoring and summaries have known values."""
    tok = ByteTokenizer()
    model = byte_llama()
    model.config.max_position_embeddings = 2048  # RoPE is computed on the fly: longer byte prompts fit
    seen = []

    def fake_generate(model, ids, result, max_new_tokens):
        seen.append((result.mode, result.split, ids.shape[1]))
        case = current["case"]
        text = " " + case.answer if result.mode in ("exact", "identity") else " 1234567"
        return torch.tensor([tok(text)["input_ids"][:max_new_tokens]])

    current = {}
    real_make = needles.make_case

    def make(*args, **kwargs):
        current["case"] = real_make(*args, **kwargs)
        return current["case"]

    monkeypatch.setattr(needles, "generate_after", fake_generate)
    monkeypatch.setattr(needles, "make_case", make)
    res = run_needles(model, tok, sentences, lengths=[1200], trials=3, variants=["single", "multikey"],
                      modes=["exact", "identity", "none"], splits=[2], tail=200, max_new_tokens=9)
    assert len(res["trials"]) == 6 and len(seen) == 18
    assert all(t["needle_in_filled_rows"] for t in res["trials"])
    assert [round(t["depth"], 2) for t in res["trials"][:3]] == pytest.approx([0.2, 0.5, 0.8], abs=0.12)
    scores = {(r["variant"], r["system"]): r for r in res["scores"]}
    assert scores[("single", "exact")]["score"] == 100.0 and scores[("single", "2/none")]["score"] == 0.0
    assert scores[("multikey", "2/identity")]["score"] == 100.0 and scores[("multikey", "2/identity")]["trials"] == 3
    lo, hi = scores[("single", "2/none")]["ci"]
    assert lo == 0.0 and 40 < hi < 60  # Wilson interval for 0/3
    assert summarise_needles(res["trials"]) == res["scores"]


def test_runner_splices_and_key_scales(sentences):
    """Splicing the exact K and V into the ridge fill answers exactly like the exact prefill; a key
    scale of 1 answers like the plain ridge fill."""
    from conftest import oracle_maps

    tok = ByteTokenizer()
    model = byte_llama(seed=2)
    model.config.max_position_embeddings = 2048
    maps = oracle_maps(model, torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0)), 2)
    res = run_needles(model, tok, sentences, lengths=[1000], trials=2, variants=["single"],
                      modes=["exact", "ridge"], maps_by_split={2: maps}, splits=[2], tail=200, splices=["kv", "k"],
                      key_scales={2: torch.ones(3, 2)}, max_new_tokens=6)
    for t in res["trials"]:
        out = {k: v["output"] for k, v in t["results"].items()}
        assert set(out) == {"exact", "2/ridge", "2/ridge+kv", "2/ridge+k", "2/ridge+kscale"}
        assert out["2/ridge"] != out["exact"]  # the fill alone answers differently: not vacuous
        assert out["2/ridge+kv"] == out["exact"] and out["2/ridge+kscale"] == out["2/ridge"]
    with pytest.raises(InputError, match="include mode 'exact'"):
        run_needles(model, tok, sentences, lengths=[1000], trials=1, modes=["ridge"], maps_by_split={2: maps},
                    splits=[2], tail=200, splices=["k"])


def test_runner_row_selection(sentences):
    """A selection budget that covers every filled row makes the fill exact: the +sel system answers
    like exact; each result records its chosen rows and the share of the needle among them."""
    from conftest import oracle_maps
    from ridgefill.select import Select

    tok = ByteTokenizer()
    model = byte_llama(seed=2)
    model.config.max_position_embeddings = 2048
    maps = oracle_maps(model, torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0)), 2)
    res = run_needles(model, tok, sentences, lengths=[1000], trials=2, variants=["single"], modes=["exact", "ridge"],
                      maps_by_split={2: maps}, splits=[2], tail=200, max_new_tokens=6,
                      selects=[Select(budget=2000), Select(budget=8, before=0, after=0)])
    for t in res["trials"]:
        r = t["results"]
        assert r["2/ridge"]["output"] != r["exact"]["output"]  # not vacuous
        assert r["2/ridge+sel0"]["output"] == r["exact"]["output"]
        assert r["2/ridge+sel0"]["selected"] == t["filled_rows"] and r["2/ridge+sel0"]["needle_hit"] == 1.0
        assert r["2/ridge+sel1"]["selected"] == 8
    with pytest.raises(InputError, match="row selection"):
        run_needles(model, tok, sentences, lengths=[1000], trials=1, modes=["ridge"], maps_by_split={2: maps},
                    splits=[2], tail=200, selects=[Select()], select_modes=["none"])
