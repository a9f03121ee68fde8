"""First-token KL to exact prefill on the tiny random hybrid models (tests/test_hybrid.py): the plain fill
(``select="off"``) against the default selection (one-pass on hybrid models), over prompts whose exact tail
repeats a span of the filled region (the shape of a retrieval question), with two kinds of maps:

- ``oracle``: maps fitted on the prompt itself (least squares of each late layer's input on ``h_S``): what a
  perfect fit would give, so the gap left is the recurrent state's;
- ``fitted``: ridge maps (λ auto) fitted on other random prompts of the same length.

No real hybrid weights can be fetched on the project's machines, so the figures are the tiny models'. Prints
a table and writes JSON (``--out``). Run: ``python scripts/hybrid_selection_kl.py --out
docs/results/hybrid-selection-kl.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import oracle_maps  # noqa: E402
from test_hybrid import FAMILIES, S, VOCAB, build  # noqa: E402

from ridgefill import RidgeMaps, prefill  # noqa: E402
from ridgefill.calibration import collect_stats_many  # noqa: E402
from ridgefill.fileio import write_json  # noqa: E402
from ridgefill.ridge import fit_maps  # noqa: E402

N, TAIL, SPAN = 256, 16, 8


def prompts(count: int, seed: int) -> list[torch.Tensor]:
    """``count`` random prompts of ``N`` ids whose tail repeats ``SPAN`` ids of the filled region."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(3, VOCAB, (1, N), generator=g)
        at = int(torch.randint(16, N - TAIL - SPAN, (1,), generator=g))
        ids[0, N - TAIL + 2:N - TAIL + 2 + SPAN] = ids[0, at:at + SPAN]
        out.append(ids)
    return out


def fitted(model, count: int = 32) -> RidgeMaps:
    stats = collect_stats_many(model, [p[0] for p in prompts(count, seed=100)], [S], heldout_every=8,
                               progress=False)
    fit, held = stats[S]
    res = fit_maps(fit, "auto", held)
    return RidgeMaps(S, res.weights.float(), res.biases.float(), res.lambdas)


def kl(exact: torch.Tensor, fill: torch.Tensor) -> float:
    p = exact.double().log_softmax(-1)
    return float((p.exp() * (p - fill.double().log_softmax(-1))).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows, table = [], []
    for name in FAMILIES:
        model = build(name)
        fit = fitted(model)
        for kind in ("oracle", "fitted"):
            kls = {"off": [], "auto": []}
            chosen = []
            for ids in prompts(args.prompts, seed=1):
                maps = oracle_maps(model, ids, S) if kind == "oracle" else fit
                exact = prefill(model, ids, tail=N, mode="exact").logits[0, -1]
                for select in kls:
                    res = prefill(model, ids, maps, tail=TAIL, select=select)
                    kls[select].append(kl(exact, res.logits[0, -1]))
                    if select == "auto":
                        chosen.append(res.selected.numel())
            row = {"model": name, "maps": kind, "prompts": args.prompts, "rows": N, "tail": TAIL, "split": S,
                   "chosen_rows_mean": float(np.mean(chosen))}
            for select, v in kls.items():
                row[f"kl_{select}_mean"] = float(np.mean(v))
                row[f"kl_{select}_median"] = float(np.median(v))
            row["selection_lower"] = int(sum(a < b for a, b in zip(kls["auto"], kls["off"])))
            rows.append(row)
            table.append(f"| {name} | {kind} | {row['kl_off_mean']:.4f} | {row['kl_auto_mean']:.4f} | "
                         f"{row['selection_lower']}/{args.prompts} | {row['chosen_rows_mean']:.1f} |")
    print("| model | maps | KL plain fill | KL default selection | selection lower | rows chosen |")
    print("|---|---|---|---|---|---|")
    print("\n".join(table))
    if args.out:
        write_json(args.out, {"rows": rows, "argv": sys.argv[1:]})


if __name__ == "__main__":
    main()
