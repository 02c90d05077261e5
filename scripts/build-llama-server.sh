#!/usr/bin/env bash
# Build llama.cpp's llama-server (a real speculative-decoding engine, EAGLE-3 included, on CPU)
# from the source inside the llama-cpp-python sdist, into a cache directory OUTSIDE the clone,
# so a developer's machine builds once. Nothing is committed; nothing is downloaded at test time.
#
#   scripts/build-llama-server.sh            # prints the path of the llama-server binary
#
# Environment: SPECDECODE_CACHE (default ~/.cache/pytest-specdecode), LLAMA_CPP_PYTHON_VERSION.
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cache="${SPECDECODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-specdecode}"
root="$cache/llama.cpp/$version"
binary="$root/build/bin/llama-server"

if [ -x "$binary" ] && "$binary" --version >/dev/null 2>&1; then
  echo "$binary"
  exit 0
fi

start=$(date +%s)
mkdir -p "$root"
echo "building llama-server from llama-cpp-python==$version into $root (about 7 minutes on 2 cores)" >&2
if [ ! -d "$root/src" ]; then
  python3 -m pip download "llama-cpp-python==$version" --no-deps --no-binary :all: \
    -d "$root/sdist" >&2
  mkdir -p "$root/src"
  tar xzf "$root/sdist/llama_cpp_python-$version.tar.gz" -C "$root/src" --strip-components=1
fi
src="$root/src/vendor/llama.cpp"
# No web UI download, no OpenSSL, no tests or examples: only the server.
cmake -S "$src" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_OPENSSL=OFF >"$root/cmake.log" 2>&1 || { tail -30 "$root/cmake.log" >&2; exit 1; }
cmake --build "$root/build" --target llama-server -j"$(nproc)" >"$root/build.log" 2>&1 \
  || { tail -40 "$root/build.log" >&2; exit 1; }
"$binary" --version >&2
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$binary"
