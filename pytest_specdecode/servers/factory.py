"""From a profile to a launcher, and from a recorded identity back to a live server.

The pool keeps servers alive across sessions through the identities in the state file
(:mod:`pytest_specdecode.servers.state`): a pid with the command it ran, or a container id. These
functions are the only places that know which launcher kind an identity belongs to.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.fleet import EngineTLS
from pytest_specdecode.profiles.kinds.registry import recorded_in_container
from pytest_specdecode.profiles.llamacpp import resolve_binary
from pytest_specdecode.profiles.profile import (
    ServerProfile,
    check_python,
    expand_secret_references,
)
from pytest_specdecode.servers.build import BuildKey, build_key
from pytest_specdecode.servers.launcher import Launcher, ServerIdentity, wait_port_free
from pytest_specdecode.servers.ports import process_cmdline, session_listens
from pytest_specdecode.servers.subprocess import (
    SubprocessLauncher,
    process_alive,
    stop_process_group,
)

# Secrets a server may need (gated model downloads) that a container does not inherit. They are
# passed through from pytest's environment and never recorded in a profile or fingerprint.
FORWARDED_SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def make_launcher(
    profile: ServerProfile,
    *,
    port: int,
    log_path: Path,
    env: Mapping[str, str],
    api_key: str | None,
) -> Launcher:
    key_args = ["--api-key", api_key] if api_key else []

    def secrets(argv: list[str]) -> list[str]:  # "${NAME}" of credential flags, from env
        return expand_secret_references(argv, env, profile=profile.name, source=profile.source)

    if profile.kind.in_container:
        from pytest_specdecode.servers.docker.engine import container_bind_host
        from pytest_specdecode.servers.docker.launcher import DockerLauncher

        if profile.docker is None:
            raise ConfigError(f"profile {profile.name!r} uses launcher docker but has no image")
        container_env = profile.launch_env({})
        for name in FORWARDED_SECRETS:  # never in a profile or fingerprint, but models need them
            if env.get(name):
                container_env[name] = env[name]
        bind = container_bind_host(profile.docker.network, profile.docker_host)
        return DockerLauncher(
            image=profile.docker.image,
            command=secrets(profile.launch_argv(host=bind, port=port)) + key_args,
            env=container_env,
            host=profile.host,
            port=port,
            log_path=log_path,
            gpus=list(profile.gpus),
            shm_size=profile.docker.shm_size,
            volumes=profile.docker.volumes,
            network=profile.docker.network,
            labels={
                "pytest-specdecode.profile": profile.name,
                "pytest-specdecode.fingerprint": profile.fingerprint().digest,
            },
            name=f"specdecode-{profile.name}-{port}",
            docker_host=profile.docker_host,
            tls=profile.docker_tls,
        )
    binary = None
    if profile.llamacpp is not None:
        binary = resolve_binary(profile.llamacpp.binary, env, source=profile.source)
    if profile.python is not None:  # a missing interpreter: a message, not Popen's traceback
        check_python(profile.python, env, profile=profile.name, source=profile.source)
    return SubprocessLauncher(
        secrets(profile.launch_argv(host=profile.host, port=port, binary=binary)) + key_args,
        env=profile.launch_env(env),
        host=profile.host,
        port=port,
        log_path=log_path,
        kind=profile.launcher,
    )


def build_of(profile: ServerProfile, env: Mapping[str, str]) -> BuildKey:
    """The build a launch of ``profile`` would run (:mod:`pytest_specdecode.servers.build`):
    what may be reused is a server of the same fingerprint *and* build. What cannot be
    resolved here (no engine, no binary) stays unknown; the launch then fails on its own."""
    binary = image_id = None
    if profile.llamacpp is not None:
        try:
            binary = resolve_binary(profile.llamacpp.binary, env, source=profile.source)
        except ConfigError:
            binary = None
    if profile.kind.in_container and profile.docker is not None:
        image_id = _image_id(profile.docker.image, profile.docker_host, profile.docker_tls)
    launch_env = profile.launch_env({}) if profile.kind.in_container else _launch_env(profile, env)
    return build_key(
        profile.launcher,
        python=profile.python,
        launch_env=launch_env,
        image=profile.docker.image if profile.docker else None,
        image_id=image_id,
        binary=binary,
        engine=profile.docker_host,
    )


def _launch_env(profile: ServerProfile, env: Mapping[str, str]) -> dict[str, str]:
    try:
        return profile.launch_env(env)
    except ConfigError:  # bad CUDA_VISIBLE_DEVICES: the launch reports it
        return dict(env)


def _image_id(image: str, docker_host: str | None, tls: EngineTLS | None) -> str | None:
    try:
        from pytest_specdecode.servers.docker.engine import connect

        client = connect(docker_host, tls)
        try:
            return str(client.images.get(image).id)
        finally:
            client.close()
    except Exception:  # no engine or no image: the launch says which, with its own message
        return None


def identity_serves(identity: ServerIdentity) -> bool | None:
    """Whether the recorded server still holds its port (``None``: cannot tell): a server kept
    by an earlier session that died, its port then taken by another, must not be reused."""
    pid, port = identity.get("pid"), identity.get("port")
    if (
        recorded_in_container(identity.get("kind"))
        or not isinstance(pid, int)
        or not isinstance(port, int)
    ):
        return None
    from pytest_specdecode.servers.ports import session_holds_port

    return session_holds_port(pid, port)


def identity_alive(identity: ServerIdentity) -> bool:
    if recorded_in_container(identity.get("kind")):
        from pytest_specdecode.servers.docker.recorded import docker_server_alive

        return docker_server_alive(identity)
    pid = identity.get("pid")
    if not isinstance(pid, int) or not process_alive(pid):
        return False
    # A recycled pid must not be mistaken for our server: check what it runs.
    cmdline = process_cmdline(pid) or ""
    return str(identity.get("argv0", "")).split(" ")[-1] in cmdline


def stop_identity(identity: ServerIdentity, *, grace: float) -> bool:
    """Stop a recorded server; ``False`` when it could not be (its engine did not answer)."""
    if recorded_in_container(identity.get("kind")):
        from pytest_specdecode.servers.docker.recorded import stop_docker_server

        return stop_docker_server(identity, grace)
    pid = identity.get("pid")
    if isinstance(pid, int) and identity_alive(identity):
        stop_process_group(pid, grace=grace)
    host, port = identity.get("host"), identity.get("port")
    if isinstance(host, str) and isinstance(port, int):
        # the server led its own session (start_new_session): its processes share its pid
        ours = (lambda: session_listens(pid, port)) if isinstance(pid, int) else None
        wait_port_free(host, port, timeout=30.0, ours=ours)
    return True
