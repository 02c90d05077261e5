"""What the README and the docs say about the settings, kept true by construction (#25 item 6):
the options table is generated from ``settings.OPTIONS``, every ``PYTEST_SPECDECODE_*`` variable
the package reads is known to the misspelling check, and every example SGLang image is of a
supported release."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from pytest_specdecode import sglang_releases
from pytest_specdecode.settings import (
    OPTIONS,
    OTHER_ENV_VARS,
    options_table,
    unknown_env_warnings,
)

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "python scripts/gen-options-table.py"


def generator() -> ModuleType:
    script = REPO / "scripts" / "gen-options-table.py"
    spec = importlib.util.spec_from_file_location("gen_options", script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_table(readme: str, gen: ModuleType) -> str:
    assert gen.START in readme, f"README.md lost its marker {gen.START}"
    assert gen.END in readme, f"README.md lost its marker {gen.END}"
    return readme.split(gen.START, 1)[1].split(gen.END, 1)[0].lstrip("\n")


def test_the_readme_options_table_is_the_one_generated_from_settings() -> None:
    gen = generator()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme_table(readme, gen) == options_table(), (
        "README.md's options table differs from OPTIONS in pytest_specdecode/settings/options.py: "
        f"run `{REGENERATE}` and commit README.md"
    )


def test_the_generator_replaces_only_the_table_between_its_markers() -> None:
    gen = generator()
    drifted = f"# intro\n{gen.START}\n| option | stale |\n{gen.END}\n## after\n"
    fixed = gen.splice(drifted, options_table())
    assert fixed == f"# intro\n{gen.START}\n{options_table()}{gen.END}\n## after\n"
    assert readme_table(fixed, gen) == options_table()
    with pytest.raises(SystemExit, match=r"no .* section"):
        gen.splice("# a README without the markers\n", options_table())


def test_options_without_an_ini_key_or_variable_say_so_in_the_table() -> None:
    lines = options_table().splitlines()[2:]
    rows = {line.split(" | ")[0].strip("| `").split()[0]: line for line in lines}
    assert len(rows) == len(OPTIONS)
    for option in OPTIONS:
        cells = [cell.strip() for cell in rows[option.flag].strip("|").split(" | ")]
        assert cells[1] == (f"`{option.ini_key}`" if option.ini else "—"), option.name
        assert cells[2] == (f"`{option.env_var}`" if option.env else "—"), option.name
    # The three the README used to give an ini key that does not exist.
    for flag in ("--server-host", "--update-baselines", "--specdecode-force-baseline"):
        assert rows[flag].split(" | ")[1] == "—"


def test_a_pipe_in_a_metavar_does_not_split_its_cell() -> None:
    (row,) = [line for line in options_table().splitlines() if "--specdecode-machine-load" in line]
    assert "measure\\|off\\|LOAD" in row
    assert len(re.split(r"(?<!\\)\|", row)) == 7  # five cells between six unescaped pipes


def test_every_pytest_specdecode_variable_the_package_reads_is_known() -> None:
    known = {o.env_var for o in OPTIONS if o.env} | set(OTHER_ENV_VARS)
    written = set()
    for path in (REPO / "pytest_specdecode").rglob("*.py"):
        written |= set(re.findall(r"PYTEST_SPECDECODE_[A-Z][A-Z_]*[A-Z]", path.read_text()))
    assert written, "the scan found no variable at all"
    assert written - known == set(), "add them to settings.OTHER_ENV_VARS"


def test_a_misspelled_variable_is_named_with_the_closest_known_one() -> None:
    env = {
        "PYTEST_SPECDECODE_MAXRUNS": "12",
        "PYTEST_SPECDECODE_ON_MISSING_BASELINES": "fail",
        "PYTEST_SPECDECODE_RUNS": "6",  # known: no warning
        "PYTEST_SPECDECODE_CALIBRATION_CACHE": "/tmp/c",  # read outside OPTIONS: no warning
        "PYTEST_SPECDECODE_XYZZY": "1",
        "SPECDECODE_SIM_SLOWDOWN": "1.1",  # another family: not ours to judge
    }
    maxruns, missing, xyzzy = unknown_env_warnings(env)
    assert "PYTEST_SPECDECODE_MAXRUNS" in maxruns
    assert "did you mean PYTEST_SPECDECODE_MAX_RUNS?" in maxruns
    assert "did you mean PYTEST_SPECDECODE_ON_MISSING_BASELINE?" in missing
    assert "PYTEST_SPECDECODE_XYZZY is not a pytest-specdecode setting" in xyzzy
    assert "did you mean" not in xyzzy  # no name is close; the shared prefix does not count


def test_a_variable_of_a_flag_only_option_says_to_pass_the_flag() -> None:
    (warning,) = unknown_env_warnings({"PYTEST_SPECDECODE_UPDATE_BASELINES": "1"})
    assert "--update-baselines has no environment variable" in warning


def test_every_example_sglang_image_is_a_supported_release() -> None:
    places = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "perf_tests").glob("*")]
    places += list((REPO / "pytest_specdecode").rglob("*.py"))
    found = {}
    for path in places:
        if path.is_file():
            for tag in re.findall(r"lmsysorg/sglang:v([0-9][0-9a-z.]*)", path.read_text()):
                found[tag] = path
    assert found, "the scan found no example image"
    for tag, path in found.items():
        try:
            sglang_releases.normalize(tag.rstrip("."))
        except ValueError as exc:
            pytest.fail(f"{path.relative_to(REPO)}: lmsysorg/sglang:v{tag}: {exc}")
