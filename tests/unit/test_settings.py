"""Where the settings' paths come from without an ini file (#13, item 7): the project root found
above the rootdir, so running from inside ``perf_tests/`` changes nothing."""

from __future__ import annotations

from pathlib import Path

from pytest_specdecode.settings import find_project_root, project_test_id, resolve


def _project(tmp_path: Path) -> Path:
    (tmp_path / "repo" / "perf_tests").mkdir(parents=True)
    (tmp_path / "repo" / "perf_tests" / "specdecode.toml").write_text("")
    return tmp_path / "repo"


def test_without_an_ini_file_the_defaults_come_from_the_project_root(tmp_path: Path) -> None:
    repo = _project(tmp_path)
    inside = repo / "perf_tests"
    settings = resolve(
        cli={}, ini={}, env={}, invocation_dir=inside, ini_dir=inside, search_from=inside
    )
    assert settings.config == repo / "perf_tests" / "specdecode.toml"
    assert settings.baselines == repo / "baselines"
    assert settings.project_root == repo
    assert settings.config_source == f"the default, found above the rootdir {inside}"


def test_a_flag_is_relative_to_where_pytest_runs_and_says_so(tmp_path: Path) -> None:
    repo = _project(tmp_path)
    settings = resolve(
        cli={"config": "other.toml"},
        ini={},
        env={},
        invocation_dir=repo / "perf_tests",
        ini_dir=repo,
        search_from=repo,
    )
    assert settings.config == repo / "perf_tests" / "other.toml"
    assert settings.config_source == "--specdecode-config"


def test_the_search_stops_at_the_repository_root(tmp_path: Path) -> None:
    _project(tmp_path)  # a perf_tests/ above the repository below must not be used
    inner = tmp_path / "repo" / "vendored"
    (inner / ".git").mkdir(parents=True)
    assert find_project_root(inner / "sub") is None
    assert find_project_root(tmp_path / "repo" / "perf_tests") == tmp_path / "repo"


def test_test_ids_are_relative_to_the_project_root(tmp_path: Path) -> None:
    repo = _project(tmp_path)
    path = repo / "perf_tests" / "test_seed.py"
    inside = repo / "perf_tests"
    assert project_test_id("test_seed.py::test_x[a]", path, inside, repo) == (
        "perf_tests/test_seed.py::test_x[a]"
    )
    assert project_test_id("perf_tests/test_seed.py::C::t", path, repo, repo) == (
        "perf_tests/test_seed.py::C::t"
    )
    outside = tmp_path / "elsewhere" / "test_y.py"
    assert project_test_id("test_y.py::t", outside, outside.parent, repo) == "test_y.py::t"
