"""The store's reads behind ``history --fleet``'s precision (how often preflight's drains were
right): the window's drain-related events, and the few readings each drain's outcome needs,
found by index seeks per drain so the cost follows the number of drains, not of runs. The
definitions themselves are ``preflight.judge.precision``'s pure functions."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence

from preflight.judge import precision as defs
from preflight.judge.precision import Event
from preflight.store.db import Store
from preflight.store.location import POSTGRES
from preflight.store.seek import _chunks, _rows

# The events a drain's outcome is read from; the rest (confirm, retest, refused) say nothing of it.
KINDS = (*defs.DRAIN_KINDS, *defs.RESUME_KINDS, *defs.STEP_KINDS, defs.OUTCOME_KIND)
# ... and of the lifecycle's transitions, those into drained or escalated (a failed retest, an
# escalation) and a person's clear: the lifecycle writes each transition's reason as
# "-> STATE: why" (lifecycle.machine), so the others (into remediating, retesting, resumed,
# suspect) are left in the table rather than decoded here by the thousand.
TRANSITIONS = ("-> drained:%", "-> escalated:%", defs.CLEARED + "%")
_FAILING = "('fail', 'error')"


def events(store: Store, since: float, until: float) -> dict[str, list[Event]]:
    """node -> its drain-related events in the window, in the order they were recorded. One
    statement over pf_events, which holds a row per change of a node, not per run."""
    marks = ", ".join("?" for _ in KINDS)
    moves = " OR ".join("reason LIKE ?" for _ in TRANSITIONS)
    out: dict[str, list[Event]] = defaultdict(list)
    for node, at, kind, reason, run_id, detail in _rows(
            store, f"SELECT node, at, kind, reason, run_id, detail FROM pf_events WHERE at >= ? AND at <= ? "
                   f"AND (kind IN ({marks}) OR (kind = 'transition' AND ({moves}))) ORDER BY node, at, id",
            (since, until, *KINDS, *TRANSITIONS)):
        decoded = _detail(detail) if kind in ("transition", defs.OUTCOME_KIND) else None
        out[node].append(Event(at, kind, reason, run_id, decoded))
    return out


def _detail(text: str | None) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}  # an event another writer recorded: it says nothing a definition reads
    return value if isinstance(value, dict) else {}


def _values(count: int, width: int) -> str:
    row = "(" + ", ".join("?" for _ in range(width)) + ")"
    return ", ".join(row for _ in range(count))


def open_at(store: Store, nodes: Sequence[str], since: float) -> set[str]:
    """The nodes among ``nodes`` that were drained by preflight at ``since``: their last drain,
    resume or clear before it was a drain. One seek back from ``since`` per node."""
    if not nodes:
        return set()
    boundary = list(defs.DRAIN_KINDS + defs.RESUME_KINDS)
    marks = ", ".join("?" for _ in boundary)
    last = (f"(SELECT e.kind FROM pf_events e WHERE e.node = x.node AND e.at < ? AND (e.kind IN ({marks}) "
            "OR (e.kind = 'transition' AND e.reason LIKE ?)) ORDER BY e.at DESC, e.id DESC LIMIT 1)")
    tail = (since, *boundary, defs.CLEARED + "%")
    if store.dialect == POSTGRES:
        rows = _rows(store, f"SELECT x.node, {last} FROM unnest(?::text[]) AS x(node)", (*tail, list(nodes)))
    else:
        rows = []
        for part in _chunks(nodes):
            rows += _rows(store, f"WITH x(node) AS (VALUES {_values(len(part), 1)}) SELECT x.node, {last} FROM x",
                          (*part, *tail))
    return {node for node, kind in rows if kind in defs.DRAIN_KINDS}


def first_failing(store: Store, drains: Sequence[tuple[str, float]]) -> list[float | None]:
    """For each (node, drained at): when the node's unbroken streak of failing readings (fail or
    error, no pass or warn between) that ends at or before the drain began; None when no failing
    reading precedes the drain. Two seeks per drain on (host, started)."""
    if not drains:
        return []
    ok = ("(SELECT p.started FROM pf_host_results p WHERE p.host = x.node AND p.started <= x.at "
          "AND p.status IN ('pass', 'warn') ORDER BY p.started DESC LIMIT 1)")
    first = (f"(SELECT h.started FROM pf_host_results h WHERE h.host = x.node AND h.started <= x.at "
             f"AND h.status IN {_FAILING} AND h.started > COALESCE({ok}, -1.0) ORDER BY h.started LIMIT 1)")
    if store.dialect == POSTGRES:
        return [r[0] for r in _rows(store, f"SELECT {first} FROM unnest(?::text[], ?::double precision[]) "
                                           "WITH ORDINALITY AS x(node, at, i) ORDER BY x.i",
                                    ([d[0] for d in drains], [d[1] for d in drains]))]
    out: list[float | None] = []
    for part in _chunks(drains, 400):
        out += [r[1] for r in _rows(store, f"WITH x(i, node, at) AS (VALUES {_values(len(part), 3)}) "
                                           f"SELECT x.i, {first} FROM x ORDER BY x.i",
                                    tuple(v for i, d in enumerate(part) for v in (i, *d)))]
    return out


def seen_again(store: Store, probes: Sequence[tuple[str, str, float, float]]) -> list[float | None]:
    """For each (node, cause, after, until): the first reading of the node in (after, until] that
    diagnosed the cause, or failed a check of that id (a healthcheck names the failing check where
    no diagnosis names a cause); None when none did. Seeks on (host, started): only failing
    readings have such rows."""
    if not probes:
        return []
    diagnosed = ("(SELECT MIN(d.started) FROM pf_diagnoses d WHERE d.host = x.node AND d.started > x.after "
                 "AND d.started <= x.until AND d.cause = x.cause)")
    failed = ("(SELECT MIN(f.started) FROM pf_findings f WHERE f.host = x.node AND f.started > x.after "
              f"AND f.started <= x.until AND f.check_id = x.cause AND f.status IN {_FAILING})")
    if store.dialect == POSTGRES:
        columns = [[p[k] for p in probes] for k in range(4)]
        rows = _rows(store, f"SELECT {diagnosed}, {failed} FROM unnest(?::text[], ?::text[], ?::double precision[], "
                            "?::double precision[]) WITH ORDINALITY AS x(node, cause, after, until, i) ORDER BY x.i",
                     tuple(columns))
    else:
        rows = []
        for part in _chunks(probes, 200):
            rows += [r[1:] for r in _rows(
                store, f"WITH x(i, node, cause, after, until) AS (VALUES {_values(len(part), 5)}) "
                       f"SELECT x.i, {diagnosed}, {failed} FROM x ORDER BY x.i",
                tuple(v for i, p in enumerate(part) for v in (i, *p)))]
    return [min((t for t in r if t is not None), default=None) for r in rows]


def nodes_and_days(store: Store, since: float, until: float) -> tuple[int, float]:
    """The nodes with a host result in the window, and their node-days: each node counted from
    its first reading in the window to the window's end. Each recorded node is found by one seek
    on (host, started), its first reading in the window by another."""
    count, seconds = _rows(store,
        "WITH RECURSIVE n(host) AS (SELECT MIN(host) FROM pf_host_results UNION ALL "
        "SELECT (SELECT MIN(h.host) FROM pf_host_results h WHERE h.host > n.host) FROM n WHERE n.host IS NOT NULL) "
        "SELECT COUNT(f.first), SUM(? - f.first) FROM (SELECT (SELECT MIN(h.started) FROM pf_host_results h "
        "WHERE h.host = n.host AND h.started >= ? AND h.started <= ?) AS first FROM n WHERE n.host IS NOT NULL) f",
        (until, since, until))[0]
    return int(count or 0), float(seconds or 0.0) / 86400


def latest(store: Store) -> float | None:
    """The latest time the store holds: its latest run's start or event, whichever is later."""
    found = [v for (v,) in store.rows("SELECT MAX(started) FROM pf_runs UNION ALL SELECT MAX(at) FROM pf_events")
             if v is not None]
    return max(found) if found else None


def precision(store: Store, since: float, until: float, within_s: float = defs.RETURNS_WITHIN_S,
              node_days: float | None = None) -> dict:
    """``history --fleet``'s ``precision``: the drains that began in the window and what each
    turned out to be (docs/store.md). ``node_days``: the window's, when the caller has it."""
    found_events = events(store, since, until)
    already = open_at(store, sorted(found_events), since)
    per_node = {node: defs.drains(node, evs, node in already) for node, evs in found_events.items()}
    end = latest(store) or until
    drains: list[defs.Drain] = []
    again: list[float | None] = []
    for found in per_node.values():
        drains += found
        again += defs.next_same_cause(found)
    # Readings that show the cause back, read only for the drains nothing else has decided.
    undecided = [i for i, d in enumerate(drains) if not defs.decided_by_events(d, again[i], within_s)]
    for i, t in zip(undecided, seen_again(store, [(drains[i].node, drains[i].cause, drains[i].ended_at,
                                                   drains[i].ended_at + within_s) for i in undecided]), strict=True):
        if t is not None:
            again[i] = t if again[i] is None else min(again[i], t)
    outcomes = [defs.outcome(d, again[i], end, within_s) for i, d in enumerate(drains)]
    starts = first_failing(store, [(d.node, d.at) for d in drains])
    to_drain = {i: d.at - t for i, (d, t) in enumerate(zip(drains, starts, strict=True)) if t is not None}
    if node_days is None:
        node_days = nodes_and_days(store, since, until)[1]
    return defs.summary(outcomes, to_drain, node_days, within_s)
