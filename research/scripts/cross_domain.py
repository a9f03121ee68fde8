#!/usr/bin/env python3
"""The cross-domain matrix (docs/evaluate.md, "Cross-domain maps"): maps calibrated on one corpus,
evaluated on held-out documents of every corpus.

For each evaluation domain ``D`` (``<corpora>/<D>-eval.txt``, made by ``scripts/prepare_corpora.py``)
it cuts ``--docs`` documents of ``--doc-tokens`` tokens evenly spaced over the file
(:func:`ridgefill.run.evaluation_documents`, as ``--text`` does), refuses any document that shares a
32-token window with a calibration file (:mod:`ridgefill.overlap`, against every
``<corpora>/*-calib.txt``), and scores the exact tail of each document under exact, identity, none and
the ridge fill with every maps file given (:func:`ridgefill.evaluate.loss.score_documents`; the
exact, local-window, identity and none passes run once per document and are shared by all maps).
ΔNLL vs exact with 95 % bootstrap intervals over documents, on all exact-row tokens and on key
tokens (:func:`ridgefill.evaluate.loss.summarise`), and, with two or more maps files, the paired
difference of every fill minus ``--reference`` on the same documents, on all exact-row tokens and on key
tokens (``paired_vs_reference``, ``paired_key_tokens_vs_reference``).

Usage::

    python scripts/cross_domain.py --corpora DIR --maps novels=FILE docs=FILE ... --out cross.json

The exact, local-window, identity and none scores are cached per domain (``<out stem>.<domain>.base.json``)
and the ridge scores per domain and maps file (``<out stem>.<domain>.ridge@<NAME>.json``); a rerun with
the same settings reuses them, so maps files can be added one by one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

DOMAINS = ("novels", "docs", "code")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", type=Path, required=True, help="folder written by scripts/prepare_corpora.py")
    ap.add_argument("--maps", nargs="*", default=[], help="NAME=FILE maps files (one split)")
    ap.add_argument("--split", type=int, default=15, help="split S of the identity and none fills (default 15)")
    ap.add_argument("--domains", nargs="+", default=list(DOMAINS))
    ap.add_argument("--docs", type=int, default=5, help="documents per domain (default 5)")
    ap.add_argument("--doc-tokens", type=int, default=2048)
    ap.add_argument("--tail", type=int, default=256)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--tau", type=float, default=1.0)
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--select", action="store_true", help="also score the ridge fill with the default "
                    "row selection (ridge+sel@NAME)")
    ap.add_argument("--reference", default="ridge@novels", help="fill the paired differences are taken against "
                    "(all exact-row tokens and key tokens; default ridge@novels, maps fitted on the novels)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    import torch

    from ridgefill.assets import load_model
    from ridgefill.calibrate import special_prefix
    from ridgefill.evaluate.loss import (DocScores, bootstrap_ci, key_token_mask, key_token_stats, score_documents,
                                         summarise, tail_nll)
    from ridgefill.fileio import write_json
    from ridgefill.maps import load_maps, maps_digest
    from ridgefill.overlap import check_disjoint, text_fingerprint
    from ridgefill.run import evaluation_plan
    from ridgefill.select import DEFAULT_SELECT

    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok, name = load_model(None)
    maps = {}
    for spec in a.maps:
        key, _, path = spec.partition("=")
        maps[key] = load_maps(path)
        maps[key].check_model(model)
    split = a.split
    if any(m.split != split for m in maps.values()):
        sys.exit(f"error: every maps file must be fitted at --split {split}")
    # every window of every calibration file (cached beside --out, keyed by the files' SHA-256)
    import hashlib

    import numpy as np

    from ridgefill.overlap import Fingerprint

    fingerprints = {}
    for p in sorted(a.corpora.glob("*-calib.txt")):
        text = p.read_text(encoding="utf-8")
        cache = a.out.with_name(f"{a.out.stem}.{hashlib.sha256(text.encode()).hexdigest()[:16]}.windows.npy")
        if cache.exists():
            fingerprints[p.name] = Fingerprint(32, 1, np.load(cache))
        else:
            fingerprints[p.name] = text_fingerprint(tok, text, sample=1)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            np.save(cache, fingerprints[p.name].hashes)
    report = {"model": name, "split": split, "docs": a.docs, "doc_tokens": a.doc_tokens, "tail": a.tail,
              "window": a.window, "tau": a.tau, "resamples": a.resamples, "maps": a.maps,
              "reference": a.reference,
              "maps_meta": {k: {"calibration_tokens": m.meta.get("calibration_tokens"), "lambdas": m.lambdas,
                                "text_sha256": m.meta.get("text_sha256"),
                                "calibration_texts": m.meta.get("calibration_texts")} for k, m in maps.items()},
              "domains": {}}
    fills = [("ridge", None)] + ([("ridge+sel", DEFAULT_SELECT)] if a.select else [])
    base = {"docs": a.docs, "doc_tokens": a.doc_tokens, "tail": a.tail, "window": a.window}
    say = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)
    for dom in a.domains:
        path = a.corpora / f"{dom}-eval.txt"
        docs, labels = evaluation_plan(tok, {path.name: path.read_text(encoding="utf-8")}, a.docs, a.doc_tokens)
        for k, fp in fingerprints.items():
            check_disjoint(docs, fp, names=labels, calibration=k, prefix_tokens=len(special_prefix(tok)))
        # exact, local window, identity and none: once per document, shared by every maps file
        cache = a.out.with_name(f"{a.out.stem}.{dom}.base.json")
        saved = json.loads(cache.read_text()) if cache.exists() else None
        if saved and saved["settings"] == base:
            recs = [DocScores(**r) for r in saved["records"]]
        else:
            fns = {v: (lambda doc, _e, v=v: tail_nll(model, doc, tail=a.tail, mode=v, split=split)[0])
                   for v in ("identity", "none")}
            recs = score_documents(model, docs, [dom] * len(docs), tail=a.tail, window=a.window, variants=fns,
                                   prefix_tokens=len(special_prefix(tok)), progress=lambda m: say(f"{dom}: {m}"))
            write_json(cache, {"settings": base, "records": [asdict(r) for r in recs]})
        for (k, m), (fill, sel) in itertools.product(maps.items(), fills):  # cached per (domain, fill, maps)
            cache = a.out.with_name(f"{a.out.stem}.{dom}.{fill}@{k}.json")
            key = {**base, "maps_sha256": maps_digest(m.weights, m.biases), **({"select": str(sel)} if sel else {})}
            saved = json.loads(cache.read_text()) if cache.exists() else None
            if not (saved and saved["settings"] == key):
                nll = []
                for i, doc in enumerate(docs):
                    nll.append(tail_nll(model, doc, tail=a.tail, mode="ridge", maps=m, split=split,
                                        select=sel)[0].tolist())
                    say(f"{dom}: {fill}@{k} document {i + 1}/{len(docs)}")
                saved = {"settings": key, "nll": nll}
                write_json(cache, saved)
            for r, v in zip(recs, saved["nll"]):
                r.fill[f"{fill}@{k}"] = v
        paired, paired_key = {}, {}
        if a.reference in {f"ridge@{k}" for k in maps} and len(maps) > 1:  # each fill minus the reference fill
            keys = [key_token_mask(torch.tensor(r.exact), torch.tensor(r.local), a.tau).tolist() for r in recs]
            for v in recs[0].fill:
                if v != a.reference:
                    diff = [sum(x - y for x, y in zip(r.fill[v], r.fill[a.reference])) for r in recs]
                    paired[v] = bootstrap_ci(diff, [len(r.exact) for r in recs], resamples=a.resamples).as_dict()
                    diff = [sum(x - y for x, y, k in zip(r.fill[v], r.fill[a.reference], m) if k)
                            for r, m in zip(recs, keys)]
                    paired_key[v] = bootstrap_ci(diff, [sum(m) for m in keys], resamples=a.resamples).as_dict()
        report["domains"][dom] = {"file": path.name, "documents": labels, "paired_vs_reference": paired,
                                  "paired_key_tokens_vs_reference": paired_key,
                                  "summary": summarise(recs, tau=a.tau, resamples=a.resamples),
                                  "key_tokens": key_token_stats(recs, a.tau)}
    write_json(a.out, report)
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    """The matrix as markdown: for each token class, one row per evaluation domain with ΔNLL [95 % CI]
    of the ridge fill with every maps file, then identity and none; and the exact NLL."""
    out = []
    for cls in ("all", "key"):
        cols = None
        for dom, d in report["domains"].items():
            rows = {r["variant"]: r for r in d["summary"] if r["set"] == dom and r["tokens"] == cls}
            if cols is None:
                cols = [v for v in rows if v.startswith("ridge")] + ["identity", "none"]
                out += [f"**{'All exact-row tokens' if cls == 'all' else 'Key tokens'}** (ΔNLL vs exact, nats/token, "
                        "[95 % CI over documents])", "",
                        "| evaluated on | tokens | exact NLL | " + " | ".join(c.replace("ridge@", "ridge, maps: ")
                                                                          for c in cols) + " |",
                        "| --- | ---: | ---: | " + " | ".join("---:" for _ in cols) + " |"]
            if not rows:
                continue
            first = rows[cols[0]]
            cells = []
            for c in cols:
                e = rows[c]["delta_nll"]
                cells.append(f"{e['mean']:+.3f} [{e['ci'][0]:+.3f}, {e['ci'][1]:+.3f}]")
            out.append(f"| {dom} | {first['delta_nll']['tokens']} | {first['exact_nll']:.3f} | " + " | ".join(cells) + " |")
        out.append("")
    for field, what in (("paired_vs_reference", "all exact-row tokens"), ("paired_key_tokens_vs_reference", "key tokens")):
        paired = {dom: d.get(field) for dom, d in report["domains"].items()}
        if any(paired.values()):
            cols = list(next(p for p in paired.values() if p))
            out += [f"**Paired difference vs {report.get('reference')}** ({what}, nats/token, [95 % CI])", "",
                    "| evaluated on | " + " | ".join(cols) + " |", "| --- | " + " | ".join("---:" for _ in cols) + " |"]
            for dom, p in paired.items():
                out.append(f"| {dom} | " + " | ".join(f"{p[c]['mean']:+.3f} [{p[c]['ci'][0]:+.3f}, {p[c]['ci'][1]:+.3f}]"
                                                      for c in cols) + " |")
            out.append("")
    return "\n".join(out).rstrip("\n")


if __name__ == "__main__":
    sys.exit(main())
