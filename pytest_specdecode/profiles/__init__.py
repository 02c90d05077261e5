"""What a server IS: the profile file (TOML) → frozen :class:`ServerProfile`s.

``profile`` holds the types and everything derived from one profile (argv, environment,
fingerprint, the arguments a running server must report); ``loader`` reads and validates the
file; ``fields`` checks the value of each profile key; ``values`` checks single TOML values;
``sglang_env`` names the variables SGLang overwrites; ``llamacpp`` is llama.cpp's half of a
profile; ``kinds/`` is what differs between the launchers, one module a kind.
"""

from __future__ import annotations

from pytest_specdecode.profiles.loader import load_profiles
from pytest_specdecode.profiles.profile import ALGORITHM_MARKERS, ProfileFile, ServerProfile

__all__ = ["ALGORITHM_MARKERS", "ProfileFile", "ServerProfile", "load_profiles"]
