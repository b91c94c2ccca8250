"""What `preflight drain` and `resume` would do (preflight/app/drain.py), without Slurm: the
shipped example fleet's verdicts (tests/golden/examples/h200-fleet.json, judged from real
captures) against node states as `scontrol show node` reports them."""

from __future__ import annotations

import json
from pathlib import Path

from preflight.app.drain import plan_drain, plan_resume
from preflight.parse.slurm import NodeState

REPORT = json.loads((Path(__file__).resolve().parents[1] / "golden" / "examples" / "h200-fleet.json").read_text())


def idle(*names: str) -> dict[str, NodeState]:
    return {n: NodeState(n, "IDLE") for n in names}


def test_the_breaker_counts_the_drains_against_the_run_and_says_why():
    states = idle(*REPORT["hosts"])
    plan = plan_drain(REPORT, states, "r1")  # 3 nodes blamed of 9: past 10 %
    assert plan.refused and plan.refused.startswith("would drain 3 of the run's 9 nodes, more than the breaker "
                                                    "allows (0: --max-fraction 0.1)")
    assert plan.doing("drain") == []
    assert plan_drain(REPORT, states, "r1", max_fraction=0.5, max_nodes=2).refused.startswith(
        "would drain 3 of the run's 9 nodes, more than the breaker allows (2: --max-fraction 0.5, --max-nodes 2)")


def test_each_blamed_node_is_drained_with_its_cause_and_action_and_unreachable_nodes_never():
    plan = plan_drain(REPORT, idle(*REPORT["hosts"]), "r1", max_fraction=0.34)
    assert plan.refused is None
    drains = {a.node: a.reason for a in plan.doing("drain")}
    assert sorted(drains) == ["gpu006", "gpu007", "gpu008"]  # gpu009 was unreachable: not its fault
    assert drains["gpu007"].startswith("preflight: nvlink-down r1: ") and len(drains["gpu007"]) <= 200
    assert drains["gpu006"].startswith("preflight: nic-fw-driver-mismatch r1: ")


def test_someone_elses_drain_is_left_and_preflights_own_is_not_repeated():
    states = {**idle(*REPORT["hosts"]),
              "gpu006": NodeState("gpu006", "IDLE+DRAIN", "bad DIMM [ops@2026-12-01T10:00:00]"),
              "gpu007": NodeState("gpu007", "IDLE+DRAIN", "preflight: nvlink-down r0 [root@2026-12-01T09:00:00]")}
    plan = plan_drain(REPORT, states, "r1", max_fraction=0.34)
    assert [a.node for a in plan.doing("drain")] == ["gpu008"]
    why = {a.node: a.why for a in plan.actions if a.kind == "none"}
    assert why["gpu006"].startswith("drained by someone else (bad DIMM")
    assert why["gpu007"].startswith("already drained by preflight")


def test_resume_only_preflights_drains_of_nodes_that_now_pass():
    states = {**idle(*REPORT["hosts"]),
              "gpu001": NodeState("gpu001", "IDLE+DRAIN", "preflight: nvlink-down r0 [root@t]"),
              "gpu002": NodeState("gpu002", "IDLE+DRAIN", "bad DIMM [ops@t]"),
              "gpu007": NodeState("gpu007", "IDLE+DRAIN", "preflight: nvlink-down r0 [root@t]")}
    plan = plan_resume(REPORT, states)
    assert [a.node for a in plan.doing("resume")] == ["gpu001"]  # passes in this run
    why = {a.node: a.why for a in plan.actions if a.kind == "none"}
    assert why == {"gpu002": "drained by someone else (bad DIMM [ops@t]): left as it is",
                   "gpu007": "still fail in this run"}


def test_a_slow_path_between_two_nodes_drains_neither_and_a_slow_rail_drains_its_node():
    """preflight fabric's path finding blames the link between two nodes, not either of them."""
    from preflight.app.drain import blamed

    report = {"diagnoses": [{"cause": "fabric-path-slow", "hosts": ["n2", "n5"], "confidence": "high"},
                            {"cause": "fabric-rail-slow", "hosts": ["n3"], "confidence": "high"}]}
    assert set(blamed(report)) == {"n3"}
