#!/usr/bin/env python3
"""ΔNLL of an ``eval loss`` result over a subset of its documents, e.g. the documents a rule was not chosen on.

``ridgefill eval loss --docs 8 --novel-docs 8`` cuts the bundled evaluation books into 16 documents; six of
them are the depth table's (``--docs 3 --novel-docs 3``), on which the default selection was chosen. This
script reruns ``eval loss``'s own summary (:func:`ridgefill.evaluate.loss.summarise`: the key-token rule
``local − exact ≥ τ``, the document bootstrap, the run's seed) on the per-token NLLs the result file keeps,
over a subset of its documents; over all documents it gives the file's own ``summary``. docs/evaluate.md,
"Twelfth session".

Usage::

    python scripts/loss_subset.py loss.json --held-out-from 3,3   # the documents sharing no 32-token
                                                                  # window with --docs 3 --novel-docs 3
    python scripts/loss_subset.py loss.json --docs 0,1,6          # indices into the file's documents

``--held-out-from P,N`` rebuilds both runs' documents from the bundled books with the bundled tokenizer
(the file must come from a run on them, without ``--text``). Raises ``SystemExit`` with a message on a bad
file, index or option.
"""

import argparse
import sys
from types import SimpleNamespace

WINDOW = 32  # tokens: documents sharing a window this long are not held out


def load(path: str) -> dict:
    """An ``eval loss`` result with its per-document NLLs, read by :func:`ridgefill.evaluate.report.load_reports`."""
    from ridgefill.errors import InputError
    from ridgefill.evaluate.report import load_reports

    try:
        data = load_reports([path])[0]
    except InputError as e:
        raise SystemExit(str(e))
    if data["kind"] != "loss" or not data.get("documents"):
        raise SystemExit(f"{path!r} is not a `ridgefill eval loss` result with per-document NLLs "
                         "(`eval depth` results are not read)")
    return data


def subset_stats(data: dict, indices) -> list[dict]:
    """``eval loss``'s own summary (:func:`ridgefill.evaluate.loss.summarise`, with the run's ``τ``,
    resamples and seed) over the documents ``indices`` of ``data``, taken in the file's order: rows
    ``{"set", "tokens", "variant", "delta_nll", ...}`` as in the file's ``summary``."""
    from ridgefill.evaluate.loss import DocScores, summarise

    records = [DocScores(**data["documents"][i]) for i in sorted(set(indices))]
    return summarise(records, tau=data["tau"], resamples=data.get("resamples", 10000), seed=data.get("seed", 0))


def held_out(data: dict, plain: int, novel: int) -> list[int]:
    """Indices of ``data``'s documents that share no :data:`WINDOW`-token window with the documents of
    ``--docs plain --novel-docs novel`` (same books, tokenizer, length and seed)."""
    from ridgefill.assets import load_model
    from ridgefill.evaluate.cli import _documents

    argv = data.get("argv", [])
    if any(a == "--text" or a.startswith("--text=") for a in argv) or "text" in data["document_sets"]:
        raise SystemExit("--held-out-from rebuilds documents from the bundled books; this run used --text")
    _, tok, name = load_model()
    if data.get("model") != name:
        raise SystemExit(f"--held-out-from rebuilds documents with the default model's tokenizer ({name}); "
                         f"this run is of {data.get('model')!r}: choose its documents with --docs")
    sets = data["document_sets"]

    def docs(p, n):
        a = SimpleNamespace(tail=data["tail"], doc_tokens=data["doc_tokens"], refit=0, docs=p, novel_docs=n,
                            seed=data["seed"], text=None)
        return _documents(a, tok)[0]

    mine = docs(sets["plain"]["documents"], sets["novel"]["documents"])
    if len(mine) != len(data["documents"]) or any(len(m) - 1 != data["doc_tokens"] for m in mine):
        raise SystemExit("the rebuilt documents do not match the file's; was it made from the bundled books?")
    theirs = set()
    for d in docs(plain, novel):
        theirs.update(tuple(d[k:k + WINDOW].tolist()) for k in range(len(d) - WINDOW + 1))
    return [i for i, d in enumerate(mine)
            if not any(tuple(d[k:k + WINDOW].tolist()) in theirs for k in range(len(d) - WINDOW + 1))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="an `eval loss` result (.json or .json.xz)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--docs", help="comma-separated indices into the file's documents (default: all)")
    group.add_argument("--held-out-from", metavar="P,N",
                       help="the documents sharing no 32-token window with those of --docs P --novel-docs N")
    a = ap.parse_args(argv)
    from ridgefill.evaluate.report import fmt_delta

    data = load(a.file)
    n = len(data["documents"])
    try:
        pair = [int(x) for x in a.held_out_from.split(",")] if a.held_out_from is not None else None
        chosen = [int(x) for x in a.docs.split(",")] if a.docs is not None else None
    except ValueError:
        raise SystemExit("--docs takes comma-separated integers, --held-out-from two (e.g. 3,3)")
    if pair is not None and len(pair) != 2:
        raise SystemExit(f"--held-out-from takes two integers, plain and novel-text documents (e.g. 3,3); got {a.held_out_from!r}")
    if chosen is not None and len(set(chosen)) != len(chosen):
        raise SystemExit(f"--docs names a document twice: {chosen}")
    indices = held_out(data, *pair) if pair is not None else chosen if chosen is not None else list(range(n))
    if not indices or any(not 0 <= i < n for i in indices):
        raise SystemExit(f"no documents chosen, or an index outside 0..{n - 1}: {indices}")
    indices = sorted(indices)
    print(f"{a.file}: documents {indices} of {n} (0-based indices into the file's documents)")
    for r in subset_stats(data, indices):
        e = r["delta_nll"]
        print(f"  {r['variant']:16s} {r['set']:6s} {r['tokens']:3s} tokens ({e['tokens']:5d}, {e['docs']:2d} docs)  "
              f"ΔNLL {fmt_delta(e)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
