#!/usr/bin/env python3
"""Which scoring rule finds the needle: rows a selection needs before the asked needle's value is exact.

A decoding-free check of row selection (docs/evaluate.md, "Fourth session"). For each needle prompt of
``ridgefill eval needle`` (the same cases: :func:`ridgefill.evaluate.needles.make_case` with the same
seeds and depths) it runs the plain ridge fill once, records the late-layer attention of the last 64
exact rows in the 16 heads with the highest induction score (:func:`ridgefill.select.induction_scores`),
and for each scoring rule below ranks the filled rows as :func:`ridgefill.select.choose_rows` does
(windows, local contrast, row 0 first). A rule's cost for a case is the number of rows it makes exact
before every digit of the asked needle's value is among them; the case counts as covered when that is
within the budget (5 % of the prompt). On SmolLM2 at S = 15 "covered" predicts the answer of ``eval
needle`` with selection (the previous default, the last row alone, 8 trials per length: 7/8, 8/8, 8/8,
8/8 covered against 7/8, 8/8, 8/8, 7/8 answered, where exact itself missed the one 8K case).

Rules (``queries``: which exact rows score; ``pool``: how their attention is combined per head; then
max over the kept heads and layers, as ``Select(heads="induction")``):

- ``last``: the last row (the default ``Select()``'s scoring, ``reference=0``);
- ``question``: the question's rows, summed or max-pooled;
- ``tail``: all 64 tail rows, summed or max-pooled;

each with 8 or 16 heads, local contrast 0, 64 or 128, windows (2, 16) or (0, 12); the product of the
``last`` and ``question`` scores (to tell the asked needle from the others); the last row against the
63 rows before it (``Select(reference=63, floor=...)``); two-part selections (a ``last`` part and a
``tail`` part with windows (0, 3), no contrast) splitting the budget; and the query-agnostic leverage of
``h_S`` (``Select(by="leverage")``, no contrast, ``prompt wB,A``) with several windows, alone and as a
first part before a ``last ref63`` part (fifth session).

Usage::

    python scripts/needle_coverage.py --maps ridgefill-out/maps-S15.safetensors --variant single \
        --lengths 1024,2048,4096,8000 --trials 8 --json coverage.json

The model is the default SmolLM2 unless ``--model`` names another (``ridgefill.assets.load_model``).
It patches ``ridgefill.fill.AttentionScores`` for the recording (a research script, not library code).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch


def _windows(scores, candidates, before: int, after: int):
    """``(anchor, new rows)`` of each window ``choose_rows`` opens, in its order: candidates by falling
    score, each widened to its not-yet-chosen candidate neighbours (``scores`` already contrasted)."""
    n = scores.numel()
    chosen = torch.zeros(n, dtype=torch.bool)
    for r in torch.argsort(torch.where(candidates, scores.float(), float("-inf")), descending=True).tolist():
        if not candidates[r]:
            break
        if chosen[r]:
            continue
        rows = [w for w in range(max(0, r - before), min(n, r + after + 1)) if candidates[w] and not chosen[w]]
        chosen[rows] = True
        yield r, rows


def rows_needed(scores, candidates, before: int, after: int, contrast: int, sink: int = 1) -> list[int]:
    """The rows ``choose_rows`` would make exact, in the order it takes them (row 0 first)."""
    from ridgefill.select import local_contrast

    out = [r for r in range(min(sink, scores.numel())) if candidates[r]]
    candidates = candidates.clone()
    candidates[:sink] = False
    if contrast:
        scores = local_contrast(scores, candidates, contrast)
    return out + [w for _, rows in _windows(scores, candidates, before, after) for w in rows]


def rows_to_cover(order: list[int], need: set[int], num_rows: int) -> int:
    """How many rows of ``order`` are taken before every row of ``need`` is (``num_rows + 1`` if some never is)."""
    pos = {r: i for i, r in enumerate(order)}
    return max(pos.get(r, num_rows) for r in need) + 1


def two_parts_cover(candidates, need: set[int], first: tuple, second: tuple) -> bool:
    """Whether two parts, each ``(scores, before, after, contrast, rows)``, the second choosing among the rows
    the first left (no sink row of its own), make every row of ``need`` exact (``Selection`` of two parts)."""
    scores, before, after, contrast, rows = first
    chosen = rows_needed(scores, candidates, before, after, contrast)[:rows]
    rest = candidates.clone()
    rest[chosen] = False
    scores, before, after, contrast, rows = second
    chosen += rows_needed(scores, rest, before, after, contrast, sink=0)[:rows]
    return need <= set(chosen)


def _spread(scores, radius: int):
    """Max over the rows within ``radius`` of each row."""
    return torch.nn.functional.max_pool1d(scores[None, None], 2 * radius + 1, 1, radius)[0, 0]


def _window_scores(scores, candidates, before: int, after: int, count: int = 64, sink: int = 1):
    """``[(score, rows)]`` of the first ``count`` windows ``choose_rows`` opens (already-contrasted scores)."""
    candidates = candidates.clone()
    candidates[:sink] = False
    windows = itertools.islice(_windows(scores, candidates, before, after), count)
    return [(float(scores[r]), set(rows)) for r, rows in windows]


def reference_scores(att, reference: int, floor: float, heads: int = 8):
    """The last row's attention over the mean of the ``reference`` rows before it plus ``floor / N``,
    per head, then the max over heads (``Select(reference=..., floor=...)``)."""
    a = att[:heads].float()
    ref = a[:, -1 - reference:-1].mean(1) + floor / a.shape[-1]
    return (a[:, -1] / ref).amax(0)


def rule_scores(att, queries: int, pool: str, heads: int):
    """``att`` ``[pairs, 64, N]`` (pairs by falling induction score): score per row."""
    a = att[:heads, -queries:].float()
    a = a.sum(1) if pool == "sum" else a.amax(1)
    return a.amax(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--maps", required=True, help="maps file (ridgefill calibrate / ridgefill run --out)")
    ap.add_argument("--model", default=None, help="model spec for ridgefill.assets.load_model (default SmolLM2)")
    ap.add_argument("--variant", default="single", choices=("single", "multikey"))
    ap.add_argument("--lengths", default="1024,2048,4096,8000")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--tail", type=int, default=64)
    ap.add_argument("--budget", type=float, default=0.05, help="budget as a fraction of the prompt (default 0.05)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the per-case rows needed here")
    a = ap.parse_args(argv)

    import ridgefill.fill as F
    from ridgefill.assets import load_model
    from ridgefill.errors import InputError
    from ridgefill.evaluate.cli import _eval_texts
    from ridgefill.evaluate.needles import case_depth, case_rng, haystack_sentences, make_case
    from ridgefill.fileio import write_json
    from ridgefill.maps import load_maps
    from ridgefill.select import (AttentionScores, Select, attention_probs, induction_scores, leverage_scores,
                                  local_contrast)

    if a.threads:
        torch.set_num_threads(a.threads)
    if a.tail != 64:
        raise InputError("--tail must be 64: the recording keeps the last 64 exact rows")
    model, tok, name = load_model(a.model)
    maps = load_maps(a.maps)
    sentences = haystack_sentences(_eval_texts(argparse.Namespace(text=None)))
    recorded: dict = {}

    class Recorder(AttentionScores):  # keeps each kept head's attention of the last 64 rows
        def __init__(self, adapter, num_rows, select):
            super().__init__(adapter, num_rows, select)
            ind = induction_scores(adapter)
            late = ind.clone()
            late[: maps.split + 1] = float("-inf")  # heads of the late layers only (those that score)
            top = torch.argsort(late.flatten(), descending=True)[:16]
            self.pairs = [(int(i) // ind.shape[1], int(i) % ind.shape[1]) for i in top]
            recorded.clear()

        def add(self, layer, x, rope, positions, keys, visible):
            p = attention_probs(self.adapter, layer, x, rope, positions, keys, visible)[0]  # [H, q, N]
            for h in (h for (l, h) in self.pairs if l == layer):
                recorded[(layer, h)] = p[h].cpu()
            recorded["pairs"] = self.pairs

    F.AttentionScores = Recorder
    rules = {}
    for q in ("last", "question", "tail"):
        for pool in ("sum",) if q == "last" else ("sum", "max"):
            for heads in (8, 16):
                for contrast in (0, 64, 128):
                    for window in ((2, 16), (0, 12)):
                        rules[f"{q} {pool} h{heads} c{contrast} w{window[0]},{window[1]}"] = (q, pool, heads, contrast, window)
    # two-part selections: (first part's budget, second part's budget), each as Select.budget_rows counts it
    splits = {"last 2.5 % + tail (0,3) 2.5 %": (0.025, 0.025), "last 1 % + tail (0,3) 4 %": (0.01, 0.04),
              "last 40 rows + tail (0,3) 3 %": (40, 0.03), "last ref63 2.5 % + tail (0,3) 2.5 %": (0.025, 0.025),
              "last ref63 2 % + tail (0,3) 3 %": (0.02, 0.03), "last ref63 1 % + tail (0,3) 4 %": (0.01, 0.04)}
    leverage_windows = ((16, 16), (8, 8), (8, 2), (9, 3), (14, 2))
    leverage_parts = {"prompt 3 % w8,2 + last ref63 2 %": 0.03, "prompt 4 % w8,2 + last ref63 1 %": 0.04}
    cases = []
    for n in (int(x) for x in a.lengths.split(",")):
        for t in range(a.trials):
            t0 = time.perf_counter()
            case = make_case(tok, sentences, length=n, tail=a.tail, variant=a.variant,
                             rng=case_rng(0, a.variant, n, t), depth=case_depth(a.variant, t, a.trials))
            ids = case.input_ids[None]
            start, end = case.spans[case.asked]
            value = list(range(end - 1 - len(case.answer), end - 1))  # the digits, before the final "."
            if tok.decode(ids[0, value]) != case.answer:
                raise InputError(f"the value rows decode to {tok.decode(ids[0, value])!r}, not {case.answer!r}: "
                                 "this tokenizer does not split numbers into digits; the script needs it")
            # one round, budget of one row (row 0): the first pass records, nothing else changes
            F.prefill(model, ids, maps, tail=a.tail, mode="ridge", select=Select(budget=1, queries=64, reference=0))
            att = torch.stack([recorded[p] for p in recorded["pairs"]])  # [16, 64, N]
            N = ids.shape[1]
            candidates = torch.ones(N, dtype=torch.bool)
            candidates[N - a.tail:] = False
            need = set(value)
            row = {"length": n, "trial": t, "tokens": N, "depth": case.depth, "needed": {}}
            for rname, (q, pool, heads, contrast, window) in rules.items():
                qn = {"last": 1, "question": case.question_tokens, "tail": a.tail}[q]
                order = rows_needed(rule_scores(att, qn, pool, heads), candidates, *window, contrast)
                row["needed"][rname] = rows_to_cover(order, need, N)
            # products of the last row's and the question's scores (each by local contrast, then the max
            # over +-8 rows, so that the rows each finds may differ by a few): does the question tell the
            # asked needle from the others?
            ques_rows = case.question_tokens
            rest = candidates.clone()
            rest[0] = False  # row 0 is taken first and left out of the contrast, as in choose_rows
            lastc = local_contrast(rule_scores(att, 1, "sum", 8), rest, 128)
            for pool in ("sum", "max"):
                quesc = local_contrast(rule_scores(att, ques_rows, pool, 16), rest, 128)
                product = _spread(lastc, 8) * _spread(quesc, 8) * (lastc > 0)
                order = rows_needed(product, candidates, 2, 16, 0)
                row["needed"][f"last x question {pool} h16"] = rows_to_cover(order, need, N)
            for floor in (1.0, 0.1):  # the last row against the 63 rows before it (Select(reference=63))
                for contrast in (0, 128):
                    order = rows_needed(reference_scores(att, 63, floor), candidates, 2, 16, contrast)
                    row["needed"][f"last ref63 floor{floor:g} c{contrast} w2,16"] = rows_to_cover(order, need, N)
            last = rule_scores(att, 1, "sum", 8)
            tail = rule_scores(att, a.tail, "sum", 8)
            # the last-row rule's window scores (local contrast) relative to its top window: the first window
            # holding a value digit, and the eighth window (is the needle separated from the rest?)
            windows = _window_scores(lastc, candidates, 2, 16)
            row["needle_window"] = next((i for i, (_, w) in enumerate(windows) if need & w), None)
            if row["needle_window"] is not None:
                row["needle_window_score"] = windows[row["needle_window"]][0] / windows[0][0]
            row["eighth_window_score"] = windows[7][0] / windows[0][0] if len(windows) > 7 else None
            for sname, (first, second) in splits.items():
                b1, b2 = (Select(budget=b).budget_rows(N) for b in (first, second))
                needle_part = reference_scores(att, 63, 1.0) if "ref63" in sname else last
                covered = two_parts_cover(candidates, need, (needle_part, 2, 16, 128, b1), (tail, 0, 3, 0, b2))
                row["needed"][sname] = 0 if covered else N  # covered within the budget or not
            # query-agnostic: the leverage of h_S (the output of layer S) under the calibration covariance
            with torch.inference_mode():
                h = model(ids, output_hidden_states=True).hidden_states[maps.split + 1]
            lev = leverage_scores(h, maps.mean_h, maps.cov_h).cpu()
            for window in leverage_windows:
                row["needed"][f"prompt w{window[0]},{window[1]}"] = rows_to_cover(rows_needed(lev, candidates, *window, 0), need, N)
            for sname, first in leverage_parts.items():
                b1, b2 = (Select(budget=b).budget_rows(N) for b in (first, a.budget - first))
                covered = two_parts_cover(candidates, need, (lev, 8, 2, 0, b1),
                                          (reference_scores(att, 63, 1.0), 2, 16, 128, b2))
                row["needed"][sname] = 0 if covered else N
            cases.append(row)
            print(f"{a.variant} {n} trial {t + 1}/{a.trials}: last-row rule needs "
                  f"{row['needed']['last sum h8 c128 w2,16']} rows ({time.perf_counter() - t0:.0f} s)", flush=True)

    print(f"\n{a.variant}: cases whose asked value is exact within {a.budget:.0%} of the prompt, per length; "
          "median rows needed / prompt")
    lengths = sorted({c["length"] for c in cases})
    refs = [f"last ref63 floor{f:g} c{c} w2,16" for f in (1.0, 0.1) for c in (0, 128)]
    levs = [f"prompt w{w[0]},{w[1]}" for w in leverage_windows]
    for rname in list(rules) + ["last x question sum h16", "last x question max h16"] + refs + list(splits) + levs + list(leverage_parts):
        ok = {L: sum(c["needed"][rname] <= Select(budget=a.budget).budget_rows(c["tokens"]) for c in cases
                     if c["length"] == L) for L in lengths}
        shares = sorted(c["needed"][rname] / c["tokens"] for c in cases)
        med = "" if rname in splits or rname in leverage_parts else f"  median {shares[len(shares) // 2]:.3f}"
        print(f"  {rname:34s} " + " ".join(f"{L}:{ok[L]}/{a.trials}" for L in lengths) + f"  total {sum(ok.values())}{med}")
    found = [c for c in cases if c.get("needle_window") is not None]
    if found:
        ns = sorted(c["needle_window_score"] for c in found)
        es = sorted(c["eighth_window_score"] for c in cases if c["eighth_window_score"] is not None)
        print(f"  last row alone (c128, reference=0): the needle's first window is window {sorted(c['needle_window'] + 1 for c in found)} "
              f"(of the first 64); its score / the top window's: {ns[0]:.2f}-{ns[-1]:.2f}, "
              f"the eighth window's: {es[0]:.2f}-{es[-1]:.2f}")
    if a.json:
        write_json(a.json, {"model": name, "maps": str(a.maps), "variant": a.variant, "budget": a.budget,
                            "argv": sys.argv[1:] if argv is None else argv, "cases": cases})
    return 0


if __name__ == "__main__":
    sys.exit(main())
