#!/usr/bin/env bash
# vLLM time to first token on a GPU: vLLM's Llama vs the RidgeFill plugin, Llama-3.1-8B shape
# (random weights, identity maps at S=15: scripts/make_shape_model.py), 8K to 128K tokens, tensor
# parallel 1 and, with two or more GPUs, 2. Not run yet (no GPU was lent to the session that wrote it).
# Usage: bash scripts/gpu_vllm.sh [OUT_DIR]  (random weights through load_format=dummy: no checkpoint download)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-ridgefill-out/gpu-vllm}
mkdir -p "$out"
bash scripts/install_vllm.sh .venv-vllm-cuda cuda
py=.venv-vllm-cuda/bin/python
[ -f "$out/shape/maps-S15.safetensors" ] || $py scripts/make_shape_model.py "$out/shape" --split 15
gpus=$($py -c "import torch; print(torch.cuda.device_count())")
echo "GPUs: $gpus"
for tp in 1 2; do
  if [ "$tp" -gt "$gpus" ]; then echo "TP=$tp skipped: $gpus GPU(s)"; continue; fi
  $py scripts/vllm_ttft.py --model "$out/shape/model" --maps "$out/shape/maps-S15.safetensors" \
    --lengths 8k,32k,64k,128000 --tail 256 --repeats 3 \
    --device-args "{\"dtype\": \"bfloat16\", \"tensor_parallel_size\": $tp, \"gpu_memory_utilization\": 0.4, \"skip_tokenizer_init\": true, \"load_format\": \"dummy\"}" \
    --json "$out/ttft-tp$tp.json" 2>&1 | grep -v -i "warn" | tee "$out/ttft-tp$tp.txt" | grep -E "^\||tokens|vLLM TTFT"
done
