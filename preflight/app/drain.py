"""``preflight drain RUN`` and ``preflight resume RUN``: a run's verdicts carried into Slurm.

``drain`` takes the run's diagnoses (``report.json``), keeps those at or above
``--min-confidence`` that blame a node's own hardware or setup, and drains each node they name
with ``Reason="preflight: <cause> <run-id>: <action>"``. Diagnoses that say nothing about the node
itself (it could not be reached, a tool is missing, the run stopped) never drain. A node drained
by someone else keeps their drain; a node already drained by preflight is left as it is.

A circuit breaker refuses the whole drain, and drains nothing, when it would take more than
``--max-fraction`` of the run's nodes (default 10 %) or more than ``--max-nodes``: a mass failure
is far more often the tool, the fabric or a shared configuration than many broken nodes at
once, and draining half a cluster on such a verdict is the outage this tool exists to prevent.

``resume`` resumes the nodes of a run that passed (or warned) whose current drain is preflight's
(its reason starts with ``preflight:``); any other drain is never touched.

The planning is pure (``plan_drain``, ``plan_resume``: the report and the nodes' states in, the
actions out), so ``--dry-run`` prints exactly what would be done.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from preflight.collect.slurm_job import node_states, set_state
from preflight.contracts import DRAIN_REASON_PREFIX
from preflight.parse.slurm import NodeState

CONFIDENCE = ("high", "medium", "low")
# Causes that are about reaching or running on the node, not about the node: never a drain.
NOT_THE_NODE = frozenset({"host-unreachable", "slurm-node-unavailable", "run-incomplete", "tool-missing",
                          "fabric-path-slow"})  # the link between two nodes (preflight fabric), neither node
REASON_MAX = 200  # Slurm keeps long reasons, but sinfo -R and the logs cut them


class DrainInputError(ValueError):
    """The run cannot be read; the message names the file and what is wrong."""


@dataclass(frozen=True)
class NodeAction:
    node: str
    kind: str  # "drain", "resume" or "none"
    reason: str | None = None
    why: str = ""


@dataclass
class Plan:
    actions: list[NodeAction] = field(default_factory=list)
    refused: str | None = None  # the breaker's reason; when set, nothing is done

    def doing(self, kind: str) -> list[NodeAction]:
        return [] if self.refused else [a for a in self.actions if a.kind == kind]


def read_report(run: Path) -> dict:
    """``report.json`` of a run directory (or the file itself)."""
    if not run.exists():
        raise DrainInputError(f"{run}: no such run directory (reports/<run-id>) or report.json")
    path = run / "report.json" if run.is_dir() else run
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise DrainInputError(f"{path}: no such file (a run directory of preflight run holds report.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DrainInputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(report, dict) or report.get("format") != "preflight-report/1" \
            or not isinstance(report.get("hosts"), dict) or not isinstance(report.get("diagnoses"), list):
        raise DrainInputError(f"{path}: not a preflight-report/1 report (format, hosts, diagnoses)")
    return report


def _theirs(state: NodeState | None) -> str | None:
    """The reason of a drain someone else set, else None."""
    if state is None or "DRAIN" not in state.flags:
        return None
    reason = state.reason or ""
    return None if reason.startswith(DRAIN_REASON_PREFIX) else (reason or "no reason given")


def blamed(report: dict, min_confidence: str = "high") -> dict[str, dict]:
    """Node -> the diagnosis that blames it: at or above ``min_confidence``, about the node itself."""
    allowed = CONFIDENCE[: CONFIDENCE.index(min_confidence) + 1]
    out: dict[str, dict] = {}
    for d in report["diagnoses"]:
        if d.get("confidence") in allowed and d.get("cause") not in NOT_THE_NODE:
            for host in d.get("hosts") or ():
                out.setdefault(host, d)  # diagnoses come strongest first: the first names the cause
    return out


def plan_drain(report: dict, states: dict[str, NodeState], run_id: str, min_confidence: str = "high",
               max_fraction: float = 0.1, max_nodes: int | None = None) -> Plan:
    plan = Plan()
    for node, d in sorted(blamed(report, min_confidence).items()):
        state = states.get(node)
        if state is None:
            plan.actions.append(NodeAction(node, "none", why="not a node Slurm knows"))
        elif (theirs := _theirs(state)) is not None:
            plan.actions.append(NodeAction(node, "none", why=f"drained by someone else ({theirs}): left as it is"))
        elif "DRAIN" in state.flags:
            plan.actions.append(NodeAction(node, "none", why=f"already drained by preflight ({state.reason})"))
        else:
            reason = f"{DRAIN_REASON_PREFIX} {d['cause']} {run_id}: {d.get('action') or ''}".strip().rstrip(":")
            plan.actions.append(NodeAction(node, "drain", reason[:REASON_MAX], f"{d['cause']} ({d['confidence']})"))
    drains, total = len(plan.doing("drain")), len(report["hosts"])
    limit = math.floor(max_fraction * total)
    if max_nodes is not None:
        limit = min(limit, max_nodes)
    if drains > limit:
        plan.refused = (f"would drain {drains} of the run's {total} nodes, more than the breaker allows ({limit}: "
                        f"--max-fraction {max_fraction:g}" + (f", --max-nodes {max_nodes}" if max_nodes is not None
                                                              else "") +
                        "); so many failing at once points at the fabric, a shared configuration or the run "
                        "itself: look at the diagnoses first, or raise the limit to drain anyway")
    return plan


def plan_resume(report: dict, states: dict[str, NodeState]) -> Plan:
    plan = Plan()
    for node, verdict in sorted(report["hosts"].items()):
        state = states.get(node)
        if state is None or "DRAIN" not in state.flags:
            continue
        if _theirs(state) is not None:
            plan.actions.append(NodeAction(node, "none", why=f"drained by someone else ({state.reason}): "
                                                             "left as it is"))
        elif verdict.get("status") in ("pass", "warn"):
            plan.actions.append(NodeAction(node, "resume", why=f"passes in this run; the drain was preflight's "
                                                               f"({state.reason})"))
        else:
            plan.actions.append(NodeAction(node, "none", why=f"still {verdict.get('status')} in this run"))
    return plan


def carry_out(plan: Plan) -> list[str]:
    """Apply a plan through scontrol; returns Slurm's complaints, one per node it refused."""
    complaints = []
    for a in plan.doing("drain") + plan.doing("resume"):
        said = set_state(a.node, "DRAIN" if a.kind == "drain" else "RESUME", a.reason)
        if said:
            complaints.append(f"{a.node}: {said}")
    return complaints


def states_of(nodes) -> dict[str, NodeState]:
    """Slurm's view of ``nodes``; raises ``SlurmUsageError`` (exit 2) for a node it does not know."""
    return node_states(sorted(nodes)) if nodes else {}
