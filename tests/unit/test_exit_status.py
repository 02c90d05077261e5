"""The kind of night a session was (issue 46): regressed, broken, not judged or ok, its exit
status under ``--specdecode-exit-status nightly``, and the output paths checked before any
server launches."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest
from reportdata import errored, scaled, seed_result

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.outputs.dashboard.site import MARK
from pytest_specdecode.outputs.markdown import markdown_summary
from pytest_specdecode.result import Outcome, SpecdecodeResult, TestError
from pytest_specdecode.session import start
from pytest_specdecode.session.exit_status import BROKEN, OK, REGRESSED, UNJUDGED, judge
from pytest_specdecode.settings import OPTIONS, resolve

TWO_STEP = "eagle3-2step-nccl"
CRASH = TestError(phase="setup", type="ServerStartError", cause="server 'x' exited with code -9")


def passed(profile: str = TWO_STEP) -> SpecdecodeResult:
    result = seed_result(profile)
    assert result.outcome is Outcome.PASS
    return result


def with_outcome(result: SpecdecodeResult, outcome: Outcome, **changes: object) -> SpecdecodeResult:
    return dataclasses.replace(result, outcome=outcome, **changes)  # type: ignore[arg-type]


def test_a_fail_is_the_build_regressed_and_comes_before_everything_else() -> None:
    slow = scaled(seed_result(TWO_STEP), 0.9)
    assert slow.outcome is Outcome.FAIL
    crashed = errored("nospec-nccl", CRASH)

    night = judge([slow, crashed, passed("eagle3-5step")], pytest_status=1, nightly=True)

    assert (night.kind, night.status) == (REGRESSED, 10)
    assert night.reasons[0] == "1 test FAILed (test_eagle3_2step_nccl_beats_no_speculation)"
    assert "1 test errored or crashed (test_no_speculation_nccl_tuned)" in night.reasons
    assert night.title() == "REGRESSED: the build regressed (exit status 10)"


def test_a_cross_night_alarm_is_named_as_such() -> None:
    alarmed = with_outcome(
        passed(), Outcome.FAIL, crossnight={"tok_s": {"alarm": True, "status": "alarm"}}
    )
    night = judge([alarmed], pytest_status=1, nightly=True)
    assert night.kind == REGRESSED
    assert "1 on the cross-night alarm" in night.reasons[0]


@pytest.mark.parametrize(
    ("outcome", "says"),
    [
        (Outcome.ERROR, "errored or crashed"),
        (Outcome.NO_BASELINE, "had no baseline"),
        (Outcome.MISMATCH, "had a baseline of another configuration"),
    ],
)
def test_what_the_box_or_setup_broke_is_broken(outcome: Outcome, says: str) -> None:
    result = (
        errored(TWO_STEP, CRASH) if outcome is Outcome.ERROR else with_outcome(passed(), outcome)
    )
    night = judge([result, passed("nospec-nccl")], pytest_status=1, nightly=True)
    assert (night.kind, night.status) == (BROKEN, 11)
    assert night.reasons == (f"1 test {says} (test_eagle3_2step_nccl_beats_no_speculation)",)


def test_an_output_not_written_or_a_failure_after_the_verdict_breaks_the_night() -> None:
    night = judge([passed()], pytest_status=1, problems=["could not write the history"])
    assert night.kind == BROKEN
    assert night.reasons == ("1 output(s) or baseline(s) not written",)
    late = dataclasses.replace(passed(), late_failure="launch 2 of 3 refused")
    assert judge([late], pytest_status=1).kind == BROKEN


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (2, "interrupted"),
        (3, "internal error"),
        (4, "usage error"),
        (5, "no test was collected"),
        (1, "a test failed without a verdict of pytest-specdecode"),
    ],
)
def test_pytests_own_trouble_is_broken(status: int, says: str) -> None:
    night = judge([passed()], pytest_status=status, nightly=True)
    assert (night.kind, night.status) == (BROKEN, 11)
    assert says in night.why()


def test_all_inconclusive_is_nothing_judged_and_beside_a_pass_is_ok() -> None:
    unsure = with_outcome(passed(), Outcome.INCONCLUSIVE)
    alone = judge(
        [unsure, with_outcome(passed("nospec-nccl"), Outcome.INCONCLUSIVE)],
        pytest_status=0,
        nightly=True,
    )
    assert (alone.kind, alone.status) == (UNJUDGED, 12)
    assert alone.reasons == ("2 tests INCONCLUSIVE",)

    beside = judge([unsure, passed("nospec-nccl")], pytest_status=0, nightly=True)
    assert (beside.kind, beside.status) == (OK, 0)
    assert beside.reasons == ("1 pass, 1 inconclusive",)
    # ... unless its policy failed the session (--specdecode-on-inconclusive fail)
    assert judge([unsure, passed("nospec-nccl")], pytest_status=1).kind == UNJUDGED


def test_without_the_option_pytests_status_stays_and_the_kind_is_still_said() -> None:
    night = judge([scaled(seed_result(TWO_STEP), 0.9)], pytest_status=1)
    assert (night.kind, night.status) == (REGRESSED, 1)
    assert night.title() == "REGRESSED: the build regressed"


def test_a_plugin_failing_after_the_judgement_breaks_an_ok_night_not_a_regressed_one() -> None:
    ok = judge([passed()], pytest_status=0, nightly=True)
    assert ok.after(0) is ok
    broken = ok.after(3)
    assert (broken.kind, broken.status) == (BROKEN, 11)
    assert "internal error" in broken.why()
    regressed = judge([scaled(seed_result(TWO_STEP), 0.9)], pytest_status=1, nightly=True)
    assert regressed.after(3).status == 10


def test_the_markdown_summary_says_the_kind_of_night_in_its_first_line() -> None:
    night = judge([errored(TWO_STEP, CRASH)], pytest_status=1, nightly=True)
    text = markdown_summary([errored(TWO_STEP, CRASH)], night=(night.title(), night.why()))
    first, blank, why = text.splitlines()[:3]
    assert first == "## pytest-specdecode: BROKEN: the box or the setup is broken (exit status 11)"
    assert blank == ""
    # escaped where Markdown would read emphasis; between letters an underscore stays
    assert why == "1 test errored or crashed (test_eagle3_2step_nccl_beats_no_speculation)"


def test_the_option_resolves_from_flag_env_and_ini_and_refuses_other_values(tmp_path: Path) -> None:
    def settings(cli: str | None = None, env: str | None = None, ini: str | None = None) -> str:
        return resolve(
            cli={o.name: (cli if o.name == "exit_status" else None) for o in OPTIONS},
            ini={"exit_status": ini},
            env={"PYTEST_SPECDECODE_EXIT_STATUS": env} if env else {},
            invocation_dir=tmp_path,
            ini_dir=tmp_path,
        ).exit_status

    assert settings() == "pytest"
    assert settings(ini="nightly") == "nightly"
    assert settings(env="nightly", ini="pytest") == "nightly"
    assert settings(cli="pytest", env="nightly") == "pytest"
    with pytest.raises(ConfigError) as caught:
        settings(env="oncall")
    assert str(caught.value) == (
        "invalid value 'oncall' from environment variable PYTEST_SPECDECODE_EXIT_STATUS: must "
        "be one of pytest, nightly"
    )


# --------------------------------------------------------------------------- outputs first


def check(
    tmp_path: Path, given: tuple[str, ...] = (), env: dict[str, str] | None = None, **paths: Path
) -> None:
    values = {name: str(path) for name, path in paths.items() if name != "junitxml"}
    settings = resolve(
        cli={o.name: values.get(o.name) if o.name in given else None for o in OPTIONS},
        ini={name: value for name, value in values.items() if name not in given},
        env=env or {},
        invocation_dir=tmp_path,
        ini_dir=tmp_path,
        ini_file=str(tmp_path / "pytest.ini"),
    )
    junit = paths.get("junitxml")
    start.check_outputs(
        settings,
        given=given,
        env=env or {},
        ini_file=str(tmp_path / "pytest.ini"),
        junitxml=str(junit) if junit else None,
        benchmark_json=None,
        args=[],
        base=tmp_path,
    )


@pytest.mark.parametrize("name", ["history", "report", "markdown", "html", "junitxml"])
def test_an_output_whose_folder_cannot_be_created_stops_the_session_before_it_starts(
    tmp_path: Path, name: str
) -> None:
    blocker = tmp_path / "out"
    blocker.write_text("a file where a folder should be\n")
    target = blocker / "nightly" / "thing"
    flag = "--junitxml" if name == "junitxml" else f"--specdecode-{name}"
    with pytest.raises(ConfigError) as caught:
        check(tmp_path, given=(name,), **{name: target})
    message = str(caught.value)
    what = "folder" if name == "html" else "file"
    assert message.startswith(f"{flag}: cannot write the {what} {target}: {blocker} is a file")
    assert "so nothing is launched" in message
    assert f"give a path in a folder ({flag})" in message


def test_where_the_path_came_from_is_named(tmp_path: Path) -> None:
    target = tmp_path / "history.jsonl"
    target.mkdir()  # a folder where the history file should be
    with pytest.raises(ConfigError, match=r"^ini key specdecode_history in .*pytest.ini: "):
        check(tmp_path, history=target)
    with pytest.raises(ConfigError, match=r"^environment variable PYTEST_SPECDECODE_HISTORY: "):
        check(tmp_path, env={"PYTEST_SPECDECODE_HISTORY": str(target)}, history=target)
    with pytest.raises(ConfigError) as caught:
        check(tmp_path, given=("history",), history=target)
    assert "it is a folder, not a file" in str(caught.value)


def test_writable_outputs_pass_and_leave_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "old-history.jsonl").write_text("")
    check(
        tmp_path,
        history=tmp_path / "old-history.jsonl",
        report=tmp_path / "new" / "deep" / "report.json",
        markdown=tmp_path / "summary.md",
        html=tmp_path / "site",
        junitxml=tmp_path / "junit.xml",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old-history.jsonl", "site"]
    assert list((tmp_path / "site").iterdir()) == []
    assert (tmp_path / "old-history.jsonl").read_text() == ""


def test_a_dashboard_folder_of_the_users_is_refused_and_an_earlier_dashboard_is_not(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "notes.txt").write_text("mine\n")
    with pytest.raises(ConfigError, match="the folder holds other files"):
        check(tmp_path, html=site)
    (site / MARK).write_text("")
    check(tmp_path, html=site)


def test_a_read_only_file_system_is_not_a_permission_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*args: object, **kwargs: object) -> tuple[int, str]:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(start.tempfile, "mkstemp", read_only)
    with pytest.raises(ConfigError) as caught:
        check(tmp_path, history=tmp_path / "history.jsonl")
    assert "Read-only file system" in str(caught.value)
    assert "mounted read-only: point --specdecode-history at a writable one" in str(caught.value)
