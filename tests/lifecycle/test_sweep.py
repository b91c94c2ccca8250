"""The idle-node sweep's pure parts: the site's file (checked whole, refused with file and field),
the pass's plan (idle, due, the share, the most overdue first), run ids, and Slurm's words about
its jobs (real captures from the test cluster, tests/fixtures/slurm/MANIFEST.tsv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.judge.loader import load_checks
from preflight.lifecycle import sweep_plan
from preflight.lifecycle.sweep_policy import SweepPolicy, SweepPolicyError, load
from preflight.parse.slurm import NodeState
from preflight.parse.slurm_jobs import job_state, parse_squeue, preempt_time

CHECKS = {c.id for c in load_checks()}
SLURM = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
HOUR = 3600.0
NOW = 1_800_000_000.0


def test_a_site_file_with_every_field(tmp_path):
    site = tmp_path / "sweep.yaml"
    site.write_text("format: preflight-sweep/1\npartition: sweep\naccount: ops\nperiod_h: 168\n"
                    "periods: {'gpu[001-032]': 24}\nmax_share: 0.25\nbudget_minutes: 20\ndcgm_level: 3\n"
                    "checks: [dcgm-diag, nccl-all-reduce]\nburn_minutes: 5\nrun_args: [--nccl-reps=2]\n"
                    "python: /opt/preflight/bin/python3\nout: /var/tmp/sweeps\n")
    p = load(site, CHECKS)
    assert (p.partition, p.account, p.max_share, p.budget_min, p.dcgm_level, p.burn_min) == (
        "sweep", "ops", 0.25, 20, 3, 5)
    assert p.period_of("gpu017") == 24 * HOUR and p.period_of("gpu100") == 168 * HOUR
    assert p.run_args == ("--nccl-reps=2",) and p.python == "/opt/preflight/bin/python3"


@pytest.mark.parametrize("body, message", [
    ("partition: sweep\n", "not a preflight-sweep/1 file"),
    ("format: preflight-sweep/1\n", "partition or qos: name the preemptable partition"),
    ("format: preflight-sweep/1\npartition: sweep\nperiod: 24\n", "period: unknown"),
    ("format: preflight-sweep/1\npartition: 'sweep;reboot'\n", "partition: a Slurm name"),
    ("format: preflight-sweep/1\nqos: [low]\n", "qos: a Slurm name"),
    ("format: preflight-sweep/1\npartition: sweep\nmax_share: 1.5\n", "max_share: from 0 to 1, not 1.5"),
    ("format: preflight-sweep/1\npartition: sweep\nmax_share: .nan\n", "max_share: a number"),
    ("format: preflight-sweep/1\npartition: sweep\nperiod_h: 0\n", "period_h: from 0.01"),
    ("format: preflight-sweep/1\npartition: sweep\nperiods: {'gpu[01-': 24}\n", "periods.gpu[01-: not a node set"),
    ("format: preflight-sweep/1\npartition: sweep\nperiods: [gpu01]\n", "periods: a mapping"),
    ("format: preflight-sweep/1\npartition: sweep\ndcgm_level: 5\n", "dcgm_level: from 1 to 4"),
    ("format: preflight-sweep/1\npartition: sweep\ndcgm_level: 2.5\n", "dcgm_level: a whole number"),
    ("format: preflight-sweep/1\npartition: sweep\nchecks: [dcgm-diagg]\n", "checks: no such check: dcgm-diagg"),
    ("format: preflight-sweep/1\npartition: sweep\nchecks: dcgm-diag\n", "checks: a list of texts"),
    ("format: preflight-sweep/1\npartition: sweep\nbudget_minutes: 10\nburn_minutes: 10\n",
     "burn_minutes: 10 leaves nothing of budget_minutes (10)"),
    ("format: preflight-sweep/1\npartition: sweep\nbudget_minutes: true\n", "budget_minutes: a number, not True"),
    ("format: preflight-sweep/1\npartition: sweep\npython: ''\n", "python: a path"),
    ("format: preflight-sweep/1\npartition: sweep\nperiods: {gpu01: 24\n", "invalid YAML"),
])
def test_a_bad_site_file_is_refused_with_file_and_field(tmp_path, body, message):
    site = tmp_path / "sweep.yaml"
    site.write_text(body)
    with pytest.raises(SweepPolicyError) as caught:
        load(site, CHECKS)
    assert str(site) in str(caught.value) and message in str(caught.value)


def idle(name: str) -> NodeState:
    return NodeState(name, "IDLE")


def test_only_idle_due_nodes_within_the_share_most_overdue_first():
    states = {"n1": idle("n1"), "n2": idle("n2"), "n3": idle("n3"), "n4": NodeState("n4", "ALLOCATED"),
              "n5": NodeState("n5", "IDLE+DRAIN"), "n6": idle("n6"), "n7": NodeState("n7", "IDLE*"),
              "n8": NodeState("n8", "ALLOCATED"), "n9": idle("n9"), "n10": idle("n10")}
    last = {"n1": NOW - 10 * HOUR, "n2": NOW - 30 * HOUR, "n3": NOW - 50 * HOUR, "n9": NOW - 25 * HOUR}
    policy = SweepPolicy(partition="sweep", period_h=24, max_share=0.5)
    p = sweep_plan.plan(states, {"n8": object()}, last, policy, NOW)
    # idle and not in flight: n1 n2 n3 n6 n9 n10 (6) + n8 in flight = 7; half of it: 3, one taken
    assert (p.capacity, p.in_flight) == (3, 1)
    assert p.submit == ("n10", "n6")  # never swept first (by name), then the most overdue
    assert p.left["n3"].startswith("due, but 3 node(s)") and p.left["n2"].startswith("due, but")
    assert p.left["n1"] == "not due for 14.0 h" and p.left["n8"] == "a sweep is in flight"
    assert p.left["n4"] == "not idle (ALLOCATED)" and p.left["n5"] == "not idle (IDLE+DRAIN)"
    assert p.left["n7"] == "not idle (IDLE*)"


def test_the_share_rounds_down_but_a_small_partition_is_still_swept_and_zero_stops_it():
    states = {"n1": idle("n1"), "n2": idle("n2"), "n3": idle("n3")}
    assert sweep_plan.plan(states, {}, {}, SweepPolicy(partition="s", max_share=0.1), NOW).submit == ("n1",)
    assert sweep_plan.plan(states, {"n1": 1}, {}, SweepPolicy(partition="s", max_share=0.1), NOW).submit == ()
    off = sweep_plan.plan(states, {}, {}, SweepPolicy(partition="s", max_share=0), NOW)
    assert off.submit == () and off.capacity == 0 and len(off.left) == 3


def test_a_node_period_of_its_own():
    policy = SweepPolicy(partition="s", period_h=168, periods=(("gpu[01-02]", 1),), max_share=1)
    states = {"gpu01": idle("gpu01"), "gpu03": idle("gpu03")}
    p = sweep_plan.plan(states, {}, {"gpu01": NOW - 2 * HOUR, "gpu03": NOW - 2 * HOUR}, policy, NOW)
    assert p.submit == ("gpu01",) and p.left["gpu03"] == "not due for 166.0 h"


def test_run_ids_name_their_node_even_with_dashes():
    rid = sweep_plan.run_id("rack-3-gpu07", NOW + 0.25)
    assert rid == "sweep-rack-3-gpu07-20270115T080000.250"
    assert sweep_plan.node_of(rid) == "rack-3-gpu07"
    assert sweep_plan.node_of("retest-gpu01-20270115T080000.250") is None and sweep_plan.node_of("sweep-x") is None


def test_slurm_words_about_the_sweep_jobs():
    jobs = parse_squeue((SLURM / "squeue-sweep-jobs-one-preempted.txt").read_text())
    assert [(j.job, j.comment, j.state, j.active) for j in jobs] == [
        (1, "sweep-gpu01-20261203T130000.000", "COMPLETED", False),
        (2, "sweep-gpu02-20261203T130000.001", "COMPLETED", False)]
    preempted = (SLURM / "scontrol-show-job-preempted-ended-in-grace.txt").read_text()
    completed = (SLURM / "scontrol-show-job-completed-not-preempted.txt").read_text()
    # The preempted job ended itself inside the grace: COMPLETED, and only PreemptTime tells.
    assert job_state(preempted) == "COMPLETED" and preempt_time(preempted) == "2026-12-03T12:43:01"
    assert job_state(completed) == "COMPLETED" and preempt_time(completed) is None
    # PreemptEligibleTime is another field, never read as PreemptTime.
    assert preempt_time("JobId=3 PreemptEligibleTime=2026-12-03T12:42:59") is None
