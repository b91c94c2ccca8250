"""One pass of the lifecycle over the fleet: read each node's state, readings and incidents from
the store and its Slurm state, decide with the pure machine, then, under the store's lock, record
each decision and carry out its actions.

Order matters for what can go wrong:
- The lock first: two controllers at once (a systemd timer and an operator, or two hosts) see
  one of them act; the other reports who holds it and does nothing. A lock whose holder was a
  controller of this host that no longer runs is taken over, and the pass says so.
- A node's new state and the event that says why are written *before* its action runs. A store
  that cannot take them stops the pass there: no drain, reset or reboot happens that the store
  could not remember, and the pass says so. The action's outcome is written after it.
- The breaker counts preflight's drains across runs in a window (every command's: drain,
  healthcheck, lifecycle), not only within this pass, and refuses the drains beyond it.
- ``dry_run`` decides the same and records and does nothing.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from preflight.lifecycle.machine import (
    Action,
    Evidence,
    LifeState,
    Policy,
    Reading,
    Scheduler,
    Step,
    StepOutcome,
    retest_not_run,
    transition,
)
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
    waiting: str | None = None  # what the step needs that this controller lacks (a way onto the node)
    captures: tuple[dict, ...] = ()  # the evidence kept before a step (capture.Capture.record())


@dataclass
class Pass:
    outcomes: list[Outcome] = field(default_factory=list)
    lock_holder: str | None = None  # set when another controller holds the lock
    took_over: str | None = None  # the holder of a lock left by a controller of this host that is gone
    stopped: str | None = None  # the store failed mid-way: nothing after this was done

    @property
    def acted(self) -> bool:
        return any(o.done for o in self.outcomes)


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _gone(holder: str) -> bool:
    """Whether ``holder`` names a controller of this host whose process no longer runs."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


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
    # A step's outcome within the window: a returned one is not tried again (docs/lifecycle.md).
    done = kept.outcomes(store, now - window)
    names = sorted(set(nodes) if nodes is not None else set(readings) | set(states))
    out = []
    for node in names:
        state = _state_of(states.get(node), node)
        ev = Evidence(tuple(Reading(*r) for r in readings.get(node, ()) if r[1] >= state.since), now,
                      scheduler.get(node) if scheduler is not None else None, dict(incidents.get(node, {})),
                      tuple(StepOutcome(o["cause"], o["step"], o["outcome"], o["step_at"], o["why"], o["reading"],
                                        o["at"]) for o in done.get(node, ())))
        out.append((state, transition(state, ev, policy)))
    return out


@dataclass
class Breaker:
    """At most ``limit`` nodes drained by preflight in the window, across runs and commands. It
    counts nodes, not drains: a node drained again (its fault back after a resume) widens
    nothing, and a mass drain is what it is there to stop."""

    limit: int
    drained: set[str]

    def allows(self, node: str) -> bool:
        return node in self.drained or len(self.drained) < self.limit

    def took(self, node: str) -> None:
        self.drained.add(node)


def _breaker(store: Store, timings: Mapping, now: float, known: int) -> Breaker:
    limit = int(timings.get("breaker_drains", 10))
    share = float(timings.get("breaker_fraction", 0.1))
    if known:
        limit = min(limit, max(1, math.floor(share * known)))
    return Breaker(limit, kept.drained_since(store, now - float(timings.get("breaker_window_s", 3600))))


def _row(s: LifeState) -> dict:
    return {"node": s.node, "state": s.state, "since": s.since, "cause": s.cause, "run_id": s.run_id, "step": s.step,
            "requested": s.requested, "retest_failures": s.retest_failures}


# A node may take several steps in one pass when each is done at once: drained -> remediating
# (a reset returns) -> retesting -> the retest -> resumed. A reboot, a grace or a busy node ends
# the chain; it goes on in a later pass.
MAX_STEPS_PER_PASS = 5


def _feasible(step: Step, before: LifeState, effects) -> tuple[Step, str | None]:
    """The step cut to what the effects can do (a reset or a retest needs a way onto the node):
    one that cannot be carried out is not taken, nor recorded as an event every pass; the node
    waits where it is, and the pass says what it lacks."""
    can = getattr(effects, "can", None)
    if can is None or not step.actions:
        return step, None
    missing = [a for a in step.actions if not can(a)]
    if not missing:
        return step, None
    why = "; ".join(dict.fromkeys(getattr(effects, "lacks", lambda a: f"no way to {a.kind} from here")(a)
                                  for a in missing))
    return Step(before, (), f"{step.why}: not taken: {why}"), why


def run_pass(store: Store, policy: Policy, timings: Mapping, now: float, effects: Callable[[Action], str | None],
             actor: str, nodes: list[str] | None = None, scheduler: Mapping[str, Scheduler] | None = None,
             dry_run: bool = False, holder: str | None = None, clock: Callable[[], float] | None = None) -> Pass:
    """Decide every node's step and carry it out. ``effects(action)`` runs one action and
    returns a complaint (Slurm's refusal, a command's error) or None; ``effects.can(action)``,
    where given, says whether it can; ``effects.view(node)``, the node's scheduler state again
    after a step. ``clock`` stamps the steps after the first of a node (default: ``now``)."""
    result = Pass()
    holder = holder or holder_name()
    clock = clock or (lambda: now)
    longest = float(getattr(effects, "longest_s", 0.0))
    capture_s = float(getattr(effects, "capture_s", 0.0))
    if not dry_run and not kept.take_lock(store, LOCK, holder, LOCK_TTL_S, now):
        found = kept.lock_holder(store, LOCK)
        if found and _gone(found[0]):
            # Its controller died holding it (killed, or its store went away under it): a lock
            # it cannot release would otherwise stop every pass until it expires.
            kept.drop_lock(store, LOCK, found[0])
            result.took_over = found[0]
        if not result.took_over or not kept.take_lock(store, LOCK, holder, LOCK_TTL_S, now):
            found = kept.lock_holder(store, LOCK)
            result.lock_holder = found[0] if found else "another controller"
            return result
    try:
        decided = decide(store, policy, timings, now, nodes, scheduler)
        room = _breaker(store, timings, now, len(decided))
        for before, step in decided:
            at = now  # the time of the step decided: its transition, its actions and their events share it
            for _ in range(MAX_STEPS_PER_PASS):
                step, lacking = _feasible(step, before, effects)
                if lacking:
                    result.outcomes.append(Outcome(before.node, step, waiting=lacking))
                    break
                outcome = _carry(store, before, step, effects, actor, room, dry_run, holder, longest, at, capture_s)
                result.outcomes.append(outcome)
                if outcome.refused and outcome.refused.startswith(STOPPED):
                    result.stopped = outcome.refused[len(STOPPED):]
                    return result
                if dry_run or outcome.refused or not _goes_on(outcome):
                    break
                view = getattr(effects, "view", None)
                sched = dict(scheduler or {})
                if view is not None and scheduler is not None:
                    sched[before.node] = view(before.node)
                try:
                    at = clock()
                    [(before, step)] = decide(store, policy, timings, at, [before.node],
                                              sched if scheduler is not None else None)
                except StoreError as exc:
                    result.stopped = f"the store could not be read after {before.node}'s step, so nothing more was " \
                                     f"done: {exc}"
                    return result
    finally:
        if not dry_run:
            try:
                kept.drop_lock(store, LOCK, holder)
            except StoreError:
                pass  # it expires on its own after its ttl
    return result


STOPPED = "stopped: "


def _goes_on(o: Outcome) -> bool:
    progressed = bool(o.done) or o.step.why.startswith("->")
    return progressed and (o.step.state.state in ("remediating", "retesting")
                             or any(line.startswith("retest ") for line in o.done))


def _carry(store: Store, before: LifeState, step: Step, effects, actor: str, room: Breaker, dry_run: bool,
           holder: str, longest: float, now: float, capture_s: float = 0.0) -> Outcome:
    """One node's step: recorded, then carried out, its outcome recorded. A refusal starting
    with STOPPED means the store failed and the pass must end. Before a reset, a restart or a
    reboot, the node's state is captured (``effects.capture``) and the capture recorded, whatever
    it came to: it is bounded by its own limit and never stops the step."""
    if not step.moved:
        return Outcome(before.node, step)
    drains = [a for a in step.actions if a.kind == "drain" and not (a.detail.get("rma") or a.detail.get("person"))]
    if drains and not room.allows(before.node):
        return Outcome(before.node, step, refused="the breaker: too many drains in its window (docs/lifecycle.md); "
                                                  "the node keeps its state")
    if dry_run:
        return Outcome(before.node, step)
    moves = step.state != before
    event = {"kind": "transition", "actor": actor, "reason": step.why, "run_id": step.state.run_id,
             "at": now, "detail": {"from": before.state, "to": step.state.state,
                                   "actions": [a.kind for a in step.actions]}}
    try:
        # A long action (a retest, a step's capture) keeps the lock for as long as it may take; the
        # rest, 5 minutes.
        long = any(a.kind == "retest" for a in step.actions)
        captured = any(a.kind in CAPTURED for a in step.actions)
        kept.take_lock(store, LOCK, holder, LOCK_TTL_S + (longest if long else 0.0) + (capture_s if captured else 0.0),
                       now)
        if moves:
            kept.put_state(store, _row(step.state), event, tuple(_outcome_event(o, actor, now) for o in step.outcomes))
        actions = [_with_store(store, a) for a in step.actions]
    except StoreError as exc:
        return Outcome(before.node, step, refused=f"{STOPPED}the store did not take {before.node}'s step, so "
                                                  f"nothing more was done: {exc}")
    if drains:
        room.took(before.node)
    done: list[str] = []
    captures: list[dict] = []
    acts = getattr(effects, "acts", True)
    take = getattr(effects, "capture", None)
    for action in actions:
        line = f"{action.kind} {action.node}" + (f" ({action.reason})" if action.reason else "")
        if not acts:
            kind, line = f"for-a-person:{action.kind}", f"for a person: {line}"
        else:
            if take is not None and action.kind in CAPTURED:
                got = take(action, now)
                if got is not None:
                    record = {**got.record(), "step_at": step.state.requested}
                    captures.append(record)
                    try:
                        store.add_event(action.node, CAPTURE, actor, _capture_line(record), step.state.run_id,
                                        at=now, detail=json.dumps(record))
                    except StoreError:
                        # The step is recorded already (remediating), and the capture is on disk with
                        # its capture.json: the step goes on; a store still down stops the pass when
                        # the step's own event cannot be written, below.
                        record["recorded"] = False
            complaint = effects(action)
            if complaint and action.kind == "retest" and step.state.state == "retesting":
                # No reading will come of it: the step's outcome is ambiguous, a person's now, rather
                # than the retest asked again every pass until the step's timeout.
                after = retest_not_run(step.state, complaint, now)
                got = _carry(store, step.state, after, effects, actor, room, dry_run, holder, longest, now, capture_s)
                return replace(got, done=(*done, *got.done))
            if complaint:
                refused = f"{action.kind} refused: {complaint}"
                if moves:
                    # The step did not happen: the node goes back to where it was, and says why.
                    try:
                        kept.put_state(store, _row(before), {**event, "kind": "refused", "reason": refused,
                                                             "detail": {"from": step.state.state, "to": before.state}})
                    except StoreError as exc:
                        refused += f"; and the store did not take the way back: {exc}"
                return Outcome(before.node, step, tuple(done), refused, captures=tuple(captures))
            kind = action.kind
        done.append(line)
        try:
            store.add_event(action.node, kind, actor, action.reason, step.state.run_id, at=now,
                            detail=json.dumps({k: action.detail[k] for k in ("run", "checks") if k in action.detail}))
        except StoreError as exc:
            return Outcome(before.node, step, tuple(done), f"{STOPPED}{action.kind} done but not recorded: {exc}",
                           captures=tuple(captures))
    return Outcome(before.node, step, tuple(done), captures=tuple(captures))


CAPTURE = "capture"  # the event of the evidence kept before a step (docs/contracts.md)
CAPTURED = ("reset", "restart", "reboot")


def _capture_line(record: dict) -> str:
    where = f" in {record['directory']}" if record.get("directory") and record.get("bytes") else ""
    why = f": {record['why']}" if record.get("why") else ""
    return (f"before the {record['step']}: {record['outcome']}, {record['bytes']} bytes in {record['seconds']:g} s"
            f"{where}{why}")[:500]


def _outcome_event(o: StepOutcome, actor: str, now: float) -> dict:
    return {"kind": kept.OUTCOME, "actor": actor, "at": now, "run_id": o.reading,
            "reason": f"{o.step} for {o.cause}: {o.outcome}: {o.why}",
            "detail": {"cause": o.cause, "step": o.step, "outcome": o.outcome, "step_at": o.step_at,
                       "reading": o.reading}}


def _with_store(store: Store, action: Action) -> Action:
    """A retest names the checks that blamed the node (its run's failing ones) and the run it
    will be, so the event can say which run answered it."""
    if action.kind != "retest":
        return action
    blamed = kept.blamed_checks(store, action.node, action.detail.get("run_id"))
    checks = sorted(set(blamed) | set(action.detail.get("acceptance", ())))
    # To the millisecond: two retests of one node in a second (a reset's chain) are two runs.
    ns = time.time_ns()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(ns / 1e9)) + f".{ns // 1_000_000 % 1000:03d}"
    return replace(action, detail={**action.detail, "checks": checks, "run": f"retest-{action.node}-{stamp}"})
