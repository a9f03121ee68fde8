#!/usr/bin/env bash
# RidgeFill prefill benchmark on one CUDA GPU (see docs/bench.md).
#
#   scripts/gpu_bench.sh [OUT_DIR]        (default OUT_DIR: gpu-bench-out)
#
# 1. CUDA equality check: the fast fill path (batched maps + folded K/V + RoPE into the cache) equals
#    the per-layer reference path, cache and logits, on the GPU: a tiny random Llama in float32 and
#    bfloat16, and the Llama-3.1-8B shape in bfloat16 at 2048 tokens, plain and context maps.
#    Exits non-zero on a mismatch (after the bench, which runs either way).
#    Then the host synchronisations of one prefill on the 8B shape at 8K and 32K tokens, counted by CUDA
#    itself (torch.cuda.set_sync_debug_mode: a warning per synchronising call), plain fill, two-pass and
#    one-pass selection, beside the CPU proxy's count (ridgefill.syncs.HostSyncCounter).
# 2. `ridgefill bench` on the Llama-3.1-8B shape with random weights, bfloat16 (the CUDA default), S = 16, tail 2048,
#    context maps (the default), with the default row selection and the one-pass selection timed beside
#    the plain fill, at 8K / 32K / 128K tokens (random weights time the same as the real model; maps are
#    random).
#
# Needs: the project importable in the active Python (pip install -e '.[full]', or PYTHONPATH=python), a CUDA
# build of torch, and one GPU with at least 80 GB (128K tokens: 16 GB of weights, 16 GB of KV cache,
# activations). About 4 minutes on an H200, most of it the 128K prefills.
# bench.json records the command with the JSON file's name only (no folder of this machine).
# Environment: PYTHON (default: python3), LENGTHS (default: 8k,32k,128k), REPEATS (default: 3),
#              SELECT (default: "on one-pass", the settings timed beside the plain fill; `off`: none);
#              for a smoke run of step 2 elsewhere (tests/test_scripts.py): CHECK=0 skips step 1, DEVICE,
#              MODEL, SPLIT, TAIL (defaults cuda, llama3-8b-random, 16, 2048).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu-bench-out}"
PY="${PYTHON:-python3}"
LENGTHS="${LENGTHS:-8k,32k,128k}"
REPEATS="${REPEATS:-3}"
SELECT="${SELECT:-on one-pass}"
CHECK="${CHECK:-1}"
DEVICE="${DEVICE:-cuda}"
MODEL="${MODEL:-llama3-8b-random}"
SPLIT="${SPLIT:-16}"
TAIL="${TAIL:-2048}"
mkdir -p "$OUT"

check_rc=0
[ "$CHECK" = 0 ] || "$PY" - <<'PYEOF' 2>&1 | tee "$OUT/cuda_check.txt" || check_rc=$?
import sys

import torch
import transformers

from ridgefill.bench import check_fast_path, random_model, timing_maps

if not torch.cuda.is_available():
    sys.exit("error: torch sees no CUDA device (torch %s)" % torch.__version__)
print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| transformers", transformers.__version__)
failed = False
for preset, dtype, n, split, tail in [("tiny-random", torch.float32, 512, 2, 64),
                                      ("tiny-random", torch.bfloat16, 512, 2, 64),
                                      ("llama3-8b-random", torch.bfloat16, 2048, 16, 256)]:
    model = random_model(preset, "cuda", dtype)
    for context in (0, 1):  # plain maps and context maps ([2d, d], the default)
        res = check_fast_path(model, timing_maps(model, split, context=context), n=n, tail=tail)
        print(f"{preset:>17} {str(dtype):>15} N={n} context {context}: max rel. diff K/V {res['max_rel_kv']:.2e}, "
              f"logits {res['max_rel_logits']:.2e} (tolerance {res['tolerance']:.0e}) -> "
              f"{'ok' if res['ok'] else 'MISMATCH'}")
        failed |= not res["ok"]
    del model
    torch.cuda.empty_cache()

import warnings

from ridgefill import prefill
from ridgefill.syncs import HostSyncCounter

model = random_model("llama3-8b-random", "cuda", torch.bfloat16)
maps = timing_maps(model, 16, context=1)
for n in (8192, 32768):
    ids = torch.randint(0, model.config.vocab_size, (1, n), device="cuda")
    for select in ("off", "on", "one-pass"):
        prefill(model, ids, maps, tail=2048, select=select)  # warm-up (induction scores once per model)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                prefill(model, ids, maps, tail=2048, select=select)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        cuda = sum("synchroniz" in str(w.message) for w in caught)
        with HostSyncCounter() as proxy:
            prefill(model, ids, maps, tail=2048, select=select)
        print(f"host synchronisations, 8B shape, N={n}, select {select}: CUDA sync debug mode {cuda}, "
              f"CPU proxy {proxy.total}")
sys.exit(1 if failed else 0)
PYEOF

sel=()
if [ "$SELECT" != off ]; then
  for s in $SELECT; do sel+=(--select "$s"); done
fi
"$PY" -m ridgefill bench --device "$DEVICE" --model "$MODEL" \
    --lengths "$LENGTHS" --split "$SPLIT" --tail "$TAIL" --repeats "$REPEATS" "${sel[@]}" \
    --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
echo "wrote $OUT/cuda_check.txt, $OUT/bench.txt, $OUT/bench.json"
[ "$check_rc" = 0 ] || { echo "error: the CUDA equality check failed (exit $check_rc): see $OUT/cuda_check.txt" >&2; exit 1; }
