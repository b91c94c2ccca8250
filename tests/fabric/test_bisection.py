"""The collective's bisection planner (preflight/fabric/bisection.py), table-tested against an
oracle: a fault model that answers for every group as a real fleet would (a group fails when it
holds a bad node or both ends of a bad path, or is at least the size a scale-only fault needs)."""

from __future__ import annotations

import math

import pytest

from preflight.fabric.bisection import attribute, bisect, disjoint_batches, plan_pairs, split


def fleet(n: int) -> list[str]:
    return [f"n{i:05d}" for i in range(n)]


def oracle(bad=(), paths=(), at_size: int | None = None, dead=(), log=None):
    """run_round for a fleet with these faults; ``dead`` nodes make a run never start."""
    def run_round(runs):
        members = [set(r.members) for r in runs]
        for m in members:  # a round's groups share no node: the planner promises it
            assert sum(len(m & other) for other in members) == len(m)
        if log is not None:
            log.append([r.members for r in runs])
        out = {}
        for r in runs:
            m = set(r.members)
            if m & set(dead):
                out[r.probe] = "unknown"
            elif m & set(bad) or any(set(p) <= m for p in paths) or (at_size and len(m) >= at_size):
                out[r.probe] = "fail"
            else:
                out[r.probe] = "pass"
        return out
    return run_round


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 13, 64, 100, 1024])
def test_one_bad_node_is_found_within_log2_n_plus_2_rounds(n):
    hosts = fleet(n)
    for bad in {hosts[0], hosts[n // 2], hosts[-1]}:
        found = bisect(hosts, oracle(bad=[bad]))
        if n == 2:
            # Two nodes, nobody known good: the pair fails and neither can be told from the other.
            assert found.culprits == () and found.unresolved == tuple(hosts)
            continue
        assert found.culprits == (bad,) and found.paths == () and found.unresolved == ()
        # Three nodes have nobody known good: their three pairs share nodes, so they take a round each.
        assert found.rounds <= (4 if n == 3 else math.log2(n) + 2), (n, bad, found.rounds)
        assert set(found.cleared) == set(hosts) - {bad}


@pytest.mark.parametrize("n", [8, 64, 1024])
def test_two_bad_nodes_are_both_found(n):
    hosts = fleet(n)
    for pair in [(hosts[1], hosts[2]), (hosts[0], hosts[-1]), (hosts[3], hosts[n // 2 + 1])]:
        found = bisect(hosts, oracle(bad=pair))
        assert found.culprits == pair and found.unresolved == ()
        assert found.rounds <= math.log2(n) + 3


def test_a_healthy_fleet_costs_one_run_and_blames_nobody():
    found = bisect(fleet(64), oracle())
    assert found.healthy and found.runs == 1 and found.rounds == 1 and len(found.cleared) == 64


def test_a_fleet_run_already_made_is_not_run_again():
    log = []
    found = bisect(fleet(8), oracle(bad=["n00005"], log=log), fleet="fail")
    assert found.culprits == ("n00005",) and len(fleet(8)) not in {len(g) for rnd in log for g in rnd}
    assert found.steps[0][0].stage == "fleet" and found.rounds == len(log) + 1


def test_a_relative_expectation_halves_a_passing_fleet_once():
    # The fleet run "passes" (nothing to compare it with); its halves, judged against each other, show the slow one.
    found = bisect(fleet(8), oracle(bad=["n00006"]), fleet="pass", split_once=True)
    assert found.culprits == ("n00006",)
    healthy = bisect(fleet(8), oracle(), fleet="pass", split_once=True)
    assert healthy.healthy and healthy.runs == 3  # the fleet run and its two halves, no cross stage


@pytest.mark.parametrize("n,path", [(8, ("n00001", "n00006")), (16, ("n00000", "n00015")),
                                    (64, ("n00010", "n00040")), (6, ("n00000", "n00001"))])
def test_a_path_fault_is_found_by_the_cross_boundary_stage(n, path):
    found = bisect(fleet(n), oracle(paths=[path]))
    assert found.paths == (path,) and found.culprits == () and found.unresolved == ()
    assert {r.stage for r, _ in found.steps} >= {"fleet", "halves"}


def test_a_fault_only_at_scale_is_left_unresolved_not_blamed():
    found = bisect(fleet(16), oracle(at_size=16))
    assert found.culprits == () and found.paths == () and len(found.unresolved) == 16
    assert any("only at that size" in n for n in found.notes)


def test_a_run_that_never_started_stops_its_branch():
    found = bisect(fleet(8), oracle(bad=["n00001"], dead=["n00006"]))
    assert "n00006" in found.unresolved and "n00001" not in found.cleared
    assert any("gave no verdict" in n for n in found.notes)


def test_hosts_named_twice_are_refused():
    with pytest.raises(ValueError, match="named twice: a"):
        bisect(["a", "b", "a"], oracle())


def test_split_halves_keep_order():
    assert split(["a", "b", "c", "d", "e"]) == (("a", "b", "c"), ("d", "e"))


def test_confirm_pairs_spread_over_good_partners_and_batch_disjointly():
    plan = plan_pairs(["a", "b", "c", "d"], {"b", "d"}, {"a", "c"})
    assert plan.pairs == (("b", "a"), ("d", "c")) and not plan.blind
    blind = plan_pairs(["a", "b", "c"], {"a", "b", "c"})
    assert blind.blind and blind.pairs == (("a", "b"), ("c", "a"))
    assert disjoint_batches([("a", "b"), ("c", "a"), ("d", "e")]) == [[("a", "b"), ("d", "e")], [("c", "a")]]


def test_attribution_blames_the_host_that_fails_with_a_trusted_partner():
    att = attribute({("b", "a"): True, ("c", "a"): False, ("d", "b"): True}, suspected={"b"})
    assert att.culprits == ("c",) and att.unresolved == ()
    att = attribute({("a", "b"): False}, suspected={"a", "b", "c"})
    assert att.culprits == () and att.unresolved == ("a", "b")
