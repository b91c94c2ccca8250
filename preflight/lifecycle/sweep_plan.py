"""One sweep pass's decision, pure: the nodes' Slurm states, the sweeps in flight and each node's
last finished sweep in; the nodes to submit a sweep job on (and why each other node is left) out.

A node is swept only when it is idle (Slurm's IDLE with no flag: not drained, reserved,
completing, powered down or not responding), has no sweep in flight, and is due (its period has
passed since its last finished sweep; never swept: due). At most ``max_share`` of the nodes that
are idle or under a sweep are under one at once (at least one node, so a small partition is
swept too; 0 stops sweeping). The most overdue go first."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from preflight.lifecycle.sweep_policy import SweepPolicy
from preflight.parse.slurm import NodeState

RUN_PREFIX = "sweep-"


@dataclass(frozen=True)
class SweepPlan:
    submit: tuple[str, ...]  # nodes, most overdue first
    left: dict[str, str]  # node -> why not this pass
    capacity: int  # nodes allowed under a sweep at once
    in_flight: int


def idle(state: NodeState) -> bool:
    return state.base == "IDLE" and not state.flags


def plan(states: Mapping[str, NodeState], in_flight: Mapping[str, object], last_done: Mapping[str, float],
         policy: SweepPolicy, now: float) -> SweepPlan:
    left: dict[str, str] = {}
    due: list[tuple[float, str]] = []
    for node, state in sorted(states.items()):
        if node in in_flight:
            left[node] = "a sweep is in flight"
        elif not idle(state):
            left[node] = f"not idle ({state.state})"
        else:
            last = last_done.get(node)
            next_at = -math.inf if last is None else last + policy.period_of(node)
            if next_at > now:
                left[node] = f"not due for {(next_at - now) / 3600:.1f} h"
            else:
                due.append((next_at, node))
    flying = sum(1 for n in in_flight if n in states)
    pool = flying + sum(1 for n, s in states.items() if idle(s) and n not in in_flight)
    capacity = 0 if policy.max_share <= 0 or not pool else max(1, math.floor(policy.max_share * pool))
    room = max(0, capacity - flying)
    due.sort()
    submit = tuple(node for _, node in due[:room])
    for _, node in due[room:]:
        left[node] = f"due, but {capacity} node(s) at most under a sweep at once (max_share)"
    return SweepPlan(submit, left, capacity, flying)


def run_id(node: str, now: float) -> str:
    """``sweep-NODE-YYYYmmddTHHMMSS.mmm``: the sweep's run in the store; the stamp has no '-', so
    the node is what lies between the prefix and the last '-'."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}"
    return f"{RUN_PREFIX}{node}-{stamp}"


def node_of(run: str) -> str | None:
    if not run.startswith(RUN_PREFIX) or "-" not in run[len(RUN_PREFIX):]:
        return None
    return run[len(RUN_PREFIX):].rsplit("-", 1)[0]
