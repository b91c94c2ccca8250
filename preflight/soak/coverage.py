"""Did the soak run as planned? Each host's covered time against soak.json's plan, and its agent's outcome.

A soak is evidence for as long as it ran: a "1 hour" soak whose agent was killed after 24 s
says nothing about minute 15, where the thermal cliff shows. So before the figures are judged
``soak-telemetry`` asks this module, per host, whether the soak is complete:

- the agent's outcome, where soak.json records one (``agents``: the controller's ``finished``,
  ``failed``, ``died``, ``stalled``, ``unreachable``, ``not started``, ``no soak``, and under
  Slurm ``killed``: its step was cancelled, e.g. at its time limit), or the host
  being listed under ``missing``: anything but ``finished`` is an ERROR (``soak-incomplete``)
  with the controller's note;
- the covered time (the span of the host's telemetry, or of its throughput windows on a host
  excused from GPU telemetry) against ``planned_s``: short by more than the tolerance,
  ``max(coverage_shortfall x planned, coverage_min_intervals x interval)`` (5 % of the plan,
  at least two sampling intervals), is an ERROR too. Sampling starts with the agent and the
  load is timed from when it runs, so a complete soak covers at least its plan; the tolerance
  absorbs the last interval's rounding and a stop signal's latency.

Coverage is judged per GPU too (``late_gpus``): a GPU first sampled well into the soak (hot
plug, a reset, a driver that came back) was not soaked for the time before, whatever its host's
other GPUs cover, so a GPU whose own span, from its first sample to its host's last, falls short
of the plan (or, without one, of its host's span) by more than the tolerance is the same ERROR,
naming the GPU. A GPU that stops reporting early is ``gpu-fallen-off-bus`` (gpu_verdicts.py),
not this.

ERROR, not FAIL: an incomplete soak means preflight could not tell whether the node holds up,
which is different from having seen it fail. A soak directory with no ``planned_s`` (telemetry
assembled from a DCGM dump) is judged on what it holds, and the summary says no plan was given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from preflight.check import Outcome
from preflight.contracts import SOAK_JSON
from preflight.model import Status
from preflight.soak import fmt
from preflight.soak.figures import GpuSummary, Thresholds

INCOMPLETE = "soak-incomplete"
FINISHED = "finished"


@dataclass(frozen=True)
class Plan:
    """What soak.json says the soak was meant to be, read defensively (it may be hand-made)."""

    planned_s: float | None
    interval_s: float | None
    agents: Mapping[str, Mapping[str, Any]]
    missing: Mapping[str, str]


def plan_of(extra: Mapping[str, Any] | None) -> Plan:
    extra = extra or {}
    agents = extra.get("agents")
    missing = extra.get("missing")
    return Plan(_positive(extra.get("planned_s")), _positive(extra.get("interval_s")),
                {str(h): a for h, a in agents.items() if isinstance(a, Mapping)} if isinstance(agents, Mapping) else {},
                {str(h): str(w) for h, w in missing.items()} if isinstance(missing, Mapping) else {})


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def tolerance_s(plan: Plan, th: Thresholds) -> float:
    """How much shorter than planned a soak may be and still count as covering its plan."""
    return max(th.coverage_shortfall * (plan.planned_s or 0.0), th.coverage_min_intervals * (plan.interval_s or 0.0))


def covered_text(covered_s: float, plan: Plan) -> str:
    if plan.planned_s is None:
        return f"covered {fmt.duration(covered_s)} ({SOAK_JSON} gives no planned length)"
    return f"covered {fmt.duration(covered_s)} of the planned {fmt.duration(plan.planned_s)}"


def incomplete(host: str, covered_s: float, plan: Plan, th: Thresholds, stepped_back_s: float = 0.0) -> Outcome | None:
    """The ERROR for a host whose soak did not run as planned, or None when it did.
    ``stepped_back_s``: the largest step back of the host's clock (order.py); a span measured
    across one is shorter than the time that passed, and the verdict says so."""
    data = {"covered_s": round(covered_s, 2), "planned_s": plan.planned_s}
    agent = plan.agents.get(host)
    outcome = None if agent is None else agent.get("outcome")
    if host in plan.missing and outcome in (None, FINISHED):
        outcome = plan.missing[host] or "missing"
    if outcome is not None and outcome != FINISHED:
        note = (agent or {}).get("note") or plan.missing.get(host)
        data["agent"] = str(outcome)
        return Outcome(Status.ERROR, f"soak incomplete: agent {outcome}" + (f" ({note})" if note else "")
                       + f"; {covered_text(covered_s, plan)}: not a pass", (INCOMPLETE,), data=data, host=host)
    if plan.planned_s is not None and covered_s < plan.planned_s - tolerance_s(plan, th):
        share = covered_s / plan.planned_s
        clock = (f"; the node's clock went back {fmt.duration(stepped_back_s)} during the soak, so the span of "
                 "its samples may understate the time it ran" if stepped_back_s > 0 else "")
        return Outcome(Status.ERROR, f"soak incomplete: {covered_text(covered_s, plan)} ({share:.0%}; "
                       f"a soak short of its plan by more than {fmt.duration(tolerance_s(plan, th))} is not a pass)"
                       + clock, (INCOMPLETE,), data=data, host=host)
    return None


def late_gpus(host: str, gpus: Sequence[GpuSummary], plan: Plan, th: Thresholds) -> Outcome | None:
    """The ERROR for a host with a GPU that joined the soak too late to cover it (see above)."""
    if not gpus:
        return None
    start, end = min(g.first_t for g in gpus), max(g.last_t for g in gpus)
    wanted = plan.planned_s if plan.planned_s is not None else end - start
    interval = min((g.interval_s for g in gpus if g.interval_s > 0), default=0.0)
    tolerance = max(th.coverage_shortfall * wanted, th.coverage_min_intervals * (plan.interval_s or interval))
    short = [(g, end - g.first_t) for g in gpus if end - g.first_t < wanted - tolerance]
    if not short:
        return None
    what = (f"of the planned {fmt.duration(wanted)}" if plan.planned_s is not None
            else f"of its host's {fmt.duration(wanted)}")
    parts = [f"GPU {g.gpu} first sampled at +{fmt.duration(g.first_t - start)}, so it covered "
             f"{fmt.duration(covered)} {what}" for g, covered in short]
    data = {"gpus_incomplete": {str(g.gpu): round(covered, 2) for g, covered in short}, "planned_s": plan.planned_s}
    return Outcome(Status.ERROR, "soak incomplete on a GPU: " + "; ".join(parts)
                   + f" (a GPU short of the soak by more than {fmt.duration(tolerance)} is not soaked: not a pass)",
                   (INCOMPLETE,), data=data, host=host)
