"""One pass of the lifecycle over the fleet: read each node's state, readings and incidents from
the store and its Slurm state, decide with the pure machine, then, under the store's lock, record
each decision and carry out its actions.

Order matters for what can go wrong:
- The lock first: two controllers at once (a systemd timer and an operator, or two hosts) see
  one of them act; the other reports who holds it and does nothing.
- A node's new state and the event that says why are written *before* its action runs. A store
  that cannot take them stops the pass there: no drain, reset or reboot happens that the store
  could not remember, and the pass says so. The action's outcome is written after it.
- The breaker counts preflight's drains across runs in a window (every command's: drain,
  healthcheck, lifecycle), not only within this pass, and refuses the drains beyond it.
- ``dry_run`` decides the same and records and does nothing.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from preflight.lifecycle.machine import Action, Evidence, LifeState, Policy, Reading, Scheduler, Step, transition
from preflight.store import StoreError
from preflight.store import lifecycle as kept
from preflight.store.db import Store

LOCK = "lifecycle"
LOCK_TTL_S = 300.0


@dataclass(frozen=True)
class Outcome:
    node: str
    step: Step
    done: tuple[str, ...] = ()  # what was carried out, one line per action
    refused: str | None = None  # why the step was not taken (breaker, a store that failed, an effect refused)


@dataclass
class Pass:
    outcomes: list[Outcome] = field(default_factory=list)
    lock_holder: str | None = None  # set when another controller holds the lock
    stopped: str | None = None  # the store failed mid-way: nothing after this was done

    @property
    def acted(self) -> bool:
        return any(o.done for o in self.outcomes)


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _state_of(row: dict | None, node: str) -> LifeState:
    if row is None:
        return LifeState(node)
    return LifeState(node, row["state"], row["since"], row["cause"], row["run_id"], row["step"], row["requested"],
                     int(row["retest_failures"] or 0))


def decide(store: Store, policy: Policy, timings: Mapping, now: float, nodes: list[str] | None = None,
           scheduler: Mapping[str, Scheduler] | None = None) -> list[tuple[LifeState, Step]]:
    """Every node's next step; reads the store, changes nothing."""
    window = float(timings.get("escalate_window_s", 7 * 86400))
    states = kept.node_states(store)
    readings = kept.readings(store, now - window)
    incidents = kept.incidents(store, now - window)
    names = sorted(set(nodes) if nodes is not None else set(readings) | set(states))
    out = []
    for node in names:
        state = _state_of(states.get(node), node)
        ev = Evidence(tuple(Reading(*r) for r in readings.get(node, ()) if r[1] >= state.since), now,
                      scheduler.get(node) if scheduler is not None else None, dict(incidents.get(node, {})))
        out.append((state, transition(state, ev, policy)))
    return out


def _breaker_room(store: Store, timings: Mapping, now: float, known: int) -> int:
    limit = int(timings.get("breaker_drains", 10))
    share = float(timings.get("breaker_fraction", 0.1))
    if known:
        limit = min(limit, max(1, math.floor(share * known)))
    used = kept.drains_since(store, now - float(timings.get("breaker_window_s", 3600)))
    return max(0, limit - used)


def _row(s: LifeState) -> dict:
    return {"node": s.node, "state": s.state, "since": s.since, "cause": s.cause, "run_id": s.run_id, "step": s.step,
            "requested": s.requested, "retest_failures": s.retest_failures}


def run_pass(store: Store, policy: Policy, timings: Mapping, now: float, effects: Callable[[Action], str | None],
             actor: str, nodes: list[str] | None = None, scheduler: Mapping[str, Scheduler] | None = None,
             dry_run: bool = False, holder: str | None = None) -> Pass:
    """Decide every node's step and carry it out. ``effects(action)`` runs one action and
    returns a complaint (Slurm's refusal, a command's error) or None."""
    result = Pass()
    holder = holder or holder_name()
    if not dry_run and not kept.take_lock(store, LOCK, holder, LOCK_TTL_S, now):
        found = kept.lock_holder(store, LOCK)
        result.lock_holder = found[0] if found else "another controller"
        return result
    try:
        decided = decide(store, policy, timings, now, nodes, scheduler)
        room = _breaker_room(store, timings, now, len(decided))
        for before, step in decided:
            if not step.moved:
                result.outcomes.append(Outcome(before.node, step))
                continue
            drains = [a for a in step.actions if a.kind == "drain" and not a.detail.get("rma")]
            if drains and room <= 0:
                result.outcomes.append(Outcome(before.node, step, refused="the breaker: too many drains in its "
                                               "window (docs/lifecycle.md); the node keeps its state"))
                continue
            if dry_run:
                result.outcomes.append(Outcome(before.node, step))
                continue
            event = {"kind": "transition", "actor": actor, "reason": step.why, "run_id": step.state.run_id,
                     "at": now, "detail": {"from": before.state, "to": step.state.state,
                                           "actions": [a.kind for a in step.actions]}}
            try:
                kept.put_state(store, _row(step.state), event)
            except StoreError as exc:
                result.stopped = f"the store did not take {before.node}'s step, so nothing more was done: {exc}"
                result.outcomes.append(Outcome(before.node, step, refused=result.stopped))
                break
            room -= len(drains)
            done, refused = [], None
            acts = getattr(effects, "acts", True)
            for action in step.actions:
                if not acts:
                    done.append(f"for a person: {action.kind} {action.node}" + (f" ({action.reason})" if action.reason
                                                                                 else ""))
                    try:
                        store.add_event(action.node, f"for-a-person:{action.kind}", actor, action.reason,
                                        step.state.run_id, at=now)
                    except StoreError as exc:
                        refused = f"not recorded: {exc}"
                        break
                    continue
                complaint = effects(action)
                if complaint:
                    refused = f"{action.kind} refused: {complaint}"
                    # The step did not happen: the node goes back to where it was, and says why.
                    try:
                        kept.put_state(store, _row(before), {**event, "kind": "refused", "reason": refused,
                                                             "detail": {"from": step.state.state, "to": before.state}})
                    except StoreError as exc:
                        refused += f"; and the store did not take the way back: {exc}"
                    break
                done.append(f"{action.kind} {action.node}" + (f" ({action.reason})" if action.reason else ""))
                try:
                    store.add_event(action.node, action.kind, actor, action.reason, step.state.run_id, at=now)
                except StoreError as exc:
                    refused = f"{action.kind} done but not recorded: {exc}"
                    break
            result.outcomes.append(Outcome(before.node, step, tuple(done), refused))
    finally:
        if not dry_run:
            try:
                kept.drop_lock(store, LOCK, holder)
            except StoreError:
                pass  # it expires on its own after LOCK_TTL_S
    return result
