"""Research script (docs/evaluate.md, "Ninth session"): a refit used only to choose the rows.

Runs the ``ridgefill`` CLI with every prefill that has both ``refit > 0`` and a selection run twice: first as
asked (the maps refitted on the exact rows, the selection's first pass scored with them) to get the chosen
rows, then the one-pass fill with those rows exact and the calibration maps (no refit). So the ``+sel+refit``
systems of ``eval needle --refit`` / ``eval loss --refit`` measure which rows the refit chooses, without
the refitted maps in the filled rows' K/V.

    python scripts/refit_choose_only.py eval needle --out DIR --lengths 8000 --trials 16 --variants single \\
        --modes '' --select attention --refit 4 --json F
"""
from __future__ import annotations

import functools
import sys

import ridgefill.fill as fill


def main(argv: list[str]) -> int:
    orig = fill.prefill

    @functools.wraps(orig)
    def prefill(*args, **kw):
        if kw.get("refit", 0) > 0 and kw.get("select") is not None:
            first = orig(*args, **kw)
            res = orig(*args, **dict(kw, refit=0.0, refit_rows=None, select=None,
                                     exact_rows=first.exact_positions.tolist()))
            res.selected = first.selected
            return res
        return orig(*args, **kw)

    import ridgefill.evaluate.loss as loss
    import ridgefill.evaluate.needles as needles
    for m in (fill, needles, loss):
        m.prefill = prefill
    from ridgefill.cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
