"""The plugin's own check of a --benchmark-json path (pytest-benchmark 5.3 checks it only when
it writes, after every test has been measured)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.outputs.benchmark import check_json_path


def test_a_path_in_an_existing_directory_passes(tmp_path: Path) -> None:
    check_json_path(tmp_path / "bench.json", base=tmp_path, source="--benchmark-json")
    check_json_path("bench.json", base=tmp_path, source="--benchmark-json")  # relative to base
    check_json_path(io.BytesIO(), base=tmp_path, source="--benchmark-json")  # opened: < 5.3


def test_a_missing_directory_names_the_value_the_source_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        check_json_path("out/b.json", base=tmp_path, source="--benchmark-json in PYTEST_ADDOPTS")
    message = str(caught.value)
    assert message.startswith("--benchmark-json in PYTEST_ADDOPTS: ")
    assert "'out/b.json'" in message
    assert f"its directory {tmp_path / 'out'} does not exist" in message
    assert f"mkdir -p {tmp_path / 'out'}" in message


def test_a_file_as_directory_and_a_directory_as_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "plain.txt").write_text("")
    with pytest.raises(ConfigError, match=r"plain\.txt is not a directory"):
        check_json_path(tmp_path / "plain.txt" / "b.json", base=tmp_path, source="x")
    with pytest.raises(ConfigError, match="is a directory"):
        check_json_path(tmp_path, base=tmp_path, source="x")
