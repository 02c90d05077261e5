"""Checkers of single values read from a TOML file, shared by the profile loader and the
llama.cpp profile checks: each returns the value or raises a :class:`ConfigError` naming where
the value was written, the key, the value with its type, and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from pytest_specdecode.errors import ConfigError


def describe_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    for kind, text in ((str, "a string"), (int, "an integer"), (float, "a float")):
        if isinstance(value, kind):
            return text
    if isinstance(value, list):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return type(value).__name__


def fail(where: str, key: str, value: object, allowed: str) -> NoReturn:
    raise ConfigError(
        f"{key} = {value!r} ({describe_type(value)}) is not allowed: {allowed}", source=where
    )


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    hint = difflib.get_close_matches(word, list(choices), n=1)
    if not hint and len(word) >= 2:  # difflib misses abbreviations: "tp" for "tp_size"
        hint = [choice for choice in choices if choice.startswith(word)][:1]
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def counted(messages: Sequence[str]) -> tuple[str, ...]:
    """Each distinct message once, in first-seen order, with ``(N times)`` after one that came
    N > 1 times: one line of a profile file that every profile and target inherits is one warning,
    not a screenful of identical ones."""
    counts: dict[str, int] = {}
    for message in messages:
        counts[message] = counts.get(message, 0) + 1
    return tuple(m if n == 1 else f"{m} ({n} times)" for m, n in counts.items())


def check_keys(table: Mapping[str, Any], allowed: Sequence[str], where: str, *, what: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"unknown {what} {key!r}{did_you_mean(key, allowed)}; allowed: "
                f"{', '.join(allowed)}",
                source=where,
            )


def string(value: object, key: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        fail(where, key, value, "must be a non-empty string")
    return value


def strings(value: object, key: str, where: str, *, allow_single: bool = False) -> tuple[str, ...]:
    if allow_single and isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        single = "a string or " if allow_single else ""
        fail(where, key, value, f"must be {single}an array of strings")
    for index, item in enumerate(value):
        if not isinstance(item, str) or (allow_single and not item.strip()):
            shown = str(item).lower() if isinstance(item, bool) else str(item)
            fail(where, f"{key}[{index}]", item, f'every element must be a string, e.g. "{shown}"')
    return tuple(value)


def integer(value: object, key: str, where: str, *, low: int, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        limit = f"between {low} and {high}" if high is not None else f">= {low}"
        fail(where, key, value, f"must be an integer {limit} (no quotes)")
    return value


def choice(value: object, key: str, where: str, choices: Sequence[str]) -> str:
    if value not in choices:
        fail(where, key, value, f"must be one of {', '.join(repr(c) for c in choices)}")
    assert isinstance(value, str)
    return value
