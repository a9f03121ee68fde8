"""Research script (docs/evaluate.md, "Ninth session"): exact rows chosen by n-gram match with the exact tail.

Runs the ``ridgefill`` CLI with every prefill that has a selection (``--select ...``) replaced by a lexical
rule, in one pass: a filled row that ends a sequence of ``n`` tokens (``n`` in ``--ngram-n``) that also ends
at a tail row (it may start before the tail) scores the sum, over those sequences, of ``1 / (their count in
the prompt)``; row 0 and windows of ``--ngram-before`` rows before and ``--ngram-after`` after the best rows
are made exact, up to the selection's budget. Only rows with a match anchor a window; with no match the
budget is left unspent. Not shipped as a ``select`` option: it keeps multikey needles but loses single
needles at 1K-4K (the section's tables).

    python scripts/select_ngram.py --ngram-before 4 --ngram-after 16 eval needle --out DIR --lengths 1k \\
        --trials 16 --variants multikey --modes '' --select attention --json F
"""
from __future__ import annotations

import argparse
import functools
import sys
from collections import Counter

import torch

import ridgefill.fill as fill


def ngram_rows(ids: list[int], tail: int, budget: int, *, before: int, after: int, ns=(2, 3),
               exact_rows=()) -> torch.Tensor:
    """Sorted int64 rows (at most ``budget``) chosen by n-gram match of the filled rows with the last ``tail``.

    ``ids``: the prompt's token ids; ``exact_rows``: further exact rows (never chosen). Row 0 comes first
    when it is filled; then, best score first, each anchor's window ``[r - before, r + after]`` cut to the
    filled rows not yet chosen and to the budget."""
    n = len(ids)
    start = n - tail
    score = [0.0] * n
    for k in ns:
        grams = [tuple(ids[i - k + 1:i + 1]) for i in range(k - 1, n)]  # grams[j] ends at row j + k - 1
        count = Counter(grams)
        in_tail = set(grams[max(0, start - (k - 1)):])
        for i in range(k - 1, start):
            g = grams[i - (k - 1)]
            if g in in_tail:
                score[i] += 1.0 / count[g]
    filled = torch.ones(n, dtype=torch.bool)
    filled[start:] = False
    filled[list(exact_rows)] = False
    chosen = torch.zeros(n, dtype=torch.bool)
    used = 0
    if budget > 0 and filled[0]:
        chosen[0], used = True, 1
    for r in sorted((i for i in range(1, start) if score[i] > 0), key=lambda i: -score[i]):
        if used >= budget:
            break
        if chosen[r]:
            continue
        w = torch.arange(max(1, r - before), min(start, r + after + 1))
        w = w[filled[w] & ~chosen[w]][: budget - used]
        chosen[w] = True
        used += w.numel()
    return chosen.nonzero().flatten()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ngram-before", type=int, default=4)
    p.add_argument("--ngram-after", type=int, default=16)
    p.add_argument("--ngram-n", default="2,3", help="sequence lengths, comma-separated")
    a, rest = p.parse_known_args(argv)
    ns = tuple(int(x) for x in a.ngram_n.split(","))
    orig = fill.prefill

    @functools.wraps(orig)
    def prefill(model, input_ids, maps=None, **kw):
        sel = kw.get("select")
        if sel is None:
            return orig(model, input_ids, maps, **kw)
        given = list(kw.get("exact_rows", ()))
        rows = ngram_rows(input_ids[0].tolist(), kw["tail"], sel.budget_rows(input_ids.shape[1]),
                          before=a.ngram_before, after=a.ngram_after, ns=ns, exact_rows=given)
        res = orig(model, input_ids, maps, **dict(kw, select=None, exact_rows=sorted(set(given) | set(rows.tolist()))))
        res.selected = rows
        return res

    import ridgefill.evaluate.loss as loss
    import ridgefill.evaluate.needles as needles
    for m in (fill, needles, loss):
        m.prefill = prefill
    from ridgefill.cli import main as cli_main
    return cli_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
