"""A node's path from a failing verdict back to service, or to an RMA, as a pure function:
``transition(state, evidence, policy) -> Step`` (the new state, the actions to take, and why).
Nothing here runs a command or reads a clock; the effects (``scontrol``, a GPU reset, a retest)
and the store's lock live around it, so every rule is tested on tables.

    healthy ──fail (one reading enough)──────────────► drained
       │                                                  │ idle, a step the cause allows
       └─fail (confirm first)─► suspect ──confirmed──────►│
                                   │                      ▼
                                   └─passes──► healthy  remediating ──step done, grace over──► retesting
                                                                                                 │
                     escalated ◄── the cause's k-th incident in the window; the step returned ───┤
                     (drained: RMA, or         with no step left; an ambiguous outcome         passes
                      a person decides)        (a retest that fails with its cause and has a
                                               next step: back to drained, for that step)
                                                                                                 ▼
                                                                                    resumed ──► healthy

Confirm before acting: a cause whose one reading is enough (an uncorrectable ECC error, a GPU
off the bus) drains at once; every other (a HW slowdown, one all_reduce dip, a probe that timed
out once) is *suspect* until a second reading after a delay, or k failing of its last n, says
the same. A suspect node that passes its confirmation goes back to healthy: the false positive
is recorded, never acted on. A reading inside the startup grace after a reboot is not believed
(the driver and fabric manager may still be coming up; Slurm 26.05 runs a health check after a
reboot for the same reason). A drain that someone else set is never touched.

Each step's outcome is typed (``OUTCOMES``, docs/lifecycle.md "Remediation outcomes"):
*cleared* (the retest after it passed), *returned* (the cause was confirmed on the node again,
at the retest or later within the window: that step is not tried again for the cause there
within the window; the cause's next step, or a person, follows), *ambiguous* (no clear reading
after it: a person decides, never a retry).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

STATES = ("healthy", "suspect", "drained", "remediating", "retesting", "resumed", "escalated")
STEPS = ("reset", "restart", "reboot", "none")  # a cause's remediation; "none": only a person can fix it
OUTCOMES = ("cleared", "returned", "ambiguous")  # a step's outcome (docs/lifecycle.md)


@dataclass(frozen=True)
class LifeState:
    """Where a node is on its path, as the store keeps it."""

    node: str
    state: str = "healthy"
    since: float = 0.0
    cause: str | None = None
    run_id: str | None = None  # the run behind the last transition
    step: str | None = None  # remediating / retesting: the step taken
    requested: float | None = None  # when the step was asked for (a reboot's request time)
    retest_failures: int = 0


@dataclass(frozen=True)
class Reading:
    """One run's verdict on the node."""

    run_id: str
    started: float
    status: str  # pass | warn | fail | error
    causes: tuple[str, ...] = ()

    @property
    def failing(self) -> bool:
        return self.status in ("fail", "error")


@dataclass(frozen=True)
class Scheduler:
    """What the scheduler says of the node (Slurm's ``scontrol show node``); None without one."""

    busy: bool  # jobs run on it
    drained: bool
    reason: str | None
    ours: bool  # a drain whose reason preflight set ("preflight:")
    boot_time: float | None = None


@dataclass(frozen=True)
class StepOutcome:
    """What one remediation step came to, as the store keeps it (an ``outcome`` event)."""

    cause: str
    step: str  # reset | restart | reboot
    outcome: str  # one of OUTCOMES
    step_at: float  # when the step was asked for: names the step among the node's
    why: str = ""
    reading: str | None = None  # the run that decided it (the retest, the return), if one did
    at: float = 0.0


@dataclass(frozen=True)
class Evidence:
    readings: tuple[Reading, ...]  # the node's runs since its state's start, oldest first
    now: float
    scheduler: Scheduler | None = None
    # cause -> incidents in the escalation window, the one now seen included (an incident is a
    # streak of consecutive runs carrying the cause: judge.trends.incidents)
    incidents: dict[str, int] = field(default_factory=dict)
    # the node's steps' outcomes within the same window, oldest first
    outcomes: tuple[StepOutcome, ...] = ()

    def returned(self, cause: str | None) -> set[str]:
        """The steps whose ``returned`` for ``cause`` lies within the window: not tried again."""
        return {o.step for o in self.outcomes if o.cause == cause and o.outcome == "returned"}

    def cleared_last(self, cause: str) -> StepOutcome | None:
        """The step that last cleared ``cause``, unless its return is already recorded."""
        mine = [o for o in self.outcomes if o.cause == cause]
        last = mine[-1] if mine else None
        return last if last is not None and last.outcome == "cleared" else None


@dataclass(frozen=True)
class CausePolicy:
    confirm: str = "again"  # "once": one reading is enough; "again": confirm first
    step: str = "none"  # reset | restart | reboot | none
    service: str | None = None  # restart: the service (nvidia-fabricmanager, nvidia-persistenced)
    acceptance: tuple[str, ...] = ()  # checks a retest adds to the ones that blamed the node
    person: str = ""  # what a person does when the step is none
    then: tuple[str, ...] = ()  # the steps tried next, in order, once an earlier one returned

    def ladder(self) -> tuple[str, ...]:
        return () if self.step == "none" else (self.step, *self.then)


@dataclass(frozen=True)
class Silence:
    node: str  # a node name, or "*"
    cause: str  # a cause id, or "*"
    owner: str
    reason: str
    expires: float


@dataclass(frozen=True)
class Policy:
    causes: dict[str, CausePolicy] = field(default_factory=dict)
    default: CausePolicy = CausePolicy()
    confirm_delay_s: float = 300.0
    confirm_k: int = 3  # ... or k failing readings of the last n
    confirm_n: int = 5
    startup_grace_s: float = 600.0
    escalate_incidents: int = 3
    retest_failures: int = 2
    step_timeout_s: float = 1800.0  # a reboot not seen done by then is a failed remediation
    silences: tuple[Silence, ...] = ()

    def of(self, cause: str | None) -> CausePolicy:
        return self.causes.get(cause or "", self.default)

    def silenced(self, node: str, cause: str, now: float) -> Silence | None:
        return next((s for s in self.silences if s.expires > now and s.node in (node, "*")
                     and s.cause in (cause, "*")), None)


@dataclass(frozen=True)
class Action:
    kind: str  # drain | resume | reset | restart | reboot | retest | confirm | person
    node: str
    reason: str = ""
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    state: LifeState
    actions: tuple[Action, ...]
    why: str
    outcomes: tuple[StepOutcome, ...] = ()  # recorded with the transition, in its transaction

    @property
    def moved(self) -> bool:
        return bool(self.actions) or self.why.startswith("->")


def reason_of(state: str, cause: str | None, run_id: str | None, extra: str = "") -> str:
    """A drain reason preflight sets: it starts with "preflight:", so that only preflight's own
    drains are ever resumed by preflight (docs/contracts.md)."""
    text = f"preflight: {state} {cause or ''} {run_id or ''}".strip()
    return (text + (f": {extra}" if extra else ""))[:200]


def _to(s: LifeState, state: str, now: float, why: str, *actions: Action, outcomes: tuple[StepOutcome, ...] = (),
        **changes) -> Step:
    return Step(replace(s, state=state, since=now, **changes), actions, f"-> {state}: {why}", outcomes)


def _stay(s: LifeState, why: str, *actions: Action) -> Step:
    return Step(s, actions, why)


def transition(s: LifeState, ev: Evidence, policy: Policy) -> Step:
    """The next step of one node. Readings are the node's runs since ``s.since``."""
    sched = ev.scheduler
    if sched is not None and sched.drained and not sched.ours and s.state in ("healthy", "suspect", "resumed"):
        return _stay(s, f"drained by someone else ({sched.reason or 'no reason'}): left alone")
    handler = {"healthy": _healthy, "resumed": _healthy, "suspect": _suspect, "drained": _drained,
               "remediating": _remediating, "retesting": _retesting, "escalated": _escalated}[s.state]
    return handler(s, ev, policy)


def _in_grace(ev: Evidence, r: Reading, policy: Policy) -> bool:
    boot = ev.scheduler.boot_time if ev.scheduler else None
    return boot is not None and 0 <= r.started - boot < policy.startup_grace_s


def _came_back(ev: Evidence, cause: str, run_id: str) -> tuple[StepOutcome, ...]:
    """A confirmed reading of ``cause`` after a step cleared it within the window: that step returned."""
    last = ev.cleared_last(cause)
    if last is None:
        return ()
    why = f"{cause} confirmed again by {run_id} after the {last.step} cleared it"
    return (replace(last, outcome="returned", why=why, reading=run_id, at=ev.now),)


def _drain(s: LifeState, cause: str, run_id: str, now: float, why: str,
           outcomes: tuple[StepOutcome, ...] = ()) -> Step:
    return _to(s, "drained", now, why, Action("drain", s.node, reason_of("drained", cause, run_id)),
               outcomes=outcomes, cause=cause, run_id=run_id, step=None, requested=None)


def _escalate(s: LifeState, cause: str | None, run_id: str | None, now: float, why: str,
              outcomes: tuple[StepOutcome, ...] = ()) -> Step:
    reason = reason_of("escalated", cause, run_id, "RMA: open a vendor case (preflight lifecycle NODE --rma)")
    return _to(s, "escalated", now, why, Action("drain", s.node, reason, {"rma": True}), outcomes=outcomes,
               cause=cause, run_id=run_id)


def _to_person(s: LifeState, now: float, why: str, outcomes: tuple[StepOutcome, ...] = ()) -> Step:
    """Escalated for a person to decide (an ambiguous outcome, no step left): no RMA asked, and
    nothing retried; ``lifecycle NODE --clear`` hands it back."""
    reason = reason_of("escalated", s.cause, s.run_id, f"{why}: a person decides (preflight lifecycle NODE --clear)")
    return _to(s, "escalated", now, f"{why}: a person decides", Action("drain", s.node, reason, {"person": True}),
               outcomes=outcomes)


def _outcome(s: LifeState, outcome: str, why: str, now: float, reading: str | None = None) -> StepOutcome:
    return StepOutcome(str(s.cause), str(s.step), outcome, s.requested if s.requested is not None else s.since,
                       why, reading, now)


def _healthy(s: LifeState, ev: Evidence, policy: Policy) -> Step:
    """Only the newest reading counts: an old failure the node has passed since is history's
    (the incidents), not a reason to act now."""
    r = ev.readings[-1] if ev.readings else None
    if r is None or not (r.failing and r.causes):
        if s.state == "resumed" and r is not None:
            return _to(s, "healthy", ev.now, f"passed {r.run_id} after its return", cause=None)
        return _stay(s, "no failing reading")
    cause = r.causes[0]
    if (hush := policy.silenced(s.node, cause, ev.now)) is not None:
        return _stay(s, f"{cause} silenced by {hush.owner} ({hush.reason})")
    if _in_grace(ev, r, policy):
        return _stay(s, f"{r.run_id} came within {policy.startup_grace_s:g} s of the boot: not believed")
    if ev.incidents.get(cause, 0) >= policy.escalate_incidents:
        return _escalate(s, cause, r.run_id, ev.now, f"{cause} again: incident {ev.incidents[cause]} in the window",
                         _came_back(ev, cause, r.run_id))
    if policy.of(cause).confirm == "once":
        return _drain(s, cause, r.run_id, ev.now, f"{cause} in {r.run_id}: one reading is enough",
                      _came_back(ev, cause, r.run_id))
    return _to(s, "suspect", ev.now, f"{cause} in {r.run_id}: to be confirmed",
               Action("confirm", s.node, f"re-read after {policy.confirm_delay_s:g} s",
                      {"after": r.started + policy.confirm_delay_s, "cause": cause}),
               cause=cause, run_id=r.run_id)


def _suspect(s: LifeState, ev: Evidence, policy: Policy) -> Step:
    """Confirmed by a reading after the delay that fails the same way, or by k failing of the
    last n (the trigger counts); cleared by a reading after the delay that passes."""
    readings = [r for r in ev.readings if not _in_grace(ev, r, policy)]
    later = [r for r in readings if r.started >= s.since + policy.confirm_delay_s]
    if later and later[-1].failing and s.cause in later[-1].causes:
        return _drain(s, s.cause, later[-1].run_id, ev.now, f"{s.cause} confirmed by {later[-1].run_id}",
                      _came_back(ev, s.cause, later[-1].run_id))
    if later and not later[-1].failing:
        return _to(s, "healthy", ev.now, f"not confirmed: {later[-1].run_id} passed (a false positive, not acted on)",
                   cause=None)
    recent = readings[-(policy.confirm_n - 1):] if policy.confirm_n > 1 else []
    bad = [r for r in recent if r.failing and s.cause in r.causes]
    if len(bad) + 1 >= policy.confirm_k:
        return _drain(s, s.cause, bad[-1].run_id, ev.now,
                      f"{s.cause} in {len(bad) + 1} of the last {len(recent) + 1} readings",
                      _came_back(ev, s.cause, bad[-1].run_id))
    return _stay(s, f"waiting for a reading after {policy.confirm_delay_s:g} s to confirm {s.cause}")


def _drained(s: LifeState, ev: Evidence, policy: Policy) -> Step:
    cp = policy.of(s.cause)
    if ev.scheduler is None:
        return _stay(s, f"no scheduler: the steps are a person's: {cp.person or cp.step + ' for ' + str(s.cause)}")
    if cp.step == "none":
        return _stay(s, f"only a person can fix {s.cause}: {cp.person}")
    returned = ev.returned(s.cause)
    left = [step for step in cp.ladder() if step not in returned]
    if not left:
        return _to_person(s, ev.now, f"{', '.join(sorted(returned))} returned within the window, no step left")
    step = left[0]
    if ev.scheduler.busy:
        return _stay(s, f"waiting for the jobs on {s.node} to end before the {step}")
    action = Action(step, s.node, reason_of("remediating", s.cause, s.run_id, step),
                    {"service": cp.service} if cp.service and step == "restart" else {})
    after = f" ({', '.join(sorted(returned))} returned)" if returned else ""
    return _to(s, "remediating", ev.now, f"{step} for {s.cause}{after}", action, step=step, requested=ev.now)


def _remediating(s: LifeState, ev: Evidence, policy: Policy) -> Step:
    requested = s.requested or s.since
    if s.step == "reboot":
        boot = ev.scheduler.boot_time if ev.scheduler else None
        done = boot is not None and boot > requested
    else:
        done = True  # a reset or a restart has returned by the time the step is recorded
    if not done:
        if ev.now - requested > policy.step_timeout_s:
            return _ambiguous(s, ev, f"the {s.step} was not seen done within {policy.step_timeout_s:g} s")
        return _stay(s, f"waiting for the {s.step} to finish")
    return _to(s, "retesting", ev.now, f"{s.step} done: retest")


def _retesting(s: LifeState, ev: Evidence, policy: Policy) -> Step:
    """The retest is asked for once the startup grace is over, and again each pass until a
    reading comes; none within ``step_timeout_s`` counts as a failed retest, so a node whose
    retest cannot run does not wait for ever."""
    fresh = [r for r in ev.readings if not _in_grace(ev, r, policy)]
    if fresh:
        r = fresh[-1]
        if not r.failing:
            why = f"retest {r.run_id} passed"
            return _to(s, "resumed", ev.now, why, Action("resume", s.node, f"passes {r.run_id}"),
                       outcomes=(_outcome(s, "cleared", why, ev.now, r.run_id),), run_id=r.run_id, retest_failures=0)
        if s.cause in r.causes:
            return _retest_failed(s, ev, policy, f"retest {r.run_id} failed: {s.cause} again", r.run_id)
        # Failing, but not with the cause the step was for: the step may have worked and something
        # else broke, or the retest could not judge it. Not for a rule to guess.
        what = ", ".join(r.causes) or f"{r.status} without a cause"
        return _ambiguous(s, ev, f"retest {r.run_id} failed with {what}, not {s.cause}", r.run_id)
    if ev.now - s.since > policy.step_timeout_s:
        return _ambiguous(s, ev, f"no retest reading within {policy.step_timeout_s:g} s")
    boot = ev.scheduler.boot_time if ev.scheduler else None
    if boot is not None and ev.now - boot < policy.startup_grace_s:
        return _stay(s, f"waiting for the startup grace ({policy.startup_grace_s:g} s after the boot) to retest")
    cp = policy.of(s.cause)
    return _stay(s, "waiting for the retest",
                 Action("retest", s.node, f"the checks that blamed it and {', '.join(cp.acceptance) or 'nothing more'}",
                        {"acceptance": list(cp.acceptance), "cause": s.cause, "run_id": s.run_id}))


def _retest_failed(s: LifeState, ev: Evidence, policy: Policy, why: str, reading: str) -> Step:
    """The cause is still there after the step: it returned. The step is not tried again for it
    within the window; the cause's next step follows, or a person, or, after ``retest_failures``
    failed retests in all, an RMA."""
    failures = s.retest_failures + 1
    returned = (_outcome(s, "returned", why, ev.now, reading),)
    if failures >= policy.retest_failures:
        return _escalate(s, s.cause, s.run_id, ev.now, f"{why} ({failures} times)", returned)
    left = [step for step in policy.of(s.cause).ladder() if step not in ev.returned(s.cause) | {s.step}]
    if not left:
        return _to_person(s, ev.now, f"{why}; the {s.step} returned, no step left", returned)
    return _to(s, "drained", ev.now, f"{why}: the {s.step} returned; next: {left[0]}", outcomes=returned,
               retest_failures=failures, step=None)


def retest_not_run(s: LifeState, why: str, now: float) -> Step:
    """The retest could not run (its run refused its options, timed out, or could not reach the
    node): no reading will say whether the step worked, so its outcome is ambiguous and a person
    decides, rather than the retest being asked again every pass."""
    return _ambiguous(s, Evidence((), now), f"the retest could not run: {why}")


def _ambiguous(s: LifeState, ev: Evidence, why: str, reading: str | None = None) -> Step:
    return _to_person(s, ev.now, f"{why} (ambiguous after the {s.step})",
                      (_outcome(s, "ambiguous", why, ev.now, reading),))


def _escalated(s: LifeState, ev: Evidence, policy: Policy) -> Step:
    return _stay(s, "escalated: stays drained until a person clears it (preflight lifecycle NODE --clear)")
