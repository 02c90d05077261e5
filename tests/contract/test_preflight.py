"""The preflight (``pytest_specdecode.servers.preflight``) against real SGLang argument code.

The first half runs :func:`preflight` on the argument code of real releases (0.5.6, 0.5.15,
0.5.23; see ``sglang_sources.py``): their own argparse rejects an unknown flag, a flag the
release does not have (yet, or any more) and a bad choice, with its own message, and accepts
the seed's EAGLE3 command. Everything but the argument modules is a stub there, so what
``ServerArgs.__post_init__`` makes of an accepted command says nothing about the release (0.5.6
reads a stubbed model config and refuses its "dual chunk attention"); those tests only insist
that argparse accepted it. The second half judges answers without SGLang: a missing
interpreter, one without SGLang, a hang, a crash, a fake SGLang that lacks a dependency, refuses
while resolving or resolves something else than the profile.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_specdecode.profiles.profile import ServerProfile, Speculative
from pytest_specdecode.servers import preflight as preflight_module
from pytest_specdecode.servers.preflight import PreflightResult, preflight

from .sglang_sources import RELEASES, StubbedRelease, stubbed_release, version_key, write_stub_site

SOURCE = "tests/contract/test_preflight.py"
#: The seed's server flags beside its EAGLE3 settings (tests/sim/conftest.py's SEED_FLAGS).
SEED_EXTRA = (
    "--trust-remote-code", "--num-continuous-decode-steps", "4", "--disable-custom-all-reduce",
)  # fmt: skip
#: Flags that only some of RELEASES have, with the first and last release that has each
#: (pytest_specdecode/sglang_releases.json, read from the same wheels): added in 0.5.12, and
#: removed after 0.5.19.
SPANS: dict[tuple[str, ...], tuple[str | None, str | None]] = {
    ("--detokenizer-worker-num", "2"): ("0.5.12", None),
    ("--stream-output",): (None, "0.5.19"),
}


def has_flag(version: str, flag: tuple[str, ...]) -> bool:
    first, last = SPANS[flag]
    return (first is None or version_key(version) >= version_key(first)) and (
        last is None or version_key(version) <= version_key(last)
    )


def seed_profile(*extra: str, python: str | None = None) -> ServerProfile:
    """The seed's EAGLE3 2-step configuration at TP8, plus ``extra`` flags."""
    return ServerProfile(
        name="eagle3-2step",
        model_path="/models/kimi-k2.5-int4",
        tp_size=8,
        mem_fraction_static=0.88,
        speculative=Speculative("EAGLE3", "/models/eagle3", 2, 1, 3),
        extra_args=(*SEED_EXTRA, *extra),
        python=python,
        source=SOURCE,
    )


def run_preflight(
    profile: ServerProfile, env: Mapping[str, str], *, timeout: float | None = None
) -> PreflightResult:
    """As the server pool calls it: the launch command and the launch environment."""
    argv = profile.launch_argv(host="127.0.0.1", port=30000)
    launch_env = profile.launch_env(env)
    if timeout is None:
        return preflight(profile, argv, launch_env)
    return preflight(profile, argv, launch_env, timeout=timeout)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without its Python settings, plus ``extra``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTHON")}
    env.update(extra)
    return env


def assert_rejected(result: PreflightResult, version: str, message: str) -> None:
    """Argparse of SGLang ``version`` rejected the command, saying ``message``."""
    assert result.problem is not None, result
    assert result.version == version
    pattern = rf"SGLang {re.escape(version)} \(.+\) rejects the launch command: "
    assert re.match(pattern, result.problem), result.problem
    assert message in result.problem
    assert SOURCE in result.problem  # where to fix it
    assert result.note is None


def assert_parsed(result: PreflightResult, version: str) -> None:
    """Argparse of SGLang ``version`` accepted the command: the answer is "ok" or a note of the
    environment stage. A refusal while resolving is SGLang's ``__post_init__`` meeting a stub
    (e.g. a stubbed model config), not a verdict on the command; it is the one problem that
    may come."""
    assert result.version == version, result
    if result.problem is not None:
        assert "rejects the launch command" not in result.problem
        assert "refuses the launch command while resolving it" in result.problem, result.problem
        return
    if result.note is not None:
        assert result.note.startswith(f"SGLang {version} could not resolve the arguments"), result
        assert result.fields is None
    else:
        assert result.fields is not None
        assert result.fields["speculative_algorithm"] == "EAGLE3"
        assert result.fields["speculative_num_draft_tokens"] == 3


# -- real argument code of real releases ----------------------------------------------------------


@pytest.fixture(scope="session")
def stub_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stub_site(tmp_path_factory.mktemp("sglang-stub-site"))


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest, stub_site: Path) -> StubbedRelease:
    version: str = request.param
    return stubbed_release(version, stub_site)


def test_an_unknown_flag_is_rejected_by_the_releases_argparse(release: StubbedRelease) -> None:
    result = run_preflight(seed_profile("--no-such-flag"), release.env)
    assert_rejected(result, release.version, "unrecognized arguments: --no-such-flag")


@pytest.mark.parametrize("flag", list(SPANS), ids=lambda flag: flag[0])
def test_a_flag_is_rejected_only_by_the_releases_without_it(
    release: StubbedRelease, flag: tuple[str, ...]
) -> None:
    result = run_preflight(seed_profile(*flag), release.env)
    if has_flag(release.version, flag):
        assert_parsed(result, release.version)
    else:
        assert_rejected(result, release.version, f"unrecognized arguments: {' '.join(flag)}")


@pytest.mark.parametrize("flag", list(SPANS), ids=lambda flag: flag[0])
def test_the_flag_tells_the_releases_apart(flag: tuple[str, ...]) -> None:
    """Each flag above is accepted by some of RELEASES and rejected by others."""
    assert {has_flag(version, flag) for version in RELEASES} == {True, False}


def test_a_bad_choice_is_rejected(release: StubbedRelease) -> None:
    result = run_preflight(seed_profile("--attention-backend", "nosuch"), release.env)
    assert_rejected(result, release.version, "argument --attention-backend: invalid choice: ")
    assert "nosuch" in (result.problem or "")


def test_a_bad_type_is_rejected(release: StubbedRelease) -> None:
    result = run_preflight(seed_profile("--stream-interval", "often"), release.env)
    assert_rejected(result, release.version, "argument --stream-interval: invalid int value:")


def test_the_seed_eagle3_command_passes_the_parse(release: StubbedRelease) -> None:
    assert_parsed(run_preflight(seed_profile(), release.env), release.version)


# -- judging, without SGLang --------------------------------------------------------------------


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_missing_interpreter_is_a_problem(tmp_path: Path) -> None:
    python = str(tmp_path / "no-venv" / "bin" / "python")
    result = run_preflight(seed_profile(python=python), clean_env())
    assert result.problem is not None
    assert f"the interpreter {python!r} does not exist" in result.problem
    assert "set python = in the profile" in result.problem
    assert result.version is None


def test_an_interpreter_without_sglang_is_a_problem() -> None:
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip(f"{sys.executable} has sglang installed; this test needs one without it")
    result = run_preflight(seed_profile(), clean_env(PYTHONPATH=""))
    assert result.problem is not None
    assert f"{sys.executable} cannot import SGLang" in result.problem
    assert "No module named 'sglang'" in result.problem
    assert result.version is None


def test_a_check_that_takes_too_long_is_not_decisive(tmp_path: Path) -> None:
    # exec: the killed process is the sleep itself, nothing is left behind.
    python = write_executable(tmp_path / "python", "#!/bin/sh\nexec sleep 30\n")
    result = run_preflight(seed_profile(python=str(python)), clean_env(), timeout=0.5)
    assert result == PreflightResult(
        None, note="not run: SGLang's argument check took more than 0.5s"
    )


def test_an_interpreter_that_dies_without_an_answer_is_not_decisive(tmp_path: Path) -> None:
    python = write_executable(
        tmp_path / "python", "#!/bin/sh\necho 'Segmentation fault' >&2\nexit 3\n"
    )
    result = run_preflight(seed_profile(python=str(python)), clean_env())
    assert result.problem is None
    assert result.note == f"not run: {python} exited with 3 without an answer (Segmentation fault)"


#: A stand-in for SGLang: ``FAKE_SGLANG`` says what its prepare_server_args does.
FAKE_SERVER_ARGS = """
import dataclasses
import os

if os.environ.get("FAKE_SGLANG") == "missing-dependency":
    import specdecode_no_such_dependency  # noqa: F401


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    tp_size: int
    mem_fraction_static: float
    speculative_algorithm: str
    speculative_draft_model_path: str
    speculative_num_steps: int
    speculative_eagle_topk: int
    speculative_num_draft_tokens: int
    num_continuous_decode_steps: int
    disable_custom_all_reduce: bool
    trust_remote_code: bool


def prepare_server_args(argv):
    mode = os.environ.get("FAKE_SGLANG")
    if mode == "value-error":
        raise ValueError("the derived gRPC port 70000 is above 65535")
    if mode == "device-query":
        raise RuntimeError("No CUDA GPUs are available")
    return ServerArgs(
        "/models/kimi-k2.5-int4", 8, 0.88, "EAGLE3", "/models/eagle3", 2, 1,
        4 if mode == "rewrite" else 3, 4, True, True,
    )
"""


@pytest.fixture
def fake_sglang(tmp_path: Path) -> Path:
    """A folder with a fake ``sglang`` package (version 0.5.99) for ``PYTHONPATH``."""
    package = tmp_path / "fake" / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.5.99"\n', encoding="utf-8")
    (package / "srt" / "__init__.py").write_text("", encoding="utf-8")
    (package / "srt" / "server_args.py").write_text(FAKE_SERVER_ARGS, encoding="utf-8")
    return package.parent


def test_sglang_without_a_module_its_arguments_import_is_a_problem(fake_sglang: Path) -> None:
    env = clean_env(PYTHONPATH=str(fake_sglang), FAKE_SGLANG="missing-dependency")
    result = run_preflight(seed_profile(), env)
    assert result.problem is not None
    assert "has SGLang but not the module 'specdecode_no_such_dependency'" in result.problem
    assert "the server would die of it the same way" in result.problem


def test_a_value_refused_while_resolving_is_a_problem(fake_sglang: Path) -> None:
    env = clean_env(PYTHONPATH=str(fake_sglang), FAKE_SGLANG="value-error")
    result = run_preflight(seed_profile(), env)
    assert result.version == "0.5.99"
    assert result.problem == (
        f"SGLang 0.5.99 ({sys.executable}) refuses the launch command while resolving it: "
        "ValueError: the derived gRPC port 70000 is above 65535"
    )


def test_an_environment_failure_while_resolving_is_not_decisive(fake_sglang: Path) -> None:
    env = clean_env(PYTHONPATH=str(fake_sglang), FAKE_SGLANG="device-query")
    result = run_preflight(seed_profile(), env)
    assert result == PreflightResult(
        "0.5.99",
        note="SGLang 0.5.99 could not resolve the arguments outside the server: "
        "RuntimeError: No CUDA GPUs are available",
    )


def test_a_resolution_as_written_passes_with_its_fields(fake_sglang: Path) -> None:
    env = clean_env(PYTHONPATH=str(fake_sglang), FAKE_SGLANG="as-written")
    result = run_preflight(seed_profile(), env)
    assert result.problem is None
    assert result.note is None
    assert result.fields is not None
    assert result.fields["speculative_num_draft_tokens"] == 3
    assert result.fields["version"] == "0.5.99"


def test_a_resolution_that_rewrites_the_profile_is_a_problem(fake_sglang: Path) -> None:
    env = clean_env(PYTHONPATH=str(fake_sglang), FAKE_SGLANG="rewrite")
    result = run_preflight(seed_profile(), env)
    assert result.problem is not None
    assert "would not run profile 'eagle3-2step' as written" in result.problem
    assert "speculative_num_draft_tokens: profile wants 3, server reports 4" in result.problem


def ok_answer(**fields: object) -> dict[str, Any]:
    """An "ok" answer of the preflight script for :func:`seed_profile` as written, then
    ``fields`` changed."""
    resolved: dict[str, Any] = {
        "model_path": "/models/kimi-k2.5-int4",
        "tp_size": 8,
        "mem_fraction_static": 0.88,
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/eagle3",
        "speculative_num_steps": 2,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 3,
        "num_continuous_decode_steps": 4,
        "disable_custom_all_reduce": True,
        "trust_remote_code": True,
        "version": "0.5.15",
    }
    resolved.update(fields)
    return {"stage": "ok", "version": "0.5.15", "fields": resolved}


def test_judge_an_ok_answer_as_written() -> None:
    answer = ok_answer()
    result = preflight_module._judge(seed_profile(), "/venv/bin/python", answer)
    assert result == PreflightResult("0.5.15", fields=answer["fields"])


def test_judge_a_resolution_mismatch() -> None:
    answer = ok_answer(speculative_num_draft_tokens=6, num_continuous_decode_steps=1)
    result = preflight_module._judge(seed_profile(), "/venv/bin/python", answer)
    assert result.version == "0.5.15"
    assert result.problem is not None
    assert result.problem.startswith(
        "SGLang 0.5.15 (/venv/bin/python) would not run profile 'eagle3-2step' as written "
        f"({SOURCE}): "
    )
    assert "speculative_num_draft_tokens: profile wants 3, server reports 6" in result.problem
    assert "num_continuous_decode_steps: profile wants 4, server reports 1" in result.problem
    assert result.fields == answer["fields"]


def test_judge_ignores_fields_a_release_does_not_report() -> None:
    answer = ok_answer()
    del answer["fields"]["num_continuous_decode_steps"]
    result = preflight_module._judge(seed_profile(), "/venv/bin/python", answer)
    assert result.problem is None


def test_judge_an_unexpected_answer() -> None:
    result = preflight_module._judge(seed_profile(), "/venv/bin/python", {"stage": "ok"})
    assert result.problem is None
    assert result.note is not None
    assert result.note.startswith("not run: an unexpected answer")
