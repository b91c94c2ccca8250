"""Bounded reads for the fleet's questions: statements whose cost follows the size of their
answer (the fleet's nodes, the failing runs) rather than the number of rows in the window, so
that a year of daily runs of 10,000 nodes (3.65 M host results) is answered from a few tens of
thousands of index seeks instead of every row (issue 31, bench/RESULTS.md).

Two devices, both plain SQL on SQLite and PostgreSQL:
- a *loose index scan*: the distinct values of an index's leading column found one seek at a
  time (``MIN(col) WHERE col > previous``) in a recursive statement, where ``SELECT DISTINCT``
  would walk every row of every value;
- the *latest rows of each key*: ``ORDER BY started DESC LIMIT k`` per key, which PostgreSQL runs
  for every key in one statement (``CROSS JOIN LATERAL``); SQLite has no LATERAL, so there each
  key's rows are read from its k-th latest one on, which a correlated seek finds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from preflight.store.db import Store
from preflight.store.location import POSTGRES


def _rows(store: Store, sql: str, params: Sequence = ()) -> list[tuple]:
    """``store.rows``, on PostgreSQL with JIT compilation off and room to sort in memory. These
    statements are tens of thousands of index seeks, which the planner's cost model prices like a
    large scan, so PostgreSQL compiles them (jit_above_cost): 0.58 s of a 1.68 s statement on
    the 3.65 M host-run store (EXPLAIN ANALYZE); and a fleet's 130,000 readings spill the default 4 MB
    work_mem to disk when sorted. ``SET LOCAL`` lasts until the read's transaction ends."""
    if store.dialect == POSTGRES:
        with store._errors():  # a server gone meanwhile is a StoreError, as in rows()
            if store.conn.info.server_version >= 110000:  # jit: PostgreSQL 11
                store.execute("SET LOCAL jit = off")
            store.execute("SET LOCAL work_mem = '64MB'")
    return store.rows(sql, params)


# The (node, figure) pairs the store holds readings of, one seek each on (host, figure, started).
_FIGURE_PAIRS = (
    "n(host) AS (SELECT MIN(host) FROM pf_figures UNION ALL "
    "SELECT (SELECT MIN(x.host) FROM pf_figures x WHERE x.host > n.host) FROM n WHERE n.host IS NOT NULL), "
    "f(host, figure) AS (SELECT host, (SELECT MIN(x.figure) FROM pf_figures x WHERE x.host = n.host) FROM n "
    "WHERE n.host IS NOT NULL UNION ALL SELECT host, (SELECT MIN(x.figure) FROM pf_figures x "
    "WHERE x.host = f.host AND x.figure > f.figure) FROM f WHERE f.figure IS NOT NULL)")


def latest_readings(store: Store, since: float, until: float, figures: Sequence[str],
                    keep: int) -> dict[tuple[str, str], list[float]]:
    """(node, figure) -> its last ``keep`` readings in the window, oldest first, for the figures
    named; pairs without a reading in the window are left out. One statement."""
    if not figures:
        return {}
    marks = ", ".join("?" for _ in figures)
    w = (since, until)
    if store.dialect == POSTGRES:
        rows = _rows(store,
            f"WITH RECURSIVE {_FIGURE_PAIRS} SELECT f.host, f.figure, x.value FROM f CROSS JOIN LATERAL "
            "(SELECT value, started, run_id FROM pf_figures v WHERE v.host = f.host AND v.figure = f.figure "
            "AND v.started >= ? AND v.started <= ? ORDER BY v.started DESC, v.run_id DESC LIMIT ?) x "
            f"WHERE f.figure IN ({marks}) ORDER BY f.host, f.figure, x.started, x.run_id", (*w, keep, *figures))
    else:
        # No LATERAL in SQLite: each pair's readings from its keep-th latest one on, that one found
        # by a seek; a tie at that time may bring one more, trimmed below.
        rows = _rows(store,
            f"WITH RECURSIVE {_FIGURE_PAIRS} SELECT f.host, f.figure, v.value FROM f JOIN pf_figures v "
            "ON v.host = f.host AND v.figure = f.figure AND v.started <= ? AND v.started >= COALESCE("
            "(SELECT b.started FROM pf_figures b WHERE b.host = f.host AND b.figure = f.figure AND b.started >= ? "
            "AND b.started <= ? ORDER BY b.started DESC LIMIT 1 OFFSET ?), ?) "
            f"WHERE f.figure IN ({marks}) ORDER BY f.host, f.figure, v.started, v.run_id",
            (until, *w, keep - 1, since, *figures))
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for host, figure, value in rows:
        out[(host, figure)].append(value)
    return {pair: values[-keep:] for pair, values in out.items()}


def latest_reached_runs(store: Store, hosts: Sequence[str], since: float, until: float,
                        depth: int) -> dict[str, list[tuple[str, str]]]:
    """node -> its last ``depth`` reachable runs in the window, latest first, as (run_id, the
    run's checks as stored)."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    w = (since, until)
    if store.dialect == POSTGRES:
        rows = _rows(store,
            "SELECT k.host, x.run_id, x.checks FROM unnest(?::text[]) WITH ORDINALITY AS k(host, i) CROSS JOIN LATERAL "
            "(SELECT h.run_id, h.started, r.checks FROM pf_host_results h JOIN pf_runs r ON r.run_id = h.run_id "
            "WHERE h.host = k.host AND h.reachable = 1 AND h.started >= ? AND h.started <= ? "
            "ORDER BY h.started DESC, h.run_id DESC LIMIT ?) x ORDER BY k.i, x.started DESC, x.run_id DESC",
            (list(hosts), *w, depth))
    else:
        rows = []
        for part in _chunks(hosts):
            rows += _rows(store,
                f"WITH k(host) AS (VALUES {', '.join('(?)' for _ in part)}) "
                "SELECT k.host, h.run_id, r.checks FROM k JOIN pf_host_results h ON h.host = k.host "
                "AND h.reachable = 1 AND h.started <= ? AND h.started >= COALESCE((SELECT b.started "
                "FROM pf_host_results b WHERE b.host = k.host AND b.reachable = 1 "
                "AND b.started >= ? AND b.started <= ? ORDER BY b.started DESC LIMIT 1 OFFSET ?), ?) "
                "JOIN pf_runs r ON r.run_id = h.run_id "
                "ORDER BY k.host, h.started DESC, h.run_id DESC", (*part, until, *w, depth - 1, since))
    for host, run_id, checks in rows:
        if len(out[host]) < depth:
            out[host].append((run_id, checks))
    return out


def _chunks(items: Sequence, size: int = 500):
    # SQLite before 3.32 binds at most 999 parameters per statement.
    for i in range(0, len(items), size):
        yield items[i:i + size]


def previous_runs(store: Store, runs: Sequence[tuple[str, str, float]], since: float,
                  reachable_only: bool) -> list[tuple[str, str, str | None]]:
    """For each (node, run_id, started): the node's run just before it in the order (host,
    started, run_id), from ``since`` on, among its reachable runs only if asked; None at the
    start. Found by seeks: the latest earlier time (MAX over the (host, started) index), then the
    last run id at that time, or an earlier run id at the run's own time."""
    if not runs:
        return []
    only = " AND p.reachable = 1" if reachable_only else ""
    at = (f"(SELECT MAX(q.started) FROM pf_host_results q WHERE q.host = x.host{only.replace('p.', 'q.')} "
          "AND q.started >= ? AND q.started < x.started)")
    before = (f"COALESCE((SELECT MAX(p.run_id) FROM pf_host_results p WHERE p.host = x.host{only} "
              f"AND p.started = x.started AND p.run_id < x.run_id), (SELECT MAX(p.run_id) FROM pf_host_results p "
              f"WHERE p.host = x.host{only} AND p.started = {at}))")
    if store.dialect == POSTGRES:
        columns = [[r[i] for r in runs] for i in range(3)]
        return _rows(store, f"SELECT x.host, x.run_id, {before} FROM unnest(?::text[], ?::text[], "
                            "?::double precision[]) AS x(host, run_id, started)", (since, *columns))
    out = []
    for part in _chunks(runs, 300):  # 3 parameters a run
        out += _rows(store, f"WITH x(host, run_id, started) AS (VALUES {', '.join('(?, ?, ?)' for _ in part)}) "
                            f"SELECT x.host, x.run_id, {before} FROM x", (*(v for r in part for v in r), since))
    return out
