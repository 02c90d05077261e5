"""The environment variables SGLang does not run with as a profile sets them: the ones it always
overwrites at startup, the ones some of its flags force, and the NCCL tuning its deterministic
mode replaces; and a port some releases refuse. A profile that sets one still loads (the value
is only ineffective); the loader turns each into a warning, so a tuned variable that never
applied is not taken for one that was measured. Kept apart from the loader because these are
facts about SGLang releases, read in their sources, not rules of the profile file.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pytest_specdecode.profiles.profile import ServerProfile, flag_groups

SGLANG_OVERWRITTEN_ENV: Mapping[str, str] = MappingProxyType(
    {
        "CUDA_DEVICE_MAX_CONNECTIONS": "SGLang 0.5.6-0.5.23 always set it to 8 at startup; there "
        "is no flag for it",
        "CUDA_MODULE_LOADING": "SGLang 0.5.6-0.5.18 always set it to AUTO at startup (0.5.19 "
        "and later leave it alone)",
    }
)
"""Variables SGLang overwrites at startup whatever the environment says (``_set_envs_and_config``
in ``srt/entrypoints/engine.py``, read in 0.5.6-0.5.23). ``NCCL_CUMEM_ENABLE`` and
``NCCL_NVLS_ENABLE`` are not among them: SGLang sets them to "0" only when they are unset, so a
profile's value is kept (unless a flag forces "1", see :data:`SGLANG_FLAG_FORCED_ENV`), and
``TORCH_NCCL_AVOID_RECORD_STREAMS`` is never set by any of these releases."""

SGLANG_FLAG_FORCED_ENV: Mapping[str, tuple[tuple[str, str], ...]] = MappingProxyType(
    {
        "--enable-symm-mem": (("NCCL_CUMEM_ENABLE", "1"), ("NCCL_NVLS_ENABLE", "1")),
        "--enable-nccl-nvls": (("NCCL_NVLS_ENABLE", "1"),),
    }
)
"""Flags with which SGLang overwrites a variable even when it is set."""

SGLANG_DETERMINISTIC_NCCL = ("NCCL_ALGO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")
"""With ``--enable-deterministic-inference`` and tp_size > 1 SGLang overwrites ``NCCL_ALGO``
with ``allreduce:tree`` (0.5.6-0.5.23) and both channel counts with 8 (0.5.18 and later,
``SGLANG_DETERMINISTIC_NCCL_NCHANNELS``): two of the seed's six tuned variables."""


def sglang_env_warnings(
    profile: ServerProfile, env_origin: Mapping[str, str] | None = None
) -> list[str]:
    """What a profile's environment sets that SGLang will not run with, one line each.

    ``env_origin`` names where each variable was written (``file [env.NAME]``): a variable that
    is ineffective whatever the profile is then reported at that line, in the same words for
    every profile and target that inherits it, so the loader can say it once."""
    warnings = []
    where = profile.source
    origin = env_origin or {}
    for var, value in profile.env.items():
        if var in SGLANG_OVERWRITTEN_ENV:
            warnings.append(
                f"{origin.get(var, where)}: {var} = {value!r} has no effect: "
                f"{SGLANG_OVERWRITTEN_ENV[var]}"
            )
    flags = {flag for flag, _ in flag_groups(profile.extra_args)}
    for flag, forced in SGLANG_FLAG_FORCED_ENV.items():
        for var, value in forced:
            if flag in flags and var in profile.env and profile.env[var] != value:
                warnings.append(
                    f"{where}: {var} = {profile.env[var]!r} has no effect: with {flag} SGLang "
                    f"sets {var}={value}"
                )
    if "--enable-deterministic-inference" in flags and profile.tp_size > 1:
        lost = [var for var in SGLANG_DETERMINISTIC_NCCL if var in profile.env]
        if lost:
            warnings.append(
                f"{where}: with --enable-deterministic-inference and tp_size {profile.tp_size} "
                f"SGLang overwrites {', '.join(lost)} (NCCL_ALGO=allreduce:tree in every "
                "release; NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS=8 from 0.5.18 on), so the "
                "profile's values do not apply"
            )
    if profile.port is not None and profile.port > 55535:
        warnings.append(
            f"{where}: port = {profile.port}: SGLang 0.5.11-0.5.15 derive a gRPC port "
            f"port + 10000 and refuse to start above 55535; choose a lower port"
        )
    return warnings
