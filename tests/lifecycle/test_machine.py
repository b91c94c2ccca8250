"""The lifecycle's rules on tables: each row a node's state, what the store and Slurm say, and
the step that must follow (preflight/lifecycle/machine.py)."""

from __future__ import annotations

import pytest

from preflight.lifecycle.machine import (
    CausePolicy,
    Evidence,
    LifeState,
    Policy,
    Reading,
    Scheduler,
    Silence,
    StepOutcome,
    retest_not_run,
    transition,
)

POLICY = Policy(causes={
    "gpu-ecc-uncorrectable": CausePolicy(confirm="once", step="reset", acceptance=("dcgm-diag", "nccl-all-reduce")),
    "gpu-fallen-off-bus": CausePolicy(confirm="once", step="reboot", acceptance=("dcgm-diag",)),
    "thermal-throttling": CausePolicy(confirm="again", step="none", person="check the fans and inlet air"),
    "fabric-manager-down": CausePolicy(confirm="again", step="restart", service="nvidia-fabricmanager"),
}, confirm_delay_s=300, startup_grace_s=600)
IDLE = Scheduler(busy=False, drained=False, reason=None, ours=False)
OURS = Scheduler(busy=False, drained=True, reason="preflight: drained x r1", ours=True)


def fail(run_id: str, t: float, cause: str) -> Reading:
    return Reading(run_id, t, "fail", (cause,))


def ok(run_id: str, t: float) -> Reading:
    return Reading(run_id, t, "pass")


def step(state: LifeState, *readings: Reading, now: float = 10_000, sched=IDLE, incidents=None, policy=POLICY,
         outcomes=()):
    return transition(state, Evidence(tuple(readings), now, sched, incidents or {}, tuple(outcomes)), policy)


def kinds(s) -> list[str]:
    return [a.kind for a in s.actions]


def test_one_reading_of_a_confirm_first_cause_never_drains():
    s = step(LifeState("n1"), fail("r1", 9_000, "thermal-throttling"))
    assert s.state.state == "suspect" and s.state.cause == "thermal-throttling" and kinds(s) == ["confirm"]
    assert "drain" not in kinds(s)


def test_a_suspect_that_passes_its_confirmation_is_healthy_again():
    sus = LifeState("n1", "suspect", 10_000, "thermal-throttling", "r1")
    assert step(sus, ok("r2", 10_100), now=10_150).state.state == "suspect"  # before the delay: not yet
    s = step(sus, ok("r2", 10_100), ok("r3", 10_400), now=10_500)
    assert s.state.state == "healthy" and s.actions == () and "false positive" in s.why


def test_a_suspect_confirmed_after_the_delay_is_drained():
    sus = LifeState("n1", "suspect", 10_000, "thermal-throttling", "r1")
    s = step(sus, fail("r2", 10_400, "thermal-throttling"), now=10_500)
    assert s.state.state == "drained" and kinds(s) == ["drain"]
    assert s.actions[0].reason == "preflight: drained thermal-throttling r2"


def test_k_failing_of_the_last_n_confirm_without_waiting():
    sus = LifeState("n1", "suspect", 10_000, "thermal-throttling", "r1")
    one_more = step(sus, fail("r2", 10_060, "thermal-throttling"), now=10_100)
    assert one_more.state.state == "suspect"
    s = step(sus, fail("r2", 10_060, "thermal-throttling"), fail("r3", 10_120, "thermal-throttling"), now=10_130)
    assert s.state.state == "drained" and "3 of the last 3 readings" in s.why


def test_a_cause_whose_one_reading_is_enough_drains_at_once():
    s = step(LifeState("n1"), fail("r1", 9_000, "gpu-ecc-uncorrectable"))
    assert s.state.state == "drained" and kinds(s) == ["drain"]


def test_a_silenced_cause_is_left_alone_until_its_silence_expires():
    hushed = Policy(causes=POLICY.causes, silences=(Silence("n1", "gpu-ecc-uncorrectable", "alice", "known, RMA open",
                                                            expires=20_000),))
    s = step(LifeState("n1"), fail("r1", 9_000, "gpu-ecc-uncorrectable"), policy=hushed)
    assert s.state.state == "healthy" and s.actions == () and "silenced by alice" in s.why
    later = step(LifeState("n1"), fail("r1", 21_000, "gpu-ecc-uncorrectable"), now=21_100, policy=hushed)
    assert later.state.state == "drained"


def test_a_reading_within_the_startup_grace_is_not_believed():
    booted = Scheduler(busy=False, drained=False, reason=None, ours=False, boot_time=8_800)
    s = step(LifeState("n1"), fail("r1", 9_000, "gpu-ecc-uncorrectable"), sched=booted)
    assert s.state.state == "healthy" and "not believed" in s.why
    s = step(LifeState("n1"), fail("r1", 9_500, "gpu-ecc-uncorrectable"), sched=booted)
    assert s.state.state == "drained"


def test_a_drain_someone_else_set_is_never_touched():
    theirs = Scheduler(busy=False, drained=True, reason="memtest [bob@12:00]", ours=False)
    s = step(LifeState("n1"), fail("r1", 9_000, "gpu-ecc-uncorrectable"), sched=theirs)
    assert s.state.state == "healthy" and s.actions == () and "someone else" in s.why


def test_a_drained_node_is_remediated_only_once_its_jobs_end():
    drained = LifeState("n1", "drained", 9_000, "gpu-ecc-uncorrectable", "r1")
    busy = Scheduler(busy=True, drained=True, reason="preflight: drained", ours=True)
    s = step(drained, sched=busy)
    assert s.state.state == "drained" and s.actions == () and "waiting for the jobs" in s.why
    s = step(drained, sched=OURS)
    assert s.state.state == "remediating" and s.state.step == "reset" and kinds(s) == ["reset"]


def test_a_restart_names_its_service():
    s = step(LifeState("n1", "drained", 9_000, "fabric-manager-down", "r1"), sched=OURS)
    assert kinds(s) == ["restart"] and s.actions[0].detail == {"service": "nvidia-fabricmanager"}


def test_a_cause_only_a_person_fixes_stays_drained_with_the_step():
    s = step(LifeState("n1", "drained", 9_000, "thermal-throttling", "r1"), sched=OURS)
    assert s.state.state == "drained" and "check the fans" in s.why


def test_without_a_scheduler_the_steps_are_a_persons():
    s = step(LifeState("n1", "drained", 9_000, "gpu-ecc-uncorrectable", "r1"), sched=None)
    assert s.state.state == "drained" and s.actions == () and "a person's: reset for gpu-ecc-uncorrectable" in s.why


def test_a_reboot_is_done_when_the_node_booted_after_the_request():
    rebooting = LifeState("n1", "remediating", 9_000, "gpu-fallen-off-bus", "r1", step="reboot", requested=9_000)
    before = Scheduler(busy=False, drained=True, reason="preflight: remediating", ours=True, boot_time=1_000)
    assert step(rebooting, sched=before, now=9_100).state.state == "remediating"
    after = Scheduler(busy=False, drained=True, reason="preflight: remediating", ours=True, boot_time=9_200)
    s = step(rebooting, sched=after, now=9_300)
    assert s.state.state == "retesting" and s.actions == ()
    lost = step(rebooting, sched=before, now=9_000 + 1_801)
    assert lost.state.state == "escalated" and [o.outcome for o in lost.outcomes] == ["ambiguous"]
    assert lost.actions[0].detail == {"person": True} and "a person decides" in lost.actions[0].reason


def test_a_retest_that_passes_resumes_and_one_that_fails_twice_escalates():
    retesting = LifeState("n1", "retesting", 10_000, "gpu-ecc-uncorrectable", "r1", step="reset", requested=9_900)
    s = step(retesting, ok("r5", 10_100), now=10_200, sched=OURS)
    assert s.state.state == "resumed" and kinds(s) == ["resume"]
    # The reset did not clear it: returned; with no other step for the cause, a person's.
    once = step(retesting, fail("r5", 10_100, "gpu-ecc-uncorrectable"), now=10_200, sched=OURS)
    assert once.state.state == "escalated" and once.actions[0].detail == {"person": True}
    assert [(o.step, o.outcome, o.reading) for o in once.outcomes] == [("reset", "returned", "r5")]
    twice = step(LifeState("n1", "retesting", 10_000, "gpu-ecc-uncorrectable", "r1", step="reset", retest_failures=1),
                 fail("r6", 10_100, "gpu-ecc-uncorrectable"), now=10_200, sched=OURS)
    assert twice.state.state == "escalated" and twice.actions[0].detail == {"rma": True}
    assert twice.actions[0].reason.startswith("preflight: escalated gpu-ecc-uncorrectable r1: RMA")


def test_a_retest_is_asked_for_after_the_startup_grace_and_given_up_after_the_step_timeout():
    retesting = LifeState("n1", "retesting", 9_300, "gpu-fallen-off-bus", "r1", step="reboot", requested=9_000)
    booted = Scheduler(busy=False, drained=True, reason="preflight: remediating", ours=True, boot_time=9_200)
    early = step(retesting, sched=booted, now=9_400)
    assert early.actions == () and "startup grace" in early.why
    due = step(retesting, sched=booted, now=9_200 + 600)
    assert due.state == retesting and kinds(due) == ["retest"]
    assert due.actions[0].detail == {"acceptance": ["dcgm-diag"], "cause": "gpu-fallen-off-bus", "run_id": "r1"}
    # A reading inside the grace is not the retest's.
    assert kinds(step(retesting, fail("r2", 9_250, "gpu-fallen-off-bus"), sched=booted, now=9_800)) == ["retest"]
    lost = step(retesting, sched=booted, now=9_300 + 1_801)
    assert lost.state.state == "escalated" and "no retest reading" in lost.why
    assert [(o.step, o.outcome, o.reading) for o in lost.outcomes] == [("reboot", "ambiguous", None)]


def test_the_third_incident_of_a_cause_escalates():
    s = step(LifeState("n1"), fail("r9", 9_000, "gpu-ecc-uncorrectable"), incidents={"gpu-ecc-uncorrectable": 3})
    assert s.state.state == "escalated" and kinds(s) == ["drain"]


def test_only_the_newest_reading_of_a_healthy_node_counts():
    s = step(LifeState("n1"), fail("r1", 8_000, "gpu-ecc-uncorrectable"), ok("r2", 9_000))
    assert s.state.state == "healthy" and s.actions == ()


def test_a_resumed_node_that_passes_is_healthy_and_escalated_stays():
    assert step(LifeState("n1", "resumed", 9_000), ok("r2", 9_500)).state.state == "healthy"
    s = step(LifeState("n1", "escalated", 9_000, "gpu-ecc-uncorrectable"), ok("r2", 9_500))
    assert s.state.state == "escalated" and s.actions == ()


@pytest.mark.parametrize("state", ["healthy", "suspect", "drained", "remediating", "retesting", "resumed",
                                   "escalated"])
def test_every_state_has_a_rule(state):
    assert step(LifeState("n1", state, 9_000, "gpu-ecc-uncorrectable", "r1", step="reset"), sched=OURS).state.node == "n1"


# Remediation outcomes (docs/lifecycle.md "Remediation outcomes"): one table, each row a node's
# state, its readings and outcomes so far, and the outcome, state and step that must follow.
LADDER = Policy(causes={**POLICY.causes,
                        "nvlink-errors": CausePolicy(confirm="once", step="reset", then=("reboot",))},
                confirm_delay_s=300, startup_grace_s=600)
RESET = "gpu-ecc-uncorrectable"
CLEARED = StepOutcome(RESET, "reset", "cleared", 9_000, "retest r2 passed", "r2", 9_100)
RETURNED = StepOutcome(RESET, "reset", "returned", 9_000, "again", "r3", 9_500)


def retesting(cause=RESET, step_="reset", failures=0):
    return LifeState("n1", "retesting", 10_000, cause, "r1", step=step_, requested=9_990, retest_failures=failures)


OUTCOME_TABLE = [
    # (case, state, readings, outcomes so far, -> state, outcomes recorded (step, outcome), next action kinds)
    ("a retest that passes clears the step", retesting(), [ok("r5", 10_100)], [],
     "resumed", [("reset", "cleared")], ["resume"]),
    ("a warning is a pass", retesting(), [Reading("r5", 10_100, "warn")], [],
     "resumed", [("reset", "cleared")], ["resume"]),
    ("the retest fails with the cause: returned; no step left: a person", retesting(),
     [fail("r5", 10_100, RESET)], [], "escalated", [("reset", "returned")], ["drain"]),
    ("the retest fails with the cause, a next step exists: drained for it", retesting("nvlink-errors"),
     [fail("r5", 10_100, "nvlink-errors")], [], "drained", [("reset", "returned")], []),
    ("the retest fails with another cause: ambiguous", retesting(),
     [fail("r5", 10_100, "nvlink-errors")], [], "escalated", [("reset", "ambiguous")], ["drain"]),
    ("the retest errors without a cause: ambiguous", retesting(),
     [Reading("r5", 10_100, "error")], [], "escalated", [("reset", "ambiguous")], ["drain"]),
    ("no retest reading within the step timeout: ambiguous", retesting(), [], [],
     "escalated", [("reset", "ambiguous")], ["drain"]),
    ("a cleared cause confirmed again on a healthy node: the step returned", LifeState("n1", "resumed", 9_200),
     [fail("r3", 9_400, RESET)], [CLEARED], "drained", [("reset", "returned")], ["drain"]),
    ("its return already recorded: not twice", LifeState("n1", "healthy", 9_600),
     [fail("r4", 9_700, RESET)], [CLEARED, RETURNED], "drained", [], ["drain"]),
    ("another cause cleared: no return of this one", LifeState("n1", "healthy", 9_200),
     [fail("r3", 9_400, RESET)], [StepOutcome("nvlink-errors", "reset", "cleared", 9_000, "", "r2", 9_100)],
     "drained", [], ["drain"]),
    ("a returned step is not tried again: a person", LifeState("n1", "drained", 9_600, RESET, "r3"),
     [], [CLEARED, RETURNED], "escalated", [], ["drain"]),
    ("a returned step is not tried again: the next one", LifeState("n1", "drained", 9_600, "nvlink-errors", "r3"),
     [], [StepOutcome("nvlink-errors", "reset", "returned", 9_000, "", "r3", 9_500)], "remediating", [], ["reboot"]),
    ("a returned step of another cause does not count", LifeState("n1", "drained", 9_600, RESET, "r3"),
     [], [StepOutcome("nvlink-errors", "reset", "returned", 9_000, "", "r3", 9_500)], "remediating", [], ["reset"]),
]


@pytest.mark.parametrize("case, state, readings, outcomes, to, recorded, actions", OUTCOME_TABLE,
                         ids=[row[0] for row in OUTCOME_TABLE])
def test_remediation_outcomes(case, state, readings, outcomes, to, recorded, actions):
    s = step(state, *readings, now=10_000 + 1_801 if not readings and state.state == "retesting" else 10_200,
             sched=OURS, outcomes=outcomes, policy=LADDER)
    assert s.state.state == to, s.why
    assert [(o.step, o.outcome) for o in s.outcomes] == recorded
    assert kinds(s) == actions
    for o in s.outcomes:
        assert o.cause == state.cause or o.cause == (readings[-1].causes[0] if readings else None)
        assert o.why and o.at == s.state.since
    if any(o.outcome == "ambiguous" for o in s.outcomes) or (to == "escalated" and not s.outcomes):
        # A person decides: no RMA asked, nothing retried.
        assert s.actions[0].detail == {"person": True} and "a person decides" in s.actions[0].reason


def test_a_returned_outcome_names_the_step_it_returned_after():
    s = step(LifeState("n1", "resumed", 9_200), fail("r3", 9_400, RESET), sched=OURS, outcomes=[CLEARED])
    (o,) = s.outcomes
    assert (o.step_at, o.reading, o.outcome) == (CLEARED.step_at, "r3", "returned") and "r3" in o.why


def test_a_cleared_outcome_names_the_step_and_the_retest():
    s = step(retesting(), ok("r5", 10_100), now=10_200, sched=OURS)
    (o,) = s.outcomes
    assert (o.cause, o.step, o.step_at, o.reading) == (RESET, "reset", 9_990, "r5")


def test_a_retest_that_could_not_run_is_ambiguous_at_once():
    s = retest_not_run(retesting(), "the retest run exited 2: no such check", 10_200)
    assert s.state.state == "escalated" and s.actions[0].detail == {"person": True}
    [o] = s.outcomes
    assert (o.step, o.outcome, o.reading, o.step_at) == ("reset", "ambiguous", None, 9_990)
    assert o.why == "the retest could not run: the retest run exited 2: no such check"
