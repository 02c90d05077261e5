#!/usr/bin/env bash
# Build the wheel bundle that scripts/gpu-smoke installs on a GPU machine without network:
# real SGLang 0.5.15 and what its launch path imports that the machine's image lacks.
#
#   scripts/gpu_smoke/fetch-wheels.sh [DIR]      # default: .whl/ in the repository root
#
# Run it on a machine that reaches PyPI (any OS with Python 3 and pip; the wheels are for
# CPython 3.12 on x86-64 Linux). Target image: Python 3.12, torch 2.11.0 (CUDA 13), triton
# 3.6.0, numpy, safetensors, huggingface_hub, httpx, uvloop, aiohttp, pillow, psutil, requests,
# pyyaml, regex, jinja2, sentencepiece, tiktoken, prometheus-client, scipy, einops, ninja,
# cuda-bindings, nvidia-ml-py, pytest and pytest-benchmark already installed (the lent H200
# image: /work/.library/device/KINDS.md). Its typing_extensions is kept.
#
# Versions: SGLang's own pins where it pins (transformers 5.12.1, openai 2.6.1,
# apache-tvm-ffi 0.1.11, sglang-kernel 0.4.4, flashinfer 0.6.12, soundfile 0.13.1); otherwise the
# newest release before sglang 0.5.15 (2026-07-10). tokenizers 0.22.2 because transformers
# 5.12.1 refuses the image's 0.23.2 at import (it wants <=0.23.0, and 0.23.0 final does not exist).
# The list was found by importing the launch path's modules (launch_server, http_server,
# scheduler, tokenizer/detokenizer managers, model_runner, llama, llama_eagle3, eagle_worker_v2,
# triton backend) and adding what each ImportError named; docs/gpu-smoke.md has the details.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dest=${1:-$repo/.whl}
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
py=${PYTHON:-python3}

platforms=()
for n in 39 38 37 36 35 34 33 32 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform any)

wheels=(
  # SGLang and its compiled parts (cut below)
  sglang==0.5.15 sglang-kernel==0.4.4 flashinfer-python==0.6.12 apache-tvm-ffi==0.1.11
  transformers==5.12.1 tokenizers==0.22.2
  # the HTTP server
  fastapi==0.139.0 starlette==1.3.1 uvicorn==0.51.0 python-multipart==0.0.32
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  # IPC, serialisation, process titles
  pyzmq==27.1.0 orjson==3.11.9 msgspec==0.21.1 pybase64==1.4.3 setproctitle==1.3.7 dill==0.4.1
  # imported at module level by the OpenAI-compatible routes and sglang/utils.py
  openai==2.6.1 distro==1.9.0 sniffio==1.3.1 partial-json-parser==0.2.1.1.post7
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.6.3
  soundfile==0.13.1 cffi==2.1.0
  ipython==9.15.0 traitlets==5.15.1 decorator==5.3.1 prompt-toolkit==3.0.52 wcwidth==0.8.2
  stack-data==0.6.3 executing==2.2.1 asttokens==3.0.1 pure-eval==0.2.3
  # model loading and quantisation configs
  gguf==0.19.0 compressed-tensors==0.17.1 loguru==0.7.3
)

"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$raw" "${wheels[@]}"

mkdir -p "$dest"
rm -f "$dest"/*.whl
for w in "$raw"/*.whl; do
  case "$(basename "$w")" in
    sglang_kernel-*)
      "$py" "$here/repack.py" "$w" "$dest" --drop 'sgl_kernel/flash_ops*.so' \
        --drop 'sgl_kernel/sm100/*' --drop 'sgl_kernel/flashmla_ops*.so' ;;
    flashinfer_python-*)
      d=flashinfer/data
      # CCCL stays whole: a partial copy mixes with the CUDA toolkit's own and fails to compile
      "$py" "$here/repack.py" "$w" "$dest" --drop "$d/cutlass/*" --drop "$d/spdlog/*" \
        --drop "$d/csrc/*" \
        --keep-includes "$d/include;$d/csrc:$d/csrc/norm.cu,$d/csrc/flashinfer_norm_binding.cu" ;;
    sglang-*)
      "$py" "$here/repack.py" "$w" "$dest" --drop 'sglang/srt/grpc/_core*.so' \
        --drop 'sglang/multimodal_gen/*' --drop 'sglang/test/*' ;;
    *) cp "$w" "$dest/" ;;
  esac
done
du -ch "$dest"/*.whl | tail -1
