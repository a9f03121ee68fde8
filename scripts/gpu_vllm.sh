#!/usr/bin/env bash
# vLLM time to first token on a GPU: vLLM's Llama vs the RidgeFill plugin, Llama-3.1-8B shape
# (random weights, identity maps at S=15: scripts/make_shape_model.py), 8K to 128K tokens, tensor
# parallel 1 and, with two or more GPUs, 2; the plain fill and row selection; CUDA graphs on and off. Then the
# hybrid family at a Qwen3-Next shape (make_shape_model.py --family qwen3_next: 48 layers, linear attention with
# full attention every fourth layer, 32 experts; identity maps at S=23), the plain fill, prefix caching off (the
# plugin serves neither row selection nor prefix caching for hybrids), the same lengths, TP 1 (the plugin refuses
# tensor parallelism for hybrids).
# Usage: bash scripts/gpu_vllm.sh [OUT_DIR]  (random weights through load_format=dummy: no checkpoint download)
# Environment: PYTHON: a Python with vLLM (CUDA build) and the plugin installed; without it the script
#              installs both into .venv-vllm-cuda (needs the package registry), unless VLLM_INSTALL=0.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-ridgefill-out/gpu-vllm}
mkdir -p "$out"
py=${PYTHON:-}
if [ -z "$py" ] || ! "$py" -c "import vllm, ridgefill_vllm" 2>/dev/null; then
  if [ "${VLLM_INSTALL:-1}" = 0 ]; then
    echo "error: ${py:-python} cannot import vllm and ridgefill_vllm, and VLLM_INSTALL=0 forbids installing them" \
         "(the vllm 0.32.0 CUDA wheel is 311 MiB and pins torch==2.13.0): install both into that Python first" >&2
    exit 3
  fi
  bash scripts/install_vllm.sh .venv-vllm-cuda cuda
  py=.venv-vllm-cuda/bin/python
fi
[ -f "$out/shape/maps-S15.safetensors" ] || $py scripts/make_shape_model.py "$out/shape" --split 15
[ -f "$out/shape-qwen3-next/maps-S23.safetensors" ] || \
  $py scripts/make_shape_model.py "$out/shape-qwen3-next" --family qwen3_next --split 23
gpus=$($py -c "import torch; print(torch.cuda.device_count())")
echo "GPUs: $gpus"
# chunked prefill on (vLLM's default) and prefix caching on in every run; with and without CUDA graphs
# (--enforce-eager); the plain fill and row selection at tensor parallel 1 and 2
for eager in 1 0; do
  for select in off on; do
    for tp in 1 2; do
      if [ "$tp" -gt "$gpus" ]; then echo "TP=$tp skipped: $gpus GPU(s)"; continue; fi
      tag="tp$tp-eager$eager-select-$select"
      $py scripts/vllm_ttft.py --model "$out/shape/model" --maps "$out/shape/maps-S15.safetensors" \
        --lengths 8k,32k,64k,128000 --tail 256 --repeats 3 --select "$select" --prefix-caching \
        --device-args "{\"dtype\": \"bfloat16\", \"tensor_parallel_size\": $tp, \"gpu_memory_utilization\": 0.4, \"skip_tokenizer_init\": true, \"load_format\": \"dummy\", \"enforce_eager\": $([ $eager = 1 ] && echo true || echo false)}" \
        --json "$out/ttft-$tag.json" 2>&1 | grep -v -i "warn" | tee "$out/ttft-$tag.txt" | grep -E "^\||tokens|vLLM TTFT"
    done
  done
done
# the hybrid family: Qwen3-Next shape, plain fill, prefix caching off, tensor parallel 1 (refused above 1)
for eager in 1 0; do
  tag="qwen3-next-tp1-eager$eager-select-off"
  $py scripts/vllm_ttft.py --model "$out/shape-qwen3-next/model" --maps "$out/shape-qwen3-next/maps-S23.safetensors" \
    --lengths 8k,32k,64k,128000 --tail 256 --repeats 3 --select off \
    --device-args "{\"dtype\": \"bfloat16\", \"tensor_parallel_size\": 1, \"gpu_memory_utilization\": 0.4, \"skip_tokenizer_init\": true, \"load_format\": \"dummy\", \"enforce_eager\": $([ $eager = 1 ] && echo true || echo false)}" \
    --json "$out/ttft-$tag.json" 2>&1 | grep -v -i "warn" | tee "$out/ttft-$tag.txt" | grep -E "^\||tokens|vLLM TTFT"
done
