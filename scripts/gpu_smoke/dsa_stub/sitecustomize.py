"""gpu-smoke: let SGLang 0.5.15 capture the EAGLE draft's CUDA graphs without nvidia-cutlass-dsl.

SGLang 0.5.15's ``EAGLEWorkerV2._capture_cuda_graphs`` imports
``sglang.srt.layers.attention.dsa_backend`` on CUDA only to list ``DeepseekSparseAttnBackend``
among the backends whose draft-extend step can be graphed (an ``isinstance`` check). That module
imports the DeepSeek sparse-attention kernels, which import ``cutlass`` (nvidia-cutlass-dsl:
its two library wheels are 153 MB, more than a device call carries). The rig's Llama target and
EAGLE3 heads run the triton backend and never touch DSA, so when ``cutlass`` is absent this
hook serves a stand-in module whose two classes match nothing in that check and refuse to be
built. When ``cutlass`` is installed it does nothing and the real module loads.

It reaches every SGLang process because scripts/gpu-smoke puts this folder first on PYTHONPATH.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

_NAME = "sglang.srt.layers.attention.dsa_backend"


class _Refused:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "gpu-smoke stand-in: the DeepSeek sparse-attention backend needs nvidia-cutlass-dsl, "
            "which this machine does not have (scripts/gpu_smoke/dsa_stub)"
        )


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = "gpu-smoke stand-in for SGLang's DSA backend (no nvidia-cutlass-dsl)"
        module.DeepseekSparseAttnBackend = type("DeepseekSparseAttnBackend", (_Refused,), {})
        module.DeepseekSparseAttnMultiStepBackend = type(
            "DeepseekSparseAttnMultiStepBackend", (_Refused,), {}
        )
        print("gpu-smoke: DSA backend stand-in loaded (no nvidia-cutlass-dsl)", file=sys.stderr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != _NAME or importlib.util.find_spec("cutlass") is not None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader())


sys.meta_path.insert(0, _Finder())
