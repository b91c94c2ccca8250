"""The rail stage's planner: disjoint pairs, at least two partners each, three rounds, fast."""

from __future__ import annotations

import time

import pytest

from preflight.fabric.pairing import MAX_ROUNDS, Rail, paired_rails, plan_rail_rounds, rail_counts


def names(n: int) -> list[str]:
    return [f"gpu{i:05d}" for i in range(n)]


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 16, 17, 63, 64, 1000, 1001])
def test_rounds_are_disjoint_and_every_node_gets_two_different_partners(n):
    plan = plan_rail_rounds(names(n))
    assert 1 <= len(plan.rounds) <= MAX_ROUNDS
    for rnd in plan.rounds:
        seen = [h for pair in rnd.pairs for h in pair]
        assert len(seen) == len(set(seen)), "a node twice in one round"
        assert set(seen) | set(rnd.idle) == set(names(n))
        assert len(rnd.idle) == n % 2
    for node in names(n):
        partners = plan.partners(node)
        assert len(set(partners)) == len(partners) >= 2, (node, partners)


def test_idle_nodes_differ_between_rounds_with_an_odd_count():
    plan = plan_rail_rounds(names(9))
    idle = [r.idle[0] for r in plan.rounds]
    assert len(set(idle)) == 3


def test_two_nodes_get_one_round_and_a_note_and_one_node_none():
    plan = plan_rail_rounds(["a", "b"])
    assert [r.pairs for r in plan.rounds] == [(("a", "b"),)] and "one partner" in plan.notes[0]
    assert plan_rail_rounds(["a"]).rounds == ()


def test_deterministic_and_names_must_be_unique():
    assert plan_rail_rounds(names(50)) == plan_rail_rounds(names(50))
    with pytest.raises(ValueError, match="named twice: b"):
        plan_rail_rounds(["a", "b", "c", "b"])


def test_planner_time_at_1024_nodes_is_under_a_second():
    t0 = time.perf_counter()
    plan = plan_rail_rounds(names(1024))
    assert time.perf_counter() - t0 < 1.0 and plan.runs == 3 * 512


def test_rails_pair_by_index_and_odd_counts_are_named():
    a = [Rail("mlx5_0", 1), Rail("mlx5_1", 1)]
    b = [Rail("mlx5_0", 1)]
    assert [(i, x.name, y.name) for i, x, y in paired_rails(a, b)] == [(0, "mlx5_0:1", "mlx5_0:1")]
    assert rail_counts({"n1": a, "n2": a, "n3": b}) == (2, {"n3": 1})
