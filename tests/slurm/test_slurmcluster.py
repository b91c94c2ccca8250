"""The test Slurm cluster itself (tests/slurmcluster.py): real slurmctld and slurmd 22.05, one
slurmd inside each simulated host's namespaces, so a task sees that host's name and shims."""

from __future__ import annotations

import time

import pytest
from simcluster import Reply, SimHost
from slurmcluster import slurm_fleet

from preflight.collect.slurm import SlurmNode

pytestmark = pytest.mark.root
NAMES = ["gpu01", "gpu02", "gpu03"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    hosts = [SimHost(n, {"nvidia-smi -L": Reply(f"GPU 0: NVIDIA H200 (UUID: GPU-{n})\n")}) for n in NAMES]
    started = time.monotonic()
    with slurm_fleet(hosts, tmp_path_factory.mktemp("slurm")) as slurm:
        slurm.up_s = time.monotonic() - started
        yield slurm


def test_every_node_runs_a_task_under_its_own_name(cluster):
    proc = cluster.slurm("srun", f"-N{len(NAMES)}", "hostname")
    assert sorted(proc.stdout.split()) == NAMES
    assert cluster.up_s < 30


def test_a_task_sees_its_nodes_shims(cluster):
    proc = cluster.slurm("srun", "-N3", "--ntasks-per-node=1", "sh", "-c", 'echo "$SLURMD_NODENAME $(nvidia-smi -L)"')
    assert sorted(proc.stdout.splitlines()) == [f"{n} GPU 0: NVIDIA H200 (UUID: GPU-{n})" for n in NAMES]


def test_a_drained_node_reads_drained_with_its_reason_until_resumed(cluster):
    cluster.drain("gpu02", "tests: fan")
    try:
        assert cluster.states()["gpu02"] == "drained"
        out = cluster.slurm("scontrol", "show", "node", "-o", "gpu02").stdout
        assert "Reason=tests: fan [root@" in out
    finally:
        cluster.resume("gpu02")
    assert cluster.states() == dict.fromkeys(NAMES, "idle")


def test_slurm_node_runs_one_command_per_step_with_stdin_and_a_timeout_on_the_node(cluster):
    node = SlurmNode("gpu02")
    r = node.run(["sh", "-c", 'printf "%s on $SLURMD_NODENAME" "$(cat)"; nvidia-smi -L >&2'], stdin=b"hi",
                 timeout=30)
    assert (r.ok, r.stdout, r.argv[0]) == (True, b"hi on gpu02", "sh")
    assert "GPU 0: NVIDIA H200 (UUID: GPU-gpu02)" in r.stderr
    started = time.monotonic()
    hung = node.run(["sleep", "60"], timeout=1)
    assert hung.timed_out and hung.error is None and time.monotonic() - started < 15
    assert node.run(["sh", "-c", "exit 3"], timeout=30).exit_code == 3


def test_slurm_node_inside_an_allocation_and_a_launch_that_fails(cluster):
    granted = cluster.slurm("salloc", "--no-shell", "-N1", "-w", "gpu03", "-t", "5")
    job = int(granted.stderr.split()[-1])
    try:
        inside = SlurmNode("gpu03", job)
        assert inside.run(["sh", "-c", "echo $SLURM_JOB_ID"], timeout=30).stdout == f"{job}\n".encode()
        cluster.stop_slurmd("gpu03")
        dead = inside.run(["true"], timeout=30)
        assert (dead.error, dead.exit_code, dead.stdout) == (
            "slurm: Communication connection failure", None, None)
    finally:
        cluster.slurm("scancel", str(job))
        cluster.start_slurmd("gpu03")
