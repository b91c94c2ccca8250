"""What the return-to-service lifecycle keeps in the store: each node's state, a lock so that
one controller acts at a time, and the readings and incidents it decides from. Plain rows in and
out; the states' meaning is ``preflight.lifecycle``'s."""

from __future__ import annotations

import json
import time
from collections import defaultdict

from preflight.judge import trends
from preflight.store.db import Store

STATE_COLUMNS = ("node", "state", "since", "cause", "run_id", "step", "requested", "retest_failures")


def node_states(store: Store) -> dict[str, dict]:
    cols = ", ".join(STATE_COLUMNS)
    return {r[0]: dict(zip(STATE_COLUMNS, r, strict=True)) for r in store.rows(f"SELECT {cols} FROM pf_node_state")}


def put_state(store: Store, row: dict, event: dict | None, more: tuple[dict, ...] = ()) -> None:
    """The node's new state and the event that says why (and ``more`` events that come with it:
    a step's outcome), in one transaction: all or none."""
    values = tuple(row.get(c) for c in STATE_COLUMNS)
    updates = ", ".join(f"{c} = excluded.{c}" for c in STATE_COLUMNS[1:])

    def work(s: Store) -> None:
        s.execute(f"INSERT INTO pf_node_state ({', '.join(STATE_COLUMNS)}, updated) VALUES "
                  f"({', '.join('?' * len(STATE_COLUMNS))}, ?) ON CONFLICT (node) DO UPDATE SET {updates}, "
                  "updated = excluded.updated", (*values, time.time()))
        for e in ((event,) if event else ()) + tuple(more):
            s.execute("INSERT INTO pf_events (node, kind, at, actor, reason, run_id, detail) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?)", (row["node"], e["kind"], e.get("at", time.time()),
                                                      e["actor"], e["reason"], e.get("run_id"),
                                                      json.dumps(e.get("detail") or {})))

    store.write(work)


OUTCOME = "outcome"  # the event kind of a remediation step's outcome (docs/contracts.md)


def outcomes(store: Store, since: float) -> dict[str, list[dict]]:
    """node -> its steps' outcomes since ``since``, oldest first: ``{at, cause, step, outcome,
    step_at, reading, why}``. An event whose detail is not an outcome's (edited by hand) is left out."""
    out: dict[str, list[dict]] = defaultdict(list)
    for node, at, reason, detail in store.rows("SELECT node, at, reason, detail FROM pf_events WHERE kind = ? "
                                               "AND at >= ? ORDER BY at, id", (OUTCOME, since)):
        try:
            d = json.loads(detail)
        except ValueError:
            continue
        if isinstance(d, dict) and all(isinstance(d.get(k), str) for k in ("cause", "step", "outcome")) \
                and isinstance(d.get("step_at"), (int, float)):
            out[node].append({"at": at, "cause": d["cause"], "step": d["step"], "outcome": d["outcome"],
                              "step_at": float(d["step_at"]), "reading": d.get("reading"), "why": reason})
    return out


def take_lock(store: Store, name: str, holder: str, ttl_s: float, now: float | None = None) -> bool:
    """The lock ``name`` for ``holder`` until now + ttl_s, unless another holder's is still
    valid. One statement: two controllers racing for it cannot both win."""
    now = time.time() if now is None else now

    def work(s: Store) -> bool:
        s.execute("INSERT INTO pf_locks (name, holder, expires) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                  "holder = excluded.holder, expires = excluded.expires "
                  "WHERE pf_locks.expires < ? OR pf_locks.holder = excluded.holder", (name, holder, now + ttl_s, now))
        got = s.execute("SELECT holder FROM pf_locks WHERE name = ?", (name,)).fetchall()
        return bool(got) and got[0][0] == holder

    return bool(store.write(work))


def lock_holder(store: Store, name: str) -> tuple[str, float] | None:
    got = store.rows("SELECT holder, expires FROM pf_locks WHERE name = ?", (name,))
    return (got[0][0], got[0][1]) if got else None


def drop_lock(store: Store, name: str, holder: str) -> None:
    store.write(lambda s: s.execute("DELETE FROM pf_locks WHERE name = ? AND holder = ?", (name, holder)))


def readings(store: Store, since: float) -> dict[str, list[tuple]]:
    """Every node's runs since ``since``: (run_id, started, status, causes), oldest first."""
    causes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for host, run_id, cause in store.rows("SELECT host, run_id, cause FROM pf_diagnoses WHERE started >= ? "
                                          "ORDER BY confidence, cause", (since,)):
        causes[(host, run_id)].append(cause)
    out: dict[str, list[tuple]] = defaultdict(list)
    for host, run_id, started, status in store.rows(
            "SELECT host, run_id, started, status FROM pf_host_results WHERE started >= ? "
            "ORDER BY host, started, run_id", (since,)):
        out[host].append((run_id, started, status, tuple(dict.fromkeys(causes.get((host, run_id), ())))))
    return out


def incidents(store: Store, since: float) -> dict[str, dict[str, int]]:
    """node -> cause -> incidents (streaks of consecutive runs carrying it) since ``since``."""
    order: dict[str, list[str]] = defaultdict(list)
    for host, run_id in store.rows("SELECT host, run_id FROM pf_host_results WHERE started >= ? "
                                   "ORDER BY host, started, run_id", (since,)):
        order[host].append(run_id)
    hits = store.rows("SELECT DISTINCT host, cause, run_id, started FROM pf_diagnoses WHERE started >= ?", (since,))
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for i in trends.incidents(order, hits):
        out[i.node][i.key] += 1
    return out


def drained_since(store: Store, since: float) -> set[str]:
    """The nodes preflight drained since ``since`` (every command's drains: drain, healthcheck,
    lifecycle), for the breaker that counts across runs."""
    return {r[0] for r in store.rows("SELECT DISTINCT node FROM pf_events WHERE kind = 'drain' AND at >= ?",
                                     (since,))}


def blamed_checks(store: Store, node: str, run_id: str | None) -> list[str]:
    """The checks that failed or errored on ``node`` in ``run_id``: what its retest runs again."""
    if not run_id:
        return []
    return [r[0] for r in store.rows("SELECT DISTINCT check_id FROM pf_findings WHERE run_id = ? AND host = ? "
                                     "AND status IN ('fail', 'error') ORDER BY check_id", (run_id, node))]
