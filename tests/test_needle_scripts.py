"""The research scripts' row sets (``scripts/needle_oracle.py``): on the bundled tokenizer the rows they
call a needle's value and key decode to that value and key, for every needle of a multikey case."""

import importlib.util
from pathlib import Path

from ridgefill.assets import EVALUATION_BOOKS, load_model, load_texts
from ridgefill.evaluate.needles import case_rng, haystack_sentences, make_case
from ridgefill.select import Select


def _script(name):
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_needle_oracle_row_sets_are_the_needles_value_and_key():
    oracle = _script("needle_oracle")
    _, tok, _ = load_model()
    sentences = haystack_sentences({k: load_texts()[k] for k in EVALUATION_BOOKS})
    for t in range(3):
        case = make_case(tok, sentences, length=1024, tail=64, variant="multikey", rng=case_rng(0, "multikey", 1024, t))
        ids = case.input_ids
        for j in range(len(case.spans)):
            sets = oracle.needle_rows(case.spans, j)
            assert tok.decode(ids[sets["asked_value"]]).strip() == f": {case.values[j]}."
            assert tok.decode(ids[sets["asked_key"]]).strip() == f"for {case.keys[j]} is"
            assert sets["asked_whole"] == list(range(*case.spans[j]))
            assert len(sets["all_values"]) == 10 * len(case.spans)
            assert set(sets["asked_whole+values"]) == set(sets["asked_whole"]).union(sets["all_values"])


def test_select_ngram_scores_the_row_that_ends_the_match_and_widens_it():
    """``scripts/select_ngram.py`` on a hand-made prompt: the score goes to the row that ends a shared
    sequence (a 2- and a 3-token match at row 22 outrank the 2-token match at row 21), the window is
    ``[22 - before, 22 + after]``, given exact rows and the tail are never chosen, row 0 comes first, and
    without a match nothing but row 0 is chosen."""
    rule = _script("select_ngram")
    ids = list(range(100, 150))  # 50 filled rows, no repeats
    ids[20:23] = [500, 501, 502]
    prompt = ids + [900, 901, 500, 501, 502, 902]  # a 6-row tail quoting rows 20-22
    rows = rule.ngram_rows(prompt, 6, 10, before=1, after=2)
    assert rows.tolist() == [0, 21, 22, 23, 24]
    assert rule.ngram_rows(prompt, 6, 10, before=1, after=2, exact_rows=[0, 23]).tolist() == [21, 22, 24]
    assert rule.ngram_rows(prompt, 6, 3, before=1, after=2).tolist() == [0, 21, 22]  # cut to the budget
    assert rule.ngram_rows(list(range(100)), 10, 5, before=4, after=16).tolist() == [0]  # nothing matches


def test_select_ngram_chooses_the_asked_needle_within_the_budget():
    """``scripts/select_ngram.py``: on multikey cases the asked needle's key and value rows are among the rows
    the n-gram rule chooses (the question quotes its key), row 0 first, no tail row, within the budget."""
    rule = _script("select_ngram")
    _, tok, _ = load_model()
    sentences = haystack_sentences({k: load_texts()[k] for k in EVALUATION_BOOKS})
    for t in range(3):
        case = make_case(tok, sentences, length=1024, tail=64, variant="multikey", rng=case_rng(0, "multikey", 1024, t))
        ids = case.input_ids.tolist()
        budget = Select().budget_rows(len(ids))  # what the wrapper passes for the default 5 %
        rows = rule.ngram_rows(ids, case.tail, budget, before=4, after=16).tolist()
        assert rows[0] == 0 and len(rows) <= budget and max(rows) < len(ids) - case.tail
        start, end = case.spans[case.asked]
        pieces = [tok.decode(ids[r]) for r in range(start, end)]
        value = [start + j for j, w in enumerate(pieces) if w.strip().isdigit()]
        ends = [len("".join(pieces[: j + 1])) for j in range(len(pieces))]  # character offsets in the needle
        k0 = "".join(pieces).index(case.keys[case.asked])
        k1 = k0 + len(case.keys[case.asked])
        key_rows = [start + j for j in range(len(pieces)) if ends[j] > k0 and ends[j] - len(pieces[j]) < k1]
        assert tok.decode(ids[key_rows[0]:key_rows[-1] + 1]).strip() == case.keys[case.asked]
        assert value and set(value) <= set(rows)
        assert set(key_rows) <= set(rows)
