"""The research scripts' row sets (``scripts/needle_oracle.py``): on the bundled tokenizer the rows they
call a needle's value and key decode to that value and key, for every needle of a multikey case."""

import importlib.util
from pathlib import Path

from ridgefill.assets import EVALUATION_BOOKS, load_model, load_texts
from ridgefill.evaluate.needles import case_rng, haystack_sentences, make_case


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


def test_select_ngram_chooses_the_asked_needle_within_the_budget():
    """``scripts/select_ngram.py``: on multikey cases the asked needle's key and value are among the rows the
    n-gram rule chooses (the question quotes its key), every chosen row is filled, within the budget, and a
    prompt whose tail shares no sequence with the filled rows gets row 0 only."""
    rule = _script("select_ngram")
    _, tok, _ = load_model()
    sentences = haystack_sentences({k: load_texts()[k] for k in EVALUATION_BOOKS})
    for t in range(3):
        case = make_case(tok, sentences, length=1024, tail=64, variant="multikey", rng=case_rng(0, "multikey", 1024, t))
        ids = case.input_ids.tolist()
        budget = int(0.05 * len(ids))
        rows = rule.ngram_rows(ids, case.tail, budget, before=4, after=16).tolist()
        assert rows[0] == 0 and len(rows) <= budget and max(rows) < len(ids) - case.tail
        start, end = case.spans[case.asked]
        value = [r for r in range(start, end) if tok.decode(ids[r]).strip().isdigit()]
        assert value and set(value) <= set(rows)
    ids = list(range(100))  # no token repeats: nothing in the tail matches a filled row
    assert rule.ngram_rows(ids, 10, 5, before=4, after=16).tolist() == [0]
