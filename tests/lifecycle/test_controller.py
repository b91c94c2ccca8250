"""One lifecycle pass over a real store (both engines): decisions recorded before their actions,
the breaker across runs, the lock that lets one controller act, a store that fails mid-way, and a
refused action that leaves the node where it was. The actions go to a recorder here; on the real
Slurm cluster they go to scontrol (tests/e2e/test_e2e_lifecycle.py)."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import threading

from runs import report

from preflight.lifecycle import controller, effects
from preflight.lifecycle.machine import Action, Scheduler
from preflight.lifecycle.policy import load
from preflight.store import Store, StoreError, parse
from preflight.store import lifecycle as kept
from preflight.store.read import Window, node_history
from preflight.store.rows import rows_of

POLICY, TIMINGS = load()
IDLE = Scheduler(busy=False, drained=False, reason=None, ours=False)


class Recorder:
    acts = True

    def __init__(self, refuse: dict[str, str] | None = None, then=None):
        self.calls: list[Action] = []
        self.refuse = refuse or {}
        self.then = then

    def __call__(self, action: Action) -> str | None:
        self.calls.append(action)
        if self.then:
            self.then(action)
        return self.refuse.get(action.kind)


def at(day: float) -> float:
    return rows_of(report("x", day, {}), started_fallback=0).run.started


def record(store: Store, run_id: str, day: float, nodes: dict) -> None:
    store.record(rows_of(report(run_id, day, nodes), started_fallback=0.0))


def test_a_confirm_first_fault_is_suspect_then_drained_on_its_second_reading(store_url):
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": {"fail": ["clock-events"], "causes": ["thermal-throttling"]}, "n2": {}})
        rec = Recorder()
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.001), rec, "test", scheduler={"n1": IDLE, "n2": IDLE})
        assert [(o.node, o.step.state.state) for o in p.outcomes if o.step.moved] == [("n1", "suspect")]
        assert [a.kind for a in rec.calls] == ["confirm"]
        # Ten minutes later the same reading: confirmed, drained.
        record(store, "r2", 1.0 + 600 / 86400, {"n1": {"fail": ["clock-events"], "causes": ["thermal-throttling"]}})
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.01), rec, "test", scheduler={"n1": IDLE, "n2": IDLE})
        assert [a.kind for a in rec.calls] == ["confirm", "drain"]
        assert rec.calls[-1].reason == "preflight: drained thermal-throttling r2"
        assert kept.node_states(store)["n1"]["state"] == "drained"
        h = node_history(store, "n1", Window(0))
        assert [e["kind"] for e in h["events"]] == ["transition", "confirm", "transition", "drain"]
        assert h["events"][2]["detail"] == {"from": "suspect", "to": "drained", "actions": ["drain"]}


def test_a_suspect_that_passes_is_healthy_and_nothing_was_done(store_url):
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": {"fail": ["clock-events"], "causes": ["thermal-throttling"]}})
        rec = Recorder()
        controller.run_pass(store, POLICY, TIMINGS, at(1.001), rec, "test", scheduler={"n1": IDLE})
        record(store, "r2", 1.0 + 600 / 86400, {"n1": {}})
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.01), rec, "test", scheduler={"n1": IDLE})
        assert [a.kind for a in rec.calls] == ["confirm"]
        assert kept.node_states(store)["n1"]["state"] == "healthy" and "false positive" in p.outcomes[0].step.why


def test_the_breaker_counts_drains_across_passes(store_url):
    """Twenty nodes with a fault one reading is enough for: the shipped breaker allows 10 % of the
    known nodes (2) in its hour, the next pass none, whichever run found them."""
    with Store.open(parse(store_url)) as store:
        nodes = {f"n{i:02d}": {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]} for i in range(20)}
        record(store, "r1", 1.0, nodes)
        rec = Recorder()
        views = dict.fromkeys(nodes, IDLE)
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.001), rec, "test", scheduler=views)
        assert [a.kind for a in rec.calls] == ["drain", "drain"]
        assert sum(1 for o in p.outcomes if o.refused and "breaker" in o.refused) == 18
        rec2 = Recorder()
        controller.run_pass(store, POLICY, TIMINGS, at(1.002), rec2, "test", scheduler=views)
        assert rec2.calls == [] or all(a.kind != "drain" for a in rec2.calls)
        # An hour later the window has passed: two more.
        rec3 = Recorder()
        controller.run_pass(store, POLICY, TIMINGS, at(1.001) + 3700, rec3, "test", scheduler=views)
        # (The first two, their retest never answered, are escalated for a person: a drain of a
        # drained node with a new reason, which the breaker does not count.)
        assert [a.node for a in rec3.calls if a.kind == "drain" and not a.detail] == ["n02", "n03"]
        assert [a.node for a in rec3.calls if a.kind == "drain" and a.detail == {"person": True}] == ["n00", "n01"]


def test_two_controllers_at_once_one_acts(store_url):
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]}})
    recs, passes, start = [Recorder(), Recorder()], [None, None], threading.Barrier(2)

    def one(i: int) -> None:
        with Store.open(parse(store_url)) as store:
            start.wait()
            passes[i] = controller.run_pass(store, POLICY, TIMINGS, at(1.001), recs[i], "test", scheduler={"n1": IDLE},
                                            holder=f"controller-{i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    drains = [a for r in recs for a in r.calls if a.kind == "drain"]
    assert len(drains) == 1  # the second found the lock taken, or the node already drained
    held = [p for p in passes if p.lock_holder]
    assert all(p.lock_holder.startswith("controller-") for p in held)


def test_a_lock_another_controller_holds_is_respected_until_it_expires(store_url):
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]}})
        now = at(1.001)
        assert kept.take_lock(store, controller.LOCK, "other:1", 300, now)
        rec = Recorder()
        p = controller.run_pass(store, POLICY, TIMINGS, now + 10, rec, "test", scheduler={"n1": IDLE})
        assert p.lock_holder == "other:1" and rec.calls == [] and "n1" not in kept.node_states(store)
        p = controller.run_pass(store, POLICY, TIMINGS, now + 301, rec, "test", scheduler={"n1": IDLE})
        assert p.lock_holder is None and [a.kind for a in rec.calls] == ["drain"]


def test_a_store_that_fails_mid_way_stops_the_pass_before_any_unrecorded_action(tmp_path):
    """The first node's drain runs; then the store goes away (another writer holds it past the
    busy timeout): the drain's event cannot be recorded, so the pass ends there and says so; the
    second node's step is not taken."""
    url = parse(f"sqlite:///{tmp_path}/s.sqlite")
    with Store.open(url) as store:
        record(store, "r1", 1.0, {"n1": {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]},
                                  "n2": {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]}})
    holder = sqlite3.connect(tmp_path / "s.sqlite", isolation_level=None)

    def block(action: Action) -> None:
        holder.execute("BEGIN IMMEDIATE")

    rec = Recorder(then=block)
    timings = {**TIMINGS, "breaker_drains": 10, "breaker_fraction": 1.0}
    with Store.open(url, timeout_s=0.3) as store:
        p = controller.run_pass(store, POLICY, timings, at(1.001), rec, "test", scheduler={"n1": IDLE, "n2": IDLE})
    holder.rollback()
    holder.close()
    assert [a.node for a in rec.calls] == ["n1"]
    assert p.stopped and "drain done but not recorded" in p.stopped and "database is locked" in p.stopped
    with Store.open(url) as store:
        assert kept.node_states(store)["n1"]["state"] == "drained" and "n2" not in kept.node_states(store)


def test_a_refused_action_leaves_the_node_where_it_was(store_url):
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]}})
        rec = Recorder(refuse={"drain": "Invalid node name specified"})
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.001), rec, "test", scheduler={"n1": IDLE})
        assert p.outcomes[0].refused == "drain refused: Invalid node name specified"
        assert kept.node_states(store)["n1"]["state"] == "healthy"
        assert [e["kind"] for e in node_history(store, "n1", Window(0))["events"]] == ["transition", "refused"]


def test_a_dry_run_decides_and_records_nothing(store_url):
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]}})
        rec = Recorder()
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.001), rec, "test", scheduler={"n1": IDLE}, dry_run=True)
        assert p.outcomes[0].step.state.state == "drained" and rec.calls == []
        assert kept.node_states(store) == {} and node_history(store, "n1", Window(0))["events"] == []


class Hands(Recorder):
    """A controller that can reach the node: its retest is a run recorded into the store."""

    def __init__(self, store: Store, retest_day: list[float], retest: dict, view=None):
        super().__init__(then=self._retest)
        self.store, self.days, self.result = store, retest_day, retest
        self.view = view or (lambda node: OURS)

    def can(self, action: Action) -> bool:
        return True

    def _retest(self, action: Action) -> None:
        if action.kind == "retest":
            record(self.store, action.detail["run"], self.days.pop(0), {action.node: self.result})


OURS = Scheduler(busy=False, drained=True, reason="preflight: drained", ours=True)
ECC = {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]}


def test_a_reset_its_retest_and_the_resume_come_in_one_pass(store_url):
    """gpu-ecc-uncorrectable: drained on its reading; the next pass resets the idle node, retests
    it (the blamed check and the acceptance), finds it passing and resumes it."""
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": ECC})
        hands = Hands(store, [1.03], {})
        controller.run_pass(store, POLICY, TIMINGS, at(1.001), hands, "test", scheduler={"n1": IDLE})
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.02), hands, "test", scheduler={"n1": OURS})
        assert [a.kind for a in hands.calls] == ["drain", "reset", "retest", "resume"]
        retest = hands.calls[2]
        assert retest.detail["checks"] == ["dcgm-diag", "nccl-all-reduce", "xid"] and retest.detail["run_id"] == "r1"
        assert [o.step.state.state for o in p.outcomes] == ["remediating", "retesting", "retesting", "resumed"]
        assert kept.node_states(store)["n1"]["state"] == "resumed"
        events = node_history(store, "n1", Window(0))["events"]
        assert [e["kind"] for e in events] == ["transition", "drain", "transition", "reset", "transition", "retest",
                                               "transition", "outcome", "resume"]
        assert events[5]["detail"]["run"] == retest.detail["run"]
        # The reset's outcome, in the transition's transaction: cleared by the retest's run.
        outcome = events[7]
        assert outcome["run_id"] == retest.detail["run"] and outcome["detail"] == {
            "cause": "gpu-ecc-uncorrectable", "step": "reset", "outcome": "cleared", "step_at": at(1.02),
            "reading": retest.detail["run"]}
        assert [o["outcome"] for o in kept.outcomes(store, 0)["n1"]] == ["cleared"]


def test_a_retest_that_fails_with_its_cause_is_never_reset_again_and_one_that_cannot_run_waits(store_url):
    """The reset did not clear the ECC error (the retest fails with it): the reset returned, and
    gpu-ecc-uncorrectable has no other step, so a person decides; no second reset."""
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": ECC})
        hands = Hands(store, [1.03, 1.05], ECC)
        controller.run_pass(store, POLICY, TIMINGS, at(1.001), hands, "test", scheduler={"n1": IDLE})
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.02), hands, "test", scheduler={"n1": OURS})
        assert p.outcomes[-1].step.state.state == "escalated"
        controller.run_pass(store, POLICY, TIMINGS, at(1.04), hands, "test", scheduler={"n1": OURS})
        assert [a.kind for a in hands.calls] == ["drain", "reset", "retest", "drain"]
        assert hands.calls[-1].reason.startswith("preflight: escalated gpu-ecc-uncorrectable r1: retest")
        assert "a person decides" in hands.calls[-1].reason
        assert kept.node_states(store)["n1"]["state"] == "escalated"
        [returned] = kept.outcomes(store, 0)["n1"]
        assert (returned["step"], returned["outcome"], returned["reading"]) == ("reset", "returned",
                                                                                hands.calls[2].detail["run"])

        # Without a way onto the node the reset is not taken, nor recorded again every pass.
        record(store, "r9", 1.1, {"n2": ECC})
        slurm_only = Recorder()
        slurm_only.can = lambda a: a.kind not in ("reset", "restart", "retest")
        scheds = {"n1": OURS, "n2": IDLE}
        controller.run_pass(store, POLICY, TIMINGS, at(1.101), slurm_only, "test", scheduler=scheds)
        before = len(node_history(store, "n2", Window(0))["events"])
        for day in (1.11, 1.12):
            p = controller.run_pass(store, POLICY, TIMINGS, at(day), slurm_only, "test",
                                    scheduler={"n1": OURS, "n2": OURS})
            [n2] = [o for o in p.outcomes if o.node == "n2"]
            assert n2.waiting and not n2.done and "no way to reset" in n2.waiting
        assert [a.kind for a in slurm_only.calls] == ["drain"]
        assert len(node_history(store, "n2", Window(0))["events"]) == before
        assert kept.node_states(store)["n2"]["state"] == "drained"


def test_a_lock_left_by_a_controller_of_this_host_that_died_is_taken_over(store_url):
    """A controller killed while holding the lock (or whose store went away before it could let
    go) would stop every pass until the lock expired; one of this host that no longer runs is
    taken over. Another host's, or a live one's, is respected."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": ECC})
        now = at(1.001)
        kept.take_lock(store, controller.LOCK, f"{socket.gethostname()}:{dead.pid}", 300, now)
        rec = Recorder()
        p = controller.run_pass(store, POLICY, TIMINGS, now + 1, rec, "test", scheduler={"n1": IDLE})
        assert p.took_over == f"{socket.gethostname()}:{dead.pid}" and [a.kind for a in rec.calls] == ["drain"]
        live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            for alive in (f"elsewhere:{dead.pid}", f"{socket.gethostname()}:{live.pid}"):
                kept.take_lock(store, controller.LOCK, alive, 300, now + 2)
                p = controller.run_pass(store, POLICY, TIMINGS, now + 3, Recorder(), "test", scheduler={"n1": OURS})
                assert p.lock_holder == alive and p.took_over is None
                kept.drop_lock(store, controller.LOCK, alive)
        finally:
            live.kill()
            live.wait()


def test_a_cleared_cause_that_comes_back_marks_the_step_returned_and_it_is_not_tried_again(store_url):
    """Reset, retest passes (cleared), resumed; a day later the ECC error is read again: the
    drain records the reset as returned (same step_at as its cleared), and the next pass hands the
    node to a person instead of resetting it again."""
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": ECC})
        hands = Hands(store, [1.03], {})
        controller.run_pass(store, POLICY, TIMINGS, at(1.001), hands, "test", scheduler={"n1": IDLE})
        controller.run_pass(store, POLICY, TIMINGS, at(1.02), hands, "test", scheduler={"n1": OURS})
        assert kept.node_states(store)["n1"]["state"] == "resumed"
        record(store, "r2", 2.0, {"n1": ECC})
        p = controller.run_pass(store, POLICY, TIMINGS, at(2.001), hands, "test", scheduler={"n1": IDLE})
        [drain] = [o for o in p.outcomes if o.step.moved]
        assert drain.step.state.state == "drained" and [r.outcome for r in drain.step.outcomes] == ["returned"]
        controller.run_pass(store, POLICY, TIMINGS, at(2.01), hands, "test", scheduler={"n1": OURS})
        assert [a.kind for a in hands.calls] == ["drain", "reset", "retest", "resume", "drain", "drain"]
        assert kept.node_states(store)["n1"]["state"] == "escalated"
        cleared, returned = kept.outcomes(store, 0)["n1"]
        assert (cleared["outcome"], returned["outcome"], returned["reading"]) == ("cleared", "returned", "r2")
        assert cleared["step_at"] == returned["step_at"] == at(1.02)


def test_a_step_whose_capture_could_not_be_taken_is_carried_out_and_the_capture_recorded_first(store_url):
    """A reboot of a node the controller has no SSH to: its state cannot be kept; the capture is
    recorded as skipped, before the reboot, which happens all the same."""
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": {"fail": ["gpu-count"], "causes": ["gpu-fallen-off-bus"]}})
        rec = Recorder()
        rec.capture = effects.SlurmEffects({}).capture
        controller.run_pass(store, POLICY, TIMINGS, at(1.001), rec, "test", scheduler={"n1": IDLE})
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.02), rec, "test", scheduler={"n1": OURS})
        assert [a.kind for a in rec.calls] == ["drain", "reboot"]
        [cap] = p.outcomes[0].captures
        assert (cap["step"], cap["outcome"], cap["step_at"]) == ("reboot", "skipped", at(1.02))
        assert "no way onto n1 over SSH" in cap["why"]
        events = node_history(store, "n1", Window(0))["events"]
        assert [e["kind"] for e in events][-2:] == ["capture", "reboot"]
        assert events[-2]["reason"].startswith("before the reboot: skipped, 0 bytes in 0 s: no way onto n1")


def test_a_retest_that_cannot_run_makes_the_step_ambiguous_and_is_not_asked_again(store_url):
    """The retest's run exits as bad usage (or times out): no reading will come, so the reset's
    outcome is ambiguous and the node a person's at once, not a retest asked every pass for 30 min."""
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": ECC})
        rec = Recorder(refuse={"retest": "the retest run exited 2: unknown check"})
        controller.run_pass(store, POLICY, TIMINGS, at(1.001), rec, "test", scheduler={"n1": IDLE})
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.02), rec, "test", scheduler={"n1": OURS})
        assert [o.step.state.state for o in p.outcomes] == ["remediating", "retesting", "escalated"]
        assert p.outcomes[-1].refused is None and "a person decides" in p.outcomes[-1].done[-1]
        controller.run_pass(store, POLICY, TIMINGS, at(1.03), rec, "test", scheduler={"n1": OURS})
        assert [a.kind for a in rec.calls] == ["drain", "reset", "retest", "drain"]
        [outcome] = kept.outcomes(store, 0)["n1"]
        assert (outcome["outcome"], outcome["reading"]) == ("ambiguous", None)
        assert outcome["why"].endswith("the retest could not run: the retest run exited 2: unknown check")


def test_a_capture_the_store_did_not_take_does_not_stop_the_step(store_url, monkeypatch):
    """The store refuses the capture's event (a blip): the reset, recorded before as remediating,
    goes on, and the pass goes on as far as the store takes the rest."""
    with Store.open(parse(store_url)) as store:
        record(store, "r1", 1.0, {"n1": ECC})
        rec = Recorder()
        rec.capture = effects.SlurmEffects({}).capture
        controller.run_pass(store, POLICY, TIMINGS, at(1.001), rec, "test", scheduler={"n1": IDLE})
        add_event = store.add_event

        def blip(node, kind, *args, **kw):
            if kind == controller.CAPTURE:
                raise StoreError("connection lost")
            return add_event(node, kind, *args, **kw)

        monkeypatch.setattr(store, "add_event", blip)
        p = controller.run_pass(store, POLICY, TIMINGS, at(1.02), rec, "test", scheduler={"n1": OURS})
        assert [a.kind for a in rec.calls][:2] == ["drain", "reset"] and p.stopped is None
        assert p.outcomes[0].captures[0]["recorded"] is False
        assert "capture" not in [e["kind"] for e in node_history(store, "n1", Window(0))["events"]]
