"""``preflight sweep --slurm`` on the real Slurm 22.05 cluster (tests/slurmcluster.py) with
preemption configured as docs/sweep.md gives it: ``PreemptType=preempt/partition_prio``,
``PreemptMode=CANCEL``, a low-priority ``sweep`` partition with a 5 s ``GraceTime`` and a
high-priority ``batch`` partition over the same nodes.

Each sweep job runs ``preflight sweep --job`` in an srun step on its simulated node, which runs
``preflight run --local`` of the site's checks there against the node's recorded real outputs,
recording into the test's store. What is checked: a pass sweeps only idle nodes that are due,
at most the site's share at once; the runs and their outcomes are in the store; a node whose
sweep failed is drained by ``lifecycle --once``; a user job submitted while a node is being
swept starts there within the grace, the sweep is recorded as preempted (no verdict), and the
node's next pass sweeps it again. The burn step is not run here: it needs PyTorch and NVML on
the node, which the simulated nodes lack (its command line is tested in tests/app/test_sweep_cli.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from nodes import DCGM_DIAG, gpu_fallen_off_bus, healthy_h200
from slurmcluster import slurm_fleet
from waiting import wait_for

from preflight.app.cli import main
from preflight.app.store_cli import open_store
from preflight.store.location import parse

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]
NODES = "gpu[01-04]"
GRACE_S = 5
PREEMPTION = ["PreemptType=preempt/partition_prio", "PreemptMode=CANCEL",
              f"PartitionName=sweep Nodes={NODES} PriorityTier=1 PreemptMode=CANCEL GraceTime={GRACE_S} State=UP",
              f"PartitionName=batch Nodes={NODES} PriorityTier=10 PreemptMode=OFF State=UP",
              # gpu05 alone, for the sweep whose job dies before it can say how it ended
              f"PartitionName=sweep2 Nodes=gpu05 PriorityTier=1 PreemptMode=CANCEL GraceTime={GRACE_S} State=UP"]


def slow_diag(node, seconds: float):
    """The node's first DCGM diagnostic takes ``seconds`` (a long level), the next as recorded."""
    reply = node.commands[DCGM_DIAG]
    return replace(node, commands={**node.commands, DCGM_DIAG: [replace(reply, sleep_s=seconds), reply]})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg):
    work = tmp_path_factory.mktemp("sweep")
    hosts = [healthy_h200("gpu01"), healthy_h200("gpu02"), gpu_fallen_off_bus(healthy_h200("gpu03")),
             slow_diag(healthy_h200("gpu04"), 90), slow_diag(healthy_h200("gpu05"), 90)]
    with pytest.MonkeyPatch.context() as env:
        # What a site has on its nodes: preflight importable by the Python the site file names
        # (set before the daemons start, so that they and every job inherit it).
        env.setenv("PYTHONPATH", str(ROOT))
        with slurm_fleet(hosts, work, PREEMPTION) as slurm:
            slurm.work = work
            # PostgreSQL, as a fleet's sweep has it (docs/sweep.md: the nodes record into the store
            # the controller reads), reached from the nodes over its unix socket.
            slurm.db = pg.create_database("sweep_e2e")
            slurm.site = work / "sweep.yaml"
            slurm.site.write_text(
                "format: preflight-sweep/1\npartition: sweep\nperiod_h: 24\nmax_share: 0.5\nbudget_minutes: 3\n"
                "dcgm_level: 1\n"  # the simulated nodes answer DCGM with a real level-1 capture
                "checks: [dcgm-diag, nccl-all-reduce, gpu-inventory, xid]\nrun_args: [--nccl-reps=1]\nburn_minutes: 0\n"
                f"python: {sys.executable}\nout: {work / 'reports'}\n")
            yield slurm


def sweep_pass(cluster, capsys, *more: str) -> dict:
    code = main(["sweep", "--slurm", "--site", str(cluster.site), "--db", cluster.db, "--json", *more])
    said = capsys.readouterr()
    assert code == 0, (code, said.out, said.err)
    return json.loads(said.out)


def query(cluster, sql: str, params=()) -> list[tuple]:
    with open_store(parse(cluster.db), create=False) as store:
        return [tuple(r) for r in store.rows(sql, params)]


def events(cluster, node: str) -> list[tuple[str, str, str]]:
    return query(cluster, "SELECT kind, reason, run_id FROM pf_events WHERE node = ? AND kind LIKE 'sweep-%' "
                          "ORDER BY at, id", (node,))


def outcome(cluster, node: str, run_id: str):
    def ended():
        """the sweep's outcome in the store"""
        return next(((k, r) for k, r, rid in events(cluster, node) if rid == run_id and k != "sweep-submitted"), None)
    return wait_for(ended, 120)


def wait_checking(run_id: str) -> None:
    """Until the sweep's `preflight run` runs on its node: `sweep --job` starts it only once it
    listens for Slurm's SIGTERM (the nodes are this machine's processes, so pgrep sees them)."""
    def checking():
        """the sweep's run started on its node"""
        return subprocess.run(["pgrep", "-f", f"preflight run --local --run-id {run_id} "],
                              stdout=subprocess.DEVNULL).returncode == 0
    wait_for(checking, 60)


def job_line(cluster, job: int | str) -> str:
    return cluster.slurm("scontrol", "show", "job", "-o", str(job)).stdout


def test_a_pass_sweeps_idle_due_nodes_within_the_share_and_the_runs_are_recorded(cluster, capsys):
    """Four idle nodes, never swept, max_share 0.5: two jobs (the first by name), in the sweep
    partition, exclusive; the next pass adds none while they run. Both runs are recorded with
    their verdicts, and a pass after them leaves the two nodes alone (not due for 24 h)."""
    first = sweep_pass(cluster, capsys)
    assert [s["node"] for s in first["submitted"]] == ["gpu01", "gpu02"] and first["capacity"] == 2
    for s in first["submitted"]:
        line = job_line(cluster, s["job"])
        assert "Partition=sweep" in line and "OverSubscribe=NO" in line and f"Comment={s['run_id']}" in line
    second = sweep_pass(cluster, capsys)
    assert second["submitted"] == [] and second["in_flight"] == ["gpu01", "gpu02"], (second, events(cluster, "gpu01"), events(cluster, "gpu02"))
    assert "max_share" in second["left"]["gpu03"]
    for s in first["submitted"]:
        assert outcome(cluster, s["node"], s["run_id"]) == ("sweep-done", "passed")
    rows = query(cluster, "SELECT r.run_id, h.host, h.status FROM pf_runs r JOIN pf_host_results h USING (run_id) "
                          "ORDER BY h.host")
    checks = {c for (j,) in query(cluster, "SELECT checks FROM pf_runs") for c in json.loads(j)}
    assert [(h, st) for _, h, st in rows] == [("gpu01", "pass"), ("gpu02", "pass")]
    assert {r for r, _, _ in rows} == {s["run_id"] for s in first["submitted"]}
    assert checks == {"dcgm-diag", "nccl-all-reduce", "gpu-inventory", "xid"}
    cluster.wait_idle()
    third = sweep_pass(cluster, capsys, "--dry-run")
    assert third["left"]["gpu01"].startswith("not due for 2") and [s["node"] for s in third["submitted"]] == [
        "gpu03", "gpu04"]


def test_a_failing_sweep_feeds_the_lifecycle_and_a_real_job_preempts_a_sweep(cluster, capsys, tmp_path):
    """gpu03 (a GPU off the bus) fails its sweep: lifecycle --once drains it. gpu04's sweep is in
    a long DCGM diagnostic when a user job asks for the node in the batch partition: the user job
    starts within the grace, the sweep is recorded as preempted (not a failure: no run, no
    verdict), and the next pass sweeps gpu04 again."""
    p = sweep_pass(cluster, capsys)
    jobs = {s["node"]: s for s in p["submitted"]}
    assert sorted(jobs) == ["gpu03", "gpu04"]
    assert outcome(cluster, "gpu03", jobs["gpu03"]["run_id"]) == ("sweep-done", "failed")
    site = tmp_path / "lifecycle.yaml"
    site.write_text("format: preflight-lifecycle/1\ntimings: {startup_grace_s: 0, breaker_fraction: 1.0}\n")
    # (1 where the chain's next step, a reboot, is refused: this cluster has no RebootProgram)
    assert main(["lifecycle", "--once", "--slurm", "--json", "--db", cluster.db,
                 "--site", str(site)]) in (0, 1)
    steps = [s for s in json.loads(capsys.readouterr().out)["steps"] if s["node"] == "gpu03"]
    assert steps[0]["to"] == "drained" and steps[0]["done"] == [
        f"drain gpu03 (preflight: drained gpu-fallen-off-bus {jobs['gpu03']['run_id']})"]
    assert "DRAIN" in cluster.slurm("scontrol", "show", "node", "-o", "gpu03").stdout

    sweep_job = jobs["gpu04"]["job"]
    wait_checking(jobs["gpu04"]["run_id"])
    time.sleep(1)  # inside the 90 s diagnostic
    submitted = time.time()
    user = cluster.slurm("sbatch", "--parsable", "-p", "batch", "-w", "gpu04", "--exclusive", "-o", "/dev/null",
                         "--wrap", "sleep 1").stdout.strip()

    def started():
        """the user job started"""
        m = re.search(r"StartTime=(\S+)", job_line(cluster, user))
        return "JobState=PENDING" not in job_line(cluster, user) and m and m.group(1)
    started_at = time.mktime(time.strptime(wait_for(started, 60), "%Y-%m-%dT%H:%M:%S"))
    # Slurm's times are whole seconds: one more on each side, and its scheduler's own pass.
    assert started_at - submitted <= GRACE_S + 2, (started_at - submitted, job_line(cluster, sweep_job))
    kind, reason = outcome(cluster, "gpu04", jobs["gpu04"]["run_id"])
    assert (kind, reason) == ("sweep-preempted", f"job {sweep_job} preempted by Slurm for a real job")
    # The sweep stopped itself inside the grace, so Slurm calls the job COMPLETED; its PreemptTime
    # is what says Slurm chose it for preemption (what the job's step asked before recording).
    assert "PreemptTime=None" not in job_line(cluster, sweep_job) and "PreemptTime=" in job_line(cluster, sweep_job)
    assert query(cluster, "SELECT COUNT(*) FROM pf_host_results WHERE host = 'gpu04'") == [(0,)]
    cluster.wait_idle()
    again = sweep_pass(cluster, capsys)
    assert [s["node"] for s in again["submitted"]] == ["gpu04"]
    assert outcome(cluster, "gpu04", again["submitted"][0]["run_id"]) == ("sweep-done", "passed")
    assert main(["history", "gpu04", "--since", "1d", "--json", "--db", cluster.db]) == 0
    kinds = [e["kind"] for e in json.loads(capsys.readouterr().out)["events"]]
    assert kinds == ["sweep-submitted", "sweep-preempted", "sweep-submitted", "sweep-done"]


def test_a_sweep_whose_job_dies_without_a_word_is_settled_by_the_next_pass(cluster, capsys, tmp_path):
    """The nodes' Python is missing: the job fails before `sweep --job` can record anything. The
    next pass finds the submitted sweep without an outcome and its job ended: incomplete, in
    Slurm's words, not a verdict; the node is due again and swept again. A sweep Slurm signals
    without preempting it records itself incomplete."""
    broken = tmp_path / "sweep.yaml"
    broken.write_text(cluster.site.read_text().replace("partition: sweep\n", "partition: sweep2\n")
                      .replace(f"python: {sys.executable}", "python: /nonexistent/python3"))
    cluster.site, kept = broken, cluster.site
    try:
        first = sweep_pass(cluster, capsys)
        [job] = [s["job"] for s in first["submitted"] if s["node"] == "gpu05"]
        wait_for(lambda: re.search(r"JobState=(FAILED|COMPLETED)", job_line(cluster, job)), 120)
        state = re.search(r"JobState=(\S+)", job_line(cluster, job)).group(1)
        second = sweep_pass(cluster, capsys)
        assert second["settled"] == [{"node": "gpu05", "run_id": first["submitted"][0]["run_id"],
                                      "outcome": "sweep-incomplete", "why": f"job {job} ended {state} without an outcome"}]
        assert [s["node"] for s in second["submitted"]] == ["gpu05"]
        cluster.slurm("scancel", str(second["submitted"][0]["job"]))
        cluster.wait_idle()
        # With the nodes' Python in place, a sweep that Slurm signals without preempting it (its
        # time limit, a person's scancel) says so itself: incomplete, and not preempted.
        cluster.site = tmp_path / "good.yaml"
        cluster.site.write_text(broken.read_text().replace("python: /nonexistent/python3", f"python: {sys.executable}"))
        third = sweep_pass(cluster, capsys)
        [s] = third["submitted"]
        wait_checking(s["run_id"])
        time.sleep(1)  # inside its 90 s diagnostic
        cluster.slurm("scancel", "--signal=TERM", str(s["job"]))
        assert outcome(cluster, "gpu05", s["run_id"]) == (
            "sweep-incomplete", "stopped by signal 15 (its time limit or a scancel; Slurm did not preempt it)")
        assert query(cluster, "SELECT COUNT(*) FROM pf_host_results WHERE host = 'gpu05'") == [(0,)]
    finally:
        cluster.site = kept
        cluster.wait_idle()
