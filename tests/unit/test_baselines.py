"""Unit tests of the baseline store, provenance, redaction, hardware key and fingerprint check."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pytest_specdecode import __version__
from pytest_specdecode.baselines.baseline import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    BaselineRecord,
    MetricSamples,
    check_fingerprint,
)
from pytest_specdecode.baselines.refs import OWN, BaselineLookup
from pytest_specdecode.baselines.store import BaselineStore, BaselineUpdate
from pytest_specdecode.errors import BaselineError, ConfigError
from pytest_specdecode.files import STALE_TEMP_SECONDS, _host, remove_stale_temp_files
from pytest_specdecode.fingerprint import Fingerprint
from pytest_specdecode.redaction import REDACTED, is_secret_name, redact
from pytest_specdecode.session.provenance import (
    GpuInfo,
    collect_provenance,
    detect_gpus,
    hardware_key,
)

TEST_ID = "perf_tests/test_seed.py::test_eagle3_2step"
HW = "8xNVIDIA-RTX-PRO-6000-Blackwell"
HARD = {
    "model": "moonshotai/Kimi-K2.5",
    "tp": 8,
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 2,
    "env": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
}
SOFT = {"sglang_version": "0.5.3", "driver": "575.57.08"}


@pytest.fixture(autouse=True)
def _own_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Baseline locks go to the state directory: this module's, not the user's cache (spawned
    writers inherit the variable)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


def make_record(
    test_id: str = TEST_ID,
    *,
    hardware_key: str = HW,
    profile: str = "eagle3-2step",
    workload_hash: str = "w-aaaa",
    samples: Mapping[str, Sequence[float]] | None = None,
    hard: Mapping[str, Any] | None = None,
    soft: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    simulated: bool = False,
    launch_runs: tuple[int, ...] = (),
) -> BaselineRecord:
    return BaselineRecord(
        test_id=test_id,
        profile=profile,
        hardware_key=hardware_key,
        simulated=simulated,
        workload_name="seed-chat",
        workload_hash=workload_hash,
        fingerprint=Fingerprint(
            hard=HARD if hard is None else hard, soft=SOFT if soft is None else soft
        ),
        samples={
            name: tuple(values)
            for name, values in (
                samples or {"tok_s": (93.1, 94.0, 95.2), "accept_length": (1.9, 2.0, 2.1)}
            ).items()
        },
        provenance=provenance or {"time_utc": "2025-01-01T00:00:00Z"},
        created_unix=1_700_000_000.5,
        launch_runs=launch_runs,
    )


def schema_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# --------------------------------------------------------------------------- record and JSON


def test_record_round_trips_through_json_and_the_store(tmp_path: Path) -> None:
    record = make_record()
    assert BaselineRecord.from_json(record.to_json()) == record
    store = BaselineStore(tmp_path)
    store.write(record)
    assert store.load(HW, TEST_ID) == record


@pytest.mark.parametrize(
    "samples", [{"tok_s": (93.1, 94.0, 95.2), "accept_length": (2.0, 2.1)}, {"tok_s": (90.0,)}]
)
def test_to_json_matches_the_schema(samples: Mapping[str, Sequence[float]]) -> None:
    record = make_record(samples=samples)
    schema_validator().validate(record.to_json())
    # The file text too, as a reader of the repository would load it.
    schema_validator().validate(json.loads(record.to_text()))


def test_schema_rejects_what_from_json_rejects() -> None:
    data = make_record().to_json()
    validator = schema_validator()
    for broken in (
        {**data, "schema_version": 1},
        {**data, "note": "hand-written"},
        {**data, "launch_runs": [0]},
        {**data, "samples": {"tok_s": ["fast"]}},
    ):
        assert not validator.is_valid(broken)


def test_file_text_is_sorted_pretty_and_has_one_sample_per_line(tmp_path: Path) -> None:
    update = BaselineStore(tmp_path).write(make_record())
    text = update.path.read_text(encoding="utf-8")
    assert text.endswith("}\n")
    keys = list(json.loads(text))
    assert keys == sorted(keys)
    assert "\n      93.1,\n      94.0,\n      95.2\n" in text  # git diff shows each run
    assert '"mean": 94.1,' in text  # no float noise (94.10000000000001) in the readable summary


def test_summary_statistics() -> None:
    summary = MetricSamples((1.0, 2.0, 3.0, 4.0)).summary()
    assert summary["n"] == 4
    assert summary["mean"] == pytest.approx(2.5)
    assert summary["std"] == pytest.approx(1.2909944)
    assert summary["cv"] == pytest.approx(1.2909944 / 2.5)
    assert (summary["median"], summary["min"], summary["max"]) == (2.5, 1.0, 4.0)


def test_single_sample_has_no_std_or_cv() -> None:
    summary = MetricSamples((90.0,)).summary()
    assert (summary["n"], summary["std"], summary["cv"]) == (1, None, None)


def test_samples_must_be_finite() -> None:
    with pytest.raises(ValueError, match="tok_s"):
        make_record(samples={"tok_s": (1.0, float("nan"))})


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["samples"].update(tok_s=["fast"]), "samples.tok_s"),
        (lambda d: d["samples"].update(tok_s=[]), "samples.tok_s"),
        (lambda d: d.update(simulated="yes"), "'simulated'"),
        (lambda d: d.pop("workload_hash"), "'workload_hash'"),
        (lambda d: d.update(note="hand-written"), "'note'"),
        (lambda d: d["fingerprint"].pop("hard"), "fingerprint"),
        (lambda d: d.update(created_unix=True), "'created_unix'"),
    ],
)
def test_from_json_names_the_file_and_the_bad_field(mutate: Any, field: str) -> None:
    data = make_record().to_json()
    mutate(data)
    with pytest.raises(BaselineError) as raised:
        BaselineRecord.from_json(data, path="baselines/x.json")
    message = str(raised.value)
    assert message.startswith("baselines/x.json: ")
    assert field in message
    assert "--update-baselines" in message


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (
            3,
            [
                "schema version 3",
                "reads schema versions 1 and 2",
                "newer",
                "upgrade",
                "--update-baselines",
            ],
        ),
        (0, ["schema version 0", "reads schema versions 1 and 2", "older", "--update-baselines"]),
        (None, ["no valid 'schema_version'", "reads schema versions 1 and 2"]),
        ("1", ["no valid 'schema_version'"]),
    ],
)
def test_wrong_schema_version_says_which_and_what_to_do(
    tmp_path: Path, version: object, expected: list[str]
) -> None:
    store = BaselineStore(tmp_path)
    path = store.write(make_record()).path
    data = json.loads(path.read_text(encoding="utf-8"))
    data["schema_version"] = version
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BaselineError) as raised:
        store.load(HW, TEST_ID)
    assert str(raised.value).startswith(f"{path}: ")
    for words in expected:
        assert words in str(raised.value)
    assert SCHEMA_VERSION == 2


def test_a_schema_1_file_is_read_as_one_launch_with_its_accept_length_per_request(
    tmp_path: Path,
) -> None:
    # What pytest-specdecode 0.1 wrote: no launch_runs, and an accept_length that was the
    # per-request figure (first token included).
    store = BaselineStore(tmp_path)
    path = store.write(
        make_record(samples={"tok_s": (90.0, 92.0), "accept_length": (3.05, 3.05)})
    ).path
    data = json.loads(path.read_text(encoding="utf-8"))
    data["schema_version"] = 1
    del data["launch_runs"]
    path.write_text(json.dumps(data), encoding="utf-8")

    record = store.load(HW, TEST_ID)

    assert record.read_from_schema == 1
    assert record.launch_runs == (2,)
    assert record.samples == {"tok_s": (90.0, 92.0), "spec_accept_length": (3.05, 3.05)}
    note = record.missing_metric_note("accept_length")
    assert note is not None
    assert "baseline schema 1" in note
    assert "--update-baselines" in note
    assert record.missing_metric_note("tok_s") is None
    # Written again, it is a schema 2 file.
    assert record.to_json()["schema_version"] == 2


def test_launch_runs_split_the_samples_and_must_add_up() -> None:
    record = make_record(samples={"tok_s": (1.0, 2.0, 3.0, 4.0, 5.0)}, launch_runs=(2, 3))
    assert record.launches("tok_s") == ((1.0, 2.0), (3.0, 4.0, 5.0))
    assert record.to_json()["launch_runs"] == [2, 3]
    with pytest.raises(
        ValueError, match=r"launch_runs \[2, 2\] must be positive counts that add up"
    ):
        make_record(samples={"tok_s": (1.0, 2.0, 3.0, 4.0, 5.0)}, launch_runs=(2, 2))


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"{not json", "is not valid JSON (line 1"),
        (b"<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> x\n", "merge-conflict markers"),
        (b"\xff\xfe", "is not UTF-8"),
        (b'{"schema_version": 1, "schema_version": 1}', "duplicate key(s) 'schema_version'"),
        (b'{"schema_version": 1, "created_unix": NaN}', "NaN is not a JSON number"),
        (b"[1, 2]", "one JSON object"),
    ],
)
def test_unreadable_file_gives_a_clear_error(tmp_path: Path, content: bytes, words: str) -> None:
    store = BaselineStore(tmp_path)
    path = store.path_for(HW, TEST_ID)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(BaselineError) as raised:
        store.load(HW, TEST_ID)
    assert str(raised.value).startswith(f"{path}: ")
    assert words in str(raised.value)
    assert "--update-baselines" in str(raised.value)
    assert path.read_bytes() == content  # reading never touches the file


def test_load_of_a_missing_baseline_is_none(tmp_path: Path) -> None:
    assert BaselineStore(tmp_path).load(HW, TEST_ID) is None


def test_load_refuses_a_record_lying_at_another_tests_path(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    source = store.write(make_record()).path
    other = "perf_tests/test_seed.py::test_baseline"
    target = store.path_for(HW, other)
    shutil.copy(source, target)
    with pytest.raises(BaselineError) as raised:
        store.load(HW, other)
    assert str(raised.value).startswith(f"{target}: ")
    assert TEST_ID in str(raised.value)
    assert "copied or renamed" in str(raised.value)


# --------------------------------------------------------------------------- writing


def test_write_reports_old_and_new(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    first = make_record(samples={"tok_s": (88.0, 89.0)})
    second = make_record(samples={"tok_s": (91.0, 92.0)})
    created = store.write(first)
    assert (created.old, created.new, created.moved_aside) == (None, first, None)
    updated = store.write(second)
    assert (updated.old, updated.new, updated.path) == (first, second, created.path)
    assert store.load(HW, TEST_ID) == second


def test_successful_write_leaves_no_temp_files(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    path = store.write(make_record()).path
    store.write(make_record(samples={"tok_s": (1.0, 1.1)}))
    leftovers = {p.name for p in path.parent.iterdir()} - {path.name}
    assert leftovers == set()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_existing_file_mode_is_kept(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    path = store.write(make_record()).path
    path.chmod(0o664)
    store.write(make_record(samples={"tok_s": (1.0, 1.1)}))
    assert stat.S_IMODE(path.stat().st_mode) == 0o664


def test_failure_between_temp_write_and_replace_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BaselineStore(tmp_path)
    path = store.write(make_record()).path
    before = path.read_bytes()

    def crash(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        store.write(make_record(samples={"tok_s": (1.0, 1.1)}))
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def _die_during_replace(root: str) -> None:
    """Child process: the power goes out after the temp file is written, before the rename."""

    def die(*args: object) -> None:
        os._exit(17)

    os.replace = die  # type: ignore[assignment]
    BaselineStore(Path(root)).write(make_record(samples={"tok_s": (1.0, 1.1)}))


def test_process_killed_before_replace_keeps_the_old_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    record = make_record()
    path = store.write(record).path
    before = path.read_bytes()
    child = multiprocessing.get_context("spawn").Process(
        target=_die_during_replace, args=(str(tmp_path),)
    )
    child.start()
    child.join(120)
    assert child.exitcode == 17
    assert path.read_bytes() == before
    stale = [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert len(stale) == 1  # the dead writer's temp file, hidden and ignored by readers
    assert store.load(HW, TEST_ID) == record
    assert store.find_for_profile(HW, "eagle3-2step", "w-aaaa") == [record]
    store.write(make_record(samples={"tok_s": (2.0, 2.1)}))  # the next writer cleans up
    assert not stale[0].exists()


def _write_many(root: str, worker: int, count: int) -> None:
    store = BaselineStore(Path(root))
    for i in range(count):
        values = tuple(float(worker * 1000 + i) + k / 100 for k in range(200))
        store.write(make_record(samples={"tok_s": values}))


def test_concurrent_writers_never_leave_a_torn_file(tmp_path: Path) -> None:
    workers, count = 4, 15
    written = {
        tuple(float(w * 1000 + i) + k / 100 for k in range(200))
        for w in range(workers)
        for i in range(count)
    }
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(target=_write_many, args=(str(tmp_path), w, count)) for w in range(workers)
    ]
    for child in children:
        child.start()
    store = BaselineStore(tmp_path)
    seen = 0
    while any(child.is_alive() for child in children):
        record = store.load(HW, TEST_ID)  # raises on a torn or half-written file
        if record is not None:
            assert record.samples["tok_s"] in written
            seen += 1
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    final = store.load(HW, TEST_ID)
    assert final is not None
    assert final.samples["tok_s"] in written
    path = store.path_for(HW, TEST_ID)
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_locks_live_outside_the_baselines_tree(tmp_path: Path) -> None:
    root, locks = tmp_path / "baselines", tmp_path / "state" / "locks"
    store = BaselineStore(root, lock_dir=locks)
    path = store.write(make_record()).path
    assert [p for p in root.rglob("*") if p.is_file()] == [path]  # no *.json.lock beside it
    assert store.lock_path(path).parent == locks
    assert store.lock_path(path).exists()


def test_the_default_lock_directory_is_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = BaselineStore(tmp_path / "baselines")
    assert store.lock_dir == tmp_path / "cache" / "pytest-specdecode" / "locks"


def test_writers_reaching_one_file_by_different_paths_exclude_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = tmp_path / "locks"
    (tmp_path / "repo").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    absolute = BaselineStore(tmp_path / "repo" / "baselines", lock_dir=locks, lock_timeout=0.2)
    relative = BaselineStore(Path("link/baselines"), lock_dir=locks, lock_timeout=0.2)
    path = absolute.path_for(HW, TEST_ID)
    assert relative.lock_path(relative.path_for(HW, TEST_ID)) == absolute.lock_path(path)
    # Another process holds the lock (a thread lock of filelock would be re-entrant here).
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import filelock, sys, time\n"
            f"with filelock.FileLock({str(absolute.lock_path(path))!r}):\n"
            "    print('held', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BaselineError, match="another process is writing this baseline"):
            relative.write(make_record())
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    relative.write(make_record())  # released: the write goes through
    assert absolute.load(HW, TEST_ID) == make_record()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"tok_s": [88.8, 91.0', "is not valid JSON"),
        (b'{"schema_version": 99}', "has schema version 99"),
    ],
)
def test_unreadable_file_is_moved_aside_never_lost(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    store = BaselineStore(tmp_path)
    path = store.path_for(HW, TEST_ID)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    update = store.write(make_record())
    assert update.old is None
    assert update.moved_aside is not None
    assert update.moved_aside.parent == path.parent
    assert update.moved_aside.name.startswith(f"{path.name}.corrupt-")
    assert update.moved_aside.read_bytes() == content
    assert store.load(HW, TEST_ID) == make_record()
    first_line = update.describe()[0]
    assert reason in first_line
    assert str(update.moved_aside) in first_line
    # A second unreadable file in the same second gets its own name.
    path.write_bytes(b"garbage")
    again = store.write(make_record())
    assert again.moved_aside is not None
    assert again.moved_aside != update.moved_aside
    assert update.moved_aside.read_bytes() == content


def test_noisy_baseline_is_refused_unless_forced(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    noisy = make_record(samples={"tok_s": (80.0, 90.0, 100.0)})  # CV 11.1 %
    with pytest.raises(BaselineError) as raised:
        store.write(noisy, max_cv=0.05)
    message = str(raised.value)
    for words in (
        "tok_s has a CV of 11.1% over 3 runs",
        "limit of 5.0%",
        "--specdecode-force-baseline",
        "specdecode_max_baseline_cv",
        TEST_ID,
    ):
        assert words in message
    assert not store.path_for(HW, TEST_ID).exists()
    assert store.write(noisy, max_cv=0.05, force=True).new == noisy
    assert store.write(noisy).new == noisy  # no limit configured
    assert store.write(noisy, max_cv=0.2).new == noisy


def test_cv_check_uses_the_listed_metrics_only(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    record = make_record(samples={"tok_s": (90.0, 90.5), "ttft": (0.1, 0.3)})
    store.write(record, max_cv=0.05)  # ttft is noisy but not listed
    with pytest.raises(BaselineError, match="ttft has a CV"):
        store.write(record, max_cv=0.05, metrics_for_cv=("tok_s", "ttft"))
    store.write(record, max_cv=0.05, metrics_for_cv=("accept_length",))  # not recorded: skipped


def test_single_run_baseline_is_refused_when_a_cv_limit_is_set(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    with pytest.raises(BaselineError, match=r"cannot be judged from 1 run"):
        store.write(make_record(samples={"tok_s": (90.0,)}), max_cv=0.05)


# --------------------------------------------------------------------------- finding by profile


def test_find_for_profile(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    wanted = [
        make_record("perf_tests/test_seed.py::test_nospec_b", profile="nospec"),
        make_record("perf_tests/test_a.py::test_nospec[c=1]", profile="nospec"),
    ]
    others = [
        make_record(
            "perf_tests/test_seed.py::test_nospec_other", profile="nospec", workload_hash="w2"
        ),
        make_record("perf_tests/test_seed.py::test_eagle3", profile="eagle3-2step"),
        make_record("perf_tests/test_seed.py::test_nospec_b", profile="nospec", hardware_key="cpu"),
    ]
    for record in wanted + others:
        store.write(record)
    found = store.find_for_profile(HW, "nospec", "w-aaaa")
    assert found == sorted(wanted, key=lambda r: r.test_id)
    assert store.find_for_profile("8xH100", "nospec", "w-aaaa") == []
    assert store.find_for_profile(HW, "eagle3-5step", "w-aaaa") == []


def test_find_for_profile_does_not_skip_a_broken_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.write(make_record(profile="nospec"))
    broken = store.path_for(HW, "perf_tests/test_seed.py::test_other")
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(BaselineError) as raised:
        store.find_for_profile(HW, "nospec", "w-aaaa")
    assert str(raised.value).startswith(f"{broken}: ")


# --------------------------------------------------------------------------- paths


def test_path_for_a_parametrised_id_is_readable(tmp_path: Path) -> None:
    path = BaselineStore(tmp_path).path_for(
        "8xH100", "perf_tests/test_seed.py::test_x[eagle3-2step-concurrency=8]"
    )
    assert path == tmp_path / "8xH100/perf_tests/test_seed/test_x[eagle3-2step-concurrency=8].json"


def test_path_for_encodes_classes_and_unsafe_characters(tmp_path: Path) -> None:
    path = BaselineStore(tmp_path).path_for(
        "cpu", "perf_tests/sub dir/test_x.py::TestSpec::test_y[a/b c:d?é]"
    )
    assert path == tmp_path / (
        "cpu/perf_tests/sub%20dir/test_x/TestSpec.test_y[a%2Fb%20c%3Ad%3F%C3%A9].json"
    )


def test_paths_are_collision_free_and_stay_under_the_root(tmp_path: Path) -> None:
    ids = [
        "a.py::T::f",
        "a.py::T.f",
        "a.py::T::f[x]",
        "a.py::T.f[x]",
        "a.py::f[x.y]",
        "a.py::f[x/y]",
        "a.py::f[x%2Fy]",
        "a.py::f[x::y]",
        "a.py::f[x~y]",
        "a/b.py::f",
        "a.py::b::f",
        "a/b.py::T::f",
        "a/b/T.py::f",
        "../a.py::f",
        "a.py::f[..]",
        "x.py::..",
        "x.yaml::f",
        "x.py::f[" + "p" * 300 + "]",
        "x.py::f[" + "p" * 299 + "q]",
    ]
    store = BaselineStore(tmp_path)
    paths = [store.path_for("hw", test_id) for test_id in ids]
    assert len(set(paths)) == len(ids)
    for path in paths:
        assert path.resolve().is_relative_to(tmp_path.resolve())
    assert store.path_for("../..", "a.py::f").resolve().is_relative_to(tmp_path.resolve())


def test_very_long_ids_get_a_hashed_suffix_and_can_be_written(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    long_id = "perf_tests/test_seed.py::test_x[" + "-".join(["concurrency=8"] * 40) + "]"
    path = store.path_for(HW, long_id)
    assert len(path.name) <= 125
    assert path.name.startswith("test_x[concurrency=8-")
    assert "~" in path.name
    assert store.path_for(HW, long_id) == path  # stable
    record = make_record(long_id)
    store.write(record)
    store.write(record)  # lock, temp and rename names fit too
    assert store.load(HW, long_id) == record


# --------------------------------------------------------------------------- secrets


def test_redact_hides_secret_looking_names_only() -> None:
    env = {
        "HF_TOKEN": "hf_abc",
        "SGLANG_API_KEY": "sk-1",
        "AWS_SECRET_ACCESS_KEY": "aws-2",
        "DB_PASSWORD": "pw",
        "NCCL_PROTO": "LL",
        "TOKENIZERS_PARALLELISM": "false",
        "SGLANG_MAX_TOKENS": "8192",
    }
    assert redact(env) == {
        "HF_TOKEN": REDACTED,
        "SGLANG_API_KEY": REDACTED,
        "AWS_SECRET_ACCESS_KEY": REDACTED,
        "DB_PASSWORD": REDACTED,
        "NCCL_PROTO": "LL",
        "TOKENIZERS_PARALLELISM": "false",
        "SGLANG_MAX_TOKENS": "8192",
    }
    assert is_secret_name("github_token")
    assert not is_secret_name("speculative_num_draft_tokens")


def test_provenance_keeps_speed_env_and_no_secret_reaches_the_file(tmp_path: Path) -> None:
    env = {
        "HF_TOKEN": "hf_secretvalue1",
        "SGLANG_API_KEY": "sk-secretvalue2",
        "AWS_SECRET_ACCESS_KEY": "secretvalue3",
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_BUFFSIZE": "16777216",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PATH": "/usr/bin",
    }
    provenance = collect_provenance(env=env, server_info=None, gpu=None, repo_dir=None)
    assert provenance["env"] == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_ALGO": "Ring",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_PROTO": "LL",
        "SGLANG_API_KEY": REDACTED,
    }
    path = BaselineStore(tmp_path).write(make_record(provenance=provenance)).path
    text = path.read_text(encoding="utf-8")
    assert "secretvalue" not in text
    assert '"NCCL_PROTO": "LL"' in text


def test_secrets_reaching_a_record_another_way_are_redacted_and_still_compare() -> None:
    hard = {
        "extra_args": ["--api-key", "sk-secret1", "--max-total-tokens", "8192", "--token=t2"],
        "env": {"HF_TOKEN": "hf_secret3", "NCCL_PROTO": "LL"},
        "docker_env": ["HUGGING_FACE_HUB_TOKEN=hf_secret4", "NCCL_ALGO=Ring"],
    }
    record = make_record(hard=hard, provenance={"env": {"OPENAI_API_KEY": "sk-secret5"}})
    text = record.to_text()
    assert "secret" not in text.replace("SECRET", "")
    assert record.fingerprint.hard["extra_args"] == [
        "--api-key",
        REDACTED,
        "--max-total-tokens",
        "8192",
        f"--token={REDACTED}",
    ]
    assert record.fingerprint.hard["docker_env"] == [
        f"HUGGING_FACE_HUB_TOKEN={REDACTED}",
        "NCCL_ALGO=Ring",
    ]
    # The current run's fingerprint still holds the real values: not a difference.
    assert check_fingerprint(record, Fingerprint(hard=hard, soft=SOFT)).comparable


# --------------------------------------------------------------------------- hardware


RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


@pytest.mark.parametrize(
    ("gpu", "simulated", "override", "expected"),
    [
        (
            GpuInfo((RTX,) * 8, "575.57.08"),
            False,
            None,
            "8xNVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        ),
        (
            GpuInfo(
                ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"), None
            ),
            False,
            None,
            "1xNVIDIA-A100-SXM4-80GB+2xNVIDIA-H100-80GB-HBM3",
        ),
        (GpuInfo((RTX,) * 8, "575.57.08"), True, None, "simulated"),
        (None, True, None, "simulated"),
        (None, False, None, "cpu"),
        (GpuInfo((), None), False, None, "cpu"),
        (GpuInfo((RTX,) * 8, "575.57.08"), True, "lab box/8 GPUs", "lab-box-8-GPUs"),
        (None, False, "8xH100", "8xH100"),
    ],
)
def test_hardware_key(
    gpu: GpuInfo | None, simulated: bool, override: str | None, expected: str
) -> None:
    assert hardware_key(gpu, simulated=simulated, override=override) == expected


def test_hardware_key_override_without_letters_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as raised:
        hardware_key(None, simulated=False, override="//")
    assert str(raised.value).startswith("--specdecode-hardware-key: hardware key '//'")


class FakeRun:
    """Stands in for subprocess.run: replies per command, records the calls."""

    def __init__(self, replies: Mapping[str, subprocess.CompletedProcess[str] | BaseException]):
        self.replies = replies
        self.calls: list[tuple[list[str], dict[str, object]]] = []

    def __call__(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        self.calls.append((argv, kwargs))
        key = " ".join(arg for arg in argv if not arg.startswith("/"))
        for prefix, reply in self.replies.items():
            if key.startswith(prefix):
                if isinstance(reply, BaseException):
                    raise reply
                return reply
        raise AssertionError(f"unexpected command {argv}")


def done(stdout: str, returncode: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], returncode, stdout=stdout, stderr="")


def test_detect_gpus_reads_nvidia_smi() -> None:
    run = FakeRun({"nvidia-smi": done(f"{RTX}, 575.57.08\n" * 8)})
    assert detect_gpus(run) == GpuInfo((RTX,) * 8, "575.57.08")
    ((argv, kwargs),) = run.calls
    assert argv == ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    assert kwargs["timeout"] == 10


@pytest.mark.parametrize(
    "reply",
    [
        FileNotFoundError("nvidia-smi"),
        subprocess.TimeoutExpired("nvidia-smi", 10),
        done("NVIDIA-SMI has failed because it couldn't communicate with the driver", 9),
        done(""),
        done("no devices were found\n"),
    ],
)
def test_detect_gpus_is_none_without_usable_nvidia_smi(
    reply: subprocess.CompletedProcess[str] | BaseException,
) -> None:
    assert detect_gpus(FakeRun({"nvidia-smi": reply})) is None


# --------------------------------------------------------------------------- provenance


def test_collect_provenance_fields() -> None:
    run = FakeRun(
        {
            "git -C rev-parse": done("0123abcd" * 5 + "\n"),
            "git -C status": done(" M perf_tests/test_seed.py\n"),
        }
    )
    gpu = GpuInfo((RTX,) * 2, "575.57.08")
    provenance = collect_provenance(
        env={"NCCL_PROTO": "LL"},
        server_info={"version": "0.5.3", "simulated": True},
        gpu=gpu,
        repo_dir=Path("/repo"),
        now=datetime(2025, 3, 1, 12, 30, tzinfo=timezone.utc),
        run=run,
    )
    assert provenance["time_utc"] == "2025-03-01T12:30:00Z"
    assert provenance["git"] == {"commit": "0123abcd" * 5, "dirty": True}
    assert provenance["plugin_version"] == __version__
    assert provenance["sglang_version"] == "0.5.3"
    assert provenance["gpu"] == {"names": [RTX, RTX], "count": 2, "driver": "575.57.08"}
    assert provenance["simulated"] is True
    assert provenance["env"] == {"NCCL_PROTO": "LL"}
    assert isinstance(provenance["hostname"], str)
    assert isinstance(provenance["python_version"], str)
    schema_validator().validate(make_record(provenance=provenance).to_json())


@pytest.mark.parametrize(
    "reply", [done("", 128), FileNotFoundError("git"), subprocess.TimeoutExpired("git", 10)]
)
def test_provenance_without_git_is_none_not_an_error(
    reply: subprocess.CompletedProcess[str] | BaseException,
) -> None:
    provenance = collect_provenance(
        env={}, server_info=None, gpu=None, repo_dir=Path("/repo"), run=FakeRun({"git": reply})
    )
    assert provenance["git"] is None
    assert provenance["sglang_version"] is None
    assert provenance["simulated"] is None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git binary")
def test_provenance_reads_a_real_git_repository(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        result = subprocess.run(
            [
                "git",
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.com",
                "-c",
                "commit.gpgsign=false",
                *args,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip()

    git("init", "-q")
    (tmp_path / "test_x.py").write_text("x = 1\n", encoding="utf-8")
    git("add", "test_x.py")
    git("commit", "-q", "-m", "one")
    commit = git("rev-parse", "HEAD")
    (tmp_path / "untracked.json").write_text("{}", encoding="utf-8")
    clean = collect_provenance(env={}, server_info=None, gpu=None, repo_dir=tmp_path)
    assert clean["git"] == {"commit": commit, "dirty": False}
    (tmp_path / "test_x.py").write_text("x = 2\n", encoding="utf-8")
    dirty = collect_provenance(env={}, server_info=None, gpu=None, repo_dir=tmp_path)
    assert dirty["git"] == {"commit": commit, "dirty": True}


# --------------------------------------------------------------------------- describe


def test_describe_a_new_baseline(tmp_path: Path) -> None:
    update = BaselineStore(tmp_path).write(make_record(samples={"tok_s": (87.7, 88.7, 89.7)}))
    assert update.describe() == [
        f"new baseline: {update.path}",
        "tok_s 88.7 tok/s, n=3, CV 1.1%",
    ]


def test_describe_old_to_new_with_fingerprint_changes(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.write(make_record(samples={"tok_s": (87.7, 88.7, 89.7), "ttft": (0.2, 0.2)}))
    changed_hard = {**HARD, "speculative_num_steps": 5}
    changed_soft = {**SOFT, "sglang_version": "0.5.4"}
    update = store.write(
        make_record(
            samples={"tok_s": (90.2, 91.2, 92.2), "accept_length": (1.85, 2.12)},
            hard=changed_hard,
            soft=changed_soft,
        )
    )
    assert update.describe() == [
        f"updated baseline: {update.path}",
        "accept_length (new metric) 1.99 tokens/step, n=2, CV 9.6%",
        "tok_s 88.7 -> 91.2 tok/s (+2.8%), n=3, CV 1.1%",
        "ttft removed (was 0.2 s)",
        "hard field changed: speculative_num_steps: baseline 2, now 5",
        "soft field changed: sglang_version: baseline '0.5.3', now '0.5.4'",
    ]


def test_describe_a_drop_and_custom_units() -> None:
    old = make_record(samples={"tok_s": (100.0, 100.0)})
    new = make_record(samples={"tok_s": (94.0, 94.0)})
    update = BaselineUpdate(Path("b.json"), old, new)
    assert update.describe(units={})[1] == "tok_s 100.0 -> 94 (-6.0%), n=2, CV 0.0%"


# --------------------------------------------------------------------------- fingerprint check


def test_hard_mismatch_is_refused_naming_the_fields() -> None:
    stored = make_record()
    current = Fingerprint(
        hard={**HARD, "speculative_num_steps": 5, "env": {"NCCL_PROTO": "LL"}},
        soft={**SOFT, "driver": "580.1"},
    )
    check = check_fingerprint(stored, current)
    assert not check.comparable
    assert [d.name for d in check.hard] == ["env", "speculative_num_steps"]
    assert [d.name for d in check.soft] == ["driver"]
    message = check.error_message(Path("baselines/hw/test_x.json"))
    first_line = message.splitlines()[0]
    assert first_line.startswith("baselines/hw/test_x.json: not compared")
    assert "hard fields differ: env, speculative_num_steps" in first_line
    assert "speculative_num_steps: baseline 2, now 5" in message
    assert "driver: baseline '575.57.08', now '580.1'" in message
    assert "--update-baselines" in message


def test_soft_mismatch_only_warns() -> None:
    check = check_fingerprint(
        make_record(), Fingerprint(hard=HARD, soft={"sglang_version": "0.5.4"})
    )
    assert check.comparable
    assert check.hard == ()
    warning = check.warning_message("b.json")
    assert warning.startswith("b.json: compared, but soft fields differ")
    assert "sglang_version: baseline '0.5.3', now '0.5.4'" in warning


def test_workload_and_simulation_differences_are_hard() -> None:
    stored = make_record()
    check = check_fingerprint(
        stored, Fingerprint(hard=HARD, soft=SOFT), workload_hash="w-bbbb", simulated=True
    )
    assert [d.name for d in check.hard] == ["workload_hash", "simulated"]
    same = check_fingerprint(
        stored, Fingerprint(hard=HARD, soft=SOFT), workload_hash="w-aaaa", simulated=False
    )
    assert same.comparable
    assert same.soft == ()


# --------------------------------------------------------------------------- lookup messages


def test_a_changed_workload_is_named_by_the_field_that_changed(tmp_path: Path) -> None:
    fields = {"prompts": "4 prompts, sha256 ab", "max_new_tokens": 500, "concurrency": 1}
    store = BaselineStore(tmp_path)
    store.write(make_record(provenance={"workload": fields}))
    now = {**fields, "max_new_tokens": 256}
    lookup = BaselineLookup(store, HW, "seed-chat", "w-bbbb", workload_fields=now)
    refs, _ = lookup.resolve(TEST_ID, Fingerprint(hard=HARD, soft=SOFT))
    problem = refs[OWN].problem or ""
    assert refs[OWN].mismatch
    assert "max_new_tokens was 500, now 256" in problem
    assert "concurrency" not in problem
    # A baseline from before workloads were stored says so instead of guessing.
    store.write(make_record())
    refs, _ = lookup.resolve(TEST_ID, Fingerprint(hard=HARD, soft=SOFT))
    assert "does not store its workload's fields" in (refs[OWN].problem or "")


def test_a_missing_against_baseline_names_who_records_it(tmp_path: Path) -> None:
    hint = "it is recorded by t.py::test_nospec (in this session): run it first"
    lookup = BaselineLookup(
        BaselineStore(tmp_path), HW, "seed-chat", "w-aaaa", recorders={"nospec": hint}
    )
    refs, _ = lookup.resolve(TEST_ID, Fingerprint(hard=HARD), {"nospec": Fingerprint(hard=HARD)})
    problem = refs["nospec"].problem or ""
    assert "no stored baseline of profile 'nospec'" in problem
    assert "against= compares with the baseline a test of that profile records" in problem
    assert problem.endswith(hint)


# ------------------------------------------------------- concurrent sessions, one baselines tree

STRESS_ROUNDS = 60
STRESS_FILES = 3  # test ids each session writes per round, as a session of several tests does


def _stress_values(session: int, round_: int, index: int) -> tuple[float, ...]:
    return tuple(float(session * 100_000 + round_ * 10 + index) + k / 100 for k in range(200))


def _stress_session(
    root: str, lock_dir: str, session: int, barrier: Any, errors: Any, rounds: int
) -> None:
    """Child process: one --update-baselines session with its own state directory (so its own
    lock directory), writing the same baselines as the other session, round by round."""
    store = BaselineStore(Path(root), lock_dir=Path(lock_dir))
    for round_ in range(rounds):
        barrier.wait(60)  # both sessions start the round's writes at the same moment
        for index in range(STRESS_FILES):
            record = make_record(
                f"tests/test_rel.py::test_{index}",
                samples={"tok_s": _stress_values(session, round_, index)},
            )
            try:
                store.write(record)
            except Exception as exc:  # a lost write: the test reports every one of them
                errors.put(f"session {session}, round {round_ + 1}, test_{index}: {exc}")
        barrier.wait(60)  # the round is over for both: what is on disk must be one of theirs
        for index in range(STRESS_FILES):
            found = store.load(HW, f"tests/test_rel.py::test_{index}")
            mine, theirs = (_stress_values(s, round_, index) for s in (session, 1 - session))
            if found is None or found.samples["tok_s"] not in (mine, theirs):
                errors.put(f"session {session}, round {round_ + 1}, test_{index}: not written")
        barrier.wait(60)  # nobody starts the next round while the other still reads


def test_two_sessions_writing_one_baselines_tree_never_lose_a_write(tmp_path: Path) -> None:
    """#27 item 4: two --update-baselines sessions with their own state directories (so their
    own lock directories) write the same baselines at the same moment, round after round. No
    write may fail (one session's clean-up of stale temp files removed the other's live temp
    file before its rename: "could not write ... .test_d.json.<random>.tmp: No such file"), and
    no temp file may be left behind."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    errors = context.Queue()
    root = tmp_path / "baselines"
    sessions = [
        context.Process(
            target=_stress_session,
            args=(str(root), str(tmp_path / f"state-{s}" / "locks"), s, barrier, errors, rounds),
        )
        for s, rounds in ((0, STRESS_ROUNDS), (1, STRESS_ROUNDS))
    ]
    for child in sessions:
        child.start()
    for child in sessions:
        child.join(300)
    lost = []
    while not errors.empty():
        lost.append(errors.get())
    assert [child.exitcode for child in sessions] == [0, 0], lost
    assert lost == [], f"{len(lost)} of {2 * STRESS_ROUNDS * STRESS_FILES} writes lost: {lost[:5]}"
    leftovers = [p.name for p in root.rglob("*") if p.is_file() and p.suffix != ".json"]
    assert leftovers == []


def test_stale_temp_clean_up_removes_only_temp_files_whose_writer_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "test_d.json"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    old = datetime.now(timezone.utc).timestamp() - STALE_TEMP_SECONDS - 60
    names = {
        "live writer here": f".test_d.json.{live.pid}@{_host()}.abcd1234.tmp",
        "dead writer here": f".test_d.json.{dead.pid}@{_host()}.abcd1234.tmp",
        "other host, fresh": ".test_d.json.42@elsewhere.abcd1234.tmp",
        "other host, old": ".test_d.json.43@elsewhere.abcd1234.tmp",
        "older plugin, fresh": ".test_d.json.abcd1234.tmp",
        "older plugin, old": ".test_d.json.efgh5678.tmp",
        "not a temp file": ".test_d.json.notes.tmp",
    }
    try:
        for what, name in names.items():
            (tmp_path / name).write_text("{}")
            if what.endswith(", old"):
                os.utime(tmp_path / name, (old, old))
        remove_stale_temp_files(path)
        left = {what for what, name in names.items() if (tmp_path / name).exists()}
    finally:
        live.kill()
        live.wait()
    assert left == {
        "live writer here",
        "other host, fresh",
        "older plugin, fresh",
        "not a temp file",
    }


def test_a_write_whose_temp_file_vanished_before_the_rename_is_done_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older plugin's clean-up may still remove a live temp file: the write is not lost."""
    store = BaselineStore(tmp_path)
    real_replace = os.replace
    removed: list[str] = []

    def clean_up_first(src: str, dst: str) -> None:
        if not removed:
            removed.append(src)
            os.unlink(src)  # another writer's clean-up, just before our rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", clean_up_first)
    record = make_record(samples={"tok_s": (3.0, 3.1)})
    path = store.write(record).path
    assert removed
    assert store.load(HW, TEST_ID) == record
    assert [p.name for p in path.parent.iterdir()] == [path.name]
