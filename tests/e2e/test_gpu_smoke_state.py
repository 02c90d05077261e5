"""scripts/gpu-smoke's state outlives the machine: after every unit it is carried out to $OUT as
one archive the device tool brings back, and a call on a fresh machine restores it with
GPU_SMOKE_RESTORE and goes on where the last one stopped (issue 47).

The end-to-end test runs the script's dry run (the simulated server in place of SGLang 0.5.15,
no GPU) as four calls, each on a fresh state directory standing in for a fresh machine: record;
a call whose deadline leaves room for nothing (it restores, finds record done, stops with exit
3 and carries the state out again); the default phases, which go on with check, attach and the
noise summary; and a check on a card that has no baseline of its own, which records one in the
same sitting and says so. The archive's parts, the budget's separation of the compiling launch
and the limits of what $OUT may hold are tested alone, in-process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-smoke"
PACKAGE = REPO / "scripts" / "gpu_smoke" / "smoke"
ARCHIVE = "gpu-smoke-state.tar.gz"


def _module(name: str) -> ModuleType:
    """A module of the driver's package that imports nothing of it (state, budget)."""
    spec = importlib.util.spec_from_file_location(f"gpu_smoke_{name}", PACKAGE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


state = _module("state")
budget = _module("budget")


def _free_port() -> int:
    """A free port SGLang 0.5.15 takes: it refuses a port whose derived gRPC port (port +
    10000) is above 65535, and so does the simulated server of that release."""
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(20000, 50000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-50000")


def _call(tmp: Path, name: str, *phases: str, **env: str) -> tuple[int, str, Path]:
    """One call of the dry run on a fresh machine: the state directory empty, at the same path
    as on the last machine (the baselines' fingerprints hold the models' paths there); its
    $OUT."""
    out = tmp / f"out-{name}"
    machine = tmp / "machine"
    shutil.rmtree(machine, ignore_errors=True)
    full_env = {
        **os.environ,
        "GPU_SMOKE_DRY_RUN": "1",
        "GPU_SMOKE_STATE": str(machine),
        "OUT": str(out),
        "PYTHON": sys.executable,
        "GPU_SMOKE_ATTACH_PORT": str(_free_port()),
        **env,
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), *phases], env=full_env, capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr, out


def _names(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return tar.getnames()


def _member(archive: Path, name: str) -> dict:
    with tarfile.open(archive) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return json.loads(f.read())


def test_the_state_is_carried_out_and_restored_on_a_fresh_machine(tmp_path: Path) -> None:
    # 1. record only: the archive comes back with the baselines and the results
    rc, output, out1 = _call(tmp_path, "1", "record")
    assert rc == 0, output[-3000:]
    assert state.out_problems(out1) == []
    assert sorted(p.name for p in out1.iterdir()) == sorted(
        [ARCHIVE, "gpu-smoke-table.md", "gpu-smoke-results.json"]
    )
    names = _names(out1 / ARCHIVE)
    for test in ("test_nospec", "test_eagle3_match", "test_eagle3_miss"):
        assert f"baselines/simulated/test_gpu_smoke/{test}.json" in names
    assert "cards/simulated/results/record-smoke-nospec.json" in names
    assert any(n.startswith("cards/simulated/pt-record-smoke-nospec/") for n in names)
    assert not any(n.startswith(("models/", "suite/")) for n in names)
    seq1 = _member(out1 / ARCHIVE, "state.json")["seq"]

    # 2. a fresh machine, the folder of call 1's $OUT restored, a deadline that admits
    #    nothing: record is done, check waits for the next call, the state goes out again
    rc, output, out2 = _call(
        tmp_path, "2", GPU_SMOKE_RESTORE=str(out1), GPU_SMOKE_DEADLINE=str(int(time.time()))
    )
    assert rc == 3, output[-3000:]
    assert f"restored {len(names)} files from {out1}" in output
    assert "[record] smoke-nospec: done in an earlier call" in output
    assert "[check] smoke-nospec: 1 launch(es): about" in output
    assert "left for the next call" in output
    assert "GPU_SMOKE_RESTORE=" in output
    assert _member(out2 / ARCHIVE, "state.json")["seq"] > seq1
    assert set(names) <= set(_names(out2 / ARCHIVE))

    # 3. another fresh machine, call 2's archive restored: the default phases go on
    rc, output, out3 = _call(tmp_path, "3", GPU_SMOKE_RESTORE=str(out2 / ARCHIVE))
    assert rc == 0, output[-3000:]
    assert "[record] smoke-eagle3-miss: done in an earlier call" in output
    assert "[record-smoke-" not in output  # nothing recorded again
    assert "all phases done: record check attach noise-summary table" in output
    results = json.loads((out3 / "gpu-smoke-results.json").read_text())
    recorded = _member(out1 / ARCHIVE, "cards/simulated/results/record-smoke-nospec.json")
    assert results["record"]["rows"]["smoke-nospec"]["tok_s"] == pytest.approx(
        recorded["rows"]["smoke-nospec"]["tok_s"]
    )
    for profile in ("smoke-nospec", "smoke-eagle3-match", "smoke-eagle3-miss"):
        assert results["check"]["rows"][profile]["outcome"] == "pass"
    report = json.loads(
        _extract(out3 / ARCHIVE, "cards/simulated/results/check-smoke-nospec-report.json")
    )
    baseline_path = report["tests"][0]["checks"][0]["baseline_path"]
    assert baseline_path.startswith(str(tmp_path / "machine" / "baselines" / "simulated"))
    assert results["attach"]["passed"]
    launches = results["noise_summary"]["profiles"]["smoke-nospec"]["launches"]
    assert [e["phase"] for e in launches] == ["record", "check"]
    table = (out3 / "gpu-smoke-table.md").read_text()
    assert "- record: done, 3 of 3 profiles" in table
    assert "pytest exit" not in table
    assert state.out_problems(out3) == []

    # 4. a card with no baseline of its own: check records one in the same sitting, says so
    card = "1xNVIDIA-H100-80GB-HBM3"
    rc, output, out4 = _call(
        tmp_path, "4", "check", GPU_SMOKE_RESTORE=str(out3),
        PYTEST_SPECDECODE_HARDWARE_KEY=card,
    )  # fmt: skip
    assert rc == 0, output[-3000:]
    assert (
        f"[check] smoke-nospec: no baseline of this card ({card}); there are baselines of "
        "simulated: recording one now, in this sitting, then checking against it"
    ) in output
    names4 = _names(out4 / ARCHIVE)
    assert f"baselines/{card}/test_gpu_smoke/test_eagle3_miss.json" in names4
    assert "baselines/simulated/test_gpu_smoke/test_eagle3_miss.json" in names4
    results4 = json.loads((out4 / "gpu-smoke-results.json").read_text())
    assert results4["check"]["rows"]["smoke-eagle3-miss"]["outcome"] == "pass"
    assert results4["check"]["rows"]["smoke-eagle3-miss"]["hardware_key"] == card


def _extract(archive: Path, name: str) -> str:
    with tarfile.open(archive) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return f.read().decode()


def _fill(root: Path, files: int, size: int) -> None:
    results = root / "cards" / "card-a" / "results"
    results.mkdir(parents=True)
    (root / "baselines" / "card-a").mkdir(parents=True)
    (root / "baselines" / "card-a" / "b.json").write_text("{}")
    (root / "models").mkdir()
    (root / "models" / "weights.bin").write_bytes(b"w" * 1000)
    for i in range(files):
        (results / f"r{i}.json").write_bytes(os.urandom(size))  # incompressible


def test_a_large_state_goes_out_in_parts_and_comes_back_whole(tmp_path: Path) -> None:
    _fill(tmp_path / "a", files=3, size=40_000)
    out = tmp_path / "out"
    parts = state.pack(tmp_path / "a", out, part_bytes=50_000)
    assert [p.name for p in parts] == [f"{ARCHIVE}.000", f"{ARCHIVE}.001", f"{ARCHIVE}.002"]
    assert all(p.stat().st_size <= 50_000 for p in parts)
    message = state.restore(out, tmp_path / "b")
    assert "restored 5 files" in message  # state.json, the baseline, 3 results
    for i in range(3):
        name = f"cards/card-a/results/r{i}.json"
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()
    assert not (tmp_path / "b" / "models").exists()  # the models are rebuilt, not carried
    # a smaller state written later replaces the parts with one file
    for p in (tmp_path / "a" / "cards" / "card-a" / "results").glob("r[12].json"):
        p.unlink()
    assert [p.name for p in state.pack(tmp_path / "a", out, part_bytes=50_000)] == [ARCHIVE]
    assert sorted(p.name for p in out.iterdir()) == [ARCHIVE]


def test_an_archive_no_newer_than_the_state_here_is_not_unpacked(tmp_path: Path) -> None:
    _fill(tmp_path / "a", files=1, size=10)
    state.pack(tmp_path / "a", tmp_path / "out")
    (tmp_path / "a" / "cards" / "card-a" / "results" / "later.json").write_text("{}")
    message = state.restore(tmp_path / "out" / ARCHIVE, tmp_path / "a")
    assert "kept, nothing unpacked" in message
    assert (tmp_path / "a" / "cards" / "card-a" / "results" / "later.json").exists()
    with pytest.raises(FileNotFoundError, match=ARCHIVE):
        state.restore(tmp_path / "a", tmp_path / "c")


def test_what_the_device_would_not_bring_back_is_named(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "a" / "b" / "c").mkdir(parents=True)
    (out / "a" / "b" / "c" / "deep.txt").write_text("x")
    (out / "bad name.txt").write_text("x")
    for i in range(7):
        (out / f"f{i}").write_text("x")
    problems = state.out_problems(out)
    assert problems[0] == f"9 files in {out}, more than 8"
    assert "a/b/c/deep.txt: more than 2 folders down" in problems
    assert any(p.startswith("bad name.txt: a name with other characters") for p in problems)
    (out / "bad name.txt").unlink()
    (out / "a" / "b" / "c" / "deep.txt").unlink()
    assert state.out_problems(out) == []


def test_the_estimate_counts_the_compiling_launch_apart() -> None:
    """The H200 figures of issue 47: a first launch ready after 149 s (triton compiling), the
    warm ones after 59-81 s, a session of one launch 110 s warm. The slowest wall time per
    launch (160 s) was the old estimate; the warm one is about 110 s."""
    first = budget.Session(wall_s=185.0, ready_s=(149.0,), preflight_s=(25.0,), first_on_boot=True)
    warm = [
        budget.Session(wall_s=110.0, ready_s=(70.0,), preflight_s=(22.0,), first_on_boot=False),
        budget.Session(wall_s=100.0, ready_s=(59.0,), preflight_s=(), first_on_boot=False),
    ]
    costs = budget.estimate([first, *warm], budget.PRIOR)
    assert costs.preflight_s == 25.0
    assert costs.warm_ready_s == pytest.approx(64.5)
    assert costs.first_extra_s == pytest.approx(149.0 - 64.5)
    # warm: (110 - 22) = 88 and 100; the compiling one less its extra: 185 - 25 - 84.5 = 75.5
    assert costs.launch_s == pytest.approx(100.0)
    assert costs.unit(1, preflight=True, first_on_boot=False) == pytest.approx(125.0)
    assert costs.unit(1, preflight=False, first_on_boot=True) == pytest.approx(184.5)
    assert costs.unit(2, preflight=True, first_on_boot=False) == pytest.approx(250.0)
    # before anything is seen: the prior; after the compiling launch alone, its warm part
    assert budget.estimate([], budget.PRIOR) is budget.PRIOR
    alone = budget.estimate([first], budget.PRIOR)
    assert alone.first_extra_s == pytest.approx(149.0 - budget.PRIOR.warm_ready_s)
    assert alone.launch_s == pytest.approx(185.0 - 25.0 - (149.0 - budget.PRIOR.warm_ready_s))


def test_the_first_session_on_each_boot_is_the_compiling_one(tmp_path: Path) -> None:
    def result(name: str, started: float, boot: str, ready: list[float]) -> None:
        body = {"kind": "session", "started": started, "boot": boot, "wall_s": 100.0,
                "ready_s": ready, "preflight_s": []}  # fmt: skip
        (tmp_path / f"{name}.json").write_text(json.dumps(body))

    result("record-a", 1.0, "boot-1", [150.0])
    result("record-b", 2.0, "boot-1", [70.0])
    result("check-a", 3.0, "boot-2", [140.0])
    (tmp_path / "record.json").write_text(json.dumps({"ready_s": [1.0], "profiles_done": 2}))
    (tmp_path / "record-a-report.json").write_text("{}")
    sessions = budget.sessions_from(tmp_path)
    assert [s.first_on_boot for s in sessions] == [True, False, True]
    assert [s.ready_s for s in sessions] == [(150.0,), (70.0,), (140.0,)]
    assert budget.launched_on(tmp_path, "boot-2")
    assert not budget.launched_on(tmp_path, "boot-3")
