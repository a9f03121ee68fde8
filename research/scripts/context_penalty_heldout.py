#!/usr/bin/env python3
"""Held-out error of context maps over the previous row's penalty ``α`` and ``λ``: would held-out error choose ``α``?

``fit_maps(..., context_penalty=α)`` penalises the previous row's block of context maps ``αλ`` and the
row's own block ``λ`` (docs/evaluate.md, "Sixteenth session"); the library keeps ``α = 1`` and chooses
``λ`` per layer by held-out error. This script asks what held-out error says about ``α``: it collects the
calibration statistics as ``ridgefill calibrate --context 1`` does (the same chunks, every 8th held out),
then for every late layer and every ``α`` of ``--alphas`` computes the held-out error
(:func:`ridgefill.ridge.heldout_errors`) on one fixed ``λ`` grid built from the unscaled Gram
(:func:`ridgefill.ridge.lambda_grid` with ``--points`` points, so ``α`` changes the penalty only), and
prints per layer the best ``α``, each ``α``'s best error relative to ``α = 1`` and its ``λ``.
With ``--out`` (one split) it also writes the maps whose every layer takes its held-out best ``α`` and
``λ``, refitted on all calibration rows as ``fit_maps``' ``"auto"`` does, for ``ridgefill eval --maps``;
``--like`` names the library's context maps of the same model, split and calibration set, whose metadata,
means and covariance they keep, and which the statistics must reproduce bit for bit (checked). The file
holds no statistics (``ridgefill certify`` cannot check it) and records the per-layer choice in
``meta["heldout_alpha"]``. 5-8 minutes on 2 busy CPU cores for SmolLM2 (the pass), seconds for the rest.

Usage::

    python scripts/context_penalty_heldout.py --splits 11,15 --json heldout-alpha.json
    python scripts/context_penalty_heldout.py --splits 15 --like maps-S15-ctx.safetensors \
        --out maps-S15-heldout-alpha.safetensors
"""

from __future__ import annotations

import argparse
import json
import sys


def sweep(fit, held, alphas: list[float], points: int) -> list[dict]:
    """Per late layer (``layer``: its index among the late layers) the held-out error of the ridge with
    previous-row penalty ``α`` for every ``α`` of ``alphas`` (``1`` among them), each at its best ``λ`` of one
    grid (:func:`ridgefill.ridge.lambda_grid` of the unscaled centred Gram, ``points`` points):
    ``best_alpha``, ``error`` (the held-out squared error), ``error_rel_to_alpha_1`` and ``lambda``, keyed by
    ``α``. ``fit`` and ``held``: context :class:`~ridgefill.ridge.RidgeStats` of the fitting and held-out rows."""
    import torch

    from ridgefill.ridge import heldout_errors, lambda_grid

    scaled = {x: (fit, held) if x == 1 else (fit.with_context_scale(x ** -0.5), held.with_context_scale(x ** -0.5))
              for x in alphas}
    rows = []
    for i in range(fit.layers):
        grid = lambda_grid(fit.centred(i)[0], points=points)  # unscaled: the same λ values for every α
        best = {}
        for x, (f, h) in scaled.items():
            err = heldout_errors(f, h, i, grid)
            j = int(torch.argmin(err))
            best[x] = (float(err[j]), float(grid[j]))
        ref = best[1.0][0]
        rows.append({"layer": i, "best_alpha": min(alphas, key=lambda x: best[x][0]),
                     "error": {x: best[x][0] for x in alphas},
                     "error_rel_to_alpha_1": {x: best[x][0] / ref if ref > 0 else 1.0 for x in alphas},
                     "lambda": {x: best[x][1] for x in alphas}})
    return rows


def heldout_maps(fit, held, rows: list[dict], like):
    """:class:`~ridgefill.maps.RidgeMaps` whose layer ``i`` is the ridge with ``rows[i]``'s best ``α`` and its
    ``λ`` (:func:`sweep`), solved on ``fit`` and ``held`` merged; metadata, means and covariance from ``like``
    (maps fitted by the library on the same statistics). Raises ``ValueError`` when ``fit_maps(fit, "auto",
    held)`` does not reproduce ``like``'s weights and ``λ`` exactly (other statistics)."""
    import torch

    from ridgefill.maps import RidgeMaps
    from ridgefill.ridge import fit_maps

    auto = fit_maps(fit, "auto", held, context_penalty=like.context_penalty)
    if auto.lambdas != like.lambdas or not torch.equal(auto.weights.float(), like.weights.float()):
        raise ValueError("--like maps were not fitted on these statistics (their λ or weights differ): give the "
                         "library's context maps of the same model, split and calibration set")
    merged = fit.merged(held)
    alphas = [r["best_alpha"] for r in rows]
    lams = [r["lambda"][a] for r, a in zip(rows, alphas)]
    weights, biases = [None] * len(rows), [None] * len(rows)
    for alpha in set(alphas):  # one fit per α, each layer with its own λ; keep the layers that chose this α
        fitted = fit_maps(merged, lams, context_penalty=alpha)
        for i in (i for i, a in enumerate(alphas) if a == alpha):
            weights[i], biases[i] = fitted.weights[i], fitted.biases[i]
    meta = dict(like.meta, lambda_spec="held-out alpha and lambda per layer (scripts/context_penalty_heldout.py)",
                heldout_alpha=alphas)
    meta.pop("context_penalty", None)  # one number in the format; the per-layer values are heldout_alpha
    return RidgeMaps(like.split, torch.stack(weights).float(), torch.stack(biases).float(), lams, meta,
                     mean_h=like.mean_h, mean_x=like.mean_x, cov_h=like.cov_h)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model spec for ridgefill.assets.load_model (default SmolLM2)")
    ap.add_argument("--splits", default="15", help="comma-separated splits S (one pass for all)")
    ap.add_argument("--calib-set", default="mix", choices=("mix", "novels"))
    ap.add_argument("--alphas", default="1,2,4,8,16,64,256")
    ap.add_argument("--points", type=int, default=81, help="λ grid points over tr(G)/d · 10^-7..10^3 (library: 25)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the per-layer results here")
    ap.add_argument("--like", default=None, help="with --out: the library's context maps of this split and set")
    ap.add_argument("--out", default=None, help="write maps with each layer's held-out α and λ (one split)")
    a = ap.parse_args(argv)
    if (a.out is None) != (a.like is None) or (a.out and "," in a.splits):
        ap.error("--out and --like go together, with one split in --splits")
    try:
        alphas = [float(x) for x in a.alphas.split(",")]
        splits = [int(x) for x in a.splits.split(",")]
    except ValueError:
        ap.error(f"--alphas {a.alphas!r} / --splits {a.splits!r}: comma-separated numbers (e.g. 1,4,16 and 11,15)")
    if 1.0 not in alphas or any(not x >= 1 for x in alphas):
        ap.error("--alphas must hold 1 (the reference) and values ≥ 1")
    if a.points < 2:
        ap.error(f"--points {a.points}: at least 2 λ values")

    import torch

    from ridgefill.assets import calibration_texts, load_model
    from ridgefill.calibrate import calibration_plan, collect_stats_many
    from ridgefill.errors import RidgeFillError
    from ridgefill.fileio import write_json
    from ridgefill.maps import load_maps
    from ridgefill.run import RunConfig

    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok, name = load_model(a.model)
    like = None
    if a.like:  # checked before the pass: a bad file is not found minutes later
        try:
            like = load_maps(a.like)
            like.check_model(model, splits[0])
        except RidgeFillError as e:
            ap.error(f"--like {a.like}: {e}")
        if not like.context or like.kind != "inputs":
            ap.error(f"--like {a.like}: give the library's context input maps (ridgefill calibrate --context 1)")
    cfg = RunConfig()
    chunks, _ = calibration_plan(tok, calibration_texts(a.calib_set), cfg.calib_tokens, cfg.chunk)
    stats = collect_stats_many(model, chunks, splits, heldout_every=8, context=1)
    out = {"model": name, "calib_set": a.calib_set, "alphas": alphas, "points": a.points, "splits": {}}
    chosen = {}
    for split, (fit, held) in stats.items():
        chosen[split] = sweep(fit, held, alphas, a.points)  # layer: index among the late layers
        rows = [dict(r, layer=r["layer"] + split + 1) for r in chosen[split]]  # the model's layer index
        for r in rows:
            rel, lam = r["error_rel_to_alpha_1"], r["lambda"]
            print(f"S={split} layer {r['layer']}: best α {r['best_alpha']:g}; error / α=1's: "
                  + " ".join(f"{x:g}:{rel[x]:.5f}" for x in alphas) + "; λ: "
                  + " ".join(f"{x:g}:{lam[x]:.3g}" for x in alphas), flush=True)
        out["splits"][str(split)] = rows
    if a.json:  # first: the sweep is kept even if the maps below cannot be written
        write_json(a.json, out)
    if like is not None:
        split = splits[0]
        fit, held = stats[split]
        try:
            heldout_maps(fit, held, chosen[split], like).save(a.out)
        except (ValueError, RidgeFillError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
