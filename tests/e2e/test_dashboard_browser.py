"""The dashboard in a real browser: Debian's headless Chromium opens the generated site from disk
and the checks read the page it rendered (``--dump-dom`` after the script ran), not the HTML
that was written: the charts' SVG paths the script drew, a filter applied through the select's
own change handler, and the change the detector found.

The 40 nights are a real history: ``benchmarks/bench_nightly.py --e2e 40 --e2e-change-night 20
--e2e-reference 15 --e2e-history tests/e2e/data/sim-40-nights.jsonl`` ran them through pytest
and the simulated server, 10 % slower from night 20 (``SPECDECODE_SIM_SLOWDOWN``); about five
minutes, so they are committed. The short run below makes its own history, through pytest, here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Project

HISTORY_40 = Path(__file__).parent / "data" / "sim-40-nights.jsonl"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def rendered(page: Path, tmp_path: Path, fragment: str = "") -> str:
    """The DOM of ``page`` after Chromium ran its script (virtual time lets it finish)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            "no Chromium: install Debian's (apt-get install -y chromium), as scripts/test does"
        )
    done = subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--virtual-time-budget=10000",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom",
         page.as_uri() + fragment],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'data-rendered="1"' in done.stdout, "the page's script did not finish"
    return done.stdout


def chart(dom: str, metric: str) -> str:
    found = re.search(rf'<svg[^>]*data-metric="{metric}"[^>]*>(.*?)</svg>', dom, re.S)
    assert found, f"no {metric} chart was drawn"
    return found.group(1)


def points(path_d: str) -> int:
    return len(re.findall(r"[ML]-?\d", path_d))


def path_d(svg: str, cls: str) -> str:
    found = re.search(rf'<path class="{cls}"[^>]* d="([^"]*)"', svg)
    assert found, f"no path of class {cls}"
    return found.group(1)


def test_forty_simulated_nights_with_a_drop_on_night_20_render_with_the_change_marked(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pytest_specdecode", "report", str(HISTORY_40),
         "--reference-nights", "15", "--html", str(site)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # the drop: a regression across nights
    assert "dashboard: " in done.stdout

    overview = rendered(site / "index.html", tmp_path)
    assert "SIMULATED: these figures come from" in overview
    row = re.search(r'<tr class="series alarm".*?</tr>', overview, re.S)
    assert row, "the series with the alarm is not marked on the overview"
    assert "ALARM" in row.group(0)
    spark = re.search(r'<svg class="spark".*?<path class="mean" d="([^"]*)"', row.group(0), re.S)
    assert spark
    assert points(spark.group(1)) == 40

    (page,) = (site / "tests").glob("*.html")
    dom = rendered(page, tmp_path)
    tok_s = chart(dom, "tok_s")
    assert points(path_d(tok_s, "mean")) == 40  # every night's launch mean
    assert path_d(tok_s, "whisker").count("V") == 40  # and its interval
    assert points(path_d(tok_s, "band")) >= 4
    assert points(path_d(tok_s, "threshold")) == 40
    assert points(path_d(chart(dom, "accept_length"), "mean")) == 40
    change = re.search(r'<path class="m-change" data-x="(\d+)"', tok_s)
    assert change, "the drop is not marked on the tok/s chart"
    night = int(change.group(1)) + 1
    assert abs(night - 20) <= 1, night  # the detector's estimate of the first slower night
    section = re.search(r'<div class="change" data-x="\d+">(.*?)</div>', dom, re.S)
    assert section
    assert f"night {night} " in section.group(1)
    if night == 20:  # what changed that night: the slowed simulator's environment variable
        assert "environment SPECDECODE_SIM_SLOWDOWN: (none) → set" in section.group(1)
    assert "(simulated)" in dom  # the charts' captions

    # a night's runs on demand: #runs=I opens that night's <details>, whose toggle fills it
    last = dom.count("<details data-i=") - 1
    opened = rendered(page, tmp_path, f"#runs={last}")
    runs = re.search(rf'<details data-i="{last}" open="">(.*?)</details>', opened, re.S)
    assert runs, "the night's details did not open"
    assert runs.group(1).count("<tr><td>") == 10  # its 10 runs, each with tok/s and accept length


TESTS = """
import pytest

@pytest.mark.specdecode("eagle3", workload="fast", tok_s=-0.5)
def test_eagle3():
    pass

@pytest.mark.specdecode("nospec", workload="fast", tok_s=-0.5)
def test_nospec():
    pass
"""


def test_a_nightly_session_writes_the_dashboard_and_a_filter_changes_what_is_shown(
    project: Project, tmp_path: Path
) -> None:
    project.tests(TESTS)
    project.run("--update-baselines", "--specdecode-baseline-runs", "3",
                "--specdecode-force-baseline").assert_outcomes(passed=2)  # fmt: skip
    history, site = project.path / "history.jsonl", project.path / "site"
    for _ in range(2):
        result = project.run("--specdecode-runs", "3", "--specdecode-max-runs", "3",
                             "--specdecode-on-inconclusive=warn", f"--specdecode-history={history}",
                             f"--specdecode-html={site}")  # fmt: skip
        result.assert_outcomes(passed=2)
        assert f"dashboard: {site / 'index.html'}" in result.stdout.str()

    everything = rendered(site / "index.html", tmp_path)
    assert "showing 2 of 2 series" in everything
    assert everything.count('<tr class="series"') == 2

    # index.html#profile=eagle3 sets the select and fires its change event: the user's path
    filtered = rendered(site / "index.html", tmp_path, "#profile=eagle3")
    assert "showing 1 of 2 series" in filtered
    rows = re.findall(r'<tr class="series"[^>]*>', filtered)
    shown = [r for r in rows if "hidden" not in r]
    assert len(shown) == 1
    assert 'data-profile="eagle3"' in shown[0]
    by_algorithm = rendered(site / "index.html", tmp_path, "#algorithm=none")
    assert "showing 1 of 2 series" in by_algorithm
    shown = [r for r in re.findall(r'<tr class="series"[^>]*>', by_algorithm) if "hidden" not in r]
    assert len(shown) == 1
    assert 'data-profile="nospec"' in shown[0]

    for page in (site / "tests").glob("*.html"):
        dom = rendered(page, tmp_path)
        assert points(path_d(chart(dom, "tok_s"), "mean")) == 2
        assert "simulated" in dom
