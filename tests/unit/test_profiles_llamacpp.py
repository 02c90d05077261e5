"""llama.cpp profiles (``launcher = "llamacpp"``): keys, validation, command line, markers,
environment, binary resolution and the fingerprint with the GGUF files' hashes."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.profiles import (
    ALGORITHM_MARKERS,
    ProfileFile,
    ServerProfile,
    llamacpp,
    load_profiles,
)
from pytest_specdecode.profiles.llamacpp import LlamaCppSpeculative, file_sha256, resolve_binary
from pytest_specdecode.servers.factory import make_launcher


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """Stand-in GGUF files (the fingerprint only hashes them)."""
    directory = tmp_path / "models"
    directory.mkdir()
    for name in ("target.gguf", "eagle3.gguf", "draft.gguf"):
        (directory / name).write_bytes(f"GGUF {name}".encode())
    return directory


@pytest.fixture
def fake_binary(tmp_path: Path) -> Path:
    """A 'llama-server' that answers --version like the real one."""
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text(
        "#!/bin/sh\necho 'version: 0.5.0-dev (build 1, commit 0c1e570)' >&2\n"
        "echo 'built with GNU 12.2.0 for Linux x86_64' >&2\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def load(tmp_path: Path, text: str, target: str = "real") -> ProfileFile:
    path = tmp_path / "specdecode.toml"
    path.write_text(text, encoding="utf-8")
    return load_profiles(path, target=target)


def error_of(tmp_path: Path, text: str, target: str = "real") -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, target)
    message = str(info.value)
    assert str(tmp_path / "specdecode.toml") in message, "every profile-file error names the file"
    return message


def llama_profile(tmp_path: Path, models: Path, body: str = "", name: str = "p") -> ServerProfile:
    text = f"""
[profiles.{name}]
launcher = "llamacpp"
model_path = "{models}/target.gguf"
{body}
"""
    return load(tmp_path, text).profiles[name]


EAGLE3 = (
    'speculative = {{ algorithm = "draft-eagle3", draft_model_path = "{m}/eagle3.gguf", '
    "draft_n_max = 4 }}"
)


def test_a_llamacpp_profile_builds_the_llama_server_command(tmp_path: Path, models: Path) -> None:
    p = llama_profile(
        tmp_path,
        models,
        "threads = 2\nctx_size = 1024\nparallel = 1\n"
        'extra_args = ["--spec-synth-rates", "0.9,0.7"]\n' + EAGLE3.format(m=models),
    )
    assert p.launcher == "llamacpp"
    assert p.speculative is None  # SGLang's table; llama.cpp's lives in p.llamacpp
    assert p.llamacpp is not None
    assert p.llamacpp.speculative == LlamaCppSpeculative(
        "draft-eagle3", f"{models}/eagle3.gguf", draft_n_max=4
    )
    assert p.gpus == ()
    assert p.algorithm_marker == "eagle3"
    assert not p.simulated
    assert p.launch_argv(host="127.0.0.1", port=18080, binary="/opt/llama-server") == [
        "/opt/llama-server", "--model", f"{models}/target.gguf", "--host", "127.0.0.1",
        "--port", "18080", "--metrics", "-t", "2", "-c", "1024", "-np", "1",
        "--spec-type", "draft-eagle3", "-md", f"{models}/eagle3.gguf",
        "--spec-draft-n-max", "4", "--spec-synth-rates", "0.9,0.7",
    ]  # fmt: skip
    plain = llama_profile(tmp_path, models)
    assert plain.algorithm_marker == "nospec"
    assert plain.launch_argv(host="h", port=1) == [
        "llama-server", "--model", f"{models}/target.gguf", "--host", "h", "--port", "1",
        "--metrics",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("spec_type", "marker"),
    [
        ("draft-eagle3", "eagle3"),
        ("draft-simple", "standalone"),
        ("draft-mtp", "nextn"),
        ("ngram-simple", "ngram"),
        ("ngram-map-k", "ngram"),
        ("ngram-map-k4v", "ngram"),
        ("ngram-mod", "ngram"),
        ("ngram-cache", "ngram"),
    ],
)
def test_spec_types_map_to_the_registered_markers(
    tmp_path: Path, models: Path, spec_type: str, marker: str
) -> None:
    draft = f', draft_model_path = "{models}/draft.gguf"' if spec_type.startswith("draft-") else ""
    if spec_type == "draft-mtp":
        draft = ""
    p = llama_profile(tmp_path, models, f'speculative = {{ algorithm = "{spec_type}"{draft} }}')
    assert p.algorithm_marker == marker
    assert marker in ALGORITHM_MARKERS
    assert set(llamacpp.SPEC_TYPES.values()) <= set(ALGORITHM_MARKERS)


def test_the_environment_drops_inherited_llama_arg_variables(tmp_path: Path, models: Path) -> None:
    text = f"""
[env.cpu]
LLAMA_ARG_BATCH = "512"
OMP_PROC_BIND = "true"

[profiles.p]
launcher = "llamacpp"
model_path = "{models}/target.gguf"
env = "cpu"
"""
    p = load(tmp_path, text).profiles["p"]
    env = p.launch_env({"PATH": "/bin", "LLAMA_ARG_THREADS": "64", "NCCL_ALGO": "Tree"})
    assert env["LLAMA_ARG_BATCH"] == "512"
    assert "LLAMA_ARG_THREADS" not in env  # the shell must not change the server silently
    assert "NCCL_ALGO" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # no gpus: a CUDA build sees none
    assert env["PATH"] == "/bin"
    gpu = llama_profile(tmp_path, models, "gpus = [1]")
    assert gpu.launch_env({})["CUDA_VISIBLE_DEVICES"] == "1"


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("tp_size = 2", "tp_size = 2 (an integer) is not allowed: it is an SGLang setting"),
        ('image = "x"', "image = 'x' (a string) is not allowed: it is an SGLang setting"),
        ("threads = 0", "threads = 0 (an integer) is not allowed: must be an integer >= 1"),
        ('parallel = "2"', "parallel = '2' (a string) is not allowed: must be an integer >= 1"),
        (
            'speculative = { algorithm = "EAGLE3", draft_model_path = "/d" }',
            "speculative.algorithm = 'EAGLE3' (a string) is not allowed: SGLang's names do not "
            "apply to launcher 'llamacpp': EAGLE3 is 'draft-eagle3', STANDALONE is "
            "'draft-simple', NGRAM is one of the ngram-* types; choose one of draft-eagle3, "
            "draft-simple, draft-mtp, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, "
            "ngram-cache",
        ),
        (
            'speculative = { algorithm = "none" }',
            "(for no speculation leave speculative out)",
        ),
        (
            'speculative = { algorithm = "draft-dflash" }',
            "speculative.algorithm = 'draft-dflash' (a string) is not allowed: must be one of",
        ),
        (
            'speculative = { algorithm = "draft-eagle3" }',
            "speculative.algorithm = 'draft-eagle3' needs draft_model_path (the draft GGUF, -md)",
        ),
        (
            'speculative = { algorithm = "ngram-simple", draft_model_path = "/d.gguf" }',
            "speculative.draft_model_path = '/d.gguf' does not apply to algorithm = "
            "'ngram-simple', which drafts without a draft model; remove it",
        ),
        (
            'speculative = { algorithm = "draft-simple", draft_model_path = "/d", num_steps = 2 }',
            "speculative sets num_steps, which are SGLang settings; llama-server drafts up to "
            "draft_n_max tokens per step",
        ),
        (
            'speculative = { algorithm = "ngram-mod", draft_n_max = 2, draft_n_min = 3 }',
            "speculative.draft_n_min = 3 is above draft_n_max = 2; llama-server would never draft",
        ),
        (
            'speculative = { algorithm = "ngram-mod", draft_n_maximum = 2 }',
            "unknown key of speculative 'draft_n_maximum' (did you mean 'draft_n_max'?)",
        ),
        (
            'extra_args = ["-t", "4"]',
            "extra_args contains '-t', which sets what threads sets; use the key threads instead",
        ),
        (
            'extra_args = ["-md", "/x.gguf"]',
            "extra_args contains '-md', which sets what speculative.draft_model_path sets",
        ),
        ('extra_args = ["--spec-type", "ngram-mod"]', "sets what speculative.algorithm sets"),
        ('extra_args = ["-hf", "org/model"]', "extra_args contains '-hf', which sets what "),
        (
            'extra_args = ["--metrics"]',
            "extra_args contains '--metrics', which sets what (nothing: the launcher always "
            "passes --metrics) sets; use nothing: the launcher always passes it instead",
        ),
        ('extra_args = ["--port", "8080"]', "use the key port instead"),
        ('extra_args = ["--api-key", "k"]', 'use api_key_env = "NAME_OF_AN_ENVIRONMENT'),
        ('extra_args = ["--sim-speed", "4"]', "a knob of the simulated SGLang server"),
    ],
)
def test_llamacpp_profile_errors(tmp_path: Path, models: Path, body: str, expected: str) -> None:
    text = f'[profiles.p]\nlauncher = "llamacpp"\nmodel_path = "{models}/t.gguf"\n{body}\n'
    message = error_of(tmp_path, text)
    assert "[profiles.p]" in message
    assert expected in message


def test_llamacpp_keys_are_refused_on_sglang_profiles(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[profiles.p]\nmodel_path = "/m"\nthreads = 4\n')
    assert 'threads = 4 (an integer) is not allowed: it is a key of launcher "llamacpp"' in message
    message = error_of(
        tmp_path,
        '[profiles.p]\nmodel_path = "/m"\nspeculative = { algorithm = "draft-eagle3" }\n',
    )
    assert "that is a llama.cpp --spec-type; set launcher = " in message


def test_defaults_shared_by_both_kinds_apply_where_they_mean_something(
    tmp_path: Path, models: Path
) -> None:
    text = f"""
[defaults]
tp_size = 8
mem_fraction_static = 0.88
threads = 2
warmup_requests = 1

[profiles.sglang]
model_path = "/models/kimi"

[profiles.cpu]
launcher = "llamacpp"
model_path = "{models}/target.gguf"
"""
    loaded = load(tmp_path, text)
    sglang, cpu = loaded.profiles["sglang"], loaded.profiles["cpu"]
    assert (sglang.tp_size, sglang.mem_fraction_static, sglang.llamacpp) == (8, 0.88, None)
    assert sglang.warmup_requests == cpu.warmup_requests == 1
    assert cpu.llamacpp is not None
    assert cpu.llamacpp.threads == 2
    assert (cpu.tp_size, cpu.mem_fraction_static) == (1, None)


def test_targets_do_not_apply_to_llamacpp_profiles(tmp_path: Path, models: Path) -> None:
    text = f"""
[profiles.cpu]
launcher = "llamacpp"
model_path = "{models}/target.gguf"
threads = 2

[profiles.gpu]
model_path = "/models/kimi"

[targets.sim]
launcher = "sim"
gpus = []
extra_args = ["--sim-speed", "4"]
startup_timeout = 60
"""
    real, sim = load(tmp_path, text), load(tmp_path, text, target="sim")
    assert sim.profiles["gpu"].launcher == "sim"
    cpu = sim.profiles["cpu"]
    assert cpu.launcher == "llamacpp"
    assert cpu.extra_args == ()
    assert cpu.startup_timeout == real.profiles["cpu"].startup_timeout
    assert cpu.fingerprint().digest == real.profiles["cpu"].fingerprint().digest


def test_llamacpp_is_not_a_target(tmp_path: Path) -> None:
    message = error_of(
        tmp_path, '[profiles.p]\nmodel_path = "/m"\n[targets.cpu]\nlauncher = "llamacpp"\n'
    )
    assert "[targets.cpu]" in message
    assert 'launcher = "llamacpp" cannot be a target' in message


# --- fingerprint ------------------------------------------------------------------------------


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_fingerprint_hashes_the_models_and_holds_every_speed_setting(
    tmp_path: Path, models: Path, fake_binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(llamacpp.BINARY_ENV, str(fake_binary))
    p = llama_profile(
        tmp_path, models, "threads = 2\nctx_size = 1024\nparallel = 1\n" + EAGLE3.format(m=models)
    )
    fp = p.fingerprint()
    assert fp.hard == {
        "launcher_class": "llamacpp",
        "model_sha256": sha(models / "target.gguf"),
        "speculative_type": "draft-eagle3",
        "speculative_draft_model_sha256": sha(models / "eagle3.gguf"),
        "speculative_draft_n_max": 4,
        "speculative_draft_n_min": None,
        "threads": 2,
        "ctx_size": 1024,
        "parallel": 1,
        "gpu_count": 0,
        "extra_args": [],
        "env": {},
    }
    assert fp.soft == {
        "launcher": "llamacpp",
        "model_path": f"{models}/target.gguf",
        "speculative_draft_model_path": f"{models}/eagle3.gguf",
        "binary": str(fake_binary),
        "llamacpp_build": "version: 0.5.0-dev (build 1, commit 0c1e570)",
    }
    fewer_threads = llama_profile(
        tmp_path, models, "threads = 1\nctx_size = 1024\nparallel = 1\n" + EAGLE3.format(m=models)
    )
    assert fewer_threads.fingerprint().digest != fp.digest


def test_a_moved_model_is_the_same_model_and_a_changed_one_is_not(
    tmp_path: Path, models: Path
) -> None:
    before = llama_profile(tmp_path, models).fingerprint()
    moved = tmp_path / "moved"
    models.rename(moved)
    assert llama_profile(tmp_path, moved).fingerprint().digest == before.digest
    (moved / "target.gguf").write_bytes(b"GGUF requantised")
    after = llama_profile(tmp_path, moved).fingerprint()
    assert after.hard["model_sha256"] == sha(moved / "target.gguf")
    assert after.digest != before.digest
    assert [d.name for d in before.diff(after).hard] == ["model_sha256"]


def test_a_missing_model_file_is_a_clear_error(tmp_path: Path, models: Path) -> None:
    p = llama_profile(tmp_path, models, 'speculative = { algorithm = "draft-simple", '
                      f'draft_model_path = "{models}/missing.gguf" }}')  # fmt: skip
    with pytest.raises(ConfigError) as info:
        p.fingerprint()
    assert str(info.value) == (
        f"{tmp_path}/specdecode.toml [profiles.p]: speculative.draft_model_path = "
        f"'{models}/missing.gguf' cannot be read (No such file or directory): the fingerprint "
        "hashes the GGUF file, so that a baseline is never compared with another model; fix "
        "the path (relative paths are taken from the directory pytest runs in)"
    )
    with pytest.raises(ConfigError, match=r"model_path = '/' cannot be read \(it is not a file\)"):
        file_sha256("/", what="model_path", source="x")


def test_each_model_file_is_hashed_once_per_process(
    tmp_path: Path, models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = models / "draft.gguf"
    first = file_sha256(str(path), what="model_path", source="x")

    def no_reading(*args: object, **kwargs: object) -> None:
        raise AssertionError("hashed again")

    monkeypatch.setattr(Path, "open", no_reading)
    assert file_sha256(str(path), what="model_path", source="x") == first
    os.utime(path, ns=(0, 0))  # another mtime: maybe another file, so hashed again
    with pytest.raises(AssertionError, match="hashed again"):
        file_sha256(str(path), what="model_path", source="x")


# --- the binary -------------------------------------------------------------------------------


def test_the_binary_comes_from_the_profile_the_environment_or_path(
    fake_binary: Path, tmp_path: Path
) -> None:
    env = {llamacpp.BINARY_ENV: "/nowhere/llama-server", "PATH": str(fake_binary.parent)}
    assert resolve_binary(str(fake_binary), env, source="s") == str(fake_binary)
    assert resolve_binary("llama-server", env, source="s") == str(fake_binary)  # on PATH
    assert resolve_binary(None, {"PATH": str(fake_binary.parent)}, source="s") == str(fake_binary)
    env[llamacpp.BINARY_ENV] = str(fake_binary)
    assert resolve_binary(None, env, source="s") == str(fake_binary)
    with pytest.raises(ConfigError) as info:
        resolve_binary(None, {"PATH": str(tmp_path)}, source="f.toml [profiles.p]")
    assert str(info.value) == (
        'f.toml [profiles.p]: no llama-server to run: the profile sets no binary = "...", '
        "SPECDECODE_LLAMA_SERVER is not set, and there is no llama-server on PATH. Build "
        "llama.cpp (cmake --build build --target llama-server) and point one of them at it"
    )
    with pytest.raises(ConfigError, match=r"\$SPECDECODE_LLAMA_SERVER = '/x/y' is not an exec"):
        resolve_binary(None, {llamacpp.BINARY_ENV: "/x/y"}, source="s")
    with pytest.raises(ConfigError, match="binary = 'nope': there is no such program on PATH"):
        resolve_binary("nope", {"PATH": str(tmp_path)}, source="s")


def test_the_launcher_runs_the_resolved_binary_or_says_why_not(
    tmp_path: Path, models: Path, fake_binary: Path
) -> None:
    p = llama_profile(tmp_path, models)
    env = {llamacpp.BINARY_ENV: str(fake_binary), "PATH": "/usr/bin"}
    launcher = make_launcher(p, port=18080, log_path=tmp_path / "log", env=env, api_key="k")
    assert launcher.kind == "llamacpp"
    argv = launcher.argv  # type: ignore[attr-defined]
    assert argv[0] == str(fake_binary)
    assert argv[-2:] == ["--api-key", "k"]
    with pytest.raises(ConfigError, match="no llama-server to run"):
        make_launcher(p, port=18080, log_path=tmp_path / "log", env={"PATH": ""}, api_key=None)
