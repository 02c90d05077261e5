"""A fleet of GPU boxes: which host each profile's server runs on.

The plugin schedules nothing itself: the Docker Engine API reaches each box (``ssh://``,
``tcp://``, a unix socket or a Docker context), and pytest-xdist runs the tests. What is decided
here is the *placement*, once per session and identically in every xdist process (it depends on
the collected tests alone): each profile goes to one host it may run on, so that

* one host runs one profile's server at a time (its tests form one xdist group, so one worker
  takes them in turn and never two servers load on the same GPUs), and
* different hosts load and measure in parallel (one group per host, spread over the workers).

The assignment is "least flexible, then longest first": profiles ordered by how few hosts can
take them, then by decreasing cost (a load plus their tests), each to the allowed host with the
least cost so far that has GPUs enough, ties to the host named first. That keeps the night's
length near the longest host's share, which is what a team waiting for the nightly verdict pays
for (benchmarks/bench_fleet.py: within 5% of the lower bound up to 1,000 hosts; placing pinned
profiles first cut a 10-host night from 37 to 27 tests' time, where plain longest-first was
never more than 1.2% better).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pytest_specdecode.errors import ConfigError

LOAD_COST = 3.0
"""The cost of a server load, in tests: a TP8 load is about 15 minutes, a test about 5."""


@dataclass(frozen=True)
class HostSpec:
    """``[hosts.NAME]``: a Docker engine and the GPUs behind it."""

    name: str
    docker_host: str | None = None  # unix://, tcp://, ssh://; None with env or context
    docker_host_env: str | None = None  # the variable that holds the endpoint (secrets stay out)
    context: str | None = None  # a Docker context name
    gpus: tuple[int, ...] = ()
    hardware: str | None = None  # the hardware key of its baselines (default: host-NAME)
    # The directory of its client certificates (ca.pem, cert.pem, key.pem), absolute; None:
    # pytest's DOCKER_TLS_VERIFY / DOCKER_CERT_PATH apply, or the context's TLS material.
    tls_cert_path: str | None = None
    tls_verify: bool = True  # with tls_cert_path: verify the engine's certificate with ca.pem
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))

    @property
    def hardware_key(self) -> str:
        return self.hardware or f"host-{self.name}"


TLS_FILES: tuple[str, str, str] = ("ca.pem", "cert.pem", "key.pem")
"""Docker's ``DOCKER_CERT_PATH`` convention: the CA, the client certificate and its key."""

TLS_SCHEMES = ("tcp", "https")
"""The endpoints TLS applies to (``ssh://`` has its own keys, a unix socket its permissions)."""


@dataclass(frozen=True)
class EngineTLS:
    """How the client of one Docker engine speaks TLS: the directory of its certificates and
    whether the engine's certificate is verified against the CA there (``verify = False``: the
    client certificate is presented, the engine's is not checked, as ``DOCKER_CERT_PATH``
    without ``DOCKER_TLS_VERIFY``). Paths only: nothing here reads a key.

    ``files`` are the names of the CA, certificate and key in ``cert_path``: Docker's
    convention, unless a context's store named them otherwise."""

    cert_path: str
    verify: bool = True
    files: tuple[str, str, str] = TLS_FILES

    @property
    def ca_cert(self) -> str:
        return os.path.join(self.cert_path, self.files[0])

    @property
    def client_cert(self) -> tuple[str, str]:
        """(certificate, key), as the Docker SDK's ``TLSConfig`` takes them."""
        return os.path.join(self.cert_path, self.files[1]), os.path.join(
            self.cert_path, self.files[2]
        )

    def missing(self) -> list[str]:
        """What of the material does not exist: the directory, or the files not in it."""
        if not os.path.isdir(self.cert_path):
            return [self.cert_path]
        paths = (self.ca_cert, *self.client_cert)
        return [path for path in paths if not os.path.isfile(path)]

    def describe(self) -> str:
        """``client certificate in DIR`` (and whether the engine's is checked), for messages."""
        checked = "" if self.verify else ", the engine's certificate not verified"
        return f"TLS client certificate in {self.cert_path}{checked}"

    def identity(self) -> dict[str, Any]:
        """What a server's recorded identity carries, so that a later session reconnects (to
        check or stop it) the way this one connected: :meth:`from_identity` reads it back."""
        recorded: dict[str, Any] = {"docker_cert_path": self.cert_path}
        recorded["docker_tls_verify"] = self.verify
        if self.files != TLS_FILES:
            recorded["docker_tls_files"] = list(self.files)
        return recorded

    @classmethod
    def from_identity(cls, identity: Mapping[str, Any]) -> EngineTLS | None:
        """The TLS recorded by :meth:`identity`; ``None`` when none was (or it is not ours)."""
        path, verify = identity.get("docker_cert_path"), identity.get("docker_tls_verify", True)
        if not isinstance(path, str) or not path or not isinstance(verify, bool):
            return None
        files = identity.get("docker_tls_files")
        if isinstance(files, list) and len(files) == 3 and all(isinstance(f, str) for f in files):
            return cls(path, verify, (files[0], files[1], files[2]))
        return cls(path, verify)


@dataclass(frozen=True)
class Need:
    """What one profile asks of a host: how many GPUs, which hosts it may use, how many tests.

    ``indices`` are the profile's ``gpus`` as written: positions in a host's ``gpus`` list (as
    ``gpus`` index the GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible on one box), so a host must
    have more GPUs than the highest of them, not merely as many as there are."""

    gpus: int
    hosts: tuple[str, ...] = ()  # empty: any host
    tests: int = 1
    indices: tuple[int, ...] = ()

    @property
    def gpus_needed(self) -> int:
        """How many GPUs a host must list to take this profile."""
        return max(self.gpus, max(self.indices, default=-1) + 1)


@dataclass
class Placement:
    """Profile name -> host name, and each host's cost (a load per profile plus its tests)."""

    host_of: dict[str, str] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)

    def group(self, profile: str) -> str:
        """The xdist group of ``profile``'s tests: its host's (one worker per host at a time)."""
        return f"specdecode-host-{self.host_of[profile]}"

    @property
    def makespan(self) -> float:
        """The largest host's cost: the night takes about this long, in tests."""
        return max(self.cost.values(), default=0.0)


def place(
    needs: Mapping[str, Need], hosts: Sequence[HostSpec], *, source: str = "the profile file"
) -> Placement:
    """Assign every profile of ``needs`` to one host (see the module docstring). A profile that
    names an unknown host, or that no allowed host has GPUs enough for, is a ``ConfigError``."""
    by_name = {host.name: host for host in hosts}
    order = {host.name: index for index, host in enumerate(hosts)}
    placement = Placement(cost=dict.fromkeys(by_name, 0.0))
    fitting = {name: _fitting(name, need, by_name, source) for name, need in needs.items()}
    ranked = sorted(
        needs.items(),
        key=lambda item: (len(fitting[item[0]]), -(LOAD_COST + item[1].tests), item[0]),
    )
    for name, need in ranked:
        best = min(fitting[name], key=lambda h: (placement.cost[h], order[h]))
        placement.host_of[name] = best
        placement.cost[best] += LOAD_COST + need.tests
    return placement


def _fitting(name: str, need: Need, by_name: Mapping[str, HostSpec], source: str) -> list[str]:
    """The hosts ``name`` may run on that have GPUs enough; a ``ConfigError`` when none."""
    allowed = need.hosts or tuple(by_name)
    unknown = [h for h in allowed if h not in by_name]
    if unknown:
        raise ConfigError(
            f"profile {name!r} may run on hosts {list(allowed)}, but {unknown} "
            f"{'is' if len(unknown) == 1 else 'are'} not defined; defined: "
            f"{', '.join(sorted(by_name)) or 'none'} (add [hosts.NAME] tables)",
            source=source,
        )
    fitting = [h for h in allowed if len(by_name[h].gpus) >= need.gpus_needed]
    if not fitting:
        asks = (
            f"uses GPUs {list(need.indices)} (positions in a host's gpus list), so it needs "
            f"a host with {need.gpus_needed}"
            if need.gpus_needed > need.gpus
            else f"needs {need.gpus} GPU(s)"
        )
        raise ConfigError(
            f"profile {name!r} {asks}, but none of its hosts "
            f"{list(allowed)} has that many ("
            + ", ".join(f"{h}: {len(by_name[h].gpus)}" for h in allowed)
            + "); give a host more gpus or the profile another host",
            source=source,
        )
    return fitting


def device_gpus(host: HostSpec, indices: Sequence[int]) -> tuple[int, ...]:
    """The GPUs of ``host`` a profile with ``gpus = indices`` gets: the host's ``gpus`` at those
    positions (``gpus = [4, 5, 6, 7]`` on the host and ``[0, 1]`` in the profile: GPUs 4 and 5
    of that box), the ids its engine is asked for and its GPU locks are named by. A profile
    without GPUs gets none. :func:`place` has checked that the positions exist."""
    return tuple(host.gpus[index] for index in indices)


def endpoint(host: HostSpec, env: Mapping[str, str]) -> str:
    """The Docker endpoint of ``host``: written in the file, read from the variable it names, or
    the Docker context's (as ``docker --context NAME`` would use). Raises ``ConfigError``."""
    return engine(host, env)[0]


def engine(host: HostSpec, env: Mapping[str, str]) -> tuple[str, EngineTLS | None]:
    """The endpoint of ``host`` (:func:`endpoint`) and the TLS its client speaks there: its
    ``tls_cert_path``, else its context's TLS material; ``None`` leaves the client to pytest's
    environment (``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``), as on one box. Material that is
    named but missing is a ``ConfigError`` naming the host, the key and the path."""
    if host.docker_host:
        return host.docker_host, _own_tls(host, host.docker_host, "docker_host")
    if host.docker_host_env:
        value = env.get(host.docker_host_env, "").strip()
        if not value:
            raise ConfigError(
                f"host {host.name!r} takes its Docker endpoint from ${host.docker_host_env}, "
                "which is not set; export it (e.g. ssh://gpu-box-2 or tcp://gpu-box-2:2376) "
                "before running pytest",
                source=host.source,
            )
        return value, _own_tls(host, value, f"${host.docker_host_env}")
    from docker.context import ContextAPI

    context = ContextAPI.get_context(host.context)
    if context is None or not context.Host:
        known = [c.Name for c in ContextAPI.contexts()]
        raise ConfigError(
            f"host {host.name!r} names the Docker context {host.context!r}, which does not "
            f"exist here (known: {', '.join(known) or 'none'}); create it with `docker context "
            "create` or give docker_host",
            source=host.source,
        )
    address = str(context.Host)
    tls = _context_tls(host, context, address)
    if tls is not None and address.startswith("http://"):
        # the SDK writes http:// for a context it made with skip_tls_verify, whose TLS material
        # is still meant to be used (the CLI keeps tcp:// there)
        address = "tcp://" + address[len("http://") :]
    return address, tls


def _own_tls(host: HostSpec, address: str, written: str) -> EngineTLS | None:
    """``tls_cert_path`` of ``host``, checked: a TLS endpoint, and the material all there."""
    if host.tls_cert_path is None:
        return None
    scheme = urlsplit(address).scheme
    if scheme not in TLS_SCHEMES:  # the scheme only: the rest may carry a user name
        raise ConfigError(
            f"host {host.name!r} has tls_cert_path, but its endpoint ({written}) is a "
            f"{scheme}:// address: TLS applies to tcp:// engines only; give a "
            "tcp://HOST:2376 endpoint or remove tls_cert_path",
            source=host.source,
        )
    tls = EngineTLS(host.tls_cert_path, host.tls_verify)
    _check_material(
        host,
        tls,
        f"tls_cert_path = {host.tls_cert_path!r}",
        "put them there, or point tls_cert_path at the directory that has them",
    )
    return tls


def _context_tls(host: HostSpec, context: Any, address: str) -> EngineTLS | None:
    """The TLS material the Docker context store holds for ``context``'s engine, as
    ``docker --context NAME`` would present it; ``None`` when it holds none."""
    if urlsplit(address).scheme not in (*TLS_SCHEMES, "http"):
        return None
    config = context.TLSConfig
    folder = os.path.join(str(context.tls_path), "docker")
    if config is None or not config.cert:
        if os.path.isdir(folder) and os.listdir(folder):  # some of it: say what is missing
            raise ConfigError(
                f"host {host.name!r}: the Docker context {host.context!r} has TLS material in "
                f"{folder}, but not all of a CA, a client certificate and its key "
                f"(found {', '.join(sorted(os.listdir(folder)))}); give all three: "
                f"`docker context update {host.context} --docker "
                f'"host={address},ca=ca.pem,cert=cert.pem,key=key.pem"`',
                source=host.source,
            )
        return None
    cert, key = config.cert
    ca = str(config.ca_cert)
    endpoint_ = context.endpoints.get("docker", {})
    tls = EngineTLS(
        cert_path=os.path.dirname(str(cert)),
        verify=not bool(endpoint_.get("SkipTLSVerify", False)),
        files=(os.path.basename(ca), os.path.basename(str(cert)), os.path.basename(str(key))),
    )
    _check_material(
        host,
        tls,
        f"the Docker context {host.context!r}",
        f"give them again: `docker context update {host.context} --docker "
        f'"host={address},ca=ca.pem,cert=cert.pem,key=key.pem"`',
    )
    return tls


def _check_material(host: HostSpec, tls: EngineTLS, named: str, fix: str) -> None:
    missing = tls.missing()
    if not missing:
        return
    if missing == [tls.cert_path]:
        what = f"the directory {tls.cert_path} does not exist"
    else:
        what = "no " + ", no ".join(
            f"{os.path.basename(path)} ({path} does not exist)" for path in missing
        )
    raise ConfigError(
        f"{named} names the TLS client certificates of host {host.name!r}, but {what}; the "
        f"directory must hold {', '.join(TLS_FILES)} (the CA that signed the engine's "
        f"certificate, the client certificate and its key, as DOCKER_CERT_PATH does): {fix}",
        source=host.source,
    )
