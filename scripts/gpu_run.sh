#!/usr/bin/env bash
# The one prepared GPU run: scripts/gpu_bench.sh, then scripts/gpu_vllm.sh, each logged to OUT_DIR,
# the second run even when the first fails. Meant for a lent machine with no package registry: wheels
# in .whl/ (transformers and gguf at the project's pins) are installed to /tmp/site first.
# Usage: bash scripts/gpu_run.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_run.sh OUT_DIR}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: installing .whl/ failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD/python${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 PYTHON=python3 VLLM_INSTALL=0
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv; nproc; } 2>&1 | tee "$out/machine.txt"
t0=$(date +%s)
bash scripts/gpu_bench.sh "$out/bench"; rc_bench=$?
t1=$(date +%s)
bash scripts/gpu_vllm.sh /tmp/gpu-vllm > "$out/vllm.txt" 2>&1; rc_vllm=$?
cp /tmp/gpu-vllm/ttft-*.txt /tmp/gpu-vllm/ttft-*.json "$out/" 2>/dev/null
tail -5 "$out/vllm.txt"
t2=$(date +%s)
echo "gpu_bench.sh: exit $rc_bench, $((t1 - t0)) s; gpu_vllm.sh: exit $rc_vllm, $((t2 - t1)) s"
