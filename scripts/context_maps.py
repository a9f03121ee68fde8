#!/usr/bin/env python3
"""Experiment: ridge maps whose input is the split state of a row *and of the rows before it*.

The library's maps predict a late layer's input (or pre-RoPE K/V) of row ``t`` from ``h_S(t)`` alone. This
experiment appends the previous rows' split states to the map's input, ``[h_S(t), h_S(t-1)]`` (``h,prev``)
or ``[h_S(t), h_S(t-1), h_S(t-2)]`` (``h,prev,prev2``; rows before row 0 are zeros), and keeps the fit a
closed-form ridge (no prior, unpenalised intercept, ``λ`` per layer from a grid by held-out K/V error:
key error + value error / 4, relative to the keys' variance). The filled rows still see only rows
``≤ t``: the fill stays causal. docs/evaluate.md, "Thirteenth and fourteenth sessions".

It is an experiment, not the library path: ``fit`` runs its own statistics pass (SmolLM2, ``S`` = 15 by
default, the ``mix`` calibration set, 65,536 tokens, every 8th 1,024-token chunk held out) and saves a
``torch`` file; ``eval`` runs ``ridgefill eval ...`` with every filled row's late-layer K/V replaced by the
maps' prediction through :func:`ridgefill.fill.prefill`'s ``kv_hook`` in mode ``ridge`` (the rows chosen by
``--select`` are exact and keep their exact K/V; row 0, the attention sink, which the fit leaves out, keeps the
shipped maps' prediction when it is filled; every other filled row's prediction is overwritten by the hook).

Usage::

    python scripts/context_maps.py fit --targets inputs --features 'h;h,prev' --out ctx-inputs.pt
    python scripts/context_maps.py eval ctx-inputs.pt h,prev -- eval loss --out DIR --splits 15 \\
        --docs 3 --novel-docs 3 --modes ridge --select on --json loss.json

``--targets inputs``: the maps predict each late layer's input ``x_l``, whose K/V come through the layer's
own norm, K/V projections and RoPE; ``kv``: its pre-RoPE keys and values directly. Raises ``SystemExit``
with a message on bad options.
"""

import argparse
import sys
import time

import torch

PARTS = ("h", "prev", "prev2")


def features(h: torch.Tensor, name: str) -> torch.Tensor:
    """``[rows, d]`` split states -> ``[rows, d·parts]``: ``h``, the previous row's ``h`` (zeros before row 0),
    the one before it, concatenated in the order of ``name`` (comma-separated parts of :data:`PARTS`)."""
    shifted = {"h": h, "prev": torch.cat([torch.zeros_like(h[:1]), h[:-1]]),
               "prev2": torch.cat([torch.zeros_like(h[:2]), h[:-2]])}
    return torch.cat([shifted[p] for p in name.split(",")], 1)


def check_features(name: str) -> str:
    if not name or any(p not in PARTS for p in name.split(",")):
        raise SystemExit(f"features {name!r}: give comma-separated parts from {PARTS}, e.g. 'h,prev'")
    return name


def fit(args) -> None:
    from ridgefill.adapters import adapter_for
    from ridgefill.assets import calibration_texts, load_model
    from ridgefill.calibrate import calibration_chunks

    sets = [check_features(s) for s in args.features.split(";")]
    if args.heldout_chunks < 1 or args.tokens < 8 * 1024:
        raise SystemExit(f"--heldout-chunks {args.heldout_chunks} / --tokens {args.tokens}: λ is chosen on held-out "
                         "chunks (every 8th 1,024-token chunk): give --heldout-chunks ≥ 1 and --tokens ≥ 8192")
    torch.set_num_threads(args.threads)
    model, tok, _ = load_model()
    ad = adapter_for(model)
    L, S = ad.num_layers, args.split
    if not 0 <= S <= L - 2:
        raise SystemExit(f"--split {S}: this model has {L} layers, so 0 ≤ S ≤ {L - 2}")
    kvd = ad.num_kv_heads * ad.head_dim
    chunks = calibration_chunks(tok, calibration_texts(args.calib_set), args.tokens, 1024)
    acc, held, t0 = {}, [], time.time()
    with torch.inference_mode():
        for i, c in enumerate(chunks):
            ids = c[None]
            pos = torch.arange(ids.shape[1])
            x = ad.embed(ids)
            rope = ad.rope(pos, x)
            inputs = []
            for layer in range(L - 1):
                shape = (1, ad.num_kv_heads, ids.shape[1], ad.head_dim)
                x = ad.layer(layer, x, rope, pos, x.new_empty(shape), x.new_empty(shape))
                if layer >= S:
                    inputs.append(x)  # the input of layer + 1
            h = inputs[0][0].double()
            kv = torch.stack([ad.kv_targets(S + 1 + j, xj)[0] for j, xj in enumerate(inputs)]).double()[:, 1:]
            targets = kv if args.targets == "kv" else torch.stack([xj[0] for xj in inputs]).double()[:, 1:]
            if i % 8 == 7:  # held out (row 0, the attention sink, is never fitted on or scored)
                if len(held) < args.heldout_chunks:
                    held.append((h.float(), kv.float()))
                continue
            for name in sets:
                F = features(h, name)[1:]
                a = acc.setdefault(name, [0, 0, 0, 0, 0])
                a[0] = a[0] + F.T @ F
                a[1] = a[1] + F.sum(0)
                a[2] = a[2] + torch.einsum("nf,lnk->lfk", F, targets)
                a[3] = a[3] + targets.sum(1)
                a[4] += F.shape[0]
            print(f"chunk {i + 1}/{len(chunks)} {time.time() - t0:.0f} s", flush=True)
    out = {"targets": args.targets, "split": S}
    for name in sets:
        G, sF, C, sT, n = acc[name]
        mF, mT = sF / n, sT / n
        ev, U = torch.linalg.eigh(G - n * torch.outer(mF, mF))
        Cc = C - n * torch.einsum("f,lk->lfk", mF, mT)
        Ws, bs, lams, errs = [], [], [], []
        with torch.inference_mode():
            for li in range(L - S - 1):
                UC, best = U.T @ Cc[li], None
                for lam in [10.0 ** (e / 2) for e in range(-2, 15)]:
                    W = U @ (UC / (ev + lam)[:, None])
                    err = tot = 0.0
                    for h, kv in held:
                        P = (features(h, name)[1:] - mF.float()) @ W.float() + mT[li].float()
                        if args.targets == "inputs":
                            P = ad.kv_targets(S + 1 + li, P[None])[0]
                        T = kv[li]
                        err += float((P[:, :kvd] - T[:, :kvd]).square().sum()) \
                            + float((P[:, kvd:] - T[:, kvd:]).square().sum()) / 4
                        tot += float((T[:, :kvd] - T[:, :kvd].mean(0)).square().sum())
                    if best is None or err / tot < best[0]:
                        best = (err / tot, lam, W)
                errs.append(best[0])
                lams.append(best[1])
                Ws.append(best[2])
                bs.append(mT[li] - mF @ best[2])
        out[name] = {"W": torch.stack(Ws).float(), "b": torch.stack(bs).float(), "lams": lams, "errs": errs}
        print(name, "λ", ["%.0g" % v for v in lams], "held-out K/V error",
              " ".join(f"{e:.3f}" for e in errs), f"{time.time() - t0:.0f} s", flush=True)
    torch.save(out, args.out)
    print(f"wrote {args.out}")


def make_hook(model, ids: torch.Tensor, maps: dict, split: int, kind: str, name: str):
    """A :func:`ridgefill.fill.prefill` ``kv_hook`` that writes each filled row's late-layer K/V from the context
    maps ``maps`` (``{"W": [L-S-1, d·parts, k], "b": [L-S-1, k]}``, ``kind`` ``"inputs"`` or ``"kv"``, features
    ``name``) instead of the prefill's own prediction. Row 0 (the attention sink), which the fit leaves out, keeps
    the K/V the prefill gave it. ``ids``: the ``[1, N]`` prompt; its split state is computed here by running
    layers ``0..S`` (the same values as the prefill's), and RoPE comes from the whole prompt's tables."""
    from ridgefill.adapters import adapter_for

    ad = adapter_for(model)
    with torch.inference_mode():
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = ad.embed(ids)
        rope = ad.rope(pos, x)
        for layer in range(split + 1):
            shape = (1, ad.num_kv_heads, ids.shape[1], ad.head_dim)
            x = ad.layer(layer, x, rope, pos, x.new_empty(shape), x.new_empty(shape))
        F = features(x[0], name)

    def hook(layer, k, v, rows):
        i = layer - split - 1
        P = (F[rows] @ maps["W"][i].to(F) + maps["b"][i].to(F))[None]
        r = rope.rows(rows)
        kf, vf = ad.kv_from_targets(layer, P, r) if kind == "kv" else ad.kv(layer, P, r)
        sink = (rows == 0).view(1, 1, -1, 1)
        return torch.where(sink, k, kf.to(k.dtype)), torch.where(sink, v, vf.to(v.dtype))
    return hook


def evaluate(args) -> int:
    import ridgefill.evaluate.loss as loss_mod
    import ridgefill.evaluate.needles as needles_mod
    from ridgefill import fill
    from ridgefill.cli import main

    name = check_features(args.features)
    saved = torch.load(args.maps)
    if name not in saved:
        raise SystemExit(f"{args.maps} has no maps for features {name!r}; it has "
                         f"{[k for k in saved if k not in ('targets', 'split')]}")
    maps, S, kind = saved[name], saved["split"], saved["targets"]

    original = fill.prefill

    def patched(model, input_ids, maps_=None, **kw):
        if kw.get("mode", "ridge") != "exact":
            if kw.get("mode", "ridge") != "ridge" or kw.get("kv_hook") is not None:
                raise SystemExit(f"context maps replace mode 'ridge' only, without a kv_hook of its own; this run asks "
                                 f"for mode {kw.get('mode')!r}{' with a kv_hook' if kw.get('kv_hook') else ''}: "
                                 "pass --modes ridge, without splices or key scales")
            split = kw.get("split")
            split = getattr(maps_, "split", None) if split is None else split
            if split != S:
                raise SystemExit(f"the context maps are for S = {S}; run the evaluation at that split")
            kw["kv_hook"] = make_hook(model, input_ids, maps, S, kind, name)
        return original(model, input_ids, maps_, **kw)

    loss_mod.prefill = patched
    needles_mod.prefill = patched
    return main(args.cli)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit context maps with their own statistics pass")
    f.add_argument("--targets", choices=("inputs", "kv"), default="inputs")
    f.add_argument("--features", default="h;h,prev", help="';'-separated feature sets, e.g. 'h;h,prev;h,prev,prev2'")
    f.add_argument("--split", type=int, default=15)
    f.add_argument("--calib-set", default="mix")
    f.add_argument("--tokens", type=int, default=65536)
    f.add_argument("--heldout-chunks", type=int, default=3, help="held-out chunks that choose λ")
    f.add_argument("--threads", type=int, default=1)
    f.add_argument("--out", required=True)
    e = sub.add_parser("eval", help="run a `ridgefill` command with the filled rows' K/V from context maps")
    e.add_argument("maps")
    e.add_argument("features")
    e.add_argument("cli", nargs=argparse.REMAINDER, help="-- then the ridgefill arguments")
    args = p.parse_args(argv)
    if args.cmd == "eval":
        args.cli = args.cli[1:] if args.cli[:1] == ["--"] else args.cli
    return args


if __name__ == "__main__":
    a = parse(sys.argv[1:])
    sys.exit(fit(a) if a.cmd == "fit" else evaluate(a))
