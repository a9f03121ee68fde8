#!/usr/bin/env python3
"""Which needle rows must be exact for the ridge fill to answer as the exact prefill does?

An oracle check of row selection (docs/evaluate.md, "Fifth session"): for each needle prompt of
``ridgefill eval needle`` (the same cases: :func:`ridgefill.evaluate.needles.make_case` with the same
seeds and depths) it answers with the exact prefill, the ridge fill with row 0 exact (``ridge``, the
baseline of the sets below), and the ridge fill with given needle rows passed as ``exact_rows`` (plus
row 0), and scores each answer as ``eval needle`` does:

- ``asked_value``: the asked needle's last 10 rows (``": "``, the 7 digits, ``"."``);
- ``asked_key``: the asked needle's key rows (``" for"``, the key, ``" is"``), not its value;
- ``asked_whole``: every row of the asked needle;
- ``all_values``: the last 10 rows of every needle (asked and distractors);
- ``all_whole``: every row of every needle;
- ``asked_whole+values``: the asked needle whole and every needle's value.

No row chooser is involved: it tells what a chooser must find (on SmolLM2 at S = 15, multikey: the
asked value alone answers every case, even those exact misses; with every needle's value exact the fill
answers about as exact does).

Usage::

    python scripts/needle_oracle.py --maps ridgefill-out/maps-S15.safetensors --variant multikey \
        --lengths 1024,2048 --trials 16 --json oracle.json

The model is the default SmolLM2 unless ``--model`` names another (``ridgefill.assets.load_model``); the
needle layout must hold for its tokenizer: every needle's last 10 rows decode to ``": <value>."`` and
its rows from the 7th to the 11th-last to ``"for <key> is"`` (checked for every needle of every case).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def needle_rows(spans: list[tuple[int, int]], asked: int) -> dict[str, list[int]]:
    """The row sets of the module docstring, from the needles' ``[(start, end)]`` token spans."""
    value = [list(range(e - 10, e)) for _, e in spans]
    whole = [list(range(s, e)) for s, e in spans]
    key = list(range(spans[asked][0] + 6, spans[asked][1] - 10))
    return {"asked_value": value[asked], "asked_key": key, "asked_whole": whole[asked],
            "all_values": sum(value, []), "all_whole": sum(whole, []),
            "asked_whole+values": sorted(set(whole[asked]).union(*value))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--maps", required=True, help="maps file (ridgefill calibrate / ridgefill run --out)")
    ap.add_argument("--model", default=None, help="model spec for ridgefill.assets.load_model (default SmolLM2)")
    ap.add_argument("--variant", default="multikey", choices=("single", "multikey"))
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--tail", type=int, default=64)
    ap.add_argument("--sets", default=None, help="comma-separated row sets to try (default all of the above)")
    ap.add_argument("--only", default=None, help="comma-separated 0-based trial indices to run, each below "
                    "--trials (default all; the cases and depths are those of the full --trials run; the progress "
                    "lines count from 1)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the per-case scores here")
    a = ap.parse_args(argv)

    from ridgefill.assets import load_model
    from ridgefill.errors import InputError
    from ridgefill.evaluate.cli import _eval_texts
    from ridgefill.evaluate.needles import case_depth, case_rng, haystack_sentences, make_case, score_answer
    from ridgefill.fileio import write_json
    from ridgefill.fill import generate_after, prefill
    from ridgefill.maps import load_maps

    known = tuple(needle_rows([(0, 22)], 0))  # the names of the row sets
    wanted = known if a.sets is None else tuple(x.strip() for x in a.sets.split(","))
    if set(wanted) - set(known):
        raise InputError(f"--sets: unknown row sets {sorted(set(wanted) - set(known))}; choose among {list(known)}")
    try:
        trials = range(a.trials) if a.only is None else [int(x) for x in a.only.split(",")]
    except ValueError:
        raise InputError(f"--only {a.only!r}: expected comma-separated trial indices, e.g. 0,3,5") from None
    if not trials or any(not 0 <= t < a.trials for t in trials):
        raise InputError(f"--only {a.only!r}: indices must be in 0..{a.trials - 1} (0-based, below --trials)")
    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok, name = load_model(a.model)
    maps = load_maps(a.maps)
    sentences = haystack_sentences(_eval_texts(argparse.Namespace(text=None)))
    cases = []
    for n in (int(x) for x in a.lengths.split(",")):
        for t in trials:
            t0 = time.perf_counter()
            case = make_case(tok, sentences, length=n, tail=a.tail, variant=a.variant,
                             rng=case_rng(0, a.variant, n, t), depth=case_depth(a.variant, t, a.trials))
            ids = case.input_ids[None]
            sets = needle_rows(case.spans, case.asked)
            for j in range(len(case.spans)):  # the layout the row sets assume, for every needle
                rows = needle_rows(case.spans, j)
                value, key = (tok.decode(ids[0, rows[k]]).strip() for k in ("asked_value", "asked_key"))
                if value != f": {case.values[j]}." or key != f"for {case.keys[j]} is":
                    raise InputError(f"needle {j}: the value rows decode to {value!r} and the key rows to {key!r}, "
                                     f"not ': {case.values[j]}.' and 'for {case.keys[j]} is': this tokenizer splits "
                                     "the needle differently from what the script assumes")
            row = {"length": n, "trial": t, "asked": case.asked, "answer": case.answer, "scores": {}}
            chosen = {k: v for k, v in sets.items() if k in wanted}
            for sname, rows in {"exact": None, "ridge": [], **chosen}.items():
                res = (prefill(model, ids, tail=a.tail, mode="exact") if rows is None else
                       prefill(model, ids, maps, tail=a.tail, mode="ridge", exact_rows=[0] + rows))
                answer = tok.decode(generate_after(model, ids, res, 12)[0], skip_special_tokens=True)
                row["scores"][sname] = score_answer(answer, case.answer)
            cases.append(row)
            print(f"{a.variant} {n} trial {t + 1}/{a.trials}: " + " ".join(
                f"{k}={int(v)}" for k, v in row["scores"].items()) + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    names = list(cases[0]["scores"])
    print(f"\n{a.variant}: cases answered per length, out of the cases run; in brackets: of those exact answers")
    for n in sorted({c["length"] for c in cases}):
        rows = [c for c in cases if c["length"] == n]
        print(f"  {n} ({len(rows)} cases): " + " ".join(f"{k} {sum(c['scores'][k] > 0 for c in rows)}"
                                    f" ({sum(c['scores'][k] > 0 and c['scores']['exact'] > 0 for c in rows)})" for k in names))
    if a.json:
        write_json(a.json, {"model": name, "maps": str(a.maps), "variant": a.variant,
                            "argv": sys.argv[1:] if argv is None else argv, "cases": cases})
    return 0


if __name__ == "__main__":
    from ridgefill.errors import InputError

    try:
        sys.exit(main())
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
