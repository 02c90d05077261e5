"""Server profiles: the TOML file, validation messages, launch argv/env, fingerprints, and the
server arguments an attached server must report."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
from pathlib import Path

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.profiles.fields import SPEC_ALGORITHMS
from pytest_specdecode.profiles.loader import load_profiles
from pytest_specdecode.profiles.profile import (
    ALGORITHM_MARKERS,
    ArgMismatch,
    ProfileFile,
    ServerProfile,
    Speculative,
    compare_server_args,
    flag_groups,
    normalized_extra_args,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "perf_tests" / "specdecode.toml"
SEED_NCCL = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}
SEED_FLAGS = ["--num-continuous-decode-steps", "4", "--disable-custom-all-reduce"]
# The seed's exact EAGLE3 2-step launch (seeds/001: msg 4683), minus the host/port it chose.
SEED_2STEP_COMMAND = [
    "--model-path", "/shared/kimi-k2.5-int4", "--trust-remote-code", "--tp-size", "8",
    "--mem-fraction-static", "0.88", "--num-continuous-decode-steps", "4",
    "--disable-custom-all-reduce", "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "/data/eagle3/output_100k_sglang/4",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3",
    "--speculative-num-steps", "2",
]  # fmt: skip

BASE = """
[defaults]
tp_size = 2

[env.tuned]
NCCL_PROTO = "LL"
NCCL_ALGO = "Ring"

[env.debug]
NCCL_DEBUG = "INFO"

[profiles.spec]
model_path = "/models/target"
mem_fraction_static = 0.8
env = "tuned"
extra_args = ["--num-continuous-decode-steps", "4", "--disable-custom-all-reduce"]

[profiles.spec.speculative]  # a sub-table works as well as an inline table
algorithm = "eagle3"
draft_model_path = "/models/draft"
num_steps = 2
eagle_topk = 1
num_draft_tokens = 3

[profiles.plain]
model_path = "/models/target"

[targets.sim]
launcher = "sim"
gpus = []
extra_args = ["--sim-speed", "4"]
startup_timeout = 60
"""


def write(tmp_path: Path, text: str, name: str = "specdecode.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str, target: str = "real") -> ProfileFile:
    return load_profiles(write(tmp_path, text), target=target)


def error_of(tmp_path: Path, text: str, target: str = "real") -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_profiles(path, target=target)
    message = str(info.value)
    assert str(path) in message, "every profile-file error names the file"
    return message


def profile(tmp_path: Path, table: str, *, name: str = "p", prelude: str = "") -> ServerProfile:
    """One profile from a table body (plus optional env sets etc. before it)."""
    return load(tmp_path, f"{prelude}\n[profiles.{name}]\n{table}").profiles[name]


def profile_error(tmp_path: Path, table: str, *, prelude: str = "") -> str:
    message = error_of(tmp_path, f"{prelude}\n[profiles.p]\n{table}")
    assert "[profiles.p]" in message, "a profile error names the profile"
    return message


# --- the example file --------------------------------------------------------------------------


def test_example_real_target_holds_the_seeds_four_configurations() -> None:
    loaded = load_profiles(EXAMPLE)

    assert loaded.targets == ("real", "sim", "docker")
    assert loaded.warnings == ()
    assert set(loaded.profiles) == {
        "nospec-nccl",
        "eagle3-5step",
        "eagle3-5step-nccl",
        "eagle3-2step-nccl",
    }
    for p in loaded.profiles.values():
        assert p.launcher == "sglang"
        assert p.model_path == "/shared/kimi-k2.5-int4"
        assert (p.tp_size, p.gpus, p.mem_fraction_static) == (8, tuple(range(8)), 0.88)
        assert list(p.extra_args[:3]) == SEED_FLAGS
        assert "--trust-remote-code" in p.extra_args
        assert p.startup_timeout == 1800
        assert p.warmup_requests == 2
        assert p.source == f"{EXAMPLE} [profiles.{p.name}]"
    nospec = loaded.profiles["nospec-nccl"]
    assert nospec.speculative is None
    assert nospec.algorithm_marker == "nospec"
    assert dict(nospec.env) == SEED_NCCL
    assert nospec.env_sets == ("nccl_tuned",)
    assert dict(loaded.profiles["eagle3-5step"].env) == {}
    draft = "/data/eagle3/output_100k_sglang/4"
    assert loaded.profiles["eagle3-5step"].speculative == Speculative("EAGLE3", draft, 5, 1, 6)
    assert loaded.profiles["eagle3-5step-nccl"].speculative == Speculative("EAGLE3", draft, 5, 1, 6)
    assert loaded.profiles["eagle3-2step-nccl"].speculative == Speculative("EAGLE3", draft, 2, 1, 3)
    assert dict(loaded.env_sets["nccl_tuned"]) == SEED_NCCL


def test_example_seed_profile_launches_with_the_seeds_exact_flags() -> None:
    p = load_profiles(EXAMPLE).profiles["eagle3-2step-nccl"]

    args = p.server_args(host="0.0.0.0", port=8000)

    # Same flags and values as the seed's command; order of different flags is irrelevant.
    assert sorted(normalized_extra_args(args)) == sorted(
        normalized_extra_args([*SEED_2STEP_COMMAND, "--host", "0.0.0.0", "--port", "8000"])
    )
    env = p.launch_env({})
    assert {k: env[k] for k in SEED_NCCL} == SEED_NCCL


def test_example_sim_target_appends_sim_knobs_and_needs_no_gpu() -> None:
    loaded = load_profiles(EXAMPLE, target="sim")

    assert loaded.target == "sim"
    assert len(loaded.profiles) == 4
    for p in loaded.profiles.values():
        assert p.simulated
        assert p.launcher == "sim"
        assert p.gpus == ()
        assert p.startup_timeout == 60
        assert list(p.extra_args[-4:]) == ["--sim-speed", "10", "--sim-load-seconds", "2"]
        assert p.source.endswith(f"[profiles.{p.name}] with [targets.sim]")
        argv = p.launch_argv(host="127.0.0.1", port=1234)
        assert argv[:3] == [sys.executable, "-m", "pytest_specdecode.sim"]
    # The sim models NCCL tuning from the environment, so the env set still reaches it.
    assert dict(loaded.profiles["eagle3-2step-nccl"].env) == SEED_NCCL


def test_example_docker_target_runs_the_image_with_the_models_mounted() -> None:
    p = load_profiles(EXAMPLE, target="docker").profiles["eagle3-2step-nccl"]

    assert p.launcher == "docker"
    assert p.docker is not None
    assert p.docker.image == "lmsysorg/sglang:v0.5.15-cu129"
    assert (p.docker.shm_size, p.docker.network) == ("32g", "host")
    hf_cache = os.path.expanduser("~/.cache/huggingface")
    assert dict(p.docker.volumes) == {
        hf_cache: "/root/.cache/huggingface",
        "/shared": "/shared",
        "/data": "/data",
    }
    assert p.launch_argv(host="0.0.0.0", port=30000)[:3] == [
        "python3",
        "-m",
        "sglang.launch_server",
    ]
    assert p.python is None


def test_example_suite_sends_the_builtin_seed_workload_and_replaces_no_builtin() -> None:
    from pytest_specdecode.workloads import BUILTIN_WORKLOADS, resolve_workload

    loaded = load_profiles(EXAMPLE)

    assert set(loaded.workloads) & set(BUILTIN_WORKLOADS) == set()
    assert not any("replaces the built-in workload" in w for w in loaded.warnings)
    workload = resolve_workload("seed", loaded.workloads, source=str(EXAMPLE))
    assert (workload.max_new_tokens, workload.requests_per_run) == (500, 4)
    assert workload.source == "built-in"


def test_a_workload_table_named_like_a_builtin_warns_naming_file_name_and_builtin(
    tmp_path: Path,
) -> None:
    path = tmp_path / "specdecode.toml"
    path.write_text(
        '[profiles.p]\nmodel_path = "/m"\n'
        "[workloads.seed]\nrequests_per_run = 1\n"
        '[workloads.default]\nbase = "default"\nmax_new_tokens = 64\n'
        "[workloads.mine]\nmax_new_tokens = 64\n"
    )

    warnings = [w for w in load_profiles(path).warnings if "built-in workload" in w]

    assert warnings == [
        f"{path} [workloads.seed] replaces the built-in workload 'seed' (mixed prompts, 500 new "
        "tokens, 4 requests per run, concurrency 1) for every test that names it; rename the "
        'table to keep both, or write base = "seed" in it to say the replacement is meant'
    ]


def test_example_profiles_are_accepted_by_the_simulators_sglang_parser() -> None:
    """The sim parses SGLang's flags the way SGLang does; what we launch must parse, and what
    it resolves must satisfy the attach check (a round trip through the sim's /server_info)."""
    from pytest_specdecode.sim.args import parse_args

    for p in load_profiles(EXAMPLE, target="sim").profiles.values():
        resolved = parse_args(p.server_args(host="127.0.0.1", port=30000))

        assert resolved.sim.unknown_args == ()
        assert compare_server_args(p, resolved.server.echo()) == []


# --- layering ----------------------------------------------------------------------------------


def test_defaults_apply_unless_the_profile_overrides_them(tmp_path: Path) -> None:
    loaded = load(tmp_path, BASE + '\n[profiles.wide]\nmodel_path = "/m"\ntp_size = 4\n')

    assert loaded.profiles["plain"].tp_size == 2
    assert loaded.profiles["plain"].gpus == (0, 1)
    assert loaded.profiles["wide"].tp_size == 4
    assert loaded.profiles["wide"].gpus == (0, 1, 2, 3)
    plain = loaded.profiles["plain"]
    assert (plain.launcher, plain.host, plain.port) == ("sglang", "127.0.0.1", None)
    assert (plain.startup_timeout, plain.warmup_requests) == (1800.0, 2)


def test_overlay_replaces_keys_and_appends_extra_args(tmp_path: Path) -> None:
    real = load(tmp_path, BASE).profiles["spec"]
    sim = load(tmp_path, BASE, target="sim").profiles["spec"]

    assert sim.extra_args == (*real.extra_args, "--sim-speed", "4")
    assert (sim.launcher, sim.gpus, sim.startup_timeout) == ("sim", (), 60.0)
    assert sim.target == "sim"
    assert real.target == "real"
    assert sim.speculative == real.speculative
    assert sim.env == real.env


def test_several_env_sets_merge_in_order(tmp_path: Path) -> None:
    p = profile(
        tmp_path,
        'model_path = "/m"\nenv = ["tuned", "debug"]',
        prelude='[env.tuned]\nNCCL_PROTO = "LL"\n[env.debug]\nNCCL_DEBUG = "INFO"\n',
    )

    assert p.env_sets == ("tuned", "debug")
    assert dict(p.env) == {"NCCL_PROTO": "LL", "NCCL_DEBUG": "INFO"}


def test_algorithm_is_case_insensitive_and_stored_upper_case(tmp_path: Path) -> None:
    p = load(tmp_path, BASE).profiles["spec"]

    assert p.speculative is not None
    assert p.speculative.algorithm == "EAGLE3"
    assert p.algorithm_marker == "eagle3"


@pytest.mark.parametrize(
    ("algorithm", "marker"),
    [("EAGLE", "eagle"), ("NEXTN", "nextn"), ("NGRAM", "ngram"), ("standalone", "standalone")],
)
def test_each_algorithm_has_its_marker(tmp_path: Path, algorithm: str, marker: str) -> None:
    p = profile(
        tmp_path,
        'model_path = "/m"\n'
        f'speculative = {{ algorithm = "{algorithm}", draft_model_path = "/d" }}',
    )

    assert p.algorithm_marker == marker
    assert marker in ALGORITHM_MARKERS


def test_every_algorithm_and_no_speculation_have_a_marker() -> None:
    assert set(ALGORITHM_MARKERS) == {a.lower() for a in SPEC_ALGORITHMS} | {"nospec"}


def test_gpus_may_be_a_count_or_a_list(tmp_path: Path) -> None:
    assert profile(tmp_path, 'model_path = "/m"\ntp_size = 2\ngpus = 3').gpus == (0, 1, 2)
    assert profile(tmp_path, 'model_path = "/m"\ntp_size = 2\ngpus = [6, 7]').gpus == (6, 7)


def test_draft_free_algorithms_need_no_draft_model(tmp_path: Path) -> None:
    p = profile(tmp_path, 'model_path = "/m"\nspeculative = { algorithm = "NEXTN" }')

    assert p.speculative == Speculative("NEXTN")


def test_warnings_are_returned_not_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = load(
        tmp_path,
        '[env.conn]\nCUDA_DEVICE_MAX_CONNECTIONS = "1"\nCUDA_MODULE_LOADING = "LAZY"\n'
        '[profiles.p]\nmodel_path = "/m"\nenv = "conn"\n',
    )

    assert len(loaded.warnings) == 2
    connections, loading = loaded.warnings
    assert "[env.conn]" in connections  # the line that set it, not each profile using it
    assert "CUDA_DEVICE_MAX_CONNECTIONS = '1' has no effect" in connections
    assert "always set it to 8" in connections
    assert "CUDA_MODULE_LOADING = 'LAZY' has no effect" in loading
    assert "0.5.6-0.5.18" in loading
    assert capsys.readouterr() == ("", "")


def test_nccl_cumem_and_nvls_are_kept_when_set_so_they_do_not_warn(tmp_path: Path) -> None:
    # SGLang sets NCCL_CUMEM_ENABLE / NCCL_NVLS_ENABLE to "0" only when they are unset, and
    # never sets TORCH_NCCL_AVOID_RECORD_STREAMS (0.5.6-0.5.23's _set_envs_and_config).
    loaded = load(
        tmp_path,
        '[env.e]\nNCCL_NVLS_ENABLE = "1"\nNCCL_CUMEM_ENABLE = "1"\n'
        'TORCH_NCCL_AVOID_RECORD_STREAMS = "1"\n'
        '[profiles.p]\nmodel_path = "/m"\nenv = "e"\n',
    )

    assert loaded.warnings == ()


def test_a_flag_that_forces_an_nccl_variable_warns_about_the_profiles_value(
    tmp_path: Path,
) -> None:
    loaded = load(
        tmp_path,
        '[env.e]\nNCCL_NVLS_ENABLE = "0"\n'
        '[profiles.p]\nmodel_path = "/m"\nenv = "e"\nextra_args = ["--enable-nccl-nvls"]\n',
    )

    assert len(loaded.warnings) == 1
    assert (
        "NCCL_NVLS_ENABLE = '0' has no effect: with --enable-nccl-nvls SGLang sets "
        "NCCL_NVLS_ENABLE=1"
    ) in loaded.warnings[0]


def test_deterministic_inference_at_tp_above_1_overrides_two_of_the_seeds_variables(
    tmp_path: Path,
) -> None:
    toml = (
        '[env.tuned]\nNCCL_PROTO = "LL"\nNCCL_ALGO = "Ring"\nNCCL_MAX_NCHANNELS = "16"\n'
        '[profiles.p]\nmodel_path = "/m"\nenv = "tuned"\ntp_size = {tp}\ngpus = 8\n'
        'extra_args = ["--enable-deterministic-inference"]\n'
    )
    assert load(tmp_path, toml.format(tp=1)).warnings == ()
    (warning,) = load(tmp_path, toml.format(tp=8)).warnings
    assert "overwrites NCCL_ALGO, NCCL_MAX_NCHANNELS" in warning
    assert "NCCL_PROTO" not in warning  # SGLang never sets NCCL_PROTO


def test_a_port_above_55535_warns_for_0_5_11_to_0_5_15(tmp_path: Path) -> None:
    (warning,) = load(tmp_path, '[profiles.p]\nmodel_path = "/m"\nport = 60000\n').warnings
    assert "port = 60000" in warning
    assert "refuse to start above 55535" in warning


def test_conflicting_env_sets_warn_and_the_later_one_wins(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        '[env.a]\nNCCL_PROTO = "LL"\n[env.b]\nNCCL_PROTO = "Simple"\n'
        '[profiles.p]\nmodel_path = "/m"\nenv = ["a", "b"]\n',
    )

    assert loaded.profiles["p"].env["NCCL_PROTO"] == "Simple"
    assert len(loaded.warnings) == 1
    assert "NCCL_PROTO" in loaded.warnings[0]
    assert "'Simple'" in loaded.warnings[0]


# --- validation errors -------------------------------------------------------------------------


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    message = profile_error(tmp_path, 'model_path = "/m"\ntp = 8')

    assert "unknown key 'tp'" in message
    assert "did you mean 'tp_size'" in message


def test_unknown_speculative_key_suggests_the_right_one(tmp_path: Path) -> None:
    message = profile_error(
        tmp_path,
        'model_path = "/m"\nspeculative = { algorithm = "NEXTN", num_step = 2 }',
    )

    assert "'num_step'" in message
    assert "did you mean 'num_steps'" in message


def test_unknown_top_level_table_suggests_the_right_one(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[profile.p]\nmodel_path = "/m"\n')

    assert "'profile'" in message
    assert "did you mean 'profiles'" in message


def test_unknown_key_in_a_target_overlay_names_the_target(tmp_path: Path) -> None:
    message = error_of(tmp_path, BASE + "\n[targets.fast]\nlauncer = 'sim'\n")

    assert "[targets.fast]" in message
    assert "did you mean 'launcher'" in message


@pytest.mark.parametrize(
    ("line", "shown", "allowed"),
    [
        ('tp_size = "8"', "tp_size = '8' (a string)", "integer >= 1"),
        ("tp_size = 0", "tp_size = 0", "integer >= 1"),
        ("mem_fraction_static = 1.5", "mem_fraction_static = 1.5", "between 0 and 1"),
        ("port = 70000", "port = 70000", "between 1 and 65535"),
        ('launcher = "podman"', "launcher = 'podman'", "'sglang', 'docker', 'sim'"),
        ("startup_timeout = -1", "startup_timeout = -1", "positive number of seconds"),
        ("warmup_requests = true", "warmup_requests = True (a boolean)", "integer >= 0"),
        ("gpus = [0, 0]", "gpus = [0, 0]", "twice"),
        ('gpus = ["0"]', "gpus[0] = '0'", "integer >= 0"),
        ('network = "overlay"', "network = 'overlay'", "'host', 'bridge'"),
        ('shm_size = "lots"', "shm_size = 'lots'", '"32g"'),
        ('extra_args = ["--max-running-requests", 4]', "extra_args[1] = 4", '"4"'),
        ('extra_args = "--trust-remote-code"', "extra_args = '--trust-remote-code'", "array"),
        ("description = 3", "description = 3", "must be a string"),
        ('api_key_env = "my key"', "api_key_env = 'my key'", "NAME of an environment variable"),
        ('volumes = { "relative/dir" = "/x" }', "'relative/dir'", "absolute path"),
        (
            'speculative = { algorithm = "MEDUSA" }',
            "speculative.algorithm = 'MEDUSA'",
            "EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM",
        ),
        (
            'speculative = { algorithm = "NEXTN", num_steps = 0, eagle_topk = 1, '
            "num_draft_tokens = 1 }",
            "speculative.num_steps = 0",
            "integer >= 1",
        ),
    ],
)
def test_bad_values_name_key_value_and_what_is_allowed(
    tmp_path: Path, line: str, shown: str, allowed: str
) -> None:
    message = profile_error(tmp_path, f'model_path = "/m"\n{line}')

    assert shown in message
    assert allowed in message


def test_env_values_must_be_strings(tmp_path: Path) -> None:
    message = error_of(tmp_path, "[env.nccl]\nNCCL_BUFFSIZE = 16777216\n")

    assert "[env.nccl]" in message
    assert "NCCL_BUFFSIZE = 16777216" in message
    assert "must be strings" in message
    assert 'NCCL_BUFFSIZE = "16777216"' in message


def test_topk_1_requires_draft_tokens_equal_to_steps_plus_one(tmp_path: Path) -> None:
    message = profile_error(
        tmp_path,
        'model_path = "/m"\nspeculative = { algorithm = "EAGLE3", draft_model_path = "/d", '
        "num_steps = 2, eagle_topk = 1, num_draft_tokens = 4 }",
    )

    assert "num_draft_tokens = 4" in message
    assert "SGLang forces num_draft_tokens to num_steps + 1" in message
    assert "set num_draft_tokens = 3" in message


def test_topk_above_1_allows_any_draft_tokens(tmp_path: Path) -> None:
    p = profile(
        tmp_path,
        'model_path = "/m"\nspeculative = { algorithm = "EAGLE", draft_model_path = "/d", '
        "num_steps = 5, eagle_topk = 4, num_draft_tokens = 16 }",
    )

    assert p.speculative == Speculative("EAGLE", "/d", 5, 4, 16)


def test_steps_topk_and_draft_tokens_come_all_or_none(tmp_path: Path) -> None:
    message = profile_error(
        tmp_path,
        'model_path = "/m"\nspeculative = { algorithm = "EAGLE3", draft_model_path = "/d", '
        "num_steps = 2 }",
    )

    assert "sets num_steps but not eagle_topk, num_draft_tokens" in message
    assert "all three" in message


def test_ngram_takes_num_draft_tokens_alone(tmp_path: Path) -> None:
    # SGLang sets NGRAM's topk from --speculative-ngram-max-bfs-breadth and applies no topk-1
    # rule: num_draft_tokens = 8 with an 8-wide breadth is a valid NGRAM server.
    p = profile(
        tmp_path,
        'model_path = "/m"\nspeculative = { algorithm = "NGRAM", num_draft_tokens = 8 }\n'
        'extra_args = ["--speculative-ngram-max-bfs-breadth", "8"]',
    )

    assert p.speculative == Speculative("NGRAM", None, None, None, 8)
    expected = p.expected_server_args()
    assert expected["speculative_num_draft_tokens"] == 8
    assert "speculative_eagle_topk" not in expected
    assert "speculative_num_steps" not in expected
    # What SGLang 0.5.15 reports for it (topk = breadth, steps = 8 // 8), with no mismatch.
    info = {
        **expected,
        "speculative_eagle_topk": 8,
        "speculative_num_steps": 1,
        "version": "0.5.15",
    }
    assert compare_server_args(p, info) == []


@pytest.mark.parametrize("keys", ["num_steps = 2, eagle_topk = 1, ", "eagle_topk = 4, "])
def test_ngram_refuses_the_eagle_knobs_it_does_not_use(tmp_path: Path, keys: str) -> None:
    message = profile_error(
        tmp_path,
        f'model_path = "/m"\nspeculative = {{ algorithm = "NGRAM", {keys}num_draft_tokens = 8 }}',
    )

    assert "for NGRAM, which SGLang does not use as given" in message
    assert "--speculative-ngram-max-bfs-breadth" in message
    assert "Set only num_draft_tokens" in message


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "STANDALONE"])
def test_draft_model_algorithms_need_a_draft_model_path(tmp_path: Path, algorithm: str) -> None:
    message = profile_error(
        tmp_path, f'model_path = "/m"\nspeculative = {{ algorithm = "{algorithm}" }}'
    )

    assert f"speculative.algorithm = '{algorithm}' needs draft_model_path" in message


def test_a_literal_api_key_is_refused_without_echoing_it(tmp_path: Path) -> None:
    message = profile_error(tmp_path, 'model_path = "/m"\napi_key = "sk-very-secret"')

    assert "api_key_env" in message
    assert "sk-very-secret" not in message


def test_a_secret_in_an_env_set_is_refused_without_echoing_it(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[env.hf]\nHF_TOKEN = "hf_very_secret"\n')

    assert "HF_TOKEN" in message
    assert "secret" in message
    assert "hf_very_secret" not in message


def test_tokenizers_parallelism_is_not_mistaken_for_a_secret(tmp_path: Path) -> None:
    loaded = load(tmp_path, '[env.tok]\nTOKENIZERS_PARALLELISM = "false"\n')

    assert dict(loaded.env_sets["tok"]) == {"TOKENIZERS_PARALLELISM": "false"}


def test_cuda_visible_devices_belongs_in_gpus_not_an_env_set(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[env.g]\nCUDA_VISIBLE_DEVICES = "0,1"\n')

    assert "CUDA_VISIBLE_DEVICES = '0,1'" in message
    assert "gpus" in message


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        (["--tp-size", "8"], "tp_size"),
        (["--tp", "8"], "tp_size"),
        (["--speculative-num-steps", "2"], "speculative.num_steps"),
        (["--speculative-algorithm", "EAGLE3"], "speculative.algorithm"),
        (["--port", "8000"], "port"),
        (["--port=8000"], "port"),
        (["--host", "0.0.0.0"], "host"),
        (["--model-path", "/x"], "model_path"),
        (["--mem-frac", "0.5"], "mem_fraction_static"),  # argparse would expand the prefix
        (["--api-key", "k"], "api_key_env"),
    ],
)
def test_extra_args_may_not_duplicate_a_first_class_key(
    tmp_path: Path, flag: list[str], field: str
) -> None:
    message = profile_error(tmp_path, f'model_path = "/m"\nextra_args = {json.dumps(flag)}')

    assert f"contains {flag[0].split('=')[0]!r}" in message
    assert field in message


def test_other_speculative_flags_are_allowed_in_extra_args(tmp_path: Path) -> None:
    p = profile(
        tmp_path,
        'model_path = "/m"\nextra_args = ["--speculative-accept-threshold-single", "0.9"]',
    )

    assert p.extra_args == ("--speculative-accept-threshold-single", "0.9")


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--disable-custom-all-reduce", "true"], "takes no value"),
        (["--num-continuous-decode-steps", "four"], "needs one int value"),
        (["4", "--trust-remote-code"], "must start with a flag"),
    ],
)
def test_extra_args_sglang_would_reject_are_refused(
    tmp_path: Path, args: list[str], problem: str
) -> None:
    message = profile_error(tmp_path, f'model_path = "/m"\nextra_args = {json.dumps(args)}')

    assert problem in message


def test_sim_knobs_on_a_real_launcher_are_refused(tmp_path: Path) -> None:
    message = profile_error(tmp_path, 'model_path = "/m"\nextra_args = ["--sim-speed", "4"]')

    assert "--sim-speed" in message
    assert "[targets.sim]" in message


def test_unknown_env_set_is_named_with_a_suggestion(tmp_path: Path) -> None:
    message = profile_error(
        tmp_path, 'model_path = "/m"\nenv = "nccl_tune"', prelude='[env.nccl_tuned]\nA = "1"\n'
    )

    assert "no env set 'nccl_tune'" in message
    assert "did you mean 'nccl_tuned'" in message


def test_unknown_target_lists_the_available_ones(tmp_path: Path) -> None:
    message = error_of(tmp_path, BASE, target="simm")

    assert "unknown target 'simm'" in message
    assert "did you mean 'sim'" in message
    assert "'real', 'sim'" in message


def test_the_target_name_real_is_reserved(tmp_path: Path) -> None:
    message = error_of(tmp_path, BASE + '\n[targets.real]\nlauncher = "sglang"\n')

    assert "[targets.real]" in message
    assert "reserved" in message


def test_a_broken_overlay_fails_every_run_not_only_its_own(tmp_path: Path) -> None:
    # The docker overlay lacks an image: found even when the real target runs.
    message = error_of(tmp_path, BASE + '\n[targets.docker]\nlauncher = "docker"\n')

    assert "[profiles.spec] with [targets.docker]" in message
    assert "needs image" in message


def test_missing_file_says_how_to_point_elsewhere(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    with pytest.raises(ConfigError) as info:
        load_profiles(missing)

    message = str(info.value)
    assert str(missing) in message
    assert "--specdecode-config PATH" in message
    assert "specdecode_config" in message


def test_toml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[profiles.p]\nmodel_path = "/m"\ntp_size = = 8\n')

    assert "not valid TOML" in message
    assert "line 3" in message
    assert "column" in message


def test_missing_model_path(tmp_path: Path) -> None:
    message = profile_error(tmp_path, "tp_size = 1")

    assert "model_path is missing" in message


def test_fewer_gpus_than_tp_size(tmp_path: Path) -> None:
    message = profile_error(tmp_path, 'model_path = "/m"\ntp_size = 4\ngpus = [0, 1]')

    assert "gpus = [0, 1]" in message
    assert "tp_size = 4" in message


def test_profile_names_must_be_usable_as_file_and_container_names(tmp_path: Path) -> None:
    message = error_of(tmp_path, '[profiles."my profile"]\nmodel_path = "/m"\n')

    assert "'my profile'" in message


# --- launch command and environment ------------------------------------------------------------


def test_sglang_argv_uses_the_configured_interpreter_or_this_one(tmp_path: Path) -> None:
    default = profile(tmp_path, 'model_path = "/m"')
    custom = profile(tmp_path, 'model_path = "/m"\npython = "/opt/venv/bin/python"')

    assert default.launch_argv(host="127.0.0.1", port=5)[:3] == [
        sys.executable,
        "-m",
        "sglang.launch_server",
    ]
    assert custom.launch_argv(host="127.0.0.1", port=5)[0] == "/opt/venv/bin/python"


def test_server_args_carry_every_setting_and_never_an_api_key(tmp_path: Path) -> None:
    keyed = BASE + '\n[profiles.keyed]\nmodel_path = "/models/target"\napi_key_env = "MY_KEY"\n'
    p = load(tmp_path, keyed).profiles["keyed"]
    spec = load(tmp_path, BASE).profiles["spec"]

    assert p.server_args(host="127.0.0.1", port=4000) == [
        "--model-path", "/models/target", "--tp-size", "2",
        "--host", "127.0.0.1", "--port", "4000",
    ]  # fmt: skip
    assert spec.server_args(host="h", port=1) == [
        "--model-path", "/models/target", "--tp-size", "2", "--host", "h", "--port", "1",
        "--mem-fraction-static", "0.8",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/draft",
        "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "3",
        "--num-continuous-decode-steps", "4", "--disable-custom-all-reduce",
    ]  # fmt: skip
    assert p.api_key_env == "MY_KEY"
    assert "--api-key" not in p.launch_argv(host="h", port=1)


def test_launch_env_merges_the_env_set_and_selects_gpus(tmp_path: Path) -> None:
    p = profile(
        tmp_path,
        'model_path = "/m"\ntp_size = 2\ngpus = [4, 5]\nenv = "tuned"',
        prelude='[env.tuned]\nNCCL_PROTO = "LL"\n',
    )

    env = p.launch_env({"PATH": "/bin", "NCCL_PROTO": "Simple", "HF_TOKEN": "t"})

    assert env["NCCL_PROTO"] == "LL"  # the profile beats the shell
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert env["PATH"] == "/bin"
    assert env["HF_TOKEN"] == "t"


def test_launch_env_drops_inherited_nccl_variables_the_profile_does_not_set(
    tmp_path: Path,
) -> None:
    p = profile(tmp_path, 'model_path = "/m"')  # like the seed's untuned eagle3-5step

    env = p.launch_env({"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "TORCH_HOME": "/t"})

    assert "NCCL_PROTO" not in env
    assert "NCCL_ALGO" not in env
    assert env["TORCH_HOME"] == "/t"


def test_launch_env_sets_no_proxy_for_localhost_keeping_existing_entries(tmp_path: Path) -> None:
    p = profile(tmp_path, 'model_path = "/m"\nhost = "10.0.0.5"')

    env = p.launch_env({"no_proxy": "corp.example,localhost", "http_proxy": "http://proxy:3128"})

    assert env["no_proxy"] == "corp.example,localhost,127.0.0.1,::1,10.0.0.5"
    assert env["NO_PROXY"] == "localhost,127.0.0.1,::1,10.0.0.5"
    assert env["http_proxy"] == "http://proxy:3128"


def test_launch_env_translates_gpus_through_an_inherited_cuda_visible_devices(
    tmp_path: Path,
) -> None:
    p = profile(tmp_path, 'model_path = "/m"\ntp_size = 2\ngpus = [0, 2]')

    assert p.launch_env({"CUDA_VISIBLE_DEVICES": "3,5,7"})["CUDA_VISIBLE_DEVICES"] == "3,7"
    with pytest.raises(ConfigError) as info:
        p.launch_env({"CUDA_VISIBLE_DEVICES": "3,5"})
    assert "CUDA_VISIBLE_DEVICES='3,5'" in str(info.value)
    assert "[profiles.p]" in str(info.value)


def test_sim_and_docker_get_no_cuda_visible_devices(tmp_path: Path) -> None:
    text = BASE + '\n[targets.docker]\nlauncher = "docker"\nimage = "img:1"\n'
    sim = load(tmp_path, text, target="sim").profiles["spec"]
    docker = load(tmp_path, text, target="docker").profiles["spec"]

    for p in (sim, docker):
        env = p.launch_env({"CUDA_VISIBLE_DEVICES": "0"})
        assert env.get("CUDA_VISIBLE_DEVICES") == "0"  # inherited untouched, not rewritten
        assert env["NCCL_PROTO"] == "LL"
        assert "CUDA_VISIBLE_DEVICES" not in p.launch_env({})


# --- fingerprints ------------------------------------------------------------------------------


def test_equal_profiles_have_equal_fingerprints(tmp_path: Path) -> None:
    a = load_profiles(write(tmp_path, BASE, "a.toml")).profiles["spec"]
    b = load_profiles(write(tmp_path, BASE, "b.toml")).profiles["spec"]

    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint().digest == b.fingerprint().digest


def _variants(p: ServerProfile) -> dict[str, ServerProfile]:
    spec = p.speculative
    assert spec is not None
    r = dataclasses.replace
    return {
        "model_path": r(p, model_path="/models/other"),
        "tp_size": r(p, tp_size=4, gpus=(0, 1, 2, 3)),
        "gpu_count": r(p, gpus=(0, 1, 2)),
        "mem_fraction_static": r(p, mem_fraction_static=0.85),
        "speculative_algorithm": r(p, speculative=r(spec, algorithm="EAGLE")),
        "speculative_draft_model_path": r(p, speculative=r(spec, draft_model_path="/d2")),
        "speculative_num_steps": r(p, speculative=r(spec, num_steps=5, num_draft_tokens=6)),
        "speculative_eagle_topk": r(p, speculative=r(spec, eagle_topk=4)),
        "speculative_num_draft_tokens": r(p, speculative=r(spec, eagle_topk=4, num_draft_tokens=8)),
        "no speculation": r(p, speculative=None),
        "extra_args": r(p, extra_args=(*p.extra_args, "--cuda-graph-max-bs", "8")),
        "extra_args value": r(p, extra_args=("--num-continuous-decode-steps", "1")),
        "env value": r(p, env={**p.env, "NCCL_PROTO": "Simple"}),
        "env variable": r(p, env={**p.env, "NCCL_NTHREADS": "512"}),
        "no env": r(p, env={}),
        "simulated": r(p, launcher="sim"),
    }


def test_every_hard_field_changes_the_fingerprint(tmp_path: Path) -> None:
    p = load(tmp_path, BASE).profiles["spec"]
    digests = {name: v.fingerprint().digest for name, v in _variants(p).items()}

    assert p.fingerprint().digest not in digests.values()
    assert len(set(digests.values())) == len(digests), "each change gives its own digest"


def test_fields_that_do_not_change_speed_keep_the_fingerprint(tmp_path: Path) -> None:
    p = load(tmp_path, BASE).profiles["spec"]
    r = dataclasses.replace
    same = [
        r(p, name="renamed", description="other words", source="elsewhere"),
        r(p, host="0.0.0.0", port=31000, startup_timeout=5.0, warmup_requests=0),
        r(p, gpus=(6, 7)),  # same number of GPUs
        r(p, env_sets=("renamed_set",)),  # same variables
        r(p, extra_args=("--disable-custom-all-reduce", "--num-continuous-decode-steps=4")),
        r(p, model_path="/models/target/"),
    ]

    for variant in same:
        assert variant.fingerprint().hard == p.fingerprint().hard


def test_simulated_and_real_fingerprints_differ_for_the_same_profile() -> None:
    real = load_profiles(EXAMPLE).profiles["eagle3-2step-nccl"].fingerprint()
    sim = load_profiles(EXAMPLE, target="sim").profiles["eagle3-2step-nccl"].fingerprint()

    assert real.hard["launcher_class"] == "real"
    assert sim.hard["launcher_class"] == "simulated"
    assert not real.diff(sim).comparable


def test_the_four_seed_configurations_have_four_fingerprints() -> None:
    digests = {p.fingerprint().digest for p in load_profiles(EXAMPLE).profiles.values()}

    assert len(digests) == 4


def test_docker_and_sglang_differ_only_in_soft_fields() -> None:
    sglang = load_profiles(EXAMPLE).profiles["nospec-nccl"].fingerprint()
    docker = load_profiles(EXAMPLE, target="docker").profiles["nospec-nccl"].fingerprint()

    diff = sglang.diff(docker)
    assert diff.comparable
    assert {d.name for d in diff.soft} == {"launcher"}  # python and image: absent on one side
    assert docker.soft["image"] == "lmsysorg/sglang:v0.5.15-cu129"
    assert sglang.soft["python"] == sys.executable


def test_nextn_and_eagle_are_one_configuration(tmp_path: Path) -> None:
    nextn = profile(tmp_path, 'model_path = "/m"\nspeculative = { algorithm = "NEXTN" }')
    eagle = dataclasses.replace(nextn, speculative=Speculative("EAGLE"))

    assert nextn.fingerprint().hard == eagle.fingerprint().hard
    assert nextn.algorithm_marker == "nextn"


def test_fingerprint_holds_no_secret_and_not_the_callers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_KEY", "sk-super-secret")
    monkeypatch.setenv("HF_TOKEN", "hf-super-secret")
    p = dataclasses.replace(load(tmp_path, BASE).profiles["spec"], api_key_env="MY_KEY")

    text = json.dumps(p.fingerprint().to_json())

    assert "super-secret" not in text
    assert json.loads(text)["hard"]["env"] == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}


def test_normalized_extra_args_ignore_order_and_equals_signs() -> None:
    assert normalized_extra_args(["--b", "2", "--a=1", "--flag"]) == ["--a 1", "--b 2", "--flag"]
    assert normalized_extra_args(["--x", "1", "--x", "2"]) == ["--x 1", "--x 2"]
    assert flag_groups(["--offset", "-1", "--on"]) == [("--offset", ("-1",)), ("--on", ())]


# --- the server arguments an attached server must report ---------------------------------------


def test_expected_server_args_of_the_seeds_winner() -> None:
    p = load_profiles(EXAMPLE).profiles["eagle3-2step-nccl"]

    assert p.expected_server_args() == {
        "model_path": "/shared/kimi-k2.5-int4",
        "tp_size": 8,
        "mem_fraction_static": 0.88,
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/data/eagle3/output_100k_sglang/4",
        "speculative_num_steps": 2,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 3,
        "num_continuous_decode_steps": 4,
        "disable_custom_all_reduce": True,
        "trust_remote_code": True,
    }


def test_expected_server_args_resolve_like_sglang(tmp_path: Path) -> None:
    nextn = profile(tmp_path, 'model_path = "/m"\nspeculative = { algorithm = "NEXTN" }')
    # Built directly (the loader would refuse it): SGLang forces draft tokens = steps + 1.
    forced = ServerProfile(
        name="x", model_path="/m", speculative=Speculative("EAGLE", "/d", 3, 1, 8)
    )
    nospec = profile(tmp_path, 'model_path = "/m"\nextra_args = ["--cuda-graph-max-bs=16"]')

    assert nextn.expected_server_args()["speculative_algorithm"] == "EAGLE"
    assert "speculative_num_steps" not in nextn.expected_server_args()  # SGLang chooses
    assert forced.expected_server_args()["speculative_num_draft_tokens"] == 4
    assert nospec.expected_server_args() == {
        "model_path": "/m",
        "tp_size": 1,
        "speculative_algorithm": None,
        "cuda_graph_max_bs": 16,
    }


def test_extra_args_sglang_does_not_echo_by_that_name_are_not_expected(tmp_path: Path) -> None:
    p = profile(
        tmp_path, 'model_path = "/m"\nextra_args = ["--enable-foo", "--stream-interval", "2"]'
    )

    assert "enable_foo" not in p.expected_server_args()
    assert p.expected_server_args()["stream_interval"] == 2


def _server_info(p: ServerProfile) -> dict[str, object]:
    """What a faithful SGLang reports for ``p``, plus the fields it reports anyway."""
    return {**p.expected_server_args(), "port": 30000, "version": "0.5.5", "random_seed": 7}


def test_a_matching_server_has_no_mismatch() -> None:
    for p in load_profiles(EXAMPLE).profiles.values():
        assert compare_server_args(p, _server_info(p)) == []


def test_every_differing_field_is_listed() -> None:
    p = load_profiles(EXAMPLE).profiles["eagle3-2step-nccl"]
    info = _server_info(p)
    info.update(
        tp_size=4,
        speculative_num_steps=5,
        speculative_num_draft_tokens=6,
        mem_fraction_static=0.85,
        disable_custom_all_reduce=False,
    )
    del info["num_continuous_decode_steps"]

    mismatches = compare_server_args(p, info)

    assert {m.field for m in mismatches} == {
        "tp_size",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "mem_fraction_static",
        "disable_custom_all_reduce",
        "num_continuous_decode_steps",
    }
    by_field = {m.field: m for m in mismatches}
    assert by_field["tp_size"] == ArgMismatch("tp_size", 8, 4)
    assert by_field["tp_size"].describe() == "tp_size: profile wants 8, server reports 4"
    missing = by_field["num_continuous_decode_steps"]
    assert not missing.reported
    assert not missing.required  # a release without the field is not refused for it
    assert "does not report it" in missing.describe()
    assert by_field["tp_size"].required


def test_a_speculative_server_does_not_pass_for_a_nospec_profile() -> None:
    loaded = load_profiles(EXAMPLE)
    nospec = loaded.profiles["nospec-nccl"]
    spec_info = _server_info(loaded.profiles["eagle3-2step-nccl"])

    mismatches = compare_server_args(nospec, spec_info)

    assert [m.field for m in mismatches] == ["speculative_algorithm"]
    assert mismatches[0].expected is None
    assert mismatches[0].actual == "EAGLE3"


def test_fields_absent_from_server_info_matter_only_if_the_profile_sets_them() -> None:
    nospec = load_profiles(EXAMPLE).profiles["nospec-nccl"]
    info = _server_info(nospec)
    del info["speculative_algorithm"]  # e.g. an SGLang without speculative support

    assert compare_server_args(nospec, info) == []


def test_model_paths_match_with_or_without_a_trailing_slash() -> None:
    p = load_profiles(EXAMPLE).profiles["eagle3-2step-nccl"]
    info = _server_info(p)
    info["model_path"] = "/shared/kimi-k2.5-int4/"
    info["speculative_draft_model_path"] = "/data/eagle3/output_100k_sglang/4/"

    assert compare_server_args(p, info) == []
    info["model_path"] = "/shared/kimi-k2.5"
    assert [m.field for m in compare_server_args(p, info)] == ["model_path"]


def test_nextn_profile_accepts_a_server_reporting_nextn_or_eagle(tmp_path: Path) -> None:
    p = profile(tmp_path, 'model_path = "/m"\nspeculative = { algorithm = "NEXTN" }')

    for reported in ("EAGLE", "NEXTN"):
        info = {"model_path": "/m", "tp_size": 1, "speculative_algorithm": reported}
        assert compare_server_args(p, info) == []


def test_booleans_are_not_numbers_when_comparing(tmp_path: Path) -> None:
    p = profile(tmp_path, 'model_path = "/m"\nextra_args = ["--disable-custom-all-reduce"]')
    info = {"model_path": "/m", "tp_size": 1, "disable_custom_all_reduce": 1}

    assert [m.field for m in compare_server_args(p, info)] == ["disable_custom_all_reduce"]


# --- immutability ------------------------------------------------------------------------------


def test_profiles_are_frozen_hashable_and_picklable(tmp_path: Path) -> None:
    p = load(tmp_path, BASE).profiles["spec"]

    with pytest.raises(dataclasses.FrozenInstanceError):
        p.tp_size = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.env["NCCL_PROTO"] = "Simple"  # type: ignore[index]
    assert pickle.loads(pickle.dumps(p)) == p
    assert {p: 1}[dataclasses.replace(p)] == 1


def test_server_module_runs_the_sim_in_a_container(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        """
[profiles.boxed]
launcher = "docker"
image = "pytest-specdecode-sim:local"
server_module = "pytest_specdecode.sim"
model_path = "/m"
tp_size = 8
extra_args = ["--sim-speed", "10"]
"""
    )
    profile = load_profiles(path).profiles["boxed"]
    assert profile.simulated
    assert profile.gpus == ()  # a simulated server needs no GPUs, even at tp_size 8
    argv = profile.launch_argv(host="127.0.0.1", port=1234)
    assert argv[:3] == ["python3", "-m", "pytest_specdecode.sim"]
    assert profile.fingerprint().hard["launcher_class"] == "simulated"
    assert profile.fingerprint().soft["server_module"] == "pytest_specdecode.sim"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('launcher = "sim"\nserver_module = "x.y"', "does not apply to launcher 'sim'"),
        ('launcher = "sglang"\nserver_module = "not a module"', "dotted Python module name"),
        ('launcher = "sglang"\nextra_args = ["--sim-speed", "2"]', "set server_module"),
    ],
)
def test_server_module_errors(tmp_path, table, message):
    path = tmp_path / "p.toml"
    path.write_text(f'[profiles.x]\nmodel_path = "/m"\n{table}\n')
    with pytest.raises(ConfigError, match=message):
        load_profiles(path)


def test_one_ineffective_line_inherited_by_every_profile_and_target_is_one_counted_warning(
    tmp_path: Path,
) -> None:
    # #25: one such line used to print a warning per profile and target, identical but for
    # the profile's name; it is reported at the line that set it, once, with a count.
    loaded = load(
        tmp_path,
        '[env.tuned]\nNCCL_PROTO = "LL"\nCUDA_DEVICE_MAX_CONNECTIONS = "1"\n'
        '[defaults]\nmodel_path = "/m"\nenv = "tuned"\n'
        "[profiles.a]\n[profiles.b]\n"
        '[targets.sim]\nlauncher = "sim"\n',
    )

    (warning,) = loaded.warnings
    assert "[env.tuned]: CUDA_DEVICE_MAX_CONNECTIONS = '1' has no effect" in warning
    assert warning.endswith("(4 times)")  # profiles a and b, each as itself and on the sim
