"""What the store keeps of the idle-node sweeps (``preflight sweep --slurm``), in its events: no
table of their own (no migration). A sweep's checks are a run like any other (run id
``sweep-NODE-STAMP``, its verdicts read by the lifecycle); around it, on the node's events:

  - ``sweep-submitted``  the pass submitted the job (detail: ``job``, ``partition``/``qos``);
  - ``sweep-done``       the run ended with its verdicts recorded (reason ``passed`` or ``failed``);
  - ``sweep-preempted``  Slurm preempted the job for a real one: no verdict, not a failure;
  - ``sweep-incomplete`` the job ended without verdicts for another reason (its time limit, a
    person's scancel, the run exiting 2, the job gone from Slurm without an outcome).

A node's last finished sweep (for its period) is its last ``sweep-done``; a preempted or
incomplete one leaves the node due, so its next pass tries again."""

from __future__ import annotations

import json
from dataclasses import dataclass

from preflight.store.db import Store

SUBMITTED, DONE, PREEMPTED, INCOMPLETE = "sweep-submitted", "sweep-done", "sweep-preempted", "sweep-incomplete"
OUTCOMES = (DONE, PREEMPTED, INCOMPLETE)


@dataclass(frozen=True)
class Open:
    """A submitted sweep without an outcome yet."""

    node: str
    run_id: str
    job: int | None
    at: float


def last_done(store: Store) -> dict[str, float]:
    """node -> when its last sweep finished with verdicts."""
    return {node: float(at) for node, at in store.rows(
        "SELECT node, MAX(at) FROM pf_events WHERE kind = ? GROUP BY node", (DONE,))}


def open_sweeps(store: Store, since: float) -> list[Open]:
    """The sweeps submitted since ``since`` that have no outcome event yet."""
    ended = {r[0] for r in store.rows(
        f"SELECT run_id FROM pf_events WHERE kind IN ({', '.join('?' * len(OUTCOMES))}) AND at >= ?",
        (*OUTCOMES, since))}
    out = []
    for node, run_id, at, detail in store.rows(
            "SELECT node, run_id, at, detail FROM pf_events WHERE kind = ? AND at >= ? ORDER BY at",
            (SUBMITTED, since)):
        if run_id not in ended:
            job = json.loads(detail or "{}").get("job")
            out.append(Open(node, run_id, int(job) if job is not None else None, float(at)))
    return out


def outcome_of(store: Store, run_id: str) -> str | None:
    rows = store.rows(f"SELECT kind FROM pf_events WHERE run_id = ? AND kind IN ({', '.join('?' * len(OUTCOMES))})",
                      (run_id, *OUTCOMES))
    return rows[0][0] if rows else None


def record(store: Store, node: str, kind: str, actor: str, reason: str, run_id: str, detail: dict) -> None:
    store.add_event(node, kind, actor, reason, run_id, detail=json.dumps(detail, sort_keys=True))
