"""``python -m pytest_specdecode init``: a performance suite of one's own, written in one go.

:func:`write_suite` writes a profile file for one model (with an EAGLE3 draft or without, a TP
size and an NCCL set), every key commented, with a ``[targets.sim]`` overlay so the suite runs
on a laptop at once, and one marked test. Outside the default ``perf_tests/`` it also writes a
``pytest.ini`` beside them, because the plugin finds ``perf_tests/specdecode.toml`` by itself
but no other path.

Nothing a user wrote is lost: when any of the files exists already, nothing is written and the
error names each one.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.profiles.fields import ENV_NAME_PATTERN
from pytest_specdecode.profiles.loader import load_profiles

ALGORITHMS = ("eagle3", "none")
DEFAULT_DIRECTORY = Path("perf_tests")
PROFILE_FILE = "specdecode.toml"
TEST_FILE = "test_perf.py"
INI_FILE = "pytest.ini"
WORKLOAD = "nightly"
"""The suite's workload table: not a built-in name, so it replaces none."""
STARTUP_TIMEOUT = 1800
"""Seconds a launch may take to become ready; the seed's TP8 Kimi-K2.5 took about 900."""


@dataclass(frozen=True)
class SuiteSpec:
    """What ``init`` was asked for."""

    model: str
    draft_model: str | None = None
    algorithm: str = "eagle3"
    tp: int = 1
    steps: int = 2
    nccl: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise ConfigError("--model is empty: give the model's path or Hugging Face id")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"--algorithm {self.algorithm!r} is not one of {', '.join(ALGORITHMS)}"
            )
        if self.algorithm == "eagle3" and not self.draft_model:
            raise ConfigError(
                "--algorithm eagle3 needs --draft-model (the EAGLE3 draft's path or id); "
                "or pass --algorithm none for a suite without speculation"
            )
        if self.algorithm == "none" and self.draft_model:
            raise ConfigError(
                f"--draft-model {self.draft_model!r} is given with --algorithm none; drop one"
            )
        if self.tp < 1:
            raise ConfigError(f"--tp {self.tp} must be 1 or more (the tensor parallel size)")
        if not 1 <= self.steps <= 16:
            raise ConfigError(f"--steps {self.steps} must be 1 to 16 (EAGLE3 draft steps)")
        for name in self.nccl:
            if not ENV_NAME_PATTERN.match(name):
                raise ConfigError(
                    f"--nccl {name}=...: {name!r} is not an environment variable name "
                    "(letters, digits and underscores, not starting with a digit)"
                )

    @property
    def profile(self) -> str:
        """The profile's name, e.g. ``eagle3-2step-nccl`` (as the example suite names them)."""
        name = f"eagle3-{self.steps}step" if self.algorithm == "eagle3" else "nospec"
        return name + ("-nccl" if self.nccl else "")


def parse_env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["NCCL_PROTO=LL", ...]`` as a mapping; a pair without ``=`` or given twice is refused."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigError(f"--nccl {pair!r} is not KEY=VALUE, e.g. --nccl NCCL_PROTO=LL")
        if name in env:
            raise ConfigError(f"--nccl {name} is given twice ({env[name]!r} and {value!r})")
        env[name] = value
    return env


def _toml(value: str) -> str:
    """A TOML basic string (JSON's escaping is TOML's for these characters)."""
    return json.dumps(value, ensure_ascii=False)


_PROFILE_TEMPLATE = """\
# Server profiles of this performance suite (pytest-specdecode), written by
# `python -m pytest_specdecode init`. Edit freely: nothing rewrites this file.
#
# A profile is [defaults], then its own [profiles.NAME] table, then - when a target other than
# the real one runs - its [targets.NAME] overlay. Everything that changes speed (model, draft,
# tp_size, the speculative settings, extra_args, the env set's variables, the number of GPUs,
# simulated or not) is in the profile's fingerprint: a baseline recorded under another one is
# never compared silently. The full list of keys: perf_tests/specdecode.toml of pytest-specdecode.

[defaults]
# launcher: "sglang" (python -m sglang.launch_server), "docker", "sim" or "llamacpp"
launcher = "sglang"
host = "127.0.0.1"           # where the server listens
startup_timeout = {startup_timeout}       # seconds until a loading server is declared failed
warmup_requests = 2          # short requests after readiness, before anything is measured
# The sglang launcher's interpreter, the one with SGLang installed (default: pytest's own):
# python = "/opt/sglang/bin/python"
# port = 30000               # default: a free port at each launch
# gpus = [0, 1, 2, 3]        # GPU indices or a count (default: the first tp_size GPUs)
# api_key_env = "SGLANG_API_KEY"   # NAME of a variable holding the server's API key

# Environment sets: variables the server gets (strings). NCCL variables exported in your shell
# are NOT passed on unless a set names them, so the profile alone decides how NCCL is tuned.
{env_table}
[profiles.{profile}]
# description: free text, shown in reports
description = {description}
model_path = {model_path}   # SGLang's --model-path
tp_size = {tp}                  # tensor parallel size (--tp-size)
{env_line}               # the env set(s) this profile runs with, merged in order
# Other SGLang flags, e.g. ["--trust-remote-code"]; flags a key above sets are refused here.
extra_args = []
# mem_fraction_static = 0.88 # --mem-fraction-static, 0 < x < 1

{speculative}
# The simulated SGLang server: the same flags and API, no GPU, every figure labelled simulated.
# Chosen when no GPU is found, or with --specdecode-target sim. Its baselines never mix with
# the real ones (the fingerprint differs).
[targets.sim]
launcher = "sim"             # python -m pytest_specdecode.sim, in pytest's interpreter
gpus = []                    # no GPUs to reserve
extra_args = ["--sim-speed", "10", "--sim-load-seconds", "2"]   # appended: 10x faster, quick load
startup_timeout = 60         # the simulated load takes 2 s

# What the test sends (every workload key: docs/workloads.md of pytest-specdecode). A name of
# your own: a [workloads.NAME] named like a built-in (default, seed, batch8, code, ...) would
# replace it, and the plugin warns.
[workloads.{workload}]
base = "default"             # the built-in workload the keys below change
prompt_set = "mixed"         # code, math, chat, summarization or mixed (one of each per 4 requests)
# prompts = ["Write a ..."]  # or your own prompt texts instead of prompt_set
max_new_tokens = 256         # tokens generated per request
temperature = 0.0            # 0: greedy, the same tokens every run
ignore_eos = true            # always generate max_new_tokens
concurrency = 1              # requests in flight at once
requests_per_run = 4         # requests per measured run (a run is one sample)
warmup_requests = 2          # requests sent before the runs of each test
flush_cache = true           # flush the server's prefix cache before each run
api = "generate-stream"      # generate, generate-stream, completions or completions-stream
"""
"""The profile file, filled in by :func:`profile_text` (``str.format`` fields)."""

_EAGLE3_TABLE = """\
# speculative: the draft and its shape (SGLang's --speculative-* flags). With eagle_topk = 1
# SGLang takes num_draft_tokens = num_steps + 1. Leave the table out for no speculation.
[profiles.{profile}.speculative]
algorithm = "EAGLE3"                # EAGLE, EAGLE3, NEXTN, STANDALONE or NGRAM
draft_model_path = {draft_model_path}   # the draft model
num_steps = {steps}                       # draft steps per verify
eagle_topk = 1                      # branches per step
num_draft_tokens = {draft_tokens}                # tokens verified per step
"""
"""The profile's ``speculative`` table for an EAGLE3 draft (``str.format`` fields)."""

_NO_SPECULATION = (
    "# speculative: none. Add a [profiles.NAME.speculative] table (algorithm,\n"
    "# draft_model_path, num_steps, eagle_topk, num_draft_tokens) for a speculative one.\n"
)


def profile_text(spec: SuiteSpec) -> str:
    """The text of the profile file."""
    return _PROFILE_TEMPLATE.format(
        startup_timeout=STARTUP_TIMEOUT,
        env_table=_env_table(spec.nccl),
        profile=spec.profile,
        description=_toml(_description(spec)),
        model_path=_toml(spec.model),
        tp=spec.tp,
        env_line='env = "nccl"' if spec.nccl else '# env = "nccl"',
        speculative=_speculative_table(spec),
        workload=WORKLOAD,
    )


def _env_table(nccl: Mapping[str, str]) -> str:
    """The ``[env.nccl]`` set: the variables asked for, or commented examples."""
    if nccl:
        return "[env.nccl]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in nccl.items())
    return '[env.nccl]\n# NCCL_PROTO = "LL"\n# NCCL_ALGO = "Ring"\n'


def _speculative_table(spec: SuiteSpec) -> str:
    """The profile's ``speculative`` table, or a comment on how to add one."""
    if spec.algorithm != "eagle3":
        return _NO_SPECULATION
    assert spec.draft_model is not None  # SuiteSpec checks it
    return _EAGLE3_TABLE.format(
        profile=spec.profile,
        draft_model_path=_toml(spec.draft_model),
        steps=spec.steps,
        draft_tokens=spec.steps + 1,
    )


def _description(spec: SuiteSpec) -> str:
    """The profile's description: model, TP size, speculation and NCCL tuning."""
    what = f"EAGLE3 {spec.steps}-step" if spec.algorithm == "eagle3" else "no speculation"
    nccl_text = ", NCCL tuned" if spec.nccl else ""
    return f"{spec.model} at TP{spec.tp}, {what}{nccl_text}"


def suite_test_text(spec: SuiteSpec) -> str:
    """The text of the one marked test."""
    margins = "tok_s=-0.03" + (", accept_length=-0.05" if spec.algorithm == "eagle3" else "")
    accept = (
        ",\n    and its accept length at most 5% shorter (the early warning of a broken draft)"
        if spec.algorithm == "eagle3"
        else ""
    )
    name = spec.profile.replace("-", "_")
    return f'''\
"""Performance tests of {spec.model} (pytest-specdecode).

Each test names a server profile of specdecode.toml; the plugin starts that server (or reuses
it), measures repeated runs and compares them with the test's stored baseline. Margins are
signed fractions: tok_s=-0.03 means "at most 3% slower than the baseline"; +0.05 would mean
"at least 5% faster". Record the baselines first: pytest --update-baselines.
"""

import pytest


@pytest.mark.specdecode(
    "{spec.profile}",  # the profile of specdecode.toml
    workload="{WORKLOAD}",  # its [workloads.{WORKLOAD}] table
    {margins},
)
def test_{name}():
    """At most 3% slower than its baseline{accept}."""
'''


INI_TEXT = f"""\
# Written by `python -m pytest_specdecode init`: where pytest-specdecode finds this suite's
# profile file and keeps its baselines when pytest runs this directory (`pytest DIR`).
[pytest]
specdecode_config = {PROFILE_FILE}
specdecode_baselines = baselines
"""


def suite_files(directory: Path, spec: SuiteSpec, *, default_place: bool) -> dict[Path, str]:
    """The files ``init`` writes and their text; ``default_place``: ``directory`` is
    ``perf_tests/`` of the project root, found without an ini file."""
    files = {
        directory / PROFILE_FILE: profile_text(spec),
        directory / TEST_FILE: suite_test_text(spec),
    }
    if not default_place:
        files[directory / INI_FILE] = INI_TEXT
    return files


def write_suite(directory: Path, spec: SuiteSpec, *, default_place: bool) -> list[Path]:
    """Write the suite; refuse, writing nothing, if any of its files exists or the profile file
    would not load (a value the loader refuses, such as a secret-looking variable)."""
    files = suite_files(directory, spec, default_place=default_place)
    with tempfile.TemporaryDirectory() as scratch:
        trial = Path(scratch) / PROFILE_FILE
        trial.write_text(files[directory / PROFILE_FILE], encoding="utf-8")
        try:
            load_profiles(trial)
        except ConfigError as exc:  # named after the scratch file: say what was asked instead
            problem = str(exc).replace(str(trial), "the profile file asked for")
            raise ConfigError(f"{problem}; nothing was written") from None
    existing = [path for path in files if path.exists() or path.is_symlink()]
    if existing:
        raise ConfigError(
            f"{', '.join(map(str, existing))} already exist{'s' if len(existing) == 1 else ''}; "
            "init never overwrites a file, so nothing was written. Give another directory "
            "(python -m pytest_specdecode init DIR), or move the file(s) away"
        )
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory} is a file, not a directory; give another DIR")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for path, text in files.items():
        with path.open("x", encoding="utf-8") as handle:  # "x": never replaces a file
            handle.write(text)
        written.append(path)
    return written


def ini_needed(directory: Path, cwd: Path) -> bool:
    """Whether ``directory`` needs its own ini: anything but ``perf_tests/`` under ``cwd``."""
    return directory.resolve() != (cwd / DEFAULT_DIRECTORY).resolve()
