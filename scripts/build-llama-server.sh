#!/usr/bin/env bash
# Build llama.cpp's llama-server (a real speculative-decoding engine, EAGLE-3 included, on CPU)
# from the source inside the llama-cpp-python sdist, into a cache directory OUTSIDE the clone,
# so a developer's machine builds once. Nothing is committed; nothing is downloaded at test time.
#
#   scripts/build-llama-server.sh            # prints the path of the llama-server binary
#
# Environment: SPECDECODE_CACHE (default ~/.cache/pytest-specdecode), LLAMA_CPP_PYTHON_VERSION
# (with LLAMA_CPP_PYTHON_SHA256, the sdist's hash, when it is not the pinned one), and
# LLAMA_BUILD_NICE: the CPU priority of the compiler alone (scripts/test passes 19, so that a build
# beside the test suite takes only what the suite leaves of the cores). The download, unpacking
# and configuring run at the caller's priority: a few seconds on an idle machine, but at nice 19
# beside the Docker engine's and the venvs' installs on a bare machine they were starved for six
# minutes before the first file was compiled.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
# The sdist of 0.3.36 as PyPI serves it, so that a build is made from the same source every time
# (the lock's rule, scripts/test-requirements.txt); another version needs its own hash.
if [ "$version" = 0.3.36 ]; then
  sha256="${LLAMA_CPP_PYTHON_SHA256:-832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e}"
else
  sha256="${LLAMA_CPP_PYTHON_SHA256:?LLAMA_CPP_PYTHON_VERSION=$version needs LLAMA_CPP_PYTHON_SHA256, the sha256 of its sdist}"
fi
nice_level="${LLAMA_BUILD_NICE:-0}"
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
  "(about 5 minutes on 2 idle cores)" >&2
if [ ! -d "$root/src" ]; then
  python3 -m pip download --require-hashes --no-deps --no-binary :all: -d "$root/sdist" \
    -r <(echo "llama-cpp-python==$version --hash=sha256:$sha256") >&2
  mkdir -p "$root/src"
  tar xzf "$root/sdist/llama_cpp_python-$version.tar.gz" -C "$root/src" --strip-components=1
fi
src="$root/src/vendor/llama.cpp"
# Only what llama-server needs: no web UI download, no OpenSSL, no tests or examples, no warning
# flags. -O1 rather than CMake's -O3: ggml's kernels are hand-vectorised intrinsics at any level,
# no level reorders floating-point arithmetic, and the engine serves the tests' tiny models, whose
# time is the server's own work, not arithmetic; and a unity build of the C++ libraries
# (scripts/llama-server-unity.cmake says which files are left out and why). Measured on 2 idle
# cores: -O3 file by file 325 s wall, 622 s of compiler time; -O2 unity 255 s, 435 s (on a slower
# machine of the same kind: 384 s, 760 s); -O1 unity there 279 s, 553 s, and tests/llamacpp took
# 62.7 s against the -O2 binary's 62.5 s, the same binary version and accept lengths. With
# llama's core sources in the batches too (not only its models), on a third machine, built
# alternately twice each: 270 and 327 s, 534 and 640 CPU-s, against 338 and 369 s, 664 and 727.
args=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_ALL_WARNINGS=OFF
  "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG"
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
nice -n "$nice_level" cmake --build "$root/build" --target llama-server -j"$(nproc)" \
  >"$root/build.log" 2>&1 \
  || { tail -40 "$root/build.log" >&2; exit 1; }
"$binary" --version >&2
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$binary"
