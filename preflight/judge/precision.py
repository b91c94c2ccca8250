"""How often preflight is wrong, from what the store remembers: each drain's outcome, read from
the node's events (docs/lifecycle.md, "How often preflight is wrong"). Pure functions over
event lists; the store's reads that feed them are ``preflight.store.precision``'s.

Every command that drains records it the same way (``drain``, ``healthcheck``, ``lifecycle``):
an event of kind ``drain`` (``for-a-person:drain`` where the lifecycle has no scheduler to act
through) whose reason starts with ``preflight:`` and names the cause. A drain is then followed
by what the lifecycle did and saw (its ``transition`` events, its steps ``reset``, ``restart``,
``reboot``), until a ``resume`` or a person's ``lifecycle NODE --clear`` ends it.

One small function per definition (``escalated``, ``retest_failed``, ``step_taken``,
``returned``). Where the lifecycle typed its steps' outcomes (an ``outcome`` event: cleared,
returned, ambiguous; docs/lifecycle.md "Remediation outcomes"), those say what a step came to;
a store written before they existed is read from the transitions, as it was.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

DRAIN_KINDS = ("drain", "for-a-person:drain")
RESUME_KINDS = ("resume", "for-a-person:resume")
STEP_KINDS = ("reset", "restart", "reboot")  # the lifecycle records one only once it was carried out
OUTCOME_KIND = "outcome"  # a step's typed outcome, detail {cause, step, outcome, step_at, reading}
# An escalation for a person to decide (an ambiguous outcome) asks no RMA: it confirms nothing.
# lifecycle.machine words its reasons so ("...: a person decides"); the judge layer reads text.
_FOR_A_PERSON = "a person decides"
# The reason a person's `preflight lifecycle NODE --clear` records (app/lifecycle_cli.py writes it).
CLEARED = "-> healthy: cleared by a person"
RETURNS_WITHIN_S = 7 * 86400.0
# What a drain turned out to be; they partition the drains.
CONFIRMED, UNCONFIRMED, OPEN, PENDING, CLEARED_BY_PERSON = "confirmed", "unconfirmed", "open", "pending", "cleared"
OUTCOMES = (CONFIRMED, UNCONFIRMED, OPEN, PENDING, CLEARED_BY_PERSON)
# Why a drain counts as confirmed, strongest evidence first.
BECAUSE = ("escalated", "retest_failed", "step", "returned")
_PREFIX = "preflight:"
_STATE_WORDS = ("drained", "escalated")  # the lifecycle's reasons: "preflight: drained CAUSE RUN"


class Event(NamedTuple):
    """One row of ``pf_events`` as the definitions need it (a tuple: a year of a fleet's drains
    is tens of thousands of them, built in one pass)."""

    at: float
    kind: str
    reason: str = ""
    run_id: str | None = None
    detail: dict | None = None


@dataclass(frozen=True)
class Drain:
    """A node drained by preflight, from its drain to the resume or clear that ended it (None:
    still drained at the end of what the store holds)."""

    node: str
    cause: str
    at: float
    run_id: str | None
    events: tuple[Event, ...]  # the drain's own event first, then every event until it ended, that one included
    ended_by: str | None = None  # "resume" | "clear" | None
    ended_at: float | None = None


@dataclass(frozen=True)
class Outcome:
    drain: Drain
    outcome: str  # one of OUTCOMES
    because: str | None = None  # for a confirmed drain: one of BECAUSE


def cause_of(reason: str) -> str:
    """The cause a drain reason names: ``preflight: CAUSE RUN`` (healthcheck), ``preflight:
    CAUSE RUN: ACTION`` (drain), ``preflight: drained CAUSE RUN`` or ``preflight: escalated CAUSE
    RUN: RMA ...`` (lifecycle). docs/contracts.md fixes the prefix; "unknown" for anything else."""
    if not reason.startswith(_PREFIX):
        return "unknown"
    words = reason[len(_PREFIX):].split()
    if len(words) >= 2 and words[0] in _STATE_WORDS:
        words = words[1:]
    return words[0].rstrip(":") if words and words[0].rstrip(":") else "unknown"


def _is_escalation(e: Event) -> bool:
    return ((e.kind in DRAIN_KINDS and e.reason.startswith(f"{_PREFIX} escalated "))
            or (e.kind == "transition" and (e.detail or {}).get("to") == "escalated"))


def _is_clear(e: Event) -> bool:
    return e.kind == "transition" and e.reason.startswith(CLEARED)


def ends(e: Event) -> bool:
    """Whether ``e`` ends a drain: a resume, or a person's clear."""
    return e.kind in RESUME_KINDS or _is_clear(e)


def drains(node: str, events: Sequence[Event], open_before: bool = False) -> list[Drain]:
    """The node's drains, from its events in time order. A drain event while one is open is no new
    drain (a healthcheck drains again each time it fails; the lifecycle's escalation re-drains with
    an RMA reason); it belongs to the open one. ``open_before``: a drain that began before the
    first event given is open (its events continue it; it is not one of the returned drains)."""
    out: list[Drain] = []
    current: list[Event] | None = [] if open_before else None
    counted = False  # whether the open drain began among the events given

    def close(by: str | None, at: float | None) -> None:
        if counted and current:
            first = current[0]
            out.append(Drain(node, cause_of(first.reason), first.at, first.run_id, tuple(current), by, at))

    for e in events:
        if current is None:
            if e.kind in DRAIN_KINDS:
                current, counted = [e], True
            continue
        current.append(e)
        if ends(e):
            close("resume" if e.kind in RESUME_KINDS else "clear", e.at)
            current, counted = None, False
    if current is not None:
        close(None, None)
    return out


# ---- the definitions, one each ------------------------------------------------------------------

def step_outcomes(d: Drain) -> tuple[str, ...]:
    """The typed outcomes of the drain's steps, in order (empty in a store from before them)."""
    return tuple(str((e.detail or {}).get("outcome")) for e in d.events if e.kind == OUTCOME_KIND)


def escalated(d: Drain) -> bool:
    """The lifecycle escalated the node for an RMA while it was drained, or drained it escalated:
    the cause's k-th incident in its window, or its retests failing ``retest_failures`` times. An
    escalation for a person to decide (an ambiguous outcome) is no confirmation."""
    return any(_is_escalation(e) and _FOR_A_PERSON not in e.reason for e in d.events)


def retest_failed(d: Drain) -> bool:
    """The node failed again while drained: the lifecycle sent it back from remediating or
    retesting (a failed retest, or none within step_timeout_s, which the lifecycle counts as
    failed), or a drain event for another run came while it was drained (a healthcheck that read
    it failing again). A second drain for the same run is the same reading acted on twice (a
    healthcheck's drain, then the lifecycle's pass over that healthcheck's run): no new evidence.
    Where the steps' outcomes are typed, they say what a retest came to instead of the
    transitions: its failure with the cause is a ``returned`` (``returned``, below), one that
    could not tell an ``ambiguous``, which confirms nothing."""
    typed = bool(step_outcomes(d))
    seen = {d.events[0].run_id}
    for e in d.events[1:]:
        info = e.detail or {}
        if not typed and e.kind == "transition" and info.get("from") in ("remediating", "retesting") \
                and info.get("to") in ("drained", "escalated"):
            return True
        if e.kind in DRAIN_KINDS and not _is_escalation(e):
            if e.run_id is not None and e.run_id not in seen:
                return True
            seen.add(e.run_id)
    return False


def step_taken(d: Drain) -> bool:
    """A remediation step (reset, restart, reboot) was needed and the node passed after it (it was
    resumed): its typed outcome is ``cleared``, or, in a store from before typed outcomes, a step
    was carried out at all (that store cannot tell a step that fixed a fault from one taken on a
    sound node)."""
    if d.ended_by != "resume":
        return False
    typed = step_outcomes(d)
    return "cleared" in typed if typed else any(e.kind in STEP_KINDS for e in d.events)


def returned(d: Drain, seen_again: float | None, within_s: float) -> bool:
    """The cause came back: the lifecycle typed a step's outcome ``returned`` (confirmed again at
    its retest, or within the window after it cleared), or, after the resume, within ``within_s``
    a reading diagnosed it or preflight drained the node for it (``seen_again``, the first such time)."""
    if "returned" in step_outcomes(d):
        return True
    return d.ended_at is not None and seen_again is not None and d.ended_at < seen_again <= d.ended_at + within_s


def decided_by_events(d: Drain, seen_again: float | None, within_s: float) -> bool:
    """Whether the drain's outcome is known without reading the node's runs after it: only a
    drain resumed with nothing else confirming it needs them, to tell whether its cause returned."""
    return d.ended_by != "resume" or escalated(d) or retest_failed(d) or step_taken(d) \
        or returned(d, seen_again, within_s)


def outcome(d: Drain, seen_again: float | None, latest: float, within_s: float = RETURNS_WITHIN_S) -> Outcome:
    """What the drain turned out to be. Confirmed: escalated, a retest failed, a step was needed
    and passed after it, or the cause returned within ``within_s`` of the resume. Unconfirmed:
    resumed with no step taken, and the cause did not return within ``within_s``. Pending:
    resumed with no step, and ``within_s`` after the resume reaches past ``latest`` (the latest
    time the store holds): too early to say. Open: still drained. Cleared: a person cleared the
    node before any of the above."""
    for name, holds in (("escalated", escalated(d)), ("retest_failed", retest_failed(d)), ("step", step_taken(d)),
                        ("returned", returned(d, seen_again, within_s))):
        if holds:
            return Outcome(d, CONFIRMED, name)
    if d.ended_by is None:
        return Outcome(d, OPEN)
    if d.ended_by == "clear":
        return Outcome(d, CLEARED_BY_PERSON)
    if d.ended_at + within_s > latest:
        return Outcome(d, PENDING)
    return Outcome(d, UNCONFIRMED)


def next_same_cause(found: Sequence[Drain]) -> list[float | None]:
    """For each of one node's drains (in time order): when preflight next drained the node for
    the same cause, if it did."""
    out: list[float | None] = []
    for i, d in enumerate(found):
        out.append(next((later.at for later in found[i + 1:] if later.cause == d.cause), None))
    return out


# ---- the figures --------------------------------------------------------------------------------

def percentile(values: Iterable[float], p: float) -> float | None:
    """The nearest-rank percentile: the smallest value with at least ``p`` % of the values at or
    below it (a value that happened, never one between two). None without values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def spread(values: Sequence[float]) -> dict:
    return {"n": len(values), "p50_s": percentile(values, 50), "p90_s": percentile(values, 90)}


def per_100_node_days(count: int, node_days: float) -> float | None:
    return round(100.0 * count / node_days, 3) if node_days > 0 else None


def summary(outcomes: Sequence[Outcome], to_drain: dict[int, float], node_days: float, within_s: float) -> dict:
    """The fleet's and each cause's counts and times. ``to_drain``: index in ``outcomes`` ->
    seconds from the first failing reading to the drain, where the store holds that reading."""
    def block(items: list[tuple[int, Outcome]]) -> dict:
        counts = {k: sum(1 for _, o in items if o.outcome == k) for k in OUTCOMES}
        decided = counts[CONFIRMED] + counts[UNCONFIRMED]
        return {"drains": len(items), **counts,
                "confirmed_by": {b: sum(1 for _, o in items if o.because == b) for b in BECAUSE},
                "precision": round(counts[CONFIRMED] / decided, 4) if decided else None,
                "to_drain": spread([to_drain[i] for i, _ in items if i in to_drain]),
                "to_resume": spread([o.drain.ended_at - o.drain.at for _, o in items if o.drain.ended_by == "resume"])}

    indexed = list(enumerate(outcomes))
    by_cause: dict[str, list[tuple[int, Outcome]]] = defaultdict(list)
    for i, o in indexed:
        by_cause[o.drain.cause].append((i, o))
    fleet = block(indexed)
    return {"returns_within_s": within_s, "node_days": round(node_days, 3), **fleet,
            "unconfirmed_per_100_node_days": per_100_node_days(fleet[UNCONFIRMED], node_days),
            "causes": [{"cause": c, **block(items)}
                       for c, items in sorted(by_cause.items(), key=lambda kv: (-len(kv[1]), kv[0]))]}
