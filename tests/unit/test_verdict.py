"""The verdict texts a user reads: what failed comes first and is not undercut, confidence levels
never round to 100%, and every p-value says what it is (#13, item 6)."""

from __future__ import annotations

import re

import pytest

from pytest_specdecode.result import Outcome
from pytest_specdecode.stats.comparison import Verdict, compare, confidence_text
from pytest_specdecode.verdict import (
    BaselineRef,
    Check,
    Threshold,
    evaluate,
    message,
    outcome_of,
)

# Deterministic per-run values: a baseline of 20 runs at about 2% CV, and current runs around it.
BASE_TOK_S = [100 * (1 + 0.03 * ((i * 7) % 11 - 5) / 5) for i in range(20)]
BASE_ACCEPT = [2.0 * (1 + 0.06 * ((i * 7) % 11 - 5) / 5) for i in range(20)]
SLOW_TOK_S = [85 * (1 + 0.01 * ((i * 3) % 5 - 2) / 2) for i in range(5)]  # 15% slower
NOISY_ACCEPT = [1.98 * (1 + 0.06 * ((i * 3) % 5 - 2) / 2) for i in range(5)]  # within the noise

P_VALUE = re.compile(r"p\((pass|fail)\)=[0-9.e+-]+")


def _slow_tok_s_beside(
    accept: list[float], alpha_no_change: float | None = None
) -> tuple[Check, ...]:
    """A tok/s 15% under its baseline (a FAIL at -3%) beside an accept-length check at -1%."""
    ref = BaselineRef("its own baseline", {"tok_s": BASE_TOK_S, "accept_length": BASE_ACCEPT})
    return evaluate(
        [Threshold("tok_s", -0.03), Threshold("accept_length", -0.01)],
        {"tok_s": SLOW_TOK_S, "accept_length": accept},
        {None: ref},
        alpha=0.15,
        method="welch-log",
        alpha_no_change=alpha_no_change,
    )


def _fail_beside_an_undecided_check() -> tuple[str, Outcome]:
    checks = _slow_tok_s_beside(NOISY_ACCEPT)
    # The accept-length check alone would say that n=5 cannot decide it.
    assert checks[1].comparison is not None
    assert any("cannot be decided" in w for w in checks[1].comparison.warnings)
    outcome = outcome_of(checks)
    return message(checks, outcome), outcome


def test_a_decisive_fail_leads_and_is_not_undercut_by_an_undecided_check() -> None:
    text, outcome = _fail_beside_an_undecided_check()
    assert outcome is Outcome.FAIL
    first, second = text.split("\n\n")
    assert first.startswith("output tok/s vs its own baseline: FAIL.")
    assert second.startswith("accept length vs its own baseline: INCONCLUSIVE as well")
    assert text.endswith("it does not change the FAIL above.")
    for undercut in ("cannot support its claim", "cannot be decided", "this test cannot"):
        assert undercut not in text, text


def test_an_undecided_check_held_back_by_the_no_change_guard_says_so_in_its_one_line() -> None:
    """Beside a FAIL, a check whose interval cleared its margin but not "no change" is one line;
    without the guard's reason, its bounds under the margin read as a FAIL called INCONCLUSIVE
    for nothing."""
    held = [1.90 * (1 + 0.06 * ((i * 3) % 5 - 2) / 2) for i in range(5)]  # 5% under, noisy
    checks = _slow_tok_s_beside(held, alpha_no_change=0.01)
    assert [c.verdict for c in checks] == [Verdict.FAIL, Verdict.INCONCLUSIVE]
    held_back = checks[1].comparison
    assert held_back is not None
    assert held_back.no_change_high is not None
    assert held_back.ci_high < 0.99 <= 1.0 <= held_back.no_change_high
    line = message(checks, outcome_of(checks)).split("\n\n")[1]
    assert line == (
        "accept length vs its own baseline: INCONCLUSIVE as well (ratio 0.951, one-sided 85% "
        "bounds [0.926, 0.976], no worse than 0.990 required, n=5; not distinguishable from no "
        f"change at 99%: upper bound {held_back.no_change_high:.3f}); it does not change the "
        "FAIL above."
    )
    # An undecided check the guard did not touch keeps the plain line.
    _, plain = _fail_beside_an_undecided_check()[0].split("\n\n")
    assert "no change" not in plain


def test_an_inconclusive_check_still_says_what_n_cannot_decide() -> None:
    ref = BaselineRef("its own baseline", {"accept_length": BASE_ACCEPT})
    checks = evaluate(
        [Threshold("accept_length", -0.01)],
        {"accept_length": NOISY_ACCEPT},
        {None: ref},
        alpha=0.15,
        method="welch-log",
    )
    text = message(checks, outcome_of(checks))
    assert "INCONCLUSIVE" in text
    assert "this check cannot be decided either way at n=5" in text


@pytest.mark.parametrize(
    ("fraction", "text"),
    [
        (0.85, "85%"),
        (0.994, "99.4%"),
        (1 - 0.0004, "99.96%"),
        (1 - 0.000123, "99.99%"),
        (1 - 1e-15, ">99.9999999999%"),
    ],
)
def test_confidence_levels_never_round_to_100(fraction: float, text: str) -> None:
    assert confidence_text(fraction) == text


def test_a_small_per_look_alpha_is_not_printed_as_100_percent_bounds() -> None:
    current = [95 * (1 + 0.03 * k) for k in (-1, 0, 1)]
    strict = compare(current, BASE_TOK_S, margin=-0.02, alpha=0.0004)
    assert "two one-sided 99.96% bounds" in strict.describe()
    # The no-change guard's level (spent across the looks, so small) is printed the same way.
    guarded = compare(current, BASE_TOK_S, margin=-0.02, alpha=0.15, alpha_no_change=0.0004)
    (guard,) = [w for w in guarded.warnings if "no change" in w]
    assert "at 85% but not distinguishable from no change at 99.96%" in guard
    for text in (strict.describe(), guard):
        assert not re.search(r"\b100(\.0)?%", text), text


def test_every_p_value_is_labelled_with_what_it_is() -> None:
    text, _ = _fail_beside_an_undecided_check()
    ref = BaselineRef("its own baseline", {"accept_length": BASE_ACCEPT})
    inconclusive = evaluate(
        [Threshold("accept_length", -0.01)],
        {"accept_length": NOISY_ACCEPT},
        {None: ref},
        alpha=0.15,
        method="welch-log",
    )
    comparison = compare(SLOW_TOK_S, BASE_TOK_S, margin=-0.03)
    texts = [text, message(inconclusive, outcome_of(inconclusive)), comparison.describe()]
    found = 0
    for paragraph in texts:
        for match in P_VALUE.finditer(paragraph):
            found += 1
            after = paragraph[match.end() : match.end() + 120]
            labelled = after.startswith(
                (" (the chance that a build exactly", " (the chances that a build exactly")
            ) or (after.startswith(" and p(fail)=") and "(the chances that a build" in after)
            assert labelled, paragraph
        # What the verdict needs of it is said beside it.
        if "p(" in paragraph:
            assert "needs" in paragraph
    assert found >= 4


# --- the no-change guard of a claim against another profile's baseline (#27, item 2) -----------


def _runs(mean: float, n: int, cv: float = 0.025) -> list[float]:
    """``n`` deterministic per-run values around ``mean`` (a spread of about 0.6 x ``cv``)."""
    return [mean * (1 + cv * ((i * 7) % 11 - 5) / 5) for i in range(n)]


NOSPEC = _runs(100.0, 60)  # the reference profile's baseline
CLAIM = [Threshold("tok_s", +0.05, "nospec")]


def _claim_checks(current: list[float], own: list[float] | None, **options: object):  # type: ignore[no-untyped-def]
    refs = {
        None: BaselineRef("its own baseline", {"tok_s": own} if own else None, problem="none"),
        "nospec": BaselineRef("nospec's baseline", {"tok_s": NOSPEC}),
    }
    settings: dict[str, object] = {"alpha": 0.15, "method": "welch-log", "alpha_no_change": 0.01}
    settings.update(options)
    return evaluate(CLAIM, {"tok_s": current}, refs, **settings)  # type: ignore[arg-type]


def test_a_claim_missed_by_an_unchanged_build_is_inconclusive_not_a_fail() -> None:
    """The own baseline met +5% (105.5 over 100); tonight's 10 runs read 1.2% under it: below
    the line at 85%, a FAIL before, but nothing changed: the guard withholds it."""
    current, own = _runs(104.2, 10), _runs(105.5, 60)
    unguarded = _claim_checks(current, own, alpha_no_change=None)
    assert unguarded[0].verdict is Verdict.FAIL  # what the margin alone says

    (check,) = _claim_checks(current, own)
    assert check.verdict is Verdict.INCONCLUSIVE
    assert check.comparison is not None
    assert check.comparison.alpha_no_change == 0.01
    text = message((check,), outcome_of((check,)))
    assert "not distinguishable from its own baseline at 99%" in text
    assert "which met the claim when recorded (1.055 of nospec's baseline)" in text
    assert "not called a FAIL" in text


def test_a_claim_missed_by_a_build_worse_than_its_own_baseline_still_fails() -> None:
    (check,) = _claim_checks(_runs(101.0, 10), _runs(105.5, 60))  # 4.3% under its own
    assert check.verdict is Verdict.FAIL
    assert check.comparison is not None
    assert check.comparison.alpha_no_change == 0.01


@pytest.mark.parametrize(
    "own", [_runs(104.0, 60), None], ids=["own-baseline-missed-the-claim", "no-own-baseline"]
)
def test_a_claim_that_never_held_or_has_no_own_baseline_is_not_guarded(
    own: list[float] | None,
) -> None:
    (check,) = _claim_checks(_runs(104.2, 10), own)
    assert check.verdict is Verdict.FAIL
    assert check.comparison is not None
    assert check.comparison.alpha_no_change is None
