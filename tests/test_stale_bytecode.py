"""A test file the suite writes again is run as written (tests/conftest.py, _no_stale_bytecode).

pytest trusts a test module's cached, rewritten bytecode while the source has the size and the
whole-second mtime it was compiled from. The suite's tests that write a test file, run pytest,
write it again with content of the same size and run again met that once: the second run ran
the first body. Here the second write keeps the first one's mtime, as a write within the same
second (or after the clock stepped back) does, so without the fix the second run would pass.
"""

from __future__ import annotations

import os

import pytest

PASSING = "def test_body():\n    assert 1 == 1\n"
FAILING = "def test_body():\n    assert 1 == 2\n"


@pytest.mark.parametrize("how", ["named", "unnamed", "makefile"])
def test_a_file_written_again_with_the_same_size_runs_its_new_body(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    assert len(PASSING) == len(FAILING)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # as scripts/test runs

    def write(source: str) -> os.PathLike[str]:
        if how == "named":
            return pytester.makepyfile(test_same_size=source)
        if how == "unnamed":
            return pytester.makepyfile(source)
        return pytester.makefile(".py", test_same_size=source)

    path = write(PASSING)
    first = os.stat(path)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", path).assert_outcomes(passed=1)
    cached = list((pytester.path / "__pycache__").glob("*.pyc"))
    assert cached, "the first run cached no bytecode: this test would test nothing"

    assert write(FAILING) == path
    os.utime(path, ns=(first.st_atime_ns, first.st_mtime_ns))  # the same second as before
    pytester.runpytest_subprocess("-p", "no:cacheprovider", path).assert_outcomes(failed=1)
