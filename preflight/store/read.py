"""The store's answers: a node's timeline and the fleet's questions, in the JSON shapes the
``history`` command prints (a contract: docs/store.md). SQL fetches the window's rows; the rules
themselves are ``trends.py``'s pure functions."""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

from preflight.judge import trends
from preflight.judge.figures import FIGURES
from preflight.model import HostHistory, PastRun
from preflight.store import precision, seek
from preflight.store.db import Store, StoreError
from preflight.store.rows import iso


class UnknownNode(StoreError):
    """A node the store has never recorded."""


@dataclass(frozen=True)
class Window:
    since: float  # seconds since the epoch
    until: float | None = None

    @property
    def end(self) -> float:
        return time.time() if self.until is None else self.until

    def frozen(self) -> Window:
        return self if self.until is not None else Window(self.since, time.time())


def up_to_latest(store: Store, since: float) -> Window:
    """The window from ``since`` to now, or to the latest time the store holds when that is
    later: a run from a writer whose clock is ahead is shown (and acted on by the lifecycle)
    now, not once the reader's clock has caught up. The runs' maximum is read from its index's
    end; the events (drains, resumes, the lifecycle's steps) are few beside the runs."""
    latest = precision.latest(store)
    return Window(since, time.time() if latest is None else max(time.time(), latest))


def nodes_like(store: Store, node: str, limit: int = 5) -> list[str]:
    """Recorded nodes whose names share the longest prefix with ``node`` (case aside), for a 'did
    you mean': the names sharing the longest prefix with a name are its neighbours in sorted
    order, so one statement reads the ``limit`` recorded names on either side of ``node`` (and of
    its lower case), each by one index seek, whatever the name's length or the store's size."""
    probes = list(dict.fromkeys((node, node.lower())))
    steps, params = [], []
    for i, probe in enumerate(probes):
        # Each step finds the next distinct name with MIN/MAX over the (host, started) index: a
        # seek, where DISTINCT would walk every run of a node with 100,000 of them.
        steps += [f"b{i}(host, n) AS (SELECT MAX(host), 1 FROM pf_host_results WHERE host < ? UNION ALL "
                  f"SELECT (SELECT MAX(h.host) FROM pf_host_results h WHERE h.host < b{i}.host), n + 1 FROM b{i} "
                  f"WHERE b{i}.host IS NOT NULL AND n < ?)",
                  f"a{i}(host, n) AS (SELECT MIN(host), 1 FROM pf_host_results WHERE host > ? UNION ALL "
                  f"SELECT (SELECT MIN(h.host) FROM pf_host_results h WHERE h.host > a{i}.host), n + 1 FROM a{i} "
                  f"WHERE a{i}.host IS NOT NULL AND n < ?)"]
        params += [probe, limit, probe, limit]
    union = " UNION ".join(f"SELECT host FROM {side}{i} WHERE host IS NOT NULL"
                           for i in range(len(probes)) for side in "ba")
    # gpu07 for gpu007: the same name with its number written to another width is not a neighbour
    # in sorted order (gpu060...gpu064 are, in a 64-node fleet), so each such spelling is looked up
    # too, by one seek each, in the same statement, and comes first.
    spellings = list(dict.fromkeys(name for probe in probes for name in _number_spellings(probe) if name != node))
    union += "".join(" UNION SELECT host FROM (SELECT (SELECT h.host FROM pf_host_results h WHERE h.host = ? "
                     "LIMIT 1) AS host) s WHERE host IS NOT NULL" for _ in spellings)
    found = [r[0] for r in store.rows(f"WITH RECURSIVE {', '.join(steps)} {union}", [*params, *spellings])]
    key = node.casefold()
    same_number = sorted(name for name in found if name in spellings)
    shared = {name: _common_prefix(key, name.casefold()) for name in found if name not in spellings}
    best = max(shared.values(), default=0)
    return (same_number + sorted(name for name, n in shared.items() if n == best and best))[:limit]


_NUMBER = re.compile(r"\d+")


def _number_spellings(node: str, longest: int = 12) -> list[str]:
    """``node`` with its last number written without leading zeros and zero-padded to up to two
    digits more than typed (gpu07: gpu7, gpu007, gpu0007), itself left out."""
    numbers = list(_NUMBER.finditer(node))
    if not numbers or len(numbers[-1].group()) > longest:
        return []
    m = numbers[-1]
    digits = m.group().lstrip("0") or "0"
    widths = range(len(digits), max(len(m.group()), len(digits)) + 3)
    spelled = (node[:m.start()] + digits.zfill(w) + node[m.end():] for w in widths)
    return [name for name in dict.fromkeys(spelled) if name != node]


def isos(times: list[float]) -> list[str]:
    """``[rows.iso(t) for t in times]``, three times faster: a node's year of five-minute
    healthchecks is 100,000 of them, and ``datetime`` builds an object for each. The day's
    date is made once per day; the second is ``datetime.fromtimestamp``'s: the fraction rounded
    half-even to microseconds (which may carry into the next second), then cut."""
    days: dict[int, str] = {}
    out = []
    for t in times:
        whole = math.floor(t)
        if round((t - whole) * 1e6) >= 1_000_000:
            whole += 1
        day, second = divmod(whole, 86400)
        date = days.get(day) or days.setdefault(day, iso(day * 86400.0)[:10])
        hour, second = divmod(second, 3600)
        out.append(f"{date}T{hour:02d}:{second // 60:02d}:{second % 60:02d}+00:00")
    return out


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def node_history(store: Store, node: str, window: Window, last: int | None = None) -> dict:
    """``{"node", "runs": [{"run_id", "kind", "started", "status", "causes", "figures",
    "failed_checks"}], "events": [...]}``, oldest first. ``last``: only the latest ``last`` runs
    and events, and then ``"runs_total"``, ``"failing_total"`` and ``"events_total"``, counted by
    the database: a node healthchecked every five minutes has 100,000 runs a year."""
    window = window.frozen()
    params = (node, window.since, window.end)
    newest = "" if last is None else " DESC"
    bound = "" if last is None else f" LIMIT {int(last)}"
    runs = store.rows("SELECT h.run_id, r.kind, h.started, h.status, h.reachable, h.profile, r.launcher "
                      "FROM pf_host_results h "
                      "JOIN pf_runs r ON r.run_id = h.run_id WHERE h.host = ? AND h.started >= ? AND h.started <= ? "
                      f"ORDER BY h.started{newest}, r.recorded{newest}, h.run_id{newest}{bound}", params)
    events = store.rows("SELECT at, kind, actor, reason, run_id, detail FROM pf_events WHERE node = ? AND at >= ? "
                        f"AND at <= ? ORDER BY at{newest}, id{newest}{bound}", params)
    if not runs and not events and not store.rows("SELECT 1 FROM pf_host_results WHERE host = ? LIMIT 1", (node,)) \
            and not store.rows("SELECT 1 FROM pf_events WHERE node = ? LIMIT 1", (node,)):
        like = nodes_like(store, node)
        raise UnknownNode(f"{node!r}: no run of the store {store.url.shown} has recorded this node"
                          + (f"; recorded nodes like it: {', '.join(like)}" if like else ""))
    if last is not None:
        runs.reverse()
        events.reverse()
    # The shown runs' causes, figures and findings: from the first shown run on.
    first = runs[0][2] if runs else window.end
    part = (node, first, window.end)
    causes: dict[str, list[dict]] = defaultdict(list)
    for run_id, cause, confidence, action in store.rows(
            "SELECT run_id, cause, confidence, action FROM pf_diagnoses WHERE host = ? AND started >= ? "
            "AND started <= ? ORDER BY cause", part):
        causes[run_id].append({"cause": cause, "confidence": confidence, "action": action})
    figures: dict[str, dict] = defaultdict(dict)
    for run_id, figure, value in store.rows("SELECT run_id, figure, value FROM pf_figures WHERE host = ? "
                                            "AND started >= ? AND started <= ?", part):
        figures[run_id][figure] = value
    failed: dict[str, list[dict]] = defaultdict(list)
    for run_id, check, status, summary in store.rows(
            "SELECT run_id, check_id, status, summary FROM pf_findings WHERE host = ? AND started >= ? "
            "AND started <= ? ORDER BY check_id", part):
        failed[run_id].append({"check": check, "status": status, "summary": summary})
    out = {
        "node": node,
        "since": iso(window.since),
        "runs": [{"run_id": r, "kind": kind, "started": at, "status": status, "reachable": bool(reach),
                  "profile": profile, "launcher": launcher, "causes": causes.get(r, []), "figures": figures.get(r, {}),
                  "findings": failed.get(r, [])}
                 for (r, kind, _, status, reach, profile, launcher), at in zip(runs, isos([r[2] for r in runs]),
                                                                                strict=True)],
        "events": [{"at": iso(at), "kind": kind, "actor": actor, "reason": reason, "run_id": run_id,
                    "detail": json.loads(detail or "{}")}
                   for at, kind, actor, reason, run_id, detail in events],
    }
    if last is not None:
        total, failing = store.rows("SELECT COUNT(*), SUM(CASE WHEN status IN ('fail', 'error') THEN 1 ELSE 0 END) "
                                    "FROM pf_host_results WHERE host = ? AND started >= ? AND started <= ?", params)[0]
        out.update(runs_total=int(total), failing_total=int(failing or 0), events_total=int(store.rows(
            "SELECT COUNT(*) FROM pf_events WHERE node = ? AND at >= ? AND at <= ?", params)[0][0]))
    return out


class _Gap:
    """A place in a node's compacted run order where runs that carry nothing stood."""


def _order_of(store: Store, window: Window, hits: list[tuple[str, str, str, float]],
              reachable_only: bool) -> dict[str, list]:
    """For ``trends.incidents``: each node's runs that carry a key (a cause, or a failing check),
    as chains of consecutive runs with a gap between chains. Incidents need only which of these
    runs follow one another directly in the node's order (all its runs, or its reachable ones),
    so a node's other runs are never fetched, and the run just before is looked up only for a
    run whose key the node carries more than once in the window: a key seen once is one
    incident wherever it stands. ``hits``: (node, key, run_id, started), each run in the node's
    order."""
    runs_of: dict[tuple[str, str], set[tuple[str, float]]] = defaultdict(set)
    for host, key, run_id, started in hits:
        runs_of[(host, key)].add((run_id, started))
    nodes: dict[str, set[str]] = defaultdict(set)
    repeated: set[tuple[str, str, float]] = set()
    for (host, _), runs in runs_of.items():
        nodes[host].update(r for r, _ in runs)
        if len(runs) > 1:
            repeated.update((host, r, started) for r, started in runs)
    after: dict[tuple[str, str], str] = {}  # (node, run) -> the run carrying a key right after it
    for host, run_id, before in seek.previous_runs(store, sorted(repeated), window.since, reachable_only):
        if before in nodes[host]:
            after[(host, before)] = run_id
    out: dict[str, list] = {}
    for host, runs in nodes.items():
        chained = set(after.get((host, r)) for r in runs)
        order: list = []
        for start in sorted(r for r in runs if r not in chained):  # each chain from its first run
            order.append(_Gap())
            run: str | None = start
            while run is not None:
                order.append(run)
                run = after.get((host, run))
        out[host] = order
    return out


def _verdicts(store: Store, window: Window, failed_in: dict[tuple[str, str], set[str]],
              policy: trends.Policy) -> dict[tuple[str, str], list[bool]]:
    """(node, check) -> the check's last ``policy.flap_runs`` verdicts on the node, oldest first:
    over the node's reachable runs that judged the check (a run that did not judge it says
    nothing of it: a --quick run is no pass of all_reduce) or failed it. Only pairs with enough
    failures to change ``policy.flap_transitions`` times are read: each failing verdict makes
    at most two changes. Each node's latest runs are read, more only while a check lacks
    verdicts among them."""
    pairs = {key: bad for key, bad in failed_in.items() if 2 * len(bad) >= policy.flap_transitions}
    hosts = sorted({host for host, _ in pairs})
    checks_of: dict[str, frozenset] = {}
    out: dict[tuple[str, str], list[bool]] = {}
    depth = policy.flap_runs
    while hosts:
        runs = seek.latest_reached_runs(store, hosts, window.since, window.end, depth)
        short = set()
        for (host, check), bad in pairs.items():
            if host not in hosts:
                continue
            latest = runs.get(host, [])
            seq = []
            for run_id, checks in latest:
                judged = checks_of.get(checks) or checks_of.setdefault(checks, frozenset(json.loads(checks)))
                if run_id in bad or check in judged:
                    seq.append(run_id in bad)
                    if len(seq) == policy.flap_runs:
                        break
            if len(seq) < policy.flap_runs and len(latest) == depth:
                short.add(host)  # the node has older runs, which may hold more of this check's verdicts
                continue
            out[(host, check)] = seq[::-1]
        hosts = sorted(short)
        depth *= 4
    return out


def fleet(store: Store, window: Window, policy: trends.Policy | None = None) -> dict:
    """``{"repeat_offenders", "flapping", "degrading", "rates"}`` over the window (docs/store.md)."""
    policy = policy or trends.Policy()
    window = window.frozen()  # one end for every query: a run recorded meanwhile is in all or none
    w = (window.since, window.end)
    # Grouped by the checks judged: a fleet's every-few-minutes healthchecks are many runs of one list.
    groups = [(json.loads(c), n, hosts, first) for c, n, hosts, first in store.rows(
        "SELECT checks, COUNT(*), SUM(hosts), MIN(started) FROM pf_runs WHERE started >= ? AND started <= ? "
        "GROUP BY checks", w)]

    # Causes: one hit per (node, cause, run); whether the run has a result for the node (a run
    # without one has no place in the node's order), by key lookup.
    causes = store.rows("SELECT DISTINCT d.host, d.cause, d.run_id, d.started, (SELECT h.reachable "
                        "FROM pf_host_results h WHERE h.run_id = d.run_id AND h.host = d.host) FROM pf_diagnoses d "
                        "WHERE d.started >= ? AND d.started <= ?", w)
    cause_hits = [c[:4] for c in causes]
    # A check's failure on a node that could not be reached is that node's absence, not the check's
    # verdict (the unreachable node's own cause, host-unreachable, counts it).
    failing = store.rows("SELECT DISTINCT f.host, f.check_id, f.run_id, f.started FROM pf_findings f "
                         "JOIN pf_host_results h ON h.run_id = f.run_id AND h.host = f.host "
                         "WHERE f.started >= ? AND f.started <= ? AND h.reachable = 1 "
                         "AND f.status IN ('fail', 'error')", w)
    cause_incidents = trends.incidents(_order_of(store, window, [c[:4] for c in causes if c[4] is not None], False),
                                       cause_hits)
    check_incidents = trends.incidents(_order_of(store, window, failing, True), failing)

    # Flapping: each failing check's verdicts on the node over the runs that judged it.
    failed_in = defaultdict(set)
    for host, check, run_id, _ in failing:
        failed_in[(host, check)].add(run_id)
    sequences = _verdicts(store, window, failed_in, policy)

    # Degrading: every figure's last readings per node, in time order.
    worse = {name: f.worse for name, f in FIGURES.items()}
    series = seek.latest_readings(store, *w, sorted(worse), policy.recent_runs + policy.baseline_runs)

    # Rates: host-runs judged per check, failing host-runs per check and cause, node-hours.
    judged: dict[str, int] = defaultdict(int)
    for checks, _, hosts, _ in groups:
        for c in checks:
            judged[c] += hosts
    check_failures = defaultdict(int)
    for _, check, _, _ in failing:
        check_failures[check] += 1
    cause_failures = defaultdict(int)
    for _, cause, _, _ in cause_hits:
        cause_failures[cause] += 1
    host_runs = sum(hosts for _, _, hosts, _ in groups)
    nodes, node_days = precision.nodes_and_days(store, *w)
    first = min((f for *_, f in groups), default=window.end)
    span_h = max(0.0, (window.end - first) / 3600)
    node_hours = (nodes or 0) * span_h
    return {
        "since": iso(window.since),
        "runs": sum(n for _, n, _, _ in groups),
        "host_runs": host_runs,
        "nodes": nodes or 0,
        "node_hours": round(node_hours, 1),
        "repeat_offenders": [{**r, "first": iso(r["first"]), "last": iso(r["last"])}
                             for r in trends.repeat_offenders(cause_incidents, policy)],
        "flapping": trends.flapping(sequences, policy),
        "degrading": [t.to_dict() for t in trends.degrading(series, worse, policy)],
        "rates": (trends.rates(judged, check_incidents, check_failures, node_hours, "check")
                  # Any host-run may carry any cause: each cause's runs are all of them.
                  + trends.rates({c: host_runs for c in cause_failures}, cause_incidents, cause_failures, node_hours,
                                 "cause")),
        "precision": precision.precision(store, *w, policy.returns_within_s, node_days),
    }


def _chunks(items: list[str], size: int = 500):
    # SQLite binds at most 32,766 parameters per statement; PostgreSQL's plans suffer far earlier.
    for i in range(0, len(items), size):
        yield items[i:i + size]


def host_histories(store: Store, nodes: list[str], window: Window, exclude_run: str | None = None
                   ) -> dict[str, HostHistory]:
    """Each node's past in the window, for the judgement (``run``/``analyze --history``), with
    the fleet's run-to-run spread and median of every figure. ``exclude_run``: the run being
    judged, when it is already recorded (a re-analysis), so that it is not its own past."""
    window = window.frozen()
    w = (window.since, window.end)
    skip = exclude_run or ""
    runs: dict[str, list] = defaultdict(list)
    causes: dict[tuple[str, str], list[str]] = defaultdict(list)
    failed: dict[tuple[str, str], list[str]] = defaultdict(list)
    figures: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    judged_cache: dict[str, frozenset] = {}
    for part in _chunks(sorted(set(nodes))):
        marks = ", ".join("?" * len(part))
        for host, run_id, started, status, reach, checks in store.rows(
                "SELECT h.host, h.run_id, h.started, h.status, h.reachable, r.checks FROM pf_host_results h "
                f"JOIN pf_runs r ON r.run_id = h.run_id WHERE h.host IN ({marks}) AND h.started >= ? "
                "AND h.started <= ? AND h.run_id <> ? ORDER BY h.host, h.started, h.run_id", (*part, *w, skip)):
            judged = judged_cache.get(checks) or judged_cache.setdefault(checks, frozenset(json.loads(checks)))
            runs[host].append((run_id, started, status, bool(reach), judged))
        for host, run_id, cause in store.rows(
                f"SELECT DISTINCT host, run_id, cause FROM pf_diagnoses WHERE host IN ({marks}) AND started >= ? "
                "AND started <= ? ORDER BY cause", (*part, *w)):
            causes[(host, run_id)].append(cause)
        for host, run_id, check in store.rows(
                f"SELECT DISTINCT host, run_id, check_id FROM pf_findings WHERE host IN ({marks}) AND started >= ? "
                "AND started <= ? AND status IN ('fail', 'error') ORDER BY check_id", (*part, *w)):
            failed[(host, run_id)].append(check)
        for host, figure, value in store.rows(
                f"SELECT host, figure, value FROM pf_figures WHERE host IN ({marks}) AND started >= ? AND started <= ? "
                "AND run_id <> ? ORDER BY host, figure, started, run_id", (*part, *w, skip)):
            figures[host][figure].append(value)
    series: dict[str, list[list[float]]] = defaultdict(list)
    current: dict[tuple[str, str], list[float]] = defaultdict(list)
    for host, figure, value in store.rows("SELECT host, figure, value FROM pf_figures WHERE started >= ? "
                                          "AND started <= ? ORDER BY host, figure, started, run_id", w):
        current[(host, figure)].append(value)
    for (_, figure), values in current.items():
        series[figure].append(values)
    spreads = {f: s for f, vs in series.items() if (s := trends.run_to_run_spread(vs)) is not None}
    medians = {f: statistics.median(v[-1] for v in vs) for f, vs in series.items()}
    now = window.end
    return {node: HostHistory(
        node=node,
        runs=tuple(PastRun(r, started, status, reach, tuple(causes.get((node, r), ())),
                           tuple(failed.get((node, r), ())), judged)
                   for r, started, status, reach, judged in runs.get(node, ())),
        figures={f: tuple(v) for f, v in figures.get(node, {}).items()},
        spreads=spreads, fleet_medians=medians, now=now, store=store.url.shown) for node in nodes}
