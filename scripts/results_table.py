"""The README's results table, from the reports of `ridgefill run` (one per model).

Regenerate it (about 15 minutes for SmolLM2 and 40 for Gemma 3 270M on 2 idle CPU cores):

    ridgefill run --threads 2 --out ridgefill-out/smollm2
    ridgefill run --threads 2 --model gemma3-270m --out ridgefill-out/gemma3
    python scripts/results_table.py ridgefill-out/smollm2/report.json ridgefill-out/gemma3/report.json \
        --update README.md

Each row is one model at the defaults: the fill with row selection (the default) and the plain fill,
beside exact prefill. The table names the date and commit each report came from; `--update` replaces the
block between the README's `<!-- results:begin -->` and `<!-- results:end -->` markers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def table(reports: list[dict]) -> str:
    """The markdown table of ``reports`` (``report.json`` of ``ridgefill run``)."""
    lines = ["| model | S / layers | prompt | system | ΔNLL | greedy agree | needles | extra rows | prefill time, exact / system |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        where = f"{r['model']} | {r['split']} / {r['num_layers']} | {r['documents']} × {r['doc_tokens']} tokens"
        for name in ("exact", "ridge+sel", "ridge"):
            m = r["modes"].get(name)
            if m is None:
                continue
            label = {"exact": "exact prefill", "ridge+sel": "fill, selection on (default)", "ridge": "fill, selection off"}[name]
            needle = "" if m.get("needle_score") is None else f"{m['needle_score'] * r['needle_trials'] / 100:.0f} of {r['needle_trials']}"
            ratio = "" if m["ratio_exact_over_mode"] is None else f"{m['ratio_exact_over_mode']:.2f}x"
            lines.append(f"| {where} | {label} | {m['delta_nll']:+.3f} | {m['agreement']:.2f} | {needle} | "
                         f"{100 * m['extra_exact_rows_share']:.1f} % | {ratio} |")
            where = " | | "
    def load(r: dict) -> str:
        la = r.get("load_average")
        return f", load average {max(la):.1f}" if la else ""

    sources = "; ".join(f"{r['model']}: {r.get('date', '?')[:10]}, commit {r.get('commit') or '?'}, "
                        f"{r['threads']} threads{load(r)}" for r in reports)
    return "\n".join(lines) + f"\n\nFrom `ridgefill run` ({sources}); `python scripts/results_table.py` regenerates it."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="report.json files written by `ridgefill run`")
    ap.add_argument("--update", metavar="README", help="replace the results block of this markdown file")
    args = ap.parse_args()
    reports = []
    for path in args.reports:
        try:
            reports.append(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            print(f"error: cannot read the report {path}: {e}", file=sys.stderr)
            return 2
    text = table(reports)
    if not args.update:
        print(text)
        return 0
    readme = Path(args.update)
    body = readme.read_text()
    if BEGIN not in body or END not in body:
        print(f"error: {readme} has no {BEGIN} ... {END} block to replace", file=sys.stderr)
        return 2
    head, rest = body.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    tmp = readme.with_name(readme.name + ".tmp")
    tmp.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    tmp.replace(readme)
    print(f"updated {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
