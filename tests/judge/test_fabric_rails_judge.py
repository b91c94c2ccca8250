"""The rail stage's attribution, on planned rounds with measured-looking figures per rule."""

from __future__ import annotations

from preflight.fabric.pairing import Rail, plan_rail_rounds
from preflight.fabric.record import RailRun
from preflight.judge.fabric_rails import FLAKY, PATH, SLOW, UNREACHABLE, judge_rails

NODES = [f"n{i}" for i in range(6)]
NDR = Rail("mlx5_0", 1, None, 400.0, "InfiniBand")


def sweep(figure, nodes=NODES, reps=3, rail=NDR):
    """Every rep of every pair of the planned rounds; ``figure(a, b, rep)`` -> Gb/s or None
    (None: the partner never answered)."""
    out = []
    for rnd in plan_rail_rounds(nodes).rounds:
        for a, b in rnd.pairs:
            for rep in range(1, reps + 1):
                g = figure(a, b, rep)
                out.append(RailRun(a, b, 0, rail, rail, rep, g, None if g is not None else "refused", g is None))
    return out


def blamed(j):
    return {(b.node, b.cause, b.severity) for b in j.blames}


def test_healthy_fleet_is_never_blamed():
    j = judge_rails(sweep(lambda a, b, rep: 392.0 + (hash((a, b, rep)) % 5) / 10))
    assert j.blames == () and all(p.state == "ok" for p in j.pairs)
    assert j.cell("n0", 0)[0] == "ok"


def test_a_node_slow_with_every_partner_is_the_culprit_and_only_it():
    j = judge_rails(sweep(lambda a, b, rep: 190.0 if "n2" in (a, b) else 392.0))
    assert blamed(j) == {("n2", SLOW, "fail")}
    assert len(j.blames[0].partners) == 3 and j.cell("n2", 0) == ("slow", 190.0)


def test_a_pair_slow_only_together_is_the_path():
    j = judge_rails(sweep(lambda a, b, rep: 100.0 if {a, b} == {"n0", "n5"} else 392.0))
    assert blamed(j) == {("n0", PATH, "warn"), ("n5", PATH, "warn")}


def test_slow_in_some_repetitions_is_flaky():
    j = judge_rails(sweep(lambda a, b, rep: 150.0 if "n4" in (a, b) and rep == 2 else 392.0))
    assert blamed(j) == {("n4", FLAKY, "fail")}


def test_a_partner_that_never_answers_is_a_finding():
    j = judge_rails(sweep(lambda a, b, rep: None if "n1" in (a, b) else 392.0))
    assert blamed(j) == {("n1", UNREACHABLE, "fail")}


def test_line_rate_catches_a_fleet_slow_as_a_whole_which_the_median_cannot():
    half = sweep(lambda a, b, rep: 200.0)
    j = judge_rails(half)
    assert {b.node for b in j.blames} == set(NODES) and "fabric-wide" in j.blames[0].detail
    veth = Rail("eth0")
    assert judge_rails(sweep(lambda a, b, rep: 2.0, rail=veth)).blames == ()
    assert "line rate unknown" in judge_rails(sweep(lambda a, b, rep: 2.0, rail=veth)).references[0]


def test_two_nodes_cannot_tell_node_from_path():
    j = judge_rails(sweep(lambda a, b, rep: 100.0, nodes=["a", "b"], rail=NDR))
    assert {(b.node, b.severity) for b in j.blames} == {("a", "warn"), ("b", "warn")}
    assert "one partner" in j.blames[0].detail


def test_a_node_that_stops_answering_part_way_is_unreachable():
    # n0 meets n5, n4, n3 in rounds 1-3; it answers in round 1 only.
    order = {("n0", "n5"): 1, ("n0", "n4"): 2, ("n0", "n3"): 3}
    j = judge_rails(sweep(lambda a, b, rep: None if order.get((a, b), 0) >= 2 else 392.0))
    assert blamed(j) == {("n0", UNREACHABLE, "fail")}


def test_the_reference_holds_with_two_slow_nodes_of_four():
    """Five of six pairs touch n1 or n2: a median over pairs would be the slow rate (150) and
    blame nobody; over the nodes' best pairs it is half-way (271), and both are blamed."""
    j = judge_rails(sweep(lambda a, b, rep: 150.0 if {a, b} & {"n1", "n2"} else 392.0, nodes=NODES[:4],
                          rail=Rail("eth0")))
    assert j.medians[0] == 271.0 and {(b.node, b.cause) for b in j.blames} == {("n1", SLOW), ("n2", SLOW)}


def test_a_tool_that_fails_on_a_node_is_not_a_slow_rail():
    """ib_write_bw missing on n2: its pairs measured nothing (not a partner that did not answer,
    no figure either); that is a test that never ran, not slowness."""
    runs = [RailRun(r.node, r.partner, r.rail, r.node_rail, r.partner_rail, r.rep, None,
                    "bash: line 1: ib_write_bw: command not found", False) if "n2" in (r.node, r.partner) else r
            for r in sweep(lambda a, b, rep: 392.0)]
    j = judge_rails(runs)
    assert blamed(j) == {("n2", UNREACHABLE, "fail")}
