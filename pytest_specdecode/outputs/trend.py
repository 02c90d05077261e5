"""Trends over the nightly history, with a persistence rule against false alarms.

Each (test, profile, hardware key) becomes one :class:`TrendRow`: its sessions in time order and
the flags raised on them. Every session judges each of the test's checks:

* ``worse``: the check's verdict was FAIL;
* ``better``: a check against the test's own baseline whose ratio CI lies entirely above 1
  (significantly faster than the baseline; against another profile "better" means nothing new);
* ``same``: compared, neither of the above;
* no judgement: not compared that night (no baseline, a mismatch, recording a new baseline).

A change is flagged only when it persists: ``persist`` (default 2) consecutive judged sessions
``worse`` make a *regression* flag, as many ``better`` an *improvement* flag; a single bad night
is shown ("watch") but not flagged. This is the PyTorch HUD rule ("regression" = at least 2
consecutive violations at the end). Sessions without a judgement neither extend nor break a run:
a night whose baseline was being re-recorded says nothing about the trend. A flag whose run reaches
the latest judged session is *ongoing*; the CLI exits 1 when any ongoing regression exists.

A session in which a test errored or crashed (its server did not start or died, its body raised)
has no judgement either, but it is never hidden: it is ``E`` among the recent outcomes, the status
of a test whose latest session errored says so with the cause, and the errors are listed under
the table with their sessions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from tabulate import tabulate

from pytest_specdecode.metrics import METRICS
from pytest_specdecode.outputs.json_report import parse_iso
from pytest_specdecode.outputs.terminal import SIMULATED_BANNER, shorten
from pytest_specdecode.stats.crossnight import CrossNightState, DetectorConfig, Night, detect
from pytest_specdecode.stats.night_series import series_from_history

DETECTED = ("tok_s", "accept_length")
"""The series the trend runs the cross-night detector on (the session also watches every metric
with an own margin; its state is in each history line)."""

OUTCOME_LETTERS = {
    "pass": "P",
    "fail": "F",
    "inconclusive": "I",
    "no baseline": "N",
    "mismatch": "M",
    "recorded": "R",
    "measured": ".",
    "error": "E",
}
LEGEND = (
    "recent: oldest → newest session; P pass, F fail, I inconclusive, N no baseline, "
    "M mismatch, R recorded, . measured only, E error (errored or crashed, no verdict)"
)


@dataclass(frozen=True)
class CheckPoint:
    """One check of one session."""

    metric: str
    reference: str | None
    state: str | None  # "worse" / "better" / "same" / None (not compared)
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    baseline_mean: float | None
    baseline_std: float | None
    threshold: float | None

    @property
    def key(self) -> str:
        return self.metric if self.reference is None else f"{self.metric} vs {self.reference}"


@dataclass(frozen=True)
class TrendPoint:
    """One test in one session."""

    time: datetime
    commit: str | None
    outcome: str
    simulated: bool
    means: Mapping[str, float]
    cis: Mapping[str, tuple[float, float] | None]
    checks: Mapping[str, CheckPoint]
    error: str | None = None  # "ServerCrashedError in call: ..." when the test errored

    @property
    def errored(self) -> bool:
        return self.outcome == "error"

    def check(self, metric: str) -> CheckPoint | None:
        """The check of ``metric`` against the test's own baseline, if there was one."""
        return self.checks.get(metric)


@dataclass(frozen=True)
class TrendFlag:
    """A change that persisted: ``length`` consecutive judged sessions of one check."""

    kind: str  # "regression" / "improvement"
    check: str
    start: datetime
    end: datetime
    length: int
    ongoing: bool
    first_commit: str | None

    def describe(self) -> str:
        span = f"{_day(self.start)} → {_day(self.end)}"
        state = "ongoing" if self.ongoing else "ended"
        commit = f", first at commit {self.first_commit[:12]}" if self.first_commit else ""
        return (
            f"{self.check} {self.kind}: {self.length} sessions in a row, {span}{commit} ({state})"
        )


@dataclass(frozen=True)
class Detection:
    """The cross-night detector's state of one series of a row after its latest night
    (:mod:`pytest_specdecode.stats.crossnight`), with the nights it ran on."""

    metric: str
    state: CrossNightState
    nights: tuple[Night, ...]

    @property
    def start(self) -> datetime | None:
        """When the change the detector found is estimated to have started."""
        index = self.state.start_index
        when = self.nights[index].when if index is not None else None
        return parse_iso(when) if when else None

    def cell(self) -> str:
        """The table's cell: the statistic against its threshold, or why there is none."""
        s = self.state
        if s.status == "warming up":
            return f"{self.metric} not judged yet ({s.nights} night{'s' if s.nights != 1 else ''})"
        head = f"{self.metric} {s.statistic:.1f}/{s.h or 0:.1f}"
        if s.direction is None:
            return head
        start = self.start
        since = f" since {start:%Y-%m-%d}" if start is not None else ""
        word = "ALARM" if s.alarm else "improved"
        return f"{head} {word} {s.shift or 0:+.1%}{since}"


@dataclass(frozen=True)
class TrendRow:
    test_id: str
    profile: str
    hardware_key: str
    points: tuple[TrendPoint, ...]
    flags: tuple[TrendFlag, ...]
    persist: int
    watch: tuple[str, ...] = ()  # checks whose latest judged session is worse, not yet flagged
    detections: tuple[Detection, ...] = ()  # the cross-night detector per series

    @property
    def alarms(self) -> tuple[Detection, ...]:
        """Series whose cross-night detector raised a regression alarm that still stands."""
        return tuple(d for d in self.detections if d.state.alarm)

    @property
    def simulated(self) -> bool:
        return any(p.simulated for p in self.points)

    @property
    def regressed(self) -> bool:
        return bool(self.alarms) or any(f.ongoing and f.kind == "regression" for f in self.flags)

    @property
    def status(self) -> str:
        ongoing = [f for f in self.flags if f.ongoing]
        regressions = [f for f in ongoing if f.kind == "regression"]
        if self.alarms:
            return "REGRESSION across nights: " + ", ".join(
                f"{d.metric} {d.state.shift or 0:+.1%}" for d in self.alarms
            )
        if regressions:
            return "REGRESSION: " + ", ".join(
                f"{f.check} ({f.length} sessions)" for f in regressions
            )
        latest = self.points[-1]
        if latest.errored:
            # the whole cause is listed under the table ("errors:")
            return f"ERROR in the latest session: {shorten(latest.error or 'no cause recorded')}"
        if self.watch:
            return f"watch: {', '.join(self.watch)} worse in the latest session (not yet flagged)"
        if ongoing:
            return "improved: " + ", ".join(f"{f.check} ({f.length} sessions)" for f in ongoing)
        judged = sum(1 for p in self.points if any(c.state for c in p.checks.values()))
        if judged == 0:
            return "not compared"
        if judged < self.persist:
            return "insufficient data"
        ended = [f for f in self.flags if f.kind == "regression"]
        return f"ok (recovered from {len(ended)} regression(s))" if ended else "ok"


@dataclass(frozen=True)
class TrendTable:
    rows: tuple[TrendRow, ...]
    persist: int
    sessions: int
    simulated: bool = False
    hardware_keys: tuple[str, ...] = field(default=())
    errored_sessions: int = 0  # sessions in which at least one test errored or crashed

    @property
    def regressed(self) -> tuple[TrendRow, ...]:
        return tuple(row for row in self.rows if row.regressed)


# --------------------------------------------------------------------------- analysis


def _state(check: Mapping[str, Any]) -> str | None:
    if not check.get("compared") or check.get("verdict") is None:
        return None
    if check["verdict"] == "fail":
        return "worse"
    low = check.get("ci_low")
    if check.get("reference") is None and isinstance(low, int | float) and low > 1.0:
        return "better"
    return "same"


def _point(record: Mapping[str, Any], test: Mapping[str, Any]) -> TrendPoint:
    checks = {}
    for c in test.get("checks", []):
        point = CheckPoint(
            metric=c["metric"],
            reference=c.get("reference"),
            state=_state(c),
            ratio=c.get("ratio"),
            ci_low=c.get("ci_low"),
            ci_high=c.get("ci_high"),
            baseline_mean=c.get("baseline_mean"),
            baseline_std=c.get("baseline_std"),
            threshold=c.get("threshold"),
        )
        checks[point.key] = point
    metrics = test.get("metrics", {})
    cis: dict[str, tuple[float, float] | None] = {}
    for name, m in metrics.items():
        low, high = m.get("ci_low"), m.get("ci_high")
        cis[name] = (low, high) if low is not None and high is not None else None
    error = test.get("error")
    return TrendPoint(
        time=parse_iso(record["time_utc"]),
        commit=record.get("commit"),
        outcome=test["outcome"],
        simulated=bool(test.get("simulated", record.get("simulated", False))),
        means={name: float(m["mean"]) for name, m in metrics.items()},
        cis=cis,
        checks=checks,
        error=(
            f"{error['type']} in {error['phase']}: {error['cause']}"
            if isinstance(error, Mapping)
            else None
        ),
    )


def _flags(
    points: Sequence[TrendPoint], persist: int
) -> tuple[tuple[TrendFlag, ...], tuple[str, ...]]:
    keys = sorted({key for p in points for key in p.checks})
    flags: list[TrendFlag] = []
    watch: list[str] = []
    for key in keys:
        runs: list[list[tuple[TrendPoint, str]]] = []
        for p in points:
            check = p.checks.get(key)
            if check is None or check.state is None:
                continue  # not judged: neither extends nor breaks a run
            if runs and runs[-1][-1][1] == check.state:
                runs[-1].append((p, check.state))
            else:
                runs.append([(p, check.state)])
        for index, run in enumerate(runs):
            kind = {"worse": "regression", "better": "improvement"}.get(run[0][1])
            ongoing = index == len(runs) - 1
            if kind and len(run) >= persist:
                flags.append(
                    TrendFlag(
                        kind,
                        key,
                        run[0][0].time,
                        run[-1][0].time,
                        len(run),
                        ongoing,
                        run[0][0].commit,
                    )
                )
            elif kind == "regression" and ongoing:
                watch.append(key)
    flags.sort(key=lambda f: (f.start, f.check))
    return tuple(flags), tuple(watch)


def recorded_config(
    ordered: Sequence[Mapping[str, Any]], test: Mapping[str, Any], metric: str
) -> DetectorConfig:
    """The detector's settings as the series' latest judged night recorded them (its
    ``crossnight`` state's ``config``; lines written before it existed keep only the reference
    length), so that the trend table and the dashboard judge with what the sessions used, not
    with a command's defaults; the defaults where no night recorded any."""
    info = METRICS.get(metric)
    config = DetectorConfig(higher_is_better=info.higher_is_better if info is not None else True)
    series = _series_key(test)
    for record in reversed(ordered):
        for entry in record.get("tests") or ():
            if not isinstance(entry, Mapping) or _series_key(entry) != series:
                continue
            state = (entry.get("crossnight") or {}).get(metric)
            if isinstance(state, Mapping):
                recorded = state.get("config")
                if not isinstance(recorded, Mapping):
                    recorded = {"reference_nights": state.get("reference_nights")}
                return config.with_recorded(recorded)
    return config


def _series_key(test: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(test.get(k) for k in ("test_id", "hardware_key", "fingerprint", "workload_hash"))


def _detections(
    ordered: Sequence[Mapping[str, Any]], test: Mapping[str, Any], reference_nights: int | None
) -> tuple[Detection, ...]:
    """The detector over the history of ``test`` (its latest line's test id, hardware key,
    fingerprint and workload: a new configuration is a new series) for each metric it has,
    with the settings its nights recorded (``reference_nights`` overrides theirs)."""
    out = []
    for metric in DETECTED:
        if metric not in (test.get("metrics") or {}):
            continue
        nights = series_from_history(
            ordered,
            test_id=str(test["test_id"]),
            hardware_key=str(test["hardware_key"]),
            fingerprint=str(test.get("fingerprint")),
            workload_hash=str(test.get("workload_hash")),
            metric=metric,
        )
        config = recorded_config(ordered, test, metric)
        if reference_nights is not None:
            config = replace(config, reference_nights=reference_nights)
        out.append(Detection(metric, detect(nights, config), tuple(nights)))
    return tuple(out)


def trend(
    records: Iterable[Mapping[str, Any]],
    *,
    persist: int = 2,
    reference_nights: int | None = None,
) -> TrendTable:
    """Rows per (test, profile, hardware key) with flags where a change persisted for
    ``persist`` consecutive judged sessions (see the module docstring), and the cross-night
    detector's state with the settings the sessions recorded (``reference_nights``: instead of
    theirs)."""
    if isinstance(persist, bool) or not isinstance(persist, int) or persist < 1:
        raise ValueError(f"persist={persist!r}: it must be a whole number of sessions, 1 or more")
    ordered = sorted(records, key=lambda r: parse_iso(r["time_utc"]))
    grouped: dict[tuple[str, str, str], list[TrendPoint]] = {}
    latest: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for record in ordered:
        for test in record.get("tests", []):
            key = (test["test_id"], test["profile"], test["hardware_key"])
            grouped.setdefault(key, []).append(_point(record, test))
            if test.get("metrics"):
                latest[key] = test
    rows = []
    for key, points in grouped.items():
        test_id, profile, hw = key
        flags, watch = _flags(points, persist)
        found = _detections(ordered, latest[key], reference_nights) if key in latest else ()
        rows.append(TrendRow(test_id, profile, hw, tuple(points), flags, persist, watch, found))
    rows.sort(key=lambda r: r.hardware_key)  # stable: tests keep the order they first ran in
    return TrendTable(
        rows=tuple(rows),
        persist=persist,
        sessions=sum(1 for r in ordered if not r.get("acknowledgements")),
        simulated=any(r.simulated for r in rows),
        hardware_keys=tuple(sorted({r.hardware_key for r in rows})),
        errored_sessions=sum(
            1 for r in ordered if any(t.get("outcome") == "error" for t in r.get("tests", []))
        ),
    )


def select(
    records: Sequence[Mapping[str, Any]],
    *,
    profiles: Sequence[str] = (),
    last: int | None = None,
) -> list[dict[str, Any]]:
    """The ``last`` sessions (by time) of ``records``, keeping only tests of ``profiles``; the
    ``acknowledge`` lines among them are kept (they are not sessions and do not count)."""
    ordered = sorted(records, key=lambda r: parse_iso(r["time_utc"]))
    if last is not None:
        sessions = [r for r in ordered if not r.get("acknowledgements")]
        kept = sessions[-last:] if last > 0 else []
        first = parse_iso(kept[0]["time_utc"]) if kept else None
        ordered = [r for r in ordered if any(r is k for k in kept) or _acknowledged_after(r, first)]
    out = []
    for record in ordered:
        copy = dict(record)
        if profiles:
            copy["tests"] = [t for t in record.get("tests", []) if t["profile"] in profiles]
        out.append(copy)
    return out


def _acknowledged_after(record: Mapping[str, Any], first: datetime | None) -> bool:
    """An ``acknowledge`` line at or after ``first`` (the first session kept)."""
    if not record.get("acknowledgements") or first is None:
        return False
    return parse_iso(record["time_utc"]) >= first


# --------------------------------------------------------------------------- table


def _day(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M")


def _short(test_id: str) -> str:
    return test_id.split("::", 1)[-1]


def _mean_ci(point: TrendPoint, metric: str, digits: int) -> str:
    if metric not in point.means:
        return "-"
    mean = point.means[metric]
    ci = point.cis.get(metric)
    return (
        f"{mean:.{digits}f}"
        if ci is None
        else f"{mean:.{digits}f} ± {(ci[1] - ci[0]) / 2:.{digits}f}"
    )


def _vs_baseline(point: TrendPoint) -> str:
    check = point.check("tok_s")
    if check is None or check.ratio is None or check.ci_low is None or check.ci_high is None:
        return "-"
    return f"{check.ratio - 1:+.1%} [{check.ci_low - 1:+.1%}, {check.ci_high - 1:+.1%}]"


def format_table(table: TrendTable, *, recent: int = 14) -> list[str]:
    """The trend table as lines: one row per test, latest values, recent outcomes, status."""
    if not table.rows:
        return ["no measured tests in the selected history"]
    show_hw = len(table.hardware_keys) > 1
    rows = []
    for row in table.rows:
        latest = row.points[-1]
        letters = "".join(OUTCOME_LETTERS.get(p.outcome, "?") for p in row.points[-recent:])
        profile = row.profile + (" (simulated)" if row.simulated else "")
        cells = [_short(row.test_id), profile]
        if show_hw:
            cells.append(row.hardware_key)
        cells += [
            str(len(row.points)),
            letters,
            _mean_ci(latest, "tok_s", 1),
            _vs_baseline(latest),
            _mean_ci(latest, "accept_length", 2),
            "; ".join(d.cell() for d in row.detections) or "-",
            row.status,
        ]
        rows.append(cells)
    headers = ["test", "profile", *(["hardware"] if show_hw else [])]
    headers += ["sessions", "recent", "tok/s latest", "vs baseline", "accept len"]
    headers += ["across nights (scan/h)", "status"]
    lines = []
    if table.simulated:
        lines.append(SIMULATED_BANNER)
    lines += tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True).splitlines()
    lines.append(LEGEND)
    errored = (
        f", {table.errored_sessions} with tests that errored or crashed"
        if table.errored_sessions
        else ""
    )
    lines.append(
        f"{table.sessions} session(s){errored}; a change is flagged after {table.persist} "
        "consecutive judged sessions"
    )
    alarms = [(row, d) for row in table.rows for d in row.detections if d.state.direction]
    if alarms:
        lines.append("")
        lines.append("across nights:")
        lines += [
            f"  {_short(row.test_id)} [{row.profile}]: {d.metric}: {d.state.describe(d.nights)}"
            for row, d in alarms
        ]
    flags = [(row, flag) for row in table.rows for flag in row.flags]
    if flags:
        lines.append("")
        lines.append("flags:")
        lines += [
            f"  {_short(row.test_id)} [{row.profile}]: {flag.describe()}" for row, flag in flags
        ]
    # The errors of the sessions the "recent" column shows, each with its cause.
    errors = [(row, point) for row in table.rows for point in row.points[-recent:] if point.errored]
    if errors:
        lines.append("")
        lines.append("errors:")
        lines += [
            f"  {_short(row.test_id)} [{row.profile}]: {_day(point.time)}: "
            f"{point.error or 'no cause recorded'}"
            for row, point in errors
        ]
    return lines
