"""``--sim-sglang-version``: one SGLang release at a time, its flags, resolution and shapes."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import statistics
import subprocess
import sys
from typing import Any

import httpx
import pytest

from pytest_specdecode import sglang_releases
from pytest_specdecode.profiles.profile import ServerProfile, Speculative, compare_server_args
from pytest_specdecode.servers.launcher import find_free_port
from pytest_specdecode.sim import versions
from pytest_specdecode.sim.args import ENV_LAUNCH_CV, StartupError, parse_args
from pytest_specdecode.sim.engine import Sequence
from pytest_specdecode.sim.server import spec_meta_info
from pytest_specdecode.sim.tokenizer import OutputTokens

from .conftest import EAGLE3_2STEP, NCCL_TUNED, StartSim, port_is_open

EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"]


def at(version: str, *flags: str, env: dict[str, str] | None = None) -> Any:
    return parse_args(["--model-path", "m", "--sim-sglang-version", version, *flags], env)


def test_supported_range_and_version_strings() -> None:
    assert sglang_releases.known_releases()[0] == "0.5.6"
    assert sglang_releases.newest() == "0.5.23"
    assert sglang_releases.normalize("0.5.15.post1") == "0.5.15"
    assert sglang_releases.normalize("0.5.9rc0") == "0.5.9"
    for bad in ("0.5.5", "0.5.24", "0.4.9", "latest"):
        with pytest.raises(ValueError, match=r"0\.5\.6 to 0\.5\.23"):
            sglang_releases.normalize(bad)
    assert parse_args(["--model-path", "m"]).release == "0.5.23"  # the newest by default
    assert parse_args(["--model-path", "m"], {versions.ENV_SGLANG_VERSION: "0.5.9"}).release == (
        "0.5.9"
    )


def test_an_unsupported_version_is_a_usage_error_naming_the_range() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_specdecode.sim", "--model-path", "m",
         "--sim-sglang-version", "0.4.0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unsupported SGLang version '0.4.0'" in done.stderr
    assert "0.5.6 to 0.5.23" in done.stderr


@pytest.mark.parametrize(
    ("version", "flags", "accepted"),
    [
        ("0.5.13", ["--cuda-graph-max-bs", "8"], True),
        ("0.5.15", ["--cuda-graph-max-bs", "8"], True),  # deprecated alias of ..._decode
        ("0.5.23", ["--cuda-graph-max-bs", "8"], False),  # removed in 0.5.20
        ("0.5.9", ["--stream-output"], True),
        ("0.5.23", ["--stream-output"], False),
        ("0.5.15", ["--grpc-port", "40000"], False),  # env-only before 0.5.16
        ("0.5.16", ["--grpc-port", "40000"], True),
        ("0.5.23", ["--some-future-flag", "7"], False),
        ("0.5.6", ["--enable-torch-compile"], True),
    ],
)
def test_flags_are_those_of_the_release(
    version: str, flags: list[str], accepted: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    if accepted:
        at(version, *flags)
        return
    with pytest.raises(SystemExit) as exited:
        at(version, *flags)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: sglang serve ")
    if flags[0] == "--cuda-graph-max-bs":  # argparse's prefix matching, as in real SGLang
        assert "error: ambiguous option: --cuda-graph-max-bs could match" in err
    else:
        assert f"error: unrecognized arguments: {' '.join(flags)}" in err


def test_choices_and_types_are_checked_as_argparse_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        at("0.5.9", "--speculative-algorithm", "MEDUSA")
    assert "argument --speculative-algorithm: invalid choice: 'MEDUSA'" in capsys.readouterr().err
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit):
        at("0.5.23", "--speculative-num-steps", "two")
    assert "invalid int value: 'two'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        at("0.5.9", "--speculative-num-steps")  # a value is required
    assert "expected one argument" in capsys.readouterr().err


def test_the_old_prog_name_before_0_5_11(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        at("0.5.10", "--nope")
    assert "launch_server.py: error: unrecognized arguments: --nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("version", "topk", "overlap_disabled"),
    [
        ("0.5.6", None, True),  # spec v1: EAGLE family turns the overlap scheduler off
        ("0.5.10", "1", True),
        ("0.5.11", "1", False),  # spec v2 by default
        ("0.5.12", "4", True),  # ...but only for topk 1
        ("0.5.13", "4", False),  # spec v2 only
        ("0.5.23", "1", False),
    ],
)
def test_overlap_schedule_for_the_eagle_family(
    version: str, topk: str | None, overlap_disabled: bool
) -> None:
    flags = [*EAGLE3, "--speculative-num-steps", "3"]
    if topk:
        flags += ["--speculative-eagle-topk", topk, "--speculative-num-draft-tokens", "8"]
    resolved = at(version, *flags)
    assert resolved.server.disable_overlap_schedule is overlap_disabled
    assert resolved.fields["disable_overlap_schedule"] is overlap_disabled
    assert at(version, *flags, "--disable-overlap-schedule").server.disable_overlap_schedule


def test_auto_parameters_topk_1_rule_and_standalone() -> None:
    llama = at("0.5.15", "--model-path", "meta-llama/Llama-3.1-8B", *EAGLE3).server
    assert (llama.speculative_num_steps, llama.speculative_eagle_topk) == (5, 4)
    assert llama.speculative_num_draft_tokens == 8
    standalone = at(
        "0.5.15", "--model-path", "llama", "--speculative-algorithm", "STANDALONE"
    ).server
    assert standalone.speculative_num_steps == 3
    assert standalone.speculative_num_draft_tokens == 4
    forced = at(
        "0.5.15", *EAGLE3, "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "7",
    )  # fmt: skip
    assert forced.server.speculative_num_draft_tokens == 3
    assert any("adjusted to speculative_num_steps + 1" in note for note in forced.notes)


def test_ngram_uses_its_own_knobs() -> None:
    old = at("0.5.12", "--speculative-algorithm", "NGRAM")
    assert old.server.speculative_eagle_topk == 10  # --speculative-ngram-max-bfs-breadth
    assert old.server.speculative_num_draft_tokens == 12
    assert old.server.disable_overlap_schedule is True
    assert old.server.max_running_requests is None
    new = at(
        "0.5.15", "--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "4",
        "--speculative-num-draft-tokens", "6",
    )  # fmt: skip
    assert (new.server.speculative_eagle_topk, new.server.speculative_num_draft_tokens) == (4, 6)
    assert new.server.disable_overlap_schedule is False


def test_derived_grpc_port_is_refused_above_65535_on_0_5_11_to_0_5_15() -> None:
    for version in ("0.5.11", "0.5.15"):
        with pytest.raises(StartupError, match=r"^SGLANG_GRPC_PORT \(66661\) must be between"):
            at(version, "--port", "56661")
        at(version, "--port", "56661", env={"SGLANG_GRPC_PORT": "40000"})  # the workaround
        at(version, "--port", "55535")
    for version in ("0.5.10", "0.5.16", "0.5.23"):
        at(version, "--port", "56661")
    with pytest.raises(StartupError, match=r"--grpc-port \(30000\) must differ"):
        at("0.5.16", "--port", "30000", "--grpc-port", "30000")


def test_the_grpc_refusal_exits_1_before_the_port_opens() -> None:
    port = find_free_port("127.0.0.1", port_range=(55536, 65535))  # where 0.5.15 refuses
    done = subprocess.run(
        [sys.executable, "-m", "pytest_specdecode.sim", "--model-path", "m", "--port", str(port),
         "--sim-sglang-version", "0.5.15", "--sim-load-seconds", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"ValueError: SGLANG_GRPC_PORT ({port + 10000}) must be between 1 and 65535" in (
        done.stderr
    )
    assert "Traceback (most recent call last)" in done.stderr
    assert not port_is_open(port)


def test_server_info_fields_follow_the_release() -> None:
    old = at("0.5.13", "--cuda-graph-max-bs", "16").fields
    assert old["cuda_graph_max_bs"] == 16
    assert "cuda_graph_max_bs_decode" not in old
    new = at("0.5.15", "--cuda-graph-max-bs", "16").fields
    assert "cuda_graph_max_bs" not in new
    assert new["cuda_graph_max_bs_decode"] == 16
    assert new["cuda_graph_config"]["decode"]["max_bs"] == 16
    assert len(new) == 422  # the real 0.5.15's ServerArgs fields
    assert "grpc_port" in at("0.5.16").fields
    assert not any(name.startswith("_") for name in at("0.5.23").fields)


def _seq(verify_ct: int, accepted: int, completion: int) -> Sequence:
    seq = Sequence(
        rid="r", index=0, prompt_tokens=4, prompt_key=0, target_tokens=completion,
        stops_naturally=False, probs=(1.0, 1.0), speed=1.0, rng=random.Random(0),
        output=OutputTokens(1), arrival=0.0,
    )  # fmt: skip
    seq.output.extend(completion)
    seq.verify_ct, seq.accepted_drafts = verify_ct, accepted
    seq.accept_histogram = [0, 0, verify_ct]
    return seq


@pytest.mark.parametrize(
    ("version", "names"),
    [
        ("0.5.6", {"spec_accept_token_num", "spec_draft_token_num"}),
        ("0.5.9", {"spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram"}),
        ("0.5.11", {"spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram"}),
        (
            "0.5.15",
            {
                "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_accepted_drafts",
                "spec_proposed_drafts", "spec_correct_drafts_histogram", "spec_accept_histogram",
            },
        ),
        (
            "0.5.23",
            {
                "spec_num_correct_drafts", "spec_num_proposed_drafts",
                "spec_correct_drafts_histogram",
            },
        ),
    ],
)  # fmt: skip
def test_meta_info_spec_names_per_release(version: str, names: set[str]) -> None:
    era = versions.era(version)
    info = spec_meta_info(_seq(21, 42, 64), 3, era)
    assert set(info) == {"spec_accept_rate", "spec_accept_length", "spec_verify_ct"} | names
    assert info["spec_accept_length"] == pytest.approx(64 / 21)
    assert info["spec_accept_rate"] == 1.0
    # A request that never reached a verify step: 0.5.6 sends zeros, later releases nothing.
    idle = spec_meta_info(_seq(0, 0, 1), 3, era)
    if version == "0.5.6":
        assert idle == {"spec_accept_rate": 0.0, "spec_accept_length": 0, "spec_verify_ct": 0}
    else:
        assert idle == {}


def test_launch_factor_is_seeded_by_sim_and_launch_seed() -> None:
    def factor(*flags: str, env: dict[str, str] | None = None) -> float:
        return float(at("0.5.23", "--sim-seed", "3", *flags, env=env).sim.launch_factor)

    assert factor() == 1.0  # default CV 0 (a noise preset changes it: test_sim_noise_preset.py)
    assert factor("--sim-noise-preset", "none") == 1.0
    one = factor("--sim-launch-cv", "0.1", "--sim-launch-seed", "1")
    assert one == factor("--sim-launch-cv", "0.1", "--sim-launch-seed", "1")
    assert one != factor("--sim-launch-cv", "0.1", "--sim-launch-seed", "2")
    assert factor("--sim-launch-seed", "1", env={ENV_LAUNCH_CV: "0.1"}) == one
    # Unseeded launches differ from each other.
    assert len({factor("--sim-launch-cv", "0.1") for _ in range(5)}) == 5
    # The distribution over 3000 launch seeds: the parsed options with only the seed replaced
    # (3000 argument parses took 40 s of a CI worker; the factor depends on nothing else).
    options = at("0.5.23", "--sim-seed", "3", "--sim-launch-cv", "0.12").sim
    draws = [dataclasses.replace(options, launch_seed=i).launch_factor for i in range(3000)]
    assert draws[7] == factor("--sim-launch-cv", "0.12", "--sim-launch-seed", "7")
    mean = statistics.fmean(draws)
    assert mean == pytest.approx(1.0, abs=0.01)
    assert statistics.pstdev(draws) / mean == pytest.approx(0.12, rel=0.08)


def test_a_live_launch_reports_its_factor_and_runs_at_it(start_sim: StartSim) -> None:
    flags = ("--sim-noise-cv", "0", "--sim-seed", "4", "--sim-launch-seed", "9")
    payload = {"text": "x", "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}}

    def run(*extra: str) -> tuple[float, dict[str, Any]]:
        sim = start_sim(*flags, *extra)
        latency = float(sim.generate(payload).json()["meta_info"]["e2e_latency"])
        info = httpx.get(f"{sim.base_url}/server_info", timeout=5).json()
        sim.kill()
        return latency, info

    base, _ = run()
    varied, info = run("--sim-launch-cv", "0.2")
    assert info["sim_launch_cv"] == 0.2
    assert info["sim_launch_seed"] == 9
    factor = info["sim_launch_speed_factor"]
    assert factor != 1.0
    assert varied == pytest.approx(base / factor, rel=0.02)


def test_always_accepted_draft_shows_steps_plus_one_in_log_and_metrics(
    start_sim: StartSim,
) -> None:
    sim = start_sim(
        *EAGLE3_2STEP, "--sim-accept-scale", "10", "--enable-metrics", "--decode-log-interval",
        "7", "--sim-seed", "1", env=NCCL_TUNED,
    )  # fmt: skip
    meta = sim.generate(
        {"text": "a", "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
    ).json()["meta_info"]
    assert meta["spec_verify_ct"] == 21  # 1 token from prefill + 21 verifies x 3
    assert meta["spec_accept_length"] == pytest.approx(64 / 21)  # per request: includes prefill
    lines = re.findall(r"accept len: ([\d.]+), accept rate: ([\d.]+)", sim.log())
    assert lines
    assert all(line == ("3.00", "1.00") for line in lines)
    metrics = httpx.get(f"{sim.base_url}/metrics", timeout=5).text
    assert re.search(r"^sglang:spec_accept_length\{[^}]*\} 3\.0$", metrics, re.M)


@pytest.mark.parametrize("version", ["0.5.6", "0.5.15", "0.5.23"])
def test_live_server_speaks_the_release(start_sim: StartSim, version: str) -> None:
    sim = start_sim(
        *EAGLE3_2STEP, "--sim-sglang-version", version, "--enable-metrics", env=NCCL_TUNED
    )
    era = versions.era(version)
    log = sim.log()
    assert f"speaking SGLang {version}" in log
    if era.graph_capture_per_graph:
        assert "Capture target verify CUDA graph begin" in log
        assert "KV Cache is allocated. dtype: torch.bfloat16" in log
    else:
        assert "Capture cuda graph begin. This can take up to several minutes." in log
        assert "Capture draft cuda graph begin" in log
    with sim.client() as client:
        info = client.get("/server_info").json()
        assert info["version"] == f"{version}+simulated"
        assert info["sim_sglang_version"] == version
        assert ("cuda_graph_max_bs" in info) is (version == "0.5.6")
        assert (client.get("/get_load").status_code == 200) is era.get_load_route
        meta = client.post(
            "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 20}}
        ).json()["meta_info"]
    assert era.retractions_key in meta
    assert "spec_verify_ct" in meta
    assert ("spec_correct_drafts_histogram" in meta) is (era.patch >= 12)
    assert ("decode_finished_ts" in meta) is (not era.modern_meta)


def test_health_stays_503_through_the_warm_up(start_sim: StartSim) -> None:
    sim = start_sim(load_seconds=2.0, speed=2, ready=False)  # 0.7 s of warm-up after the port
    sim.wait_for_log("Uvicorn running on")
    assert httpx.get(f"{sim.base_url}/health", timeout=5).status_code == 503
    sim.wait_ready()
    assert "ready to roll" in sim.log()


def test_asyncio_is_not_needed_for_meta_helpers() -> None:
    asyncio.run(asyncio.sleep(0))  # Sequence objects above were built outside a loop


@pytest.mark.parametrize("version", ["0.5.6", "0.5.15", "0.5.23"])
def test_an_ngram_profile_with_explicit_numbers_passes_the_attach_check(version: str) -> None:
    # Before the fix the plugin expected topk 1 and steps + 1 draft tokens of NGRAM too, so an
    # NGRAM profile with numbers never passed: SGLang sets its topk from the BFS breadth.
    profile = ServerProfile(
        name="ngram",
        model_path="m",
        speculative=Speculative("NGRAM", num_draft_tokens=8),
        extra_args=("--speculative-ngram-max-bfs-breadth", "4"),
    )
    resolved = at(version, *profile.server_args(host="127.0.0.1", port=30000)[2:])
    info = {**resolved.server.echo(), "version": version}
    assert (info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (4, 8)
    assert compare_server_args(profile, info) == []
