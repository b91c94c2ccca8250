"""The series the fleet page plots (``preflight history --fleet --html``), read beside
``read.fleet``'s answers: the fleet's failure rate per UTC day, each degrading node's readings of
its figure against the fleet's band of that figure, and each repeat offender's diagnosed runs.

Plain dicts of numbers, times in seconds since the epoch (UTC), so that the page is rendered
from them without the store. Days and percentiles are worked out here rather than in SQL:
SQLite and PostgreSQL spell "this time's UTC day" differently (a cast to integer truncates in
one and rounds in the other) and share no percentile function, while the statements below are
the plain ones both engines run alike. Every query is bounded by the window, and the plots by
``MAX_TRENDS`` and ``MAX_TIMELINES``.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterator, Sequence

from preflight.judge.figures import FIGURES
from preflight.judge.trends import FAILING
from preflight.store.db import Store
from preflight.store.read import Window

DAY_S = 86400
MAX_TRENDS = 20  # degrading (node, figure) pairs plotted: the worst first, as read.fleet sorts them
MAX_TIMELINES = 50  # repeat offenders whose diagnosed runs are read


def fleet_series(store: Store, window: Window, result: dict) -> dict:
    """``{"since", "until", "days", "figures", "trends", "offenders", "limits"}`` for the fleet
    answers ``result`` (``read.fleet`` over the same window)."""
    since, until = window.since, window.end  # one end for every query below
    degrading = list(result.get("degrading") or ())[:MAX_TRENDS]
    offenders = list(result.get("repeat_offenders") or ())[:MAX_TIMELINES]
    readings = _readings(store, since, until, sorted({d["figure"] for d in degrading}))
    return {
        "since": since,
        "until": until,
        "days": _failure_days(store, since, until),
        "figures": {name: _figure(name, rows) for name, rows in readings.items()},
        "trends": [{"node": d["node"], "figure": d["figure"],
                    "readings": [[t, v] for host, t, v in readings.get(d["figure"], ()) if host == d["node"]]}
                   for d in degrading],
        "offenders": _timelines(store, since, until, offenders),
        "limits": {"trends": MAX_TRENDS, "offenders": MAX_TIMELINES},
    }


def day_of(t: float) -> float:
    """The start of the UTC day that holds ``t``."""
    return math.floor(t / DAY_S) * DAY_S


def _day_starts(first: float, until: float) -> Iterator[float]:
    day = day_of(first)
    while day <= until:
        yield day
        day += DAY_S


def _failure_days(store: Store, since: float, until: float) -> list[dict]:
    """Host-runs and failing host-runs per UTC day, from the first day with a run to the
    window's end (a day without runs is kept, with zero, so a plot shows the gap). One counting
    query per day: the host results of a fleet's frequent healthchecks are far too many to fetch."""
    first = store.rows("SELECT MIN(started) FROM pf_host_results WHERE started >= ? AND started <= ?",
                       (since, until))[0][0]
    if first is None:
        return []
    days = []
    for day in _day_starts(first, until):
        runs, failing = store.rows(
            f"SELECT COUNT(*), SUM(CASE WHEN status IN ({_marks(FAILING)}) THEN 1 ELSE 0 END) FROM pf_host_results "
            "WHERE started >= ? AND started < ? AND started <= ?", (*FAILING, max(day, since), day + DAY_S, until))[0]
        days.append({"start": day, "host_runs": int(runs or 0), "failing": int(failing or 0)})
    return days


def _marks(values: Sequence) -> str:
    """One ``?`` per value: the values themselves are bound, never written into the SQL."""
    return ", ".join("?" for _ in values)


def _readings(store: Store, since: float, until: float,
              figures: Sequence[str]) -> dict[str, list[tuple[str, float, float]]]:
    """figure -> every node's (host, started, value) readings of it in the window, by host and
    time: the band needs the whole fleet's, and the degrading nodes' own are among them."""
    if not figures:
        return {}
    out: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    for figure, host, started, value in store.rows(
            f"SELECT figure, host, started, value FROM pf_figures WHERE started >= ? AND started <= ? "
            f"AND figure IN ({_marks(figures)}) ORDER BY figure, host, started, run_id", (since, until, *figures)):
        out[figure].append((host, float(started), float(value)))
    return dict(out)


def _figure(name: str, rows: Sequence[tuple[str, float, float]]) -> dict:
    known = FIGURES.get(name)
    return {"label": known.label if known else name, "unit": known.unit if known else "",
            "worse": known.worse if known else "lower", "band": band(rows)}


def band(rows: Sequence[tuple[str, float, float]]) -> list[dict]:
    """Per UTC day, the 10th, 50th and 90th percentile over the nodes that read the figure that
    day, each node counted once by its median of the day: a node healthchecked every few minutes
    would otherwise be most of the fleet's band."""
    by_day: dict[float, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for host, started, value in rows:
        by_day[day_of(started)][host].append(value)
    out = []
    for day in sorted(by_day):
        levels = [statistics.median(values) for values in by_day[day].values()]
        p10, p50, p90 = percentiles(levels)
        out.append({"start": day, "p10": p10, "p50": p50, "p90": p90, "nodes": len(levels)})
    return out


def percentiles(values: Sequence[float]) -> tuple[float, float, float]:
    """The 10th, 50th and 90th percentile, interpolated between readings (numpy's default); a
    single reading is all three."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return cuts[0], statistics.median(values), cuts[-1]


def _timelines(store: Store, since: float, until: float, offenders: Sequence[dict]) -> list[dict]:
    """Each repeat offender's diagnosed runs of its cause, as times, in one query for all of them."""
    if not offenders:
        return []
    hosts = sorted({o["node"] for o in offenders})
    runs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for host, cause, started in store.rows(
            f"SELECT DISTINCT host, cause, started FROM pf_diagnoses WHERE started >= ? AND started <= ? "
            f"AND host IN ({_marks(hosts)}) ORDER BY host, cause, started", (since, until, *hosts)):
        runs[(host, cause)].append(float(started))
    return [{"node": o["node"], "cause": o["cause"], "runs": runs.get((o["node"], o["cause"]), [])}
            for o in offenders]
