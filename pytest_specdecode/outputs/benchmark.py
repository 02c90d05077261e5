"""Measured runs in pytest-benchmark's own JSON, so its existing tooling reads them.

This is pytest-side wiring (it builds pytest-benchmark's objects), used by ``plugin.py`` only.
The mapping, documented in docs/reports.md:

* one benchmark entry per measured test: ``fullname`` is the test id, ``name`` the test name,
  ``group`` is ``specdecode:<profile>``;
* one *round* per measured run, with one iteration each;
* the *time* of a round is **seconds per output token** of that run (1 / tok_s): lower is better,
  as pytest-benchmark assumes, so ``--benchmark-compare-fail=mean:5%`` means "5% fewer tok/s",
  and pytest-benchmark's ``ops`` column (rounds / total time) is the run-weighted tok/s;
* ``extra_info`` carries what pytest-benchmark has no column for: the profile, whether it was
  simulated, the workload and its hash, the per-run tok/s and accept length, their means, the
  plugin's verdict, and ``bench_serving``: the figures under SGLang bench_serving's names and
  units, as in the JSON report.

Entries are added only when pytest-benchmark is going to write JSON (``--benchmark-json``,
``--benchmark-save``, ``--benchmark-autosave``), so a plain run does not print a second table.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.outputs.json_report import bench_serving_block
from pytest_specdecode.result import SpecdecodeResult


def check_json_path(value: object, *, base: Path, source: str) -> None:
    """Refuse a ``--benchmark-json`` path pytest-benchmark could not write, before anything runs.

    pytest-benchmark up to 5.2 opened the file while parsing the options, so a missing directory
    was a usage error; 5.3 keeps the path and opens it only at the session's end, after every
    test has been measured (an INTERNALERROR, exit 3). The plugin does not depend on either: it
    checks the path itself. ``value`` is the option's value (an already opened file is left
    alone), ``base`` the directory a relative path is taken from, ``source`` where it was given.
    """
    if not isinstance(value, (str, os.PathLike)):
        return  # pytest-benchmark < 5.3 has already opened it
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base / path
    parent = path.parent
    if not parent.exists():
        problem = f"its directory {parent} does not exist"
        fix = f"create it (mkdir -p {parent}) or give a path in an existing directory"
    elif not parent.is_dir():
        problem = f"{parent} is not a directory"
        fix = "give a path in a directory"
    elif path.is_dir():
        problem = f"{path} is a directory"
        fix = "give a file name, e.g. --benchmark-json=" + str(path / "benchmark.json")
    elif not os.access(parent, os.W_OK):
        problem = f"its directory {parent} is not writable"
        fix = "give a path in a directory you can write to"
    else:
        return
    raise ConfigError(
        f"pytest-benchmark cannot write its JSON to {os.fspath(value)!r}: {problem}, and it would "
        f"find out only after every test has been measured; {fix}",
        source=source,
    )


def wants_export(benchmark_session: Any) -> bool:
    """Whether pytest-benchmark will write JSON in this session."""
    return bool(
        getattr(benchmark_session, "json", None)
        or getattr(benchmark_session, "save", None)
        or getattr(benchmark_session, "autosave", None)
    )


def add_result(benchmark_session: Any, result: SpecdecodeResult) -> bool:
    """Append ``result``'s runs to pytest-benchmark's session; False if there is nothing to add."""
    from pytest_benchmark.stats import Metadata

    tok_s = [v for v in result.samples.get("tok_s", []) if v > 0]
    if not tok_s:
        return False
    accept = result.samples.get("accept_length", [])
    name = result.test_id.split("::")[-1]
    extra_info: dict[str, Any] = {
        "specdecode_profile": result.profile,
        "specdecode_simulated": result.simulated,
        "specdecode_workload": result.workload_name,
        "specdecode_workload_hash": result.workload_hash,
        "specdecode_hardware_key": result.hardware_key,
        "specdecode_outcome": result.outcome.value,
        "tok_s": tok_s,
        "tok_s_mean": sum(tok_s) / len(tok_s),
        "time_unit": "seconds per output token (1 / tok_s)",
    }
    if accept:
        extra_info["accept_length"] = accept
        extra_info["accept_length_mean"] = sum(accept) / len(accept)
    # the same figures under SGLang bench_serving's names and units (output_throughput, ...)
    extra_info["bench_serving"] = bench_serving_block(result)
    fixture = SimpleNamespace(
        name=name,
        fullname=result.test_id,
        group=f"specdecode:{result.profile}",
        param=None,
        params=None,
        extra_info=extra_info,
        cprofile_stats=None,
        has_error=False,
    )
    options = {"specdecode": True, "rounds": len(tok_s), "iterations": 1}
    metadata = Metadata(fixture, iterations=1, options=options)  # type: ignore[no-untyped-call]
    for value in tok_s:
        metadata.update(1.0 / value)  # type: ignore[no-untyped-call]
    benchmark_session.benchmarks.append(metadata)
    return True
