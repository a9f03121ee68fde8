"""The research scripts' row sets (``scripts/needle_oracle.py``): on the bundled tokenizer the rows they
call a needle's value and key decode to that value and key, for every needle of a multikey case; and the
lexical selection part (``Select.parse("ngram")``) chooses those rows on the same cases."""

from pathlib import Path

from conftest import script_module
from ridgefill.assets import EVALUATION_BOOKS, load_model, load_texts
from ridgefill.evaluate.needles import case_rng, haystack_sentences, make_case
from ridgefill.evaluate.report import load_reports
import torch

from ridgefill.select import Select, choose_rows, ngram_scores


def test_needle_oracle_row_sets_are_the_needles_value_and_key():
    oracle = script_module("needle_oracle")
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


def test_ngram_part_chooses_the_asked_needle_within_the_budget():
    """The lexical selection part (``Select.parse("ngram")``, 5 % of the prompt): on multikey cases the asked needle's key and value
    rows are among the rows it chooses (the question quotes its key), row 0 first, no tail row, within
    the budget."""
    sel = Select.parse("ngram")
    _, tok, _ = load_model()
    sentences = haystack_sentences({k: load_texts()[k] for k in EVALUATION_BOOKS})
    for t in range(3):
        case = make_case(tok, sentences, length=1024, tail=64, variant="multikey", rng=case_rng(0, "multikey", 1024, t))
        ids = case.input_ids.tolist()
        budget = sel.budget_rows(len(ids))
        filled = torch.ones(len(ids), dtype=torch.bool)
        filled[-case.tail:] = False
        scores = ngram_scores(torch.tensor([ids]), torch.arange(len(ids) - case.tail, len(ids))[-sel.queries:])
        rows = choose_rows(scores, filled, sel, budget).tolist()
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


def test_ngram_coverage_weighing_filled_is_the_library_score():
    """``scripts/ngram_coverage.py`` compares weighings; its ``filled`` weighing is the library's
    :func:`ridgefill.select.ngram_scores` (same values on multikey prompts), and its ``prompt`` weighing
    (the ninth session's) differs from it there."""
    from ridgefill.select import NGRAM_SIZES

    cov = script_module("ngram_coverage")
    _, tok, _ = load_model()
    sentences = haystack_sentences({k: load_texts()[k] for k in EVALUATION_BOOKS})
    for t in range(2):
        case = make_case(tok, sentences, length=1024, tail=64, variant="multikey", rng=case_rng(0, "multikey", 1024, t))
        ids = case.input_ids.tolist()
        queries = list(range(len(ids) - 64, len(ids)))
        lib = ngram_scores(torch.tensor([ids]), torch.tensor(queries))
        torch.testing.assert_close(cov.weighed_scores(ids, queries, NGRAM_SIZES, "filled").float(), lib)
        assert not torch.allclose(cov.weighed_scores(ids, queries, NGRAM_SIZES, "prompt").float(), lib)


def test_loss_subset_matches_eval_loss_and_finds_the_held_out_documents():
    """``scripts/loss_subset.py`` over all documents of a kept ``eval loss`` result gives that run's own
    summary (all-token and key-token ΔNLL, every interval, per system and set); over the depth table's six
    documents inside that 16-document run it gives the depth table's own S = 15 figures (another run, on
    those six documents alone), in any order of the indices; ``--held-out-from 3,3`` keeps the 10 documents
    that share no 32-token window with the depth table's six, and none when held out from all 16."""
    subset = script_module("loss_subset")
    results = Path(__file__).resolve().parents[1] / "docs" / "results"
    data = subset.load(str(results / "loss-twelfth-8x8.json.xz"))
    n = len(data["documents"])

    def check(rows, summary, prefix=""):
        mine = {(r["variant"], r["set"], r["tokens"]): r["delta_nll"] for r in rows}
        want = [s for s in summary if s["variant"].startswith(prefix)]
        for s in want:
            got = mine[(s["variant"], s["set"], s["tokens"])]
            assert got["tokens"] == s["delta_nll"]["tokens"] and got["docs"] == s["delta_nll"]["docs"]
            assert max(abs(a - b) for a, b in zip([got["mean"], *got["ci"]],
                                                  [s["delta_nll"]["mean"], *s["delta_nll"]["ci"]])) < 1e-6, s
        return len(want)

    assert check(subset.subset_stats(data, range(n)), data["summary"]) == 12
    depth = load_reports([results / "depth-twelfth.json.xz"])[0]
    six = [14, 9, 8, 6, 1, 0]  # the depth table's documents inside the 16, given out of order
    assert check(subset.subset_stats(data, six), depth["loss"]["summary"], prefix="15/") == 12
    assert subset.held_out(data, 3, 3) == sorted(set(range(n)) - set(six))
    assert subset.held_out(data, 8, 8) == []
