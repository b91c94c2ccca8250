"""``preflight healthcheck``: the program slurm.conf's ``HealthCheckProgram`` runs on every node.

Static probes only (never an active test, which would load the GPUs under running jobs), on this
node, within a time budget (default 60 s: per-probe and node limits are derived from it), judged
with the same checks as a run; the node's report stays on local disk (``--out``, the newest
``KEEP`` runs). Then the node's Slurm state follows the verdict, and only preflight's own drains
are ever undone:

  - FAIL: drain this node, ``Reason="preflight: <cause> <run-id>"`` (cause: the diagnosis with
    the highest confidence). A node drained by someone else keeps their drain and reason.
  - PASS or WARN: resume the node if, and only if, its current reason starts with ``preflight:``.
  - ERROR (could not tell: a tool timed out, a probe failed): nothing changes, never a drain.

Slurm 22.05 does not set ``SLURM_NODE_IS_HEALTHY`` for the program; where a later slurmd does,
its value is recorded in the report's meta and the verdict still comes from the node's own
evidence. Exit status: 0 healthy (pass/warn), 1 otherwise, 2 bad input.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from preflight import __version__
from preflight.app.interrupt import Interrupted
from preflight.collect.fanout import ExecPlan, run_node
from preflight.collect.local import LocalNode, local_host_name
from preflight.collect.slurm_job import SlurmUsageError, node_states, set_state
from preflight.contracts import DRAIN_REASON_PREFIX, EXIT_FAILED, EXIT_OK
from preflight.diagnose.analysis import analyze
from preflight.evidence.bundle import BundleWriter, new_run_id
from preflight.model import Analysis
from preflight.parse.slurm import NodeState
from preflight.report.files import write_reports

KEEP = 10  # healthcheck runs kept on the node's disk; it runs every HealthCheckInterval
_CONFIDENCE = {"high": 0, "medium": 1, "low": 2}


@dataclass(frozen=True)
class Action:
    """What to do with the node's Slurm state: ``drain`` (with ``reason``), ``resume``, or ``none``."""

    kind: str
    reason: str | None = None
    why: str = ""


def decide(status: str, cause: str | None, run_id: str, node: NodeState | None) -> Action:
    """The rule above, pure: this run's verdict and the node's current state in, the action out."""
    current = (node.reason or "") if node else ""
    ours = current.startswith(DRAIN_REASON_PREFIX)
    drained = node is not None and "DRAIN" in node.flags
    if status == "fail":
        if drained and not ours:
            return Action("none", why=f"failed, but drained by someone else ({current}): left as it is")
        return Action("drain", f"{DRAIN_REASON_PREFIX} {cause or 'check-failed'} {run_id}", "failed")
    if status == "error":
        return Action("none", why="could not tell (error): never drains, never resumes")
    if drained and ours:
        return Action("resume", why=f"healthy again; the drain was preflight's ({current})")
    if drained:
        return Action("none", why=f"healthy, but drained by someone else ({current}): left as it is")
    return Action("none", why="healthy")


def event_of(action: Action, node: str, run_id: str) -> dict | None:
    """The store's record of what the healthcheck did to its node's Slurm state (None: nothing):
    the event ``history --fleet`` reads the drain's outcome from (preflight.judge.precision)."""
    if action.kind not in ("drain", "resume"):
        return None
    return {"node": node, "kind": action.kind, "actor": "healthcheck", "reason": action.reason or action.why,
            "run_id": run_id}


def worst_cause(analysis: Analysis, host: str) -> str | None:
    mine = [d for d in analysis.diagnoses if host in d.hosts]
    if mine:
        return min(mine, key=lambda d: _CONFIDENCE.get(d.confidence, 9)).cause
    failed = [f.check for f in analysis.findings_of(host) if f.status.value == "fail"]
    return failed[0] if failed else None


def plan_for(probes, budget_s: float, per_node: int = 4) -> ExecPlan:
    """Static probes bounded by the budget: a probe gets a third of it (at most 30 s), the node
    three quarters, leaving time to judge and to call scontrol."""
    # No active tests, so no second readings after them either.
    static = tuple(p for p in probes if not p.active and not p.after_active)
    # mlxfwmanager's own 120 s limit does not fit a 60 s budget: every probe gets the run's limit.
    static = tuple(p if p.timeout_s is None and p.timeout_factor is None else replace(p, timeout_s=None,
                                                                                       timeout_factor=None)
                   for p in static)
    return ExecPlan(static, timeout_s=min(30.0, budget_s / 3), per_node=per_node, node_timeout_s=budget_s * 0.75)


def run_healthcheck(probes, checks, profiles, kb, out: Path, budget_s: float, node: str | None = None,
                    drain: bool = True, mode: str = "healthcheck") -> tuple[int, Analysis, Action, Path]:
    """``mode`` names the runs kept on disk: ``healthcheck``, or ``prolog`` (which never drains:
    Slurm drains the node itself when a prolog fails)."""
    name = node or os.environ.get("SLURMD_NODENAME") or local_host_name().split(".")[0]
    run_id = f"{mode}-" + new_run_id(name)
    run_dir = out / run_id
    started_at = time.time()
    created = datetime.fromtimestamp(started_at, timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    plan = plan_for(probes, budget_s)
    writer = BundleWriter(run_dir / "bundle", [name], created,
                          {"run_id": run_id, "preflight_version": __version__, "probes": [p.id for p in plan.probes],
                           "checks": [c.id for c in checks], "local": True, "mode": mode})
    try:
        run_node(LocalNode(name), plan, writer.add)
    except KeyboardInterrupt:
        raise Interrupted(run_dir / "bundle") from None
    analysis = analyze(writer.bundle(), checks, profiles, kb)
    status = analysis.hosts[name].status
    action = Action("none", why="--no-drain")
    if drain:
        try:
            states = node_states([name])
        except SlurmUsageError as exc:  # the verdict stands and is kept; only Slurm's state is not changed
            states, action = None, Action("none", why=f"Slurm not asked: {exc}")
        if states is not None:
            action = decide(status, worst_cause(analysis, name), run_id, states.get(name))
        if action.kind in ("drain", "resume"):
            complaint = set_state(name, "DRAIN" if action.kind == "drain" else "RESUME", action.reason)
            if complaint:
                action = Action("none", why=f"{action.kind} refused by Slurm: {complaint}")
    analysis.meta.update({"run_id": run_id, "kind": mode, "created": created, "preflight_version": __version__,
                          "launcher": "local", "duration_s": round(time.monotonic() - t0, 3),
                          "started_at": round(started_at, 3),
                          "bundle": "bundle", "healthcheck": {"action": action.kind, "reason": action.reason,
                                                              "why": action.why,
                                                              "slurm_node_is_healthy":
                                                                  os.environ.get("SLURM_NODE_IS_HEALTHY")}})
    write_reports(run_dir, analysis, html=False)
    _prune(out, mode)
    return (EXIT_OK if status in ("pass", "warn") else EXIT_FAILED), analysis, action, run_dir


def _prune(out: Path, mode: str) -> None:
    runs = sorted(p for p in out.glob(f"{mode}-*") if p.is_dir())
    for old in runs[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
