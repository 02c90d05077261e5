"""How one raw option value (a flag, an environment variable or an ini value, always text) becomes
a typed value: each parser returns it or raises ``ValueError`` saying what is allowed, and
:func:`pytest_specdecode.settings.resolve` adds which value it was and where it came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pytest_specdecode.redaction import redact_url

INCONCLUSIVE_POLICIES = ("fail", "warn", "xfail")
MISSING_BASELINE_POLICIES = ("skip", "fail")
METHODS = ("welch-log", "bootstrap", "rank")
EXIT_STATUS_MODES = ("pytest", "nightly")
"""``--specdecode-exit-status``: pytest's own exit statuses, or one per kind of night
(:mod:`pytest_specdecode.session.exit_status`)."""


def run_count(text: str) -> int:
    value = int(text)
    if value < 2:
        raise ValueError(
            "must be a whole number of at least 2 (one run has no run-to-run variance, so no "
            "confidence interval)"
        )
    return value


def launch_count(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 20:
        raise ValueError("must be a whole number of launches from 1 to 20")
    return value


def reference_nights(text: str) -> int:
    value = int(text)
    if not 5 <= value <= 1000:
        raise ValueError("must be a whole number of nights from 5 to 1000")
    return value


def probability(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 0.5:
        raise ValueError("must lie between 0 and 0.5 (a one-sided error rate such as 0.05)")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be a positive number")
    return value


def seconds_or_auto(text: str) -> float | None:
    if text.strip().lower() == "auto":
        return None
    return positive_float(text)


def machine_load(text: str) -> float | str:
    lowered = text.strip().lower()
    if lowered in ("measure", "off"):
        return lowered
    try:
        value = float(lowered)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise ValueError(
            "must be 'measure', 'off', or the machine's load as runnable tasks per CPU (a "
            "number of at least 0, such as 0.5)"
        )
    return value


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return text

    return parse


def switch(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def text_value(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


@dataclass(frozen=True)
class ServerHosts:
    """``--server-host``: the servers someone else runs. ``default`` (a bare ``URL``) serves
    every selected profile it runs (by its ``/server_info``); ``named`` (``PROFILE=URL``) says
    which server serves which profile. The URLs are as written (``HOST[:PORT]`` or a URL);
    ``servers.attach.attach_url`` completes them."""

    default: str | None = None
    named: Mapping[str, str] = field(default_factory=dict)

    def url_for(self, profile: str) -> str | None:
        """The server given for ``profile``: its own, else the default (None: none given)."""
        return self.named.get(profile, self.default)

    @property
    def specs(self) -> list[str]:
        """Every server given, the default first, each once."""
        urls = ([self.default] if self.default else []) + list(self.named.values())
        return list(dict.fromkeys(urls))

    def __str__(self) -> str:
        """As the user would write it, passwords in URLs redacted."""
        parts = [f"{name}={url}" for name, url in self.named.items()]
        if self.default:
            parts.insert(0, self.default)
        return redact_url(", ".join(parts))


_PROFILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
"""What may stand before ``=`` in ``PROFILE=URL``: a profile name. A URL's own ``=`` (in a
password) has ``:``, ``/`` or ``@`` before it, so it is never taken for one."""


def server_hosts(text: str) -> ServerHosts:
    """``URL`` and/or ``PROFILE=URL`` values, separated by commas or whitespace (the flag may
    be repeated). At most one bare URL; a profile named twice must name one server."""
    default: str | None = None
    named: dict[str, str] = {}
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        name, sep, url = item.partition("=")
        if not (sep and _PROFILE_NAME.fullmatch(name)):
            if default is not None and default != item:
                raise ValueError(
                    f"gives two servers without a profile ({redact_url(default)} and "
                    f"{redact_url(item)}): give at most one bare URL (it serves the profiles it "
                    "runs) and name the others PROFILE=URL"
                )
            default = item
            continue
        if not url:
            raise ValueError(f"{name}= names no server: write {name}=HOST[:PORT] or a URL")
        if named.get(name, url) != url:
            raise ValueError(
                f"names two servers for profile {name!r} ({redact_url(named[name])} and "
                f"{redact_url(url)}): one profile is measured on one server"
            )
        named[name] = url
    if default is None and not named:
        raise ValueError("must not be empty")
    return ServerHosts(default=default, named=named)


def default_state_dir() -> Path:
    """The machine-wide state directory (per user): ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pytest-specdecode"
