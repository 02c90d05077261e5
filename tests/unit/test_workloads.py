"""Workloads: shipped prompt sets, the content hash, prompt selection, resolution and validation."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from importlib import resources
from pathlib import Path

import pytest

from pytest_specdecode.errors import ConfigError
from pytest_specdecode.workloads import (
    APIS,
    BUILTIN_WORKLOADS,
    DEFAULT_WORKLOAD,
    PROMPT_KINDS,
    PROMPT_SETS,
    WORKLOAD_KEYS,
    Prompt,
    Workload,
    load_prompt_set,
    resolve_workload,
)

SOURCE = "perf_tests/specdecode.toml"


def _small(**changes: object) -> Workload:
    prompts = (Prompt("custom", "first prompt"), Prompt("custom", "second prompt"))
    workload = Workload("small", "inline", prompts, requests_per_run=2, source="test")
    return dataclasses.replace(workload, **changes)  # type: ignore[arg-type]


# --- shipped prompt sets -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", PROMPT_KINDS)
def test_every_shipped_prompt_set_loads_with_enough_distinct_prompts(kind: str) -> None:
    prompts = load_prompt_set(kind)

    assert len(prompts) >= 8
    assert {prompt.kind for prompt in prompts} == {kind}
    texts = [prompt.text for prompt in prompts]
    assert len(set(texts)) == len(texts)
    assert all(len(text.split()) >= 40 for text in texts), "prompts are a few sentences or more"


def test_summarization_prompts_carry_a_passage_of_150_to_300_words() -> None:
    for prompt in load_prompt_set("summarization"):
        instruction, _, passage = prompt.text.partition("\n\n")
        assert 150 <= len(passage.split()) <= 300, instruction


def test_no_prompt_appears_in_two_sets() -> None:
    texts = [prompt.text for kind in PROMPT_KINDS for prompt in load_prompt_set(kind)]

    assert len(set(texts)) == len(texts)


def test_shipped_files_are_one_json_object_per_line() -> None:
    folder = resources.files("pytest_specdecode") / "prompts"
    for kind in PROMPT_KINDS:
        lines = (folder / f"{kind}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line)["kind"] for line in lines] == [kind] * len(lines)


def test_mixed_set_interleaves_the_kinds() -> None:
    mixed = load_prompt_set("mixed")

    assert [prompt.kind for prompt in mixed[:8]] == [*PROMPT_KINDS, *PROMPT_KINDS]
    assert len(mixed) == sum(len(load_prompt_set(kind)) for kind in PROMPT_KINDS)
    assert set(mixed) == {prompt for kind in PROMPT_KINDS for prompt in load_prompt_set(kind)}


def test_unknown_prompt_set_is_a_config_error_listing_the_sets() -> None:
    with pytest.raises(ConfigError, match=r"unknown prompt set 'poetry'.*code, math, chat"):
        load_prompt_set("poetry")


# --- the content hash --------------------------------------------------------------------------


def test_content_hash_is_sha256_of_the_documented_canonical_json() -> None:
    shape = {
        "api": "generate-stream",
        "concurrency": 1,
        "ignore_eos": True,
        "max_new_tokens": 256,
        "prompt_order": "first-n-cyclic",
        "prompts": ["first prompt", "second prompt"],
        "requests_per_run": 2,
        "temperature": 0.0,
    }
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    assert _small().content_hash() == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_content_hash_is_stable_across_equal_workloads() -> None:
    assert _small().content_hash() == _small().content_hash()
    assert resolve_workload("default").content_hash() == BUILTIN_WORKLOADS["default"].content_hash()
    assert _small(temperature=0).content_hash() == _small(temperature=0.0).content_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"prompts": (Prompt("custom", "first prompt"), Prompt("custom", "other prompt"))},
        {"max_new_tokens": 512},
        {"temperature": 0.7},
        {"ignore_eos": False},
        {"concurrency": 2},
        {"requests_per_run": 3},
        {"api": "completions-stream"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_content_hash_changes_with_every_field_that_shapes_requests(
    change: dict[str, object],
) -> None:
    assert _small(**change).content_hash() != _small().content_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"name": "renamed"},
        {"source": "elsewhere.toml"},
        {"warmup_requests": 7},
        {"flush_cache": False},
        {"prompt_set": "another label"},
        {"prompts": (Prompt("code", "first prompt"), Prompt("math", "second prompt"))},
    ],
    ids=lambda change: next(iter(change)),
)
def test_content_hash_ignores_fields_that_do_not_shape_requests(
    change: dict[str, object],
) -> None:
    assert _small(**change).content_hash() == _small().content_hash()


def test_content_hash_covers_only_the_prompts_that_are_sent() -> None:
    one_request = _small(requests_per_run=1)
    unused_prompt_changed = dataclasses.replace(
        one_request, prompts=(one_request.prompts[0], Prompt("custom", "never sent"))
    )

    assert unused_prompt_changed.content_hash() == one_request.content_hash()


# --- prompt selection --------------------------------------------------------------------------


def test_every_run_sends_the_same_prompts() -> None:
    workload = BUILTIN_WORKLOADS["default"]

    first = workload.prompts_for_run(0)
    assert [prompt.kind for prompt in first] == list(PROMPT_KINDS)
    assert all(workload.prompts_for_run(index) == first for index in (1, 2, 5, 17))


def test_prompt_selection_cycles_when_a_run_needs_more_prompts_than_the_set_has() -> None:
    workload = _small(requests_per_run=5)

    texts = [prompt.text for prompt in workload.prompts_for_run(0)]
    assert texts == ["first prompt", "second prompt"] * 2 + ["first prompt"]


def test_warmup_cycles_over_the_prompts_of_a_run() -> None:
    workload = dataclasses.replace(BUILTIN_WORKLOADS["default"], warmup_requests=6)

    run = workload.prompts_for_run(0)
    assert workload.prompts_for_warmup() == (*run, run[0], run[1])
    assert dataclasses.replace(workload, warmup_requests=0).prompts_for_warmup() == ()


@pytest.mark.parametrize("bad_index", [-1, True, 1.0])
def test_run_index_must_be_a_non_negative_integer(bad_index: object) -> None:
    with pytest.raises(ValueError, match="run_index"):
        _small().prompts_for_run(bad_index)  # type: ignore[arg-type]


# --- built-in workloads ------------------------------------------------------------------------


def test_builtin_workloads_match_their_descriptions() -> None:
    default, seed, batch8 = (BUILTIN_WORKLOADS[name] for name in ("default", "seed", "batch8"))

    assert (default.prompt_set, default.max_new_tokens, default.concurrency) == ("mixed", 256, 1)
    assert default.requests_per_run == 4
    assert (seed.max_new_tokens, seed.requests_per_run, seed.concurrency) == (500, 4, 1)
    assert (batch8.concurrency, batch8.requests_per_run) == (8, 8)
    for kind in PROMPT_KINDS:
        assert {prompt.kind for prompt in BUILTIN_WORKLOADS[kind].prompts} == {kind}
    for workload in BUILTIN_WORKLOADS.values():
        assert (workload.temperature, workload.ignore_eos, workload.flush_cache) == (
            0.0,
            True,
            True,
        )
        assert workload.api == "generate-stream"
        assert workload.source == "built-in"


def test_to_json_describes_the_workload_with_its_hash_and_without_prompt_texts() -> None:
    described = BUILTIN_WORKLOADS["default"].to_json()

    assert described["content_hash"] == BUILTIN_WORKLOADS["default"].content_hash()
    assert described["prompt_kinds"] == list(PROMPT_KINDS)
    assert "prompts" not in described


# --- resolution --------------------------------------------------------------------------------


def test_none_resolves_to_the_default_workload() -> None:
    assert resolve_workload(None) == BUILTIN_WORKLOADS["default"]


def test_a_name_resolves_to_a_builtin() -> None:
    assert resolve_workload("batch8", {}, source=SOURCE) == BUILTIN_WORKLOADS["batch8"]


def test_a_table_in_the_file_overrides_its_base() -> None:
    defined = {"long-code": {"base": "code", "max_new_tokens": 1024, "api": "completions"}}

    workload = resolve_workload("long-code", defined, source=SOURCE)

    assert workload.name == "long-code"
    assert workload.source == f"{SOURCE} [workloads.long-code]"
    assert workload.prompts == BUILTIN_WORKLOADS["code"].prompts
    assert (workload.max_new_tokens, workload.api) == (1024, "completions")
    assert workload.requests_per_run == BUILTIN_WORKLOADS["code"].requests_per_run


def test_a_file_table_takes_precedence_over_a_builtin_of_the_same_name() -> None:
    workload = resolve_workload("seed", {"seed": {"max_new_tokens": 64}}, source=SOURCE)

    assert workload.max_new_tokens == 64
    assert workload.requests_per_run == BUILTIN_WORKLOADS["default"].requests_per_run


def test_a_mapping_overrides_the_default() -> None:
    workload = resolve_workload({"prompt_set": "math", "temperature": 1}, source="marker")

    assert workload.prompts == load_prompt_set("math")
    assert workload.prompt_set == "math"
    assert workload.temperature == 1.0
    assert isinstance(workload.temperature, float)
    assert workload.max_new_tokens == BUILTIN_WORKLOADS["default"].max_new_tokens


def test_inline_prompts_become_custom_prompts() -> None:
    workload = resolve_workload({"prompts": ["Say hello.", "Count to ten."]}, source=SOURCE)

    assert workload.prompts == (Prompt("custom", "Say hello."), Prompt("custom", "Count to ten."))
    assert workload.prompt_set == "inline"


def test_unknown_workload_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_workload("defualt", {"mine": {}}, source=SOURCE)

    message = str(caught.value)
    assert message.startswith(f"{SOURCE}: unknown workload 'defualt' (did you mean 'default'?)")
    assert "mine" in message
    assert "batch8" in message


def test_unknown_key_names_the_key_the_workload_and_the_source() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_workload("fast", {"fast": {"max_new_token": 64}}, source=SOURCE)

    message = str(caught.value)
    assert f"{SOURCE} [workloads.fast]" in message
    assert (
        "workload 'fast': unknown key 'max_new_token' (did you mean 'max_new_tokens'?)" in message
    )
    assert caught.value.source == f"{SOURCE} [workloads.fast]"


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("max_new_tokens", 0, "integer >= 1"),
        ("max_new_tokens", "256", "integer >= 1"),
        ("concurrency", True, "integer >= 1"),
        ("requests_per_run", 2.5, "integer >= 1"),
        ("warmup_requests", -1, "integer >= 0"),
        ("temperature", -0.5, "number >= 0"),
        ("temperature", float("nan"), "number >= 0"),
        ("ignore_eos", "yes", "true or false"),
        ("flush_cache", 1, "true or false"),
        ("api", "chat", ", ".join(APIS)),
        ("prompt_set", "poems", ", ".join(PROMPT_SETS)),
        ("prompts", [], "non-empty list of non-empty strings"),
        ("prompts", "one string", "non-empty list of non-empty strings"),
        ("prompts", ["ok", ""], "non-empty list of non-empty strings"),
        ("base", "sedd", "default, seed, batch8"),
    ],
)
def test_a_bad_value_names_workload_key_value_allowed_values_and_source(
    key: str, value: object, allowed: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_workload("mine", {"mine": {key: value}}, source=SOURCE)

    message = str(caught.value)
    assert message.startswith(f"{SOURCE} [workloads.mine]: workload 'mine': {key} = {value!r}")
    assert allowed in message


def test_concurrency_above_requests_per_run_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"concurrency = 8 .*Set requests_per_run to at least 8"):
        resolve_workload({"concurrency": 8}, source="marker on test_batch")


def test_prompt_set_and_prompts_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="either prompt_set or prompts, not both"):
        resolve_workload({"prompt_set": "code", "prompts": ["x"]}, source=SOURCE)


@pytest.mark.parametrize("spec", [42, ["default"]])
def test_a_spec_that_is_neither_name_nor_table_is_refused(spec: object) -> None:
    with pytest.raises(ConfigError, match="a workload must be a name or a table"):
        resolve_workload(spec, source=SOURCE)  # type: ignore[arg-type]


def test_a_file_entry_that_is_not_a_table_is_refused() -> None:
    with pytest.raises(ConfigError, match="workload 'mine' must be a table of settings"):
        resolve_workload("mine", {"mine": "fast"}, source=SOURCE)  # type: ignore[dict-item]


def test_docs_workloads_md_lists_every_key_with_the_default_workloads_value() -> None:
    """docs/workloads.md's key table: every key once, each default the built-in default's."""
    text = (Path(__file__).parents[2] / "docs" / "workloads.md").read_text(encoding="utf-8")
    table = text[text.index("| key | type | default | meaning |") :].split("\n\n")[0]
    rows = {
        match.group(1): match.group(2)
        for match in re.finditer(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \|", table, re.MULTILINE)
    }
    assert list(rows) == list(WORKLOAD_KEYS)
    default = BUILTIN_WORKLOADS["default"]
    for key in WORKLOAD_KEYS:
        if key in ("base", "prompts"):
            continue
        value = getattr(default, key)
        shown = f'`"{value}"`' if isinstance(value, str) else f"`{str(value).lower()}`"
        assert rows[key].strip() == shown, key
    assert rows["base"].strip() == f'`"{DEFAULT_WORKLOAD}"`'
