"""Time ``calibrate`` split into the statistics pass and the solve, on random-weight Llama shapes.

Timing only: the weights are random, so the maps are meaningless. Per hidden size ``d`` a Llama config
with ``--layers`` layers (head size 64, MLP ``8/3·d``) is built in memory; ``--chunks`` chunks of
``--chunk`` random token ids are accumulated at split ``--split`` with context maps (features ``2d``), as
``ridgefill calibrate`` does (:func:`ridgefill.calibration.collect_stats_many`), then
:func:`ridgefill.ridge.fit_maps` with ``λ = "auto"`` fits every late layer (one ``eigh`` of the
``2d × 2d`` feature Gram for the choice of λ and the held-out report, one Cholesky solve per layer).
The time of one ``eigh`` is measured too: the solve before the shared decomposition ran ``2 ×`` late
layers of them.

Usage: ``python scripts/time_calibrate.py --hidden 576,896,2048 [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ridgefill.calibration import collect_stats_many
from ridgefill.ridge import fit_maps


def shape_model(d: int, layers: int, vocab: int) -> LlamaForCausalLM:
    heads = d // 64
    kv = max(1, heads // 4) if heads % max(1, heads // 4) == 0 else 1
    while heads % kv:
        kv -= 1
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=(8 * d // 3 + 63) // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                      max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", default="576,896,2048")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--split", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for d in (int(v) for v in args.hidden.split(",")):
        model = shape_model(d, args.layers, args.vocab)
        g = torch.Generator().manual_seed(1)
        chunks = [torch.randint(0, args.vocab, (args.chunk,), generator=g) for _ in range(args.chunks)]
        t0 = time.perf_counter()
        fit, held = collect_stats_many(model, chunks, (args.split,), heldout_every=8, progress=False,
                                       context=1)[args.split]
        t1 = time.perf_counter()
        res = fit_maps(fit, "auto", held, progress=False)
        t2 = time.perf_counter()
        gram, _, _ = fit.centred(0)
        t3 = time.perf_counter()
        torch.linalg.eigh(gram)
        eigh_s = time.perf_counter() - t3
        row = {"hidden": d, "features": fit.features, "layers": args.layers, "split": args.split,
               "late_layers": fit.layers, "tokens": fit.count + held.count, "pass_s": round(t1 - t0, 2),
               "solve_s": round(t2 - t1, 2), "one_eigh_s": round(eigh_s, 2),
               "solve_before_estimate_s": round(t2 - t1 + (2 * fit.layers - 1) * eigh_s, 2),
               "lambdas": [f"{v:.3g}" for v in res.lambdas], "threads": torch.get_num_threads(),
               "load_average": list(os.getloadavg())}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model, fit, held, res
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
