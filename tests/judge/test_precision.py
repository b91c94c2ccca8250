"""The definitions behind ``history --fleet``'s precision, on tables of events in the shapes the
commands record them (healthcheck and drain: a ``drain`` and a ``resume``; the lifecycle: its
``transition`` events around each action). The same definitions on stores built from real runs
and real lifecycle passes: tests/store/test_precision_store.py."""

from __future__ import annotations

import pytest

from preflight.judge.precision import (
    CLEARED,
    Drain,
    Event,
    cause_of,
    decided_by_events,
    drains,
    escalated,
    next_same_cause,
    outcome,
    per_100_node_days,
    percentile,
    retest_failed,
    returned,
    step_taken,
    summary,
)

H = 3600.0
D = 86400.0
WEEK = 7 * D


def t(frm: str, to: str, at: float, why: str = "") -> Event:
    return Event(at, "transition", f"-> {to}: {why}", None, {"from": frm, "to": to})


def drain(at: float, reason: str = "preflight: drained gpu-ecc-uncorrectable r1", kind: str = "drain") -> Event:
    return Event(at, kind, reason, "r1")


def resume(at: float, kind: str = "resume") -> Event:
    return Event(at, kind, "passes r2", "r2")


def step(at: float, kind: str = "reset") -> Event:
    return Event(at, kind, "preflight: remediating gpu-ecc-uncorrectable r1: reset", "r1")


HEALTHCHECK = [drain(0, "preflight: xid healthcheck-20261101-000000-n1-ab"), resume(6 * H)]
LIFECYCLE_RESET = [t("healthy", "drained", 0), drain(0), t("drained", "remediating", H), step(H),
                   t("remediating", "retesting", H), t("retesting", "resumed", 2 * H), resume(2 * H)]
RETEST_FAILED = [t("healthy", "drained", 0), drain(0), t("drained", "remediating", H), step(H),
                 t("remediating", "retesting", H), t("retesting", "drained", 2 * H, "retest r3 failed")]
ESCALATED_AT_ONCE = [t("healthy", "escalated", 0),
                     drain(0, "preflight: escalated nvlink-down r9: RMA: open a vendor case (preflight lifecycle "
                              "NODE --rma)")]
REBOOT_NEVER_SEEN = [drain(0), t("drained", "remediating", H), step(H, "reboot"),
                     t("remediating", "drained", H + 1800, "the reboot was not seen done within 1800 s")]
HEALTHCHECK_AGAIN = [Event(0, "drain", "preflight: xid hc-1", "hc-1"), Event(300, "drain", "preflight: xid hc-2", "hc-2"),
                     resume(D)]
# A healthcheck drains on its reading; the lifecycle's next pass acts on the same reading: one reading, not two.
SAME_READING_TWICE = [Event(0, "drain", "preflight: xid hc-1", "hc-1"), t("healthy", "drained", 60),
                      Event(60, "drain", "preflight: drained xid hc-1", "hc-1"), resume(D)]
CLEARED_BY_PERSON = [drain(0), Event(D, "transition", f"{CLEARED}: GPU replaced", None,
                                     {"from": "drained", "to": "healthy"})]
NO_SCHEDULER = [t("healthy", "drained", 0), drain(0, kind="for-a-person:drain")]


# Typed step outcomes (the lifecycle's `outcome` events, docs/lifecycle.md "Remediation outcomes").
def typed(at: float, what: str, step_kind: str = "reset") -> Event:
    return Event(at, "outcome", f"{step_kind} {what}", "r3",
                 {"cause": "gpu-ecc-uncorrectable", "step": step_kind, "outcome": what, "step_at": H, "reading": "r3"})


PERSON = "a person decides"
TYPED_CLEARED = [*LIFECYCLE_RESET[:-2], typed(2 * H, "cleared"), *LIFECYCLE_RESET[-2:]]
# The retest failed with its cause: the reset's outcome is `returned`, and with no step left a person decides.
TYPED_RETURNED = [*RETEST_FAILED[:-1], typed(2 * H, "returned"),
                  t("retesting", "escalated", 2 * H, f"reset returned within the window, no step left: {PERSON}"),
                  drain(2 * H, f"preflight: escalated gpu-ecc-uncorrectable r1: reset returned: {PERSON} (preflight "
                               "lifecycle NODE --clear)")]
# The reboot was never seen done: nothing says whether it worked; a person decides, no RMA.
TYPED_AMBIGUOUS = [drain(0), t("drained", "remediating", H), step(H, "reboot"), typed(H + 1800, "ambiguous", "reboot"),
                   t("remediating", "escalated", H + 1800, f"the reboot was not seen done within 1800 s: {PERSON}"),
                   drain(H + 1800, f"preflight: escalated gpu-ecc-uncorrectable r1: the reboot was not seen done: "
                                   f"{PERSON} (preflight lifecycle NODE --clear)")]
TYPED_AMBIGUOUS_CLEARED = [*TYPED_AMBIGUOUS, Event(D, "transition", f"{CLEARED}: reseated", None,
                                                   {"from": "escalated", "to": "healthy"})]


def one(events: list[Event]) -> Drain:
    [d] = drains("n1", events)
    return d


@pytest.mark.parametrize("reason, cause", [
    ("preflight: xid healthcheck-20261101-000000-n1-ab", "xid"),  # healthcheck
    ("preflight: gpu-ecc-uncorrectable r1: drain the node, reset GPU3", "gpu-ecc-uncorrectable"),  # drain RUN
    ("preflight: drained thermal-throttling r2", "thermal-throttling"),  # lifecycle
    ("preflight: escalated nvlink-down r9: RMA: open a vendor case", "nvlink-down"),
    ("preflight: check-failed hc-1", "check-failed"),
    ("maintenance by ops", "unknown"),  # not preflight's: never recorded as its drain, but not a crash either
    ("preflight:", "unknown"),
])
def test_the_cause_a_drain_reason_names(reason, cause):
    assert cause_of(reason) == cause


@pytest.mark.parametrize("events, esc, failed, stepped", [
    (HEALTHCHECK, False, False, False),
    (LIFECYCLE_RESET, False, False, True),
    (RETEST_FAILED, False, True, False),  # a step was taken, but the node did not pass after it
    (ESCALATED_AT_ONCE, True, False, False),
    (REBOOT_NEVER_SEEN, False, True, False),  # the lifecycle counts it as a failed retest
    (HEALTHCHECK_AGAIN, False, True, False),  # read failing again while drained
    (SAME_READING_TWICE, False, False, False),
    (CLEARED_BY_PERSON, False, False, False),
    (NO_SCHEDULER, False, False, False),
    (TYPED_CLEARED, False, False, True),
    (TYPED_RETURNED, False, False, False),  # typed: the outcome says it (returned), not the transition
    (TYPED_AMBIGUOUS, False, False, False),  # an escalation for a person is no confirmation
    (TYPED_AMBIGUOUS_CLEARED, False, False, False),
])
def test_each_definition_on_the_shapes_the_commands_record(events, esc, failed, stepped):
    d = one(events)
    assert (escalated(d), retest_failed(d), step_taken(d)) == (esc, failed, stepped)


@pytest.mark.parametrize("events, seen_again, latest, expected", [
    (HEALTHCHECK, None, 30 * D, ("unconfirmed", None)),
    (HEALTHCHECK, 6 * H + 3 * D, 30 * D, ("confirmed", "returned")),  # back within the week
    (HEALTHCHECK, 6 * H + 8 * D, 30 * D, ("unconfirmed", None)),  # back, but after the week
    (HEALTHCHECK, None, 6 * H + 6 * D, ("pending", None)),  # the week not over in the store's data
    (HEALTHCHECK, 6 * H + D, 6 * H + 2 * D, ("confirmed", "returned")),  # back already: no need to wait
    (LIFECYCLE_RESET, None, 30 * D, ("confirmed", "step")),
    (LIFECYCLE_RESET, None, 3 * H, ("confirmed", "step")),  # a step needs no look-ahead
    (RETEST_FAILED, None, 30 * D, ("confirmed", "retest_failed")),  # still drained: confirmed all the same
    (ESCALATED_AT_ONCE, None, 30 * D, ("confirmed", "escalated")),
    (HEALTHCHECK_AGAIN, None, 30 * D, ("confirmed", "retest_failed")),
    (SAME_READING_TWICE, None, 30 * D, ("unconfirmed", None)),
    (CLEARED_BY_PERSON, None, 30 * D, ("cleared", None)),
    (NO_SCHEDULER, None, 30 * D, ("open", None)),
    (HEALTHCHECK[:1], None, 30 * D, ("open", None)),
    (TYPED_CLEARED, None, 30 * D, ("confirmed", "step")),
    (TYPED_RETURNED, None, 30 * D, ("confirmed", "returned")),
    (TYPED_AMBIGUOUS, None, 30 * D, ("open", None)),  # neither right nor wrong until a person decides
    (TYPED_AMBIGUOUS_CLEARED, None, 30 * D, ("cleared", None)),
])
def test_what_a_drain_turned_out_to_be(events, seen_again, latest, expected):
    o = outcome(one(events), seen_again, latest)
    assert (o.outcome, o.because) == expected


def test_the_look_ahead_is_configurable():
    d = one(HEALTHCHECK)
    assert outcome(d, 6 * H + 3 * D, 30 * D, within_s=2 * D).outcome == "unconfirmed"
    assert outcome(d, None, 6 * H + 2.5 * D, within_s=2 * D).outcome == "unconfirmed"
    assert outcome(d, None, 6 * H + 2.5 * D, within_s=3 * D).outcome == "pending"
    assert returned(d, 6 * H + 2 * D, 2 * D) and not returned(d, 6 * H, 2 * D)  # at the resume itself: not after it


def test_drains_split_a_nodes_events_and_a_drain_while_drained_is_not_a_new_one():
    events = [*HEALTHCHECK, *[Event(e.at + 2 * D, e.kind, e.reason, e.run_id, e.detail) for e in LIFECYCLE_RESET],
              drain(10 * D, "preflight: xid hc-9")]
    found = drains("n1", events)
    assert [(d.cause, d.at, d.ended_by) for d in found] == [("xid", 0, "resume"),
                                                          ("gpu-ecc-uncorrectable", 2 * D, "resume"),
                                                          ("xid", 10 * D, None)]
    assert len(drains("n1", HEALTHCHECK_AGAIN)) == 1
    assert next_same_cause(found) == [10 * D, None, None]


def test_a_drain_open_before_the_window_is_continued_not_counted():
    """The window starts while the node is drained: its events in the window (a second drain by
    a healthcheck, the resume) end that drain; only the next one is the window's."""
    events = [drain(D, "preflight: xid hc-2"), resume(2 * D), drain(5 * D, "preflight: xid hc-5")]
    assert [d.at for d in drains("n1", events, open_before=True)] == [5 * D]
    assert [d.at for d in drains("n1", events)] == [D, 5 * D]
    assert drains("n1", [step(H), t("retesting", "drained", 2 * H)], open_before=True) == []


def test_percentiles_are_nearest_rank_values_that_happened():
    assert percentile([], 50) is None
    assert percentile([7.0], 90) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 90) == 4.0
    assert percentile(list(range(1, 11)), 90) == 9 and percentile(list(range(1, 11)), 50) == 5


def test_the_summary_partitions_the_drains_per_cause_and_rates_the_fleet():
    hc = one(HEALTHCHECK)
    hc_back = one(HEALTHCHECK)
    reset = one(LIFECYCLE_RESET)
    still = one(NO_SCHEDULER)
    outs = [outcome(hc, None, 30 * D), outcome(hc_back, 6 * H + D, 30 * D), outcome(reset, None, 30 * D),
            outcome(still, None, 30 * D)]
    s = summary(outs, {0: 120.0, 1: 60.0, 2: 600.0}, node_days=400.0, within_s=WEEK)
    assert (s["drains"], s["confirmed"], s["unconfirmed"], s["open"], s["pending"], s["cleared"]) == (4, 2, 1, 1, 0, 0)
    assert s["confirmed_by"] == {"escalated": 0, "retest_failed": 0, "step": 1, "returned": 1}
    assert s["precision"] == pytest.approx(2 / 3, abs=1e-4)
    assert s["unconfirmed_per_100_node_days"] == 0.25  # 1 unconfirmed drain in 400 node-days
    assert s["to_drain"] == {"n": 3, "p50_s": 120.0, "p90_s": 600.0}
    assert s["to_resume"] == {"n": 3, "p50_s": 6 * H, "p90_s": 6 * H}
    by = {c["cause"]: c for c in s["causes"]}
    assert [c["cause"] for c in s["causes"]] == ["gpu-ecc-uncorrectable", "xid"]  # most drains first
    assert (by["xid"]["drains"], by["xid"]["unconfirmed"], by["xid"]["precision"]) == (2, 1, 0.5)
    assert (by["gpu-ecc-uncorrectable"]["open"], by["gpu-ecc-uncorrectable"]["to_resume"]["n"]) == (1, 1)
    assert sum(c["drains"] for c in s["causes"]) == s["drains"]


def test_no_node_days_no_rate():
    assert per_100_node_days(3, 0.0) is None and per_100_node_days(0, 10.0) == 0.0
    assert summary([], {}, 0.0, WEEK)["unconfirmed_per_100_node_days"] is None


def test_only_a_resumed_drain_nothing_else_confirms_needs_the_runs_after_it():
    assert not decided_by_events(one(HEALTHCHECK), None, WEEK)
    assert decided_by_events(one(HEALTHCHECK), 6 * H + D, WEEK)  # a later drain for the cause already says it
    assert all(decided_by_events(one(e), None, WEEK) for e in (LIFECYCLE_RESET, RETEST_FAILED, ESCALATED_AT_ONCE,
                                                                CLEARED_BY_PERSON, NO_SCHEDULER))
