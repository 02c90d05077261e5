"""Secrets outside the documented path (issue #12, item 7): every credential flag is treated like
``--api-key`` (never a literal in a profile, never logged or recorded), and URLs lose their user
info wherever they are shown or stored. Also the interpreter check of item 8."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.profiles.loader import load_profiles
from pytest_specdecode.profiles.profile import check_python, expand_secret_references
from pytest_specdecode.redaction import is_secret_flag, redact_json, redact_url
from pytest_specdecode.servers.factory import make_launcher
from pytest_specdecode.servers.launcher import redact_argv

SECRET = "adm-0a1b2c3d4e"


# --- which flags carry a credential ------------------------------------------------------------


@pytest.mark.parametrize(
    "flag",
    [
        "--api-key",
        "--admin-api-key",
        "--hf-token",
        "--token",
        "--access-token=x",
        "--client-secret",
        "--ssl-keyfile-password",
        "--db-passwd",
        "--auth-cookie",
        "-apiKey",
        "--API_KEY",
    ],
)
def test_credential_flags(flag: str) -> None:
    assert is_secret_flag(flag)


@pytest.mark.parametrize(
    "flag",
    [
        "--speculative-token-map",  # a path; hiding it would hide a configuration change
        "--ssl-keyfile",
        "--api-key-file",
        "--max-total-tokens",
        "--skip-tokenizer-init",
        "--tokenizer-path",
        "--keep-mm-feature-on-device",
        "--model-path",
    ],
)
def test_flags_that_carry_no_credential(flag: str) -> None:
    assert not is_secret_flag(flag)


# --- URLs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://perf:pw@gpu-box:30000", "http://<redacted>@gpu-box:30000"),
        ("https://tok@github.com/org/repo.git", "https://<redacted>@github.com/org/repo.git"),
        ("http://u:p@ss@h:1/x", "http://<redacted>@h:1/x"),  # an unescaped @ in the password
        ("perf:pw@127.0.0.1:30000", "<redacted>@127.0.0.1:30000"),
        ("--server-host=perf:pw@gpu-box", "--server-host=<redacted>@gpu-box"),
        ("at http://a:b@h and http://h2", "at http://<redacted>@h and http://h2"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),  # no password
        ("http://gpu-box:30000", "http://gpu-box:30000"),
        ("error: see foo@bar", "error: see foo@bar"),
    ],
)
def test_redact_url(text: str, shown: str) -> None:
    assert redact_url(text) == shown


def test_redact_json_hides_url_user_info_and_every_credential_flag() -> None:
    data = {
        "pytest_args": [
            "--server-host",
            "http://perf:pw1@gpu-box:30000",
            "--server-host=perf:pw2@gpu-box",
        ],
        "extra_args": ["--admin-api-key 'k1'", "--speculative-token-map /maps/freq.pt"],
        "argv": ["--admin-api-key", "k2", "--hf-token=k3", "--ssl-keyfile", "/etc/key.pem"],
    }
    text = json.dumps(redact_json(data))
    for secret in ("pw1", "pw2", "k1", "k2", "k3"):
        assert secret not in text
    assert "/maps/freq.pt" in text
    assert "/etc/key.pem" in text


def test_redact_argv_hides_credential_flags_and_url_user_info() -> None:
    argv = ["python", "-m", "srv", "--admin-api-key", SECRET, "--hf-token=t0k"]
    argv += ["--model-path", "https://me:pw@models.example/m", "--speculative-token-map", "/m"]
    shown = redact_argv(argv)
    assert shown == [
        "python", "-m", "srv", "--admin-api-key", "***", "--hf-token=***",
        "--model-path", "https://<redacted>@models.example/m", "--speculative-token-map", "/m",
    ]  # fmt: skip


# --- profiles ----------------------------------------------------------------------------------


def load(tmp_path: Path, extra_args: str, launcher: str = "sim") -> object:
    path = tmp_path / "specdecode.toml"
    path.write_text(
        f'[profiles.p]\nlauncher = "{launcher}"\nmodel_path = "/m"\nextra_args = {extra_args}\n'
    )
    return load_profiles(path, target="real").profiles["p"]


@pytest.mark.parametrize(
    "extra_args",
    [
        f'["--admin-api-key", "{SECRET}"]',
        f'["--admin-api-key={SECRET}"]',
        f'["--hf-token", "{SECRET}", "--disable-custom-all-reduce"]',
        '["--admin-api-key", "$ADMIN_KEY"]',  # not the ${NAME} form: taken as a literal
        '["--admin-api-key"]',
    ],
)
def test_a_literal_credential_in_extra_args_is_refused_without_echoing_it(
    tmp_path: Path, extra_args: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, extra_args)
    message = str(caught.value)
    assert SECRET not in message
    assert "[profiles.p]" in message
    assert "takes a credential" in message
    assert '"${' in message
    assert "export" in message


def test_a_literal_credential_is_refused_for_llamacpp_too(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="takes a credential"):
        load(tmp_path, f'["--hf-token", "{SECRET}"]', launcher="llamacpp")


def test_the_api_key_keeps_its_own_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api_key_env"):
        load(tmp_path, '["--api-key", "k"]')


def test_an_environment_reference_is_accepted_and_expanded_only_at_launch(
    tmp_path: Path,
) -> None:
    profile = load(tmp_path, '["--admin-api-key", "${ADMIN_KEY}", "--speculative-token-map", "/m"]')
    argv = profile.launch_argv(host="127.0.0.1", port=1)  # type: ignore[attr-defined]
    assert argv[-4:] == ["--admin-api-key", "${ADMIN_KEY}", "--speculative-token-map", "/m"]
    assert SECRET not in json.dumps(profile.fingerprint().to_json())  # type: ignore[attr-defined]

    launcher = make_launcher(
        profile,  # type: ignore[arg-type]
        port=1,
        log_path=tmp_path / "server.log",
        env={"ADMIN_KEY": SECRET, "PATH": "/usr/bin"},
        api_key=None,
    )
    assert launcher.argv[-4:] == ["--admin-api-key", SECRET, "--speculative-token-map", "/m"]  # type: ignore[attr-defined]
    assert SECRET not in " ".join(redact_argv(launcher.argv))  # type: ignore[attr-defined]


def test_an_unset_reference_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"ADMIN_KEY is not set.*export it"):
        expand_secret_references(
            ["srv", "--admin-api-key=${ADMIN_KEY}"], {}, profile="p", source="f.toml"
        )


# --- item 8: the profile's interpreter ---------------------------------------------------------


def test_a_missing_interpreter_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "venv" / "bin" / "python")
    with pytest.raises(ConfigError) as caught:
        check_python(missing, {"PATH": "/usr/bin"}, profile="p", source="specdecode.toml")
    message = str(caught.value)
    assert f"python = {missing!r}" in message
    assert "does not exist" in message
    assert "specdecode.toml" in message
    assert "Python that has SGLang" in message
    with pytest.raises(ConfigError, match="no such program on PATH"):
        check_python("python9.99", {"PATH": str(tmp_path)}, profile="p", source=None)
    check_python("sh", {"PATH": "/bin:/usr/bin"}, profile="p", source=None)
