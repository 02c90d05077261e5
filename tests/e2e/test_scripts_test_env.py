"""scripts/test never touches the venv it is called from (issue 45, item 3).

The README's Quickstart makes a venv, installs the plugin into it and runs ``pytest perf_tests``;
``scripts/test`` run from that venv once installed the test lock into it (pytest 9.2.0 -> 9.0.3,
pluggy, pytest-benchmark, plus mypy, ruff, ...). It now makes a test venv of its own
(``SPECDECODE_TEST_VENV``, default ``.venv-test`` in the checkout) and installs there. Here a
user's venv is made and activated the way ``. .venv/bin/activate`` does (``VIRTUAL_ENV``, its
``bin`` first on ``PATH``), ``scripts/test --venv-only`` (the same function that the full run
calls first) runs from a copy of the checkout, and the user's ``pip freeze`` is compared before
and after: twice, the second run reusing the test venv.

The copy carries a lock of four pinned, hashed packages taken from the real lock (setuptools
and wheel with its packaging, which build the editable install, and iniconfig), so that a run
costs seconds of CPU, not the whole lock's download: what is tested is where scripts/test
installs, not what. It mostly waits on pip's index (2-3 minutes on a busy machine, 23 CPU-s), so
scripts/test runs it beside the live-speed tests (tests/conftest.py, BESIDE_THE_QUIET_TESTS).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "scripts" / "test-requirements.txt"
SMALL_LOCK = ("iniconfig", "packaging", "setuptools", "wheel")


def lock_blocks(names: tuple[str, ...]) -> str:
    """The lines of ``names``'s pins in the real lock, hashes and all."""
    text = LOCK.read_text()
    blocks = []
    for name in names:
        match = re.search(rf"^{re.escape(name)}==\S+ \\\n(?:    --hash=\S+(?: \\)?\n)+", text, re.M)
        assert match is not None, f"{name} is not pinned in {LOCK}"
        blocks.append(match.group(0))
    return "".join(blocks)


def pinned_version(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)", LOCK.read_text(), re.M)
    assert match is not None
    return match.group(1)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """What scripts/test --venv-only reads, copied: the script, the package and its metadata,
    with the small lock in place of the real one."""
    copy = tmp_path / "checkout"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "test", copy / "scripts" / "test")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, copy / name)
    shutil.copytree(
        REPO / "pytest_specdecode",
        copy / "pytest_specdecode",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    (copy / "scripts" / "test-requirements.txt").write_text(lock_blocks(SMALL_LOCK))
    return copy


def make_user_venv(path: Path) -> dict[str, str]:
    """A venv with pip, and the environment its ``activate`` script gives a shell."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    env.pop("SPECDECODE_TEST_VENV", None)
    env.pop("SPECDECODE_TEST_PYTHON", None)
    env["VIRTUAL_ENV"] = str(path)
    env["PATH"] = f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def freeze(venv: Path) -> str:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return done.stdout


def venv_only(checkout: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(checkout / "scripts" / "test"), "--venv-only"],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_scripts_test_installs_into_a_venv_of_its_own_and_leaves_the_callers_alone(
    tmp_path: Path, checkout: Path
) -> None:
    user = tmp_path / "user-venv"
    env = make_user_venv(user)
    test_venv = tmp_path / "test-venv"
    env["SPECDECODE_TEST_VENV"] = str(test_venv)
    before = freeze(user)

    first = venv_only(checkout, env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.splitlines()[-1] == str(test_venv)
    assert freeze(user) == before  # nothing installed into, or upgraded in, the caller's venv
    # The test venv holds the lock's pins and this checkout, editable; its Python is the one the
    # caller's python3 (the active venv's) made it from.
    tested = freeze(test_venv)
    for name in SMALL_LOCK:
        assert f"{name}=={pinned_version(name)}" in tested.splitlines(), tested
    where = "import pytest_specdecode as p; print(p.__file__)"
    located = subprocess.run(
        [str(test_venv / "bin" / "python"), "-c", where],
        cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert located.stdout.strip() == str(checkout / "pytest_specdecode" / "__init__.py")

    # Reused: the second run installs nothing and makes no new venv.
    marker = test_venv / "kept-by-the-second-run"
    marker.write_text("")
    second = venv_only(checkout, env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert marker.exists()
    assert freeze(test_venv) == tested
    assert freeze(user) == before


def test_scripts_test_refuses_to_use_the_active_venv_as_its_test_venv(
    tmp_path: Path, checkout: Path
) -> None:
    user = tmp_path / "user-venv"
    env = make_user_venv(user)
    env["SPECDECODE_TEST_VENV"] = str(user)
    before = freeze(user)
    done = venv_only(checkout, env)
    assert done.returncode != 0
    assert f"SPECDECODE_TEST_VENV={user} is the active venv" in done.stderr
    assert freeze(user) == before
