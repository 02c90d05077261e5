#!/usr/bin/env bash
# Build llama.cpp's llama-server (a real speculative-decoding engine, EAGLE-3 included, on CPU)
# from the source inside the llama-cpp-python sdist, into a cache directory OUTSIDE the clone,
# so a developer's machine builds once. Nothing is committed; nothing is downloaded at test time.
#
#   scripts/build-llama-server.sh            # prints the path of the llama-server binary
#
# Environment: SPECDECODE_CACHE (default ~/.cache/pytest-specdecode), LLAMA_CPP_PYTHON_VERSION.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

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
echo "building llama-server from llama-cpp-python==$version into $root" \
  "(about 10 minutes on 2 idle cores)" >&2
if [ ! -d "$root/src" ]; then
  python3 -m pip download "llama-cpp-python==$version" --no-deps --no-binary :all: \
    -d "$root/sdist" >&2
  mkdir -p "$root/src"
  tar xzf "$root/sdist/llama_cpp_python-$version.tar.gz" -C "$root/src" --strip-components=1
fi
src="$root/src/vendor/llama.cpp"
# Only what llama-server needs: no web UI download, no OpenSSL, no tests or examples, no warning
# flags. -O2 rather than CMake's -O3 (10% less compiler time; ggml's kernels are hand-vectorised
# intrinsics either way, and neither level reorders floating-point arithmetic), and a unity build
# of the C++ libraries (scripts/llama-server-unity.cmake says which files are left out and why).
# Measured on 2 cores: 325 s -> 255 s wall, 622 s -> 435 s of compiler time, same binary version.
args=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_ALL_WARNINGS=OFF
  "-DCMAKE_C_FLAGS_RELEASE=-O2 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG"
  -DCMAKE_UNITY_BUILD=ON "-DCMAKE_PROJECT_INCLUDE=$here/llama-server-unity.cmake")
# Ninja (in Debian's cmake set-up here) schedules the two cores better than make.
if command -v ninja >/dev/null 2>&1; then
  args+=(-G Ninja)
fi
# ggml picks up ccache by itself when it is installed (GGML_CCACHE): keep its files in the cache.
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_DIR="${CCACHE_DIR:-$cache/ccache}"
fi
# A build folder left by another recipe (an interrupted build of an older version of this
# script, another generator) is started afresh; an unfinished one of this recipe is resumed.
recipe="$(printf '%s\n' "${args[@]}" | sed "s|$here|scripts|")"
if [ -d "$root/build" ] && [ "$(cat "$root/build/specdecode-recipe" 2>/dev/null)" != "$recipe" ]; then
  rm -rf "$root/build"
fi
mkdir -p "$root/build"
printf '%s\n' "$recipe" >"$root/build/specdecode-recipe"
cmake -S "$src" -B "$root/build" "${args[@]}" >"$root/cmake.log" 2>&1 \
  || { tail -30 "$root/cmake.log" >&2; exit 1; }
cmake --build "$root/build" --target llama-server -j"$(nproc)" >"$root/build.log" 2>&1 \
  || { tail -40 "$root/build.log" >&2; exit 1; }
"$binary" --version >&2
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$binary"
