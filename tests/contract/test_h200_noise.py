"""The measured noise of one H200 at TP 1 (``data/h200_noise.json``) holds together, and what the
simulator and the cross-night benchmark take from it is what it says.

The file was written by the noise phase of ``scripts/gpu-smoke`` (evidence in
``docs/gpu-smoke-2026-12-03/``): a GPU-bound SGLang 0.5.15 server, CUDA graphs on, a
Llama-3.1-8B-shaped target with random bf16 weights and EAGLE3 heads of the real draft shape
built to agree always ("match": accept length steps + 1), never ("miss": 1) or on the first
draft position only ("first": 2). Its summary figures are recomputed here from the per-launch
lists it keeps, so a hand edit of one figure, or a figure copied elsewhere that drifts from it
(``sim/model.toml``'s ``[noise.*]`` presets), fails.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_specdecode.sim.noise import load_presets

from .conftest import H200_NOISE, h200_noise

REPO = Path(__file__).resolve().parents[2]


def _rig_noise_phase() -> ModuleType:
    """The gpu-smoke noise phase's own module (standard library only): its table of how each
    profile was built is what the measured figures must match."""
    spec = importlib.util.spec_from_file_location(
        "gpu_smoke_noise", REPO / "scripts" / "gpu_smoke" / "noise.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_RIG = _rig_noise_phase()
#: profile -> (the head it was built with, None for no speculation; speculative steps)
BUILT: dict[str, tuple[str | None, int]] = dict(_RIG.PROFILES)
#: The profiles measured over many launches (the noise figures); the others check the heads.
MAIN: tuple[str, ...] = tuple(_RIG.MAIN)
MIN_LAUNCHES = 8
#: A bf16 decode step that reads its weights at under this share of the device's copy
#: bandwidth would be bound by something else than the GPU's memory (the host, launches).
GPU_BOUND_SHARE = 0.6


def built_accept_length(head: str | None, steps: int) -> float | None:
    """The accept length a head of that kind gives by construction."""
    return {None: None, "match": steps + 1.0, "miss": 1.0, "first": 2.0}[head]


def rms(values: list[float]) -> float:
    return math.sqrt(statistics.mean(v * v for v in values))


PROFILES: dict[str, Any] = h200_noise()["profiles"]


def test_the_file_names_its_machine_versions_flags_and_protocol() -> None:
    data = h200_noise()
    machine = data["machine"]
    assert "H200" in machine["nvidia_smi"]
    assert machine["sglang"] == "0.5.15"
    for package in ("sglang-kernel", "flashinfer-python", "torch", "triton", "python"):
        assert machine[package], package
    assert "one H200, TP 1" in data["what"]
    flags = data["server_flags"]
    assert flags
    assert all(isinstance(flag, str) for flag in flags)
    # TP 1 with CUDA graphs on: neither a tensor-parallel size nor graphs turned off
    assert not {"--tp-size", "--tp", "--tensor-parallel-size", "--disable-cuda-graph"} & set(flags)
    assert data["protocol"]["runs_per_launch"] >= 8
    assert set(PROFILES) == set(BUILT)
    for name, profile in PROFILES.items():
        assert profile["cuda_graph_in_decode"] == ["True"], name
        assert set(profile["batches"]) <= set(data["batches"]), name


@pytest.mark.parametrize("name", MAIN)
def test_every_main_profile_has_enough_launches_none_failed(name: str) -> None:
    profile = PROFILES[name]
    launches = profile["launches"]
    assert launches >= MIN_LAUNCHES
    assert profile["failed_launches"] == 0
    for key in ("launch_means_tok_s", "run_cv_per_launch", "step_ms_per_launch", "run1_over_warm",
                "run2_over_warm", "noflush_over_flush", "ready_s"):  # fmt: skip
        assert len(profile[key]) == launches, key


@pytest.mark.parametrize("name", sorted(BUILT))
def test_the_recorded_figures_recompute_from_the_per_launch_lists(name: str) -> None:
    profile = PROFILES[name]
    means = profile["launch_means_tok_s"]  # rounded to 0.01 tok/s in the file
    run_cvs = profile["run_cv_per_launch"]  # rounded to 1e-5
    assert profile["tok_s_mean"] == pytest.approx(statistics.mean(means), rel=1e-4)
    assert profile["run_cv_median"] == pytest.approx(statistics.median(run_cvs), abs=1e-5)
    assert profile["run_cv_max"] == pytest.approx(max(run_cvs), abs=1e-5)
    assert profile["run_cv_rms"] == pytest.approx(rms(run_cvs), abs=1e-5)
    assert profile["step_ms_mean"] == pytest.approx(
        statistics.mean(profile["step_ms_per_launch"]), rel=1e-4
    )
    if len(means) < 2:
        assert profile["launch_mean_cv"] is None
        assert profile["launch_cv_beyond_runs"] is None
    else:
        launch_mean_cv = statistics.stdev(means) / statistics.mean(means)
        assert profile["launch_mean_cv"] == pytest.approx(launch_mean_cv, rel=1e-3)
        # the launch means' own spread, less what the runs averaged into each mean explain
        beyond = math.sqrt(
            profile["launch_mean_cv"] ** 2 - profile["run_cv_rms"] ** 2 / profile["runs_per_launch"]
        )
        assert profile["launch_cv_beyond_runs"] == pytest.approx(beyond, rel=1e-9)
    if name != "noise-nospec":
        nospec = PROFILES["noise-nospec"]["tok_s_mean"]
        assert profile["speedup_vs_nospec"] == pytest.approx(profile["tok_s_mean"] / nospec)


def test_the_largest_run_cv_is_the_largest_of_the_profiles() -> None:
    largest = max(profile["run_cv_max"] for profile in PROFILES.values())
    assert h200_noise()["largest_run_cv"] == pytest.approx(largest, abs=1e-5)


@pytest.mark.parametrize("name", sorted(BUILT))
def test_accept_lengths_are_exactly_what_the_heads_were_built_for(name: str) -> None:
    expected = built_accept_length(*BUILT[name])
    profile = PROFILES[name]
    assert profile["expected_accept_length"] == expected
    seen = [] if expected is None else [expected]  # every launch, client and SGLang's log alike
    assert profile["accept_length"] == seen
    assert profile["sglang_log_accept_len"] == seen
    assert (profile["sglang_log_lines"] > 0) == (expected is not None)


def test_decode_is_gpu_bound() -> None:
    data = h200_noise()
    nospec = PROFILES["noise-nospec"]
    assert nospec["bytes_per_step"] == data["rig"]["target_bytes_per_step"]
    achieved = nospec["bytes_per_step"] / (nospec["step_ms_mean"] / 1000) / 1e9
    assert nospec["achieved_gb_s"] == pytest.approx(achieved)
    assert achieved / data["copy_bandwidth_gb_s"] >= GPU_BOUND_SHARE


def test_the_simulators_noise_presets_are_these_figures() -> None:
    """``[noise.*]`` of ``sim/model.toml``: one preset per main profile, with its steps, its
    pooled run CV and its launch CV beyond the runs, rounded to 1e-5, and a label that names
    this file."""
    presets = load_presets()
    by_profile = {preset.profile: preset for preset in presets.presets.values()}
    assert sorted(by_profile) == sorted(MAIN)
    assert len(by_profile) == len(presets.presets)
    assert presets.auto_tp_size == 1
    for name, preset in by_profile.items():
        measured = PROFILES[name]
        assert preset.steps == BUILT[name][1], name
        assert preset.run_cv == pytest.approx(measured["run_cv_rms"], abs=5e-6), name
        assert preset.launch_cv == pytest.approx(measured["launch_cv_beyond_runs"], abs=5e-6), name
        assert preset.label == (
            f"measured on one H200, TP 1 ({H200_NOISE.relative_to(REPO).as_posix()})"
        )
