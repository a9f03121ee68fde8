"""The lexical selection part (``Select.parse("ngram")``) on the bundled tokenizer and evaluation text:
on multikey needle cases it chooses the asked needle's key and value rows."""

import torch
from ridgefill.data.models import load_tokenizer
from ridgefill.data.texts import EVALUATION_BOOKS, load_texts
from ridgefill.evaluate.needles import case_rng, haystack_sentences, make_case
from ridgefill.select import Select, choose_rows, ngram_scores


def test_ngram_part_chooses_the_asked_needle_within_the_budget():
    """The lexical selection part (``Select.parse("ngram")``, 5 % of the prompt): on multikey cases the asked needle's key and value
    rows are among the rows it chooses (the question quotes its key), row 0 first, no tail row, within
    the budget."""
    sel = Select.parse("ngram")
    tok = load_tokenizer()
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
