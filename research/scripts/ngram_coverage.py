#!/usr/bin/env python3
"""Does the lexical selection part find the asked needle? Coverage without a model run.

A decoding-free check of the n-gram part (``Select.parse("ngram")``; docs/evaluate.md, "Tenth session"). For
each needle prompt of ``ridgefill eval needle`` (the same cases: :func:`ridgefill.evaluate.needles.make_case`
with the same seeds and depths, tail 64) it scores the filled rows from the token ids alone and chooses
rows as :func:`ridgefill.select.choose_rows` does; a case counts as covered when every digit of the asked
needle's value is among the chosen rows. The model is loaded for its tokenizer; nothing runs through it.

Three tables:

- ``--weights``: how a shared sequence is weighed, with the library's windows and budget: ``prompt``
  (one over its count in the whole prompt, the question's copies included: the ninth session's rule),
  ``filled`` (one over the number of rows outside the question that end it: the library's
  :func:`ridgefill.select.ngram_scores`) and ``tfidf`` (``filled`` times how often the question
  repeats it), each with sequence lengths 2-3, 2-4, 3-5 and 2-5, at budgets of 26 rows, 2.5 % and 5 %, without
  the threshold (``min_score=0``, as in the tenth session).
- ``--questions``: the library's part (``--select``, default the default selection's lexical part) with
  the question replaced: ``template`` (the test's own question, which quotes the key twice),
  ``key-once`` ("Which number was given for {key}? Answer:"), ``no-key`` ("What is the special magic
  number mentioned in the provided text? Answer:", single needles only) and ``key-spaced`` (the key with
  a space for its hyphen, "Which number goes with the words silver barrel?", which tokenises apart).

- ``--scores``: the library's scores (:func:`ridgefill.select.ngram_scores`, the tail's last 64 rows as the
  question): per needle cell, how many cases' asked needle has a row scoring 4, 3 or more, and how many
  cases have a row outside the asked needle scoring 3 or more; per document of ``eval loss`` (the depth
  table's 3 plain and 3 novel-text documents, tail 256), the filled rows scoring 3 or more and the
  best score: what the preset's ``min_score = 3`` keeps (docs/evaluate.md, "Eleventh session").

Usage::

    python scripts/ngram_coverage.py --weights --questions --scores --json coverage-ngram.json
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import torch

from ridgefill.assets import EVALUATION_BOOKS, load_model, load_texts
from ridgefill.evaluate.needles import case_depth, case_rng, haystack_sentences, make_case
from ridgefill.fileio import write_json
from ridgefill.select import Select, choose_rows, ngram_scores

LENGTHS = (1024, 2048, 4096, 8000)
QUESTIONS = {"template": None,
             "key-once": "\n\nWhich number was given for {key}? Answer:",
             "no-key": "\n\nWhat is the special magic number mentioned in the provided text? Answer:",
             "key-spaced": "\n\nWhich number goes with the words {spaced}? Answer:"}


def weighed_scores(ids: list[int], queries: list[int], sizes, weight: str) -> torch.Tensor:
    """Row scores with the weighing ``weight`` (``prompt``, ``filled`` or ``tfidf``; module docstring)."""
    n, ends = len(ids), set(queries)
    out = [0.0] * n
    for k in sizes:
        grams = [tuple(ids[i - k + 1:i + 1]) for i in range(k - 1, n)]  # grams[j] ends at row j + k - 1
        in_prompt = Counter(grams)
        outside = Counter(g for j, g in enumerate(grams) if j + k - 1 not in ends)
        asked = Counter(grams[e - k + 1] for e in ends if e >= k - 1)
        for j, g in enumerate(grams):
            if g in asked and j + k - 1 not in ends:
                out[j + k - 1] += {"prompt": 1 / in_prompt[g], "filled": 1 / outside[g],
                                   "tfidf": asked[g] / outside[g]}[weight]
    return torch.tensor(out)


def cases(tok, sentences, trials: int):
    """``(variant, length, case, value rows)`` for every ``eval needle`` case."""
    for variant in ("single", "multikey"):
        for n in LENGTHS:
            for t in range(trials):
                c = make_case(tok, sentences, length=n, tail=64, variant=variant, rng=case_rng(0, variant, n, t),
                              depth=case_depth(variant, t, trials))
                start, end = c.spans[c.asked]
                ids = c.input_ids.tolist()
                yield variant, n, c, {r for r in range(start, end) if tok.decode(ids[r]).strip().isdigit()}


def covered(ids: list[int], tail: int, value: set[int], sel: Select, scores) -> bool:
    n = len(ids)
    filled = torch.ones(n, dtype=torch.bool)
    filled[n - tail:] = False
    return value <= set(choose_rows(scores, filled, sel, sel.budget_rows(n)).tolist())


def score_table(tok, all_cases) -> dict:
    """The ``--scores`` table (module docstring), printed and returned."""
    from ridgefill.evaluate.loss import novel_documents
    from ridgefill.run import evaluation_plan

    out = {"needles": {}, "documents": []}
    for variant, n, c, _ in all_cases:
        ids = c.input_ids.view(1, -1)
        s = ngram_scores(ids, torch.arange(ids.shape[1] - 64, ids.shape[1]))
        start, end = c.spans[c.asked]
        asked, other = float(s[start:end].max()), float(torch.cat([s[:start], s[end:]]).max())
        cell = out["needles"].setdefault(f"{variant} {n}", Counter())
        cell["cases"] += 1
        cell["asked scores 4"] += asked >= 4
        cell["asked scores >= 3"] += asked >= 3
        cell["another row scores >= 3"] += other >= 3
    texts = {k: load_texts()[k] for k in EVALUATION_BOOKS}
    plain, _ = evaluation_plan(tok, texts, 3, 2048)
    novel, _ = novel_documents(tok, texts, 3, 2048, seed=0)
    for name, doc in [("plain", d) for d in plain] + [("novel", d) for d in novel]:
        doc = doc[:-1]  # eval loss prefills all but the last target token
        n = doc.numel()
        s = ngram_scores(doc.view(1, -1), torch.arange(n - 64, n))[: n - 256]  # the filled rows (tail 256)
        out["documents"].append({"set": name, "rows scoring >= 3": int((s >= 3).sum()), "best": round(float(s.max()), 3)})
    for k, v in out["needles"].items():
        print(k, dict(v), flush=True)
    for d in out["documents"]:
        print(d, flush=True)
    out["needles"] = {k: dict(v) for k, v in out["needles"].items()}
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", action="store_true", help="the weighing table")
    p.add_argument("--questions", action="store_true", help="the paraphrased-question table")
    p.add_argument("--select", default="ngram,budget=0.02", help="the lexical part for --questions")
    p.add_argument("--scores", action="store_true", help="the score table")
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--json", help="write the counts here")
    a = p.parse_args(argv)
    _, tok, _ = load_model()
    sentences = haystack_sentences({k: load_texts()[k] for k in EVALUATION_BOOKS})
    all_cases = list(cases(tok, sentences, a.trials))
    out = {"trials": a.trials, "lengths": list(LENGTHS)}
    if a.weights:
        out["weights"] = {}
        for sizes in ((2, 3), (2, 3, 4), (3, 4, 5), (2, 3, 4, 5)):
            for weight in ("prompt", "filled", "tfidf"):
                for budget in ("26", "0.025", "0.05"):
                    sel = Select.parse(f"ngram,min_score=0,budget={budget}")  # the weighings before the threshold
                    count = Counter()
                    for variant, n, c, value in all_cases:
                        ids = c.input_ids.tolist()
                        queries = list(range(len(ids) - c.tail, len(ids)))[-sel.queries:]
                        count[f"{variant} {n}"] += covered(ids, c.tail, value, sel, weighed_scores(ids, queries, sizes, weight))
                    key = f"sizes {'-'.join(map(str, sizes))}, {weight}, budget {budget}"
                    out["weights"][key] = dict(count)
                    print(key, dict(count), flush=True)
    if a.questions:
        sel = Select.parse(a.select)
        out["questions"] = {"select": str(sel)}
        for name, question in QUESTIONS.items():
            count = Counter()
            for variant, n, c, value in all_cases:
                if name == "no-key" and variant == "multikey":
                    continue  # without the key the question does not say which needle
                ids, tail = c.input_ids.tolist(), c.tail
                if question is not None:
                    key = c.keys[c.asked]
                    q = tok.encode(question.format(key=key, spaced=key.replace("-", " ")), add_special_tokens=False)
                    ids, tail = ids[: len(ids) - c.tail] + q, len(q)
                scores = ngram_scores(torch.tensor([ids]), torch.arange(len(ids) - tail, len(ids))[-sel.queries:])
                count[f"{variant} {n}"] += covered(ids, tail, value, sel, scores)
            out["questions"][name] = dict(count)
            print(name, dict(count), flush=True)
    if a.scores:
        out["scores"] = score_table(tok, all_cases)
    if a.json:
        write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
