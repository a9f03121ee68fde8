#!/usr/bin/env python3
"""Maps for a mixture of calibration corpora from the statistics of maps fitted on each corpus.

Each input maps file has its float64 statistics beside it (``<name>.stats.safetensors``, written by
``ridgefill calibrate``); their sums are merged (:meth:`ridgefill.ridge.RidgeStats.merged`), each
corpus's rows optionally weighted (``NAME=FILE:WEIGHT``: every sum, and the row count, multiplied
by the weight, i.e. its rows counted ``WEIGHT`` times), and the maps are solved once more
(:func:`ridgefill.ridge.fit_maps`) with per-layer ``λ`` taken from a reference maps file times a
factor (``--lam-from FILE ... --lam-factor F``: per layer the geometric mean over the files, times
``F``; the Gram grows with the row count, so merging three corpora of the references' size calls for
a factor near 3) or one number (``--lam``). No model pass:
seconds on a CPU.

Usage::

    python scripts/merge_maps.py novels=A.safetensors docs=B.safetensors code=C.safetensors \\
        --lam-from A.safetensors B.safetensors C.safetensors --lam-factor 3 --out MERGED.safetensors
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="NAME=MAPS_FILE[:WEIGHT]")
    ap.add_argument("--lam-from", nargs="+", default=None, help="maps files whose per-layer λ to use: their "
                    "geometric mean, times --lam-factor")
    ap.add_argument("--lam-factor", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=None, help="one λ for every layer instead")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    from ridgefill.maps import RidgeMaps, calibration_cov, load_maps, load_stats, stats_path
    from ridgefill.overlap import Fingerprint
    from ridgefill.ridge import fit_maps

    total, texts, metas, fps, splits = None, [], [], [], set()
    for spec in a.inputs:
        name, _, rest = spec.partition("=")
        path, _, weight = rest.partition(":")
        w = float(weight) if weight else 1.0
        maps = load_maps(path)
        splits.add(maps.split)
        stats, _ = load_stats(stats_path(path))
        if w != 1.0:
            for k in ("sum_h", "gram", "sum_x", "cross", "sq_x"):
                setattr(stats, k, getattr(stats, k) * w)
            stats.count = int(round(stats.count * w))
        total = stats if total is None else total.merged(stats)
        metas.append(maps.meta)
        for t in maps.meta.get("calibration_texts") or [{"name": name, "calibration_tokens": maps.meta.get(
                "calibration_tokens"), "sha256": maps.meta.get("text_sha256"), "text_tokens": None}]:
            texts.append({**t, "corpus": name, "weight": w})
        if "calibration_fingerprint" in maps.meta:
            fps.append(Fingerprint.from_meta(maps.meta["calibration_fingerprint"]))
    if len(splits) != 1:
        sys.exit(f"error: the maps files are fitted at different splits {sorted(splits)}")
    if a.lam is not None:
        lam = a.lam
    elif a.lam_from:
        import math

        per = [load_maps(f).lambdas for f in a.lam_from]
        lam = [a.lam_factor * math.exp(sum(math.log(v) for v in vs) / len(vs)) for vs in zip(*per)]
    else:
        sys.exit("error: give --lam or --lam-from")
    fit = fit_maps(total, lam)
    meta = {k: v for k, v in metas[0].items() if k in ("model_name", "model_hash", "weight_fingerprint",
                                                        "weights_dtype", "weights_device", "weight_sample", "chunk")}
    meta.update(calibration_tokens=sum(int(m.get("calibration_tokens", 0)) for m in metas), heldout_tokens=0,
                lambda_spec=f"merged: {a.lam if a.lam is not None else f'{a.lam_factor} x geometric mean of the λ of {[Path(f).name for f in a.lam_from]}'}",
                calibration_texts=texts, kind="inputs", context=total.context,
                merged_from=[s.partition("=")[0] for s in a.inputs])
    if fps and len(fps) == len(a.inputs):  # every input recorded its fingerprint: their union
        import numpy as np

        sample = max(f.sample for f in fps)
        hashes = np.unique(np.concatenate([f.hashes for f in fps]))
        meta["calibration_fingerprint"] = Fingerprint(fps[0].window, sample,
                                                      hashes[hashes % np.uint64(sample) == 0]).to_meta()
    mean_h, mean_x = fit.stats.means()
    out = RidgeMaps(splits.pop(), fit.weights.float(), fit.biases.float(), fit.lambdas, meta, fit.stats,
                    mean_h=mean_h[:fit.stats.hidden].float(), mean_x=mean_x.float(),
                    cov_h=calibration_cov(fit.stats).float())
    out.save(a.out)
    print(f"wrote {a.out}: {fit.stats.count} rows from {len(a.inputs)} maps files, λ per layer "
          f"{[f'{v:.3g}' for v in fit.lambdas]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
