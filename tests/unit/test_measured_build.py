"""What was measured, beside the test repository's commit (#25 item 5): SGLang's version and
commit and the versions of the packages that move its speed, read in the server's interpreter;
the build reaches the history line and the JSON report, with the driver of the GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest
from reportdata import seed_result

from pytest_specdecode.outputs.history import HISTORY_SCHEMA_PATH, history_record
from pytest_specdecode.outputs.json_report import build_report, make_session_info
from pytest_specdecode.profiles.kinds.sglang import KIND, SPEED_PACKAGES, sglang_of


def fake_dist(site: Path, name: str, version: str, direct_url: dict[str, object] | None) -> None:
    """An installed distribution as importlib.metadata finds it: a dist-info directory."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def probe(site: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setenv("PYTHONPATH", str(site))  # the probe's interpreter finds the fake dists
    return sglang_of.__wrapped__(sys.executable)  # type: ignore[attr-defined, no-any-return]


def test_an_install_from_git_names_its_commit_and_the_packages_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    url = {
        "url": "https://github.com/sgl-project/sglang",
        "vcs_info": {"vcs": "git", "commit_id": commit},
    }
    fake_dist(tmp_path, "sglang", "0.5.15", url)
    fake_dist(tmp_path, "sgl-kernel", "0.3.21", None)
    fake_dist(tmp_path, "flashinfer-python", "0.5.3", None)
    build = probe(tmp_path, monkeypatch)
    assert build["sglang"] == "0.5.15"
    assert build["commit"] == commit
    packages = build["packages"]
    assert isinstance(packages, dict)
    assert packages["sgl-kernel"] == "0.3.21"
    assert packages["flashinfer-python"] == "0.5.3"
    assert set(packages) <= set(SPEED_PACKAGES)
    shown = KIND.describe_build({"python": "/venv/bin/python", **build})
    assert shown == "SGLang 0.5.15 (commit 0123456789ab) in /venv/bin/python"


def test_an_editable_install_names_the_commit_of_its_source_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "sglang-src"
    source.mkdir()

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(source), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    git("init", "-q")
    (source / "setup.py").write_text("")
    git("add", "setup.py")
    git("commit", "-qm", "sglang")
    head = git("rev-parse", "HEAD")
    url = {"url": f"file://{source}", "dir_info": {"editable": True}}
    fake_dist(tmp_path / "site", "sglang", "0.5.15", url)
    build = probe(tmp_path / "site", monkeypatch)
    assert build["commit"] == head


def test_a_release_wheel_has_no_commit_and_says_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_dist(tmp_path, "sglang", "0.5.15", None)
    build = probe(tmp_path, monkeypatch)
    assert build["sglang"] == "0.5.15"
    assert build["commit"] is None
    assert KIND.describe_build({"python": "/p", **build}) == "SGLang 0.5.15 in /p"


def test_the_build_and_the_driver_reach_the_history_and_the_report() -> None:
    result = seed_result()
    build = {
        "python": "/venv/bin/python",
        "sglang": "0.5.15",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "packages": {"torch": "2.9.1", "sgl-kernel": "0.3.21"},
        "record": "00112233aabbccdd",
        "env": ["NCCL_ALGO"],
    }
    result.provenance = {
        **result.provenance,
        "build": build,
        "gpu": {"names": ["NVIDIA H200"], "count": 1, "driver": "570.124.06"},
        "git": {"commit": "feedface" * 5, "dirty": False},
    }
    info = make_session_info(
        started=datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc),
        finished=datetime(2026, 12, 1, 3, 10, tzinfo=timezone.utc),
        target="real",
        pytest_args=[],
        exit_status=0,
    )
    record = history_record([result], session_info=info)
    jsonschema.Draft202012Validator(json.loads(HISTORY_SCHEMA_PATH.read_text())).validate(record)
    assert record["commit"] == "feedface" * 5  # the test repository's
    assert record["gpu"]["driver"] == "570.124.06"
    (test,) = record["tests"]
    assert test["build"]["sglang"] == "0.5.15"
    assert test["build"]["commit"] == build["commit"]  # SGLang's, beside it
    assert test["build"]["packages"] == {"torch": "2.9.1", "sgl-kernel": "0.3.21"}
    assert test["server_version"] == result.server_version
    report = build_report([result], session_info=info)
    assert report["tests"][0]["provenance"]["build"]["commit"] == build["commit"]
