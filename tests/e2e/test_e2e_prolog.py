"""`preflight prolog` as slurm.conf's Prolog, run by the real slurmd of each simulated node before
a job (tests/slurmcluster.py): on a node whose NIC port is down it exits 1, so Slurm itself drains
the node ("Prolog error") and requeues the job; on a healthy node the job runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from nodes import healthy_h200, port_polling
from slurmcluster import shipped_wrapper, slurm_fleet
from waiting import wait_for

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("prolog")
    out = work / "reports"
    # What a site installs (examples/slurm/preflight-prolog): slurmd runs the Prolog with the job's
    # environment, no PATH and no arguments. No store file here: the runs stay on the node.
    script = shipped_wrapper("preflight-prolog", work / "preflight-prolog", store_file=work / "store.url",
                             prelude=f"export PYTHONPATH={ROOT}",
                             exec_line=f'exec {sys.executable} -m preflight prolog --budget 10 --out "{out}/$(hostname)"')
    hosts = [port_polling(healthy_h200("gpu01"), nic=3), healthy_h200("gpu02")]
    with slurm_fleet(hosts, work, [f"Prolog={script}"]) as slurm:
        slurm.reports = out
        yield slurm


def job_state(cluster, job: str) -> str:
    line = cluster.slurm("scontrol", "show", "job", "-o", job).stdout
    return re.search(r"JobState=(\S+)", line).group(1)


def submit(cluster, node: str) -> str:
    said = cluster.slurm("sbatch", "--parsable", "-N1", f"--nodelist={node}", "-o", "/dev/null", "--wrap", "true")
    return said.stdout.strip().split(";")[0]


def test_a_failing_prolog_has_slurm_drain_the_node_and_requeue_the_job(cluster):
    job = submit(cluster, "gpu01")

    def drained():
        """gpu01 drained by Slurm after its prolog failed"""
        line = cluster.slurm("scontrol", "show", "node", "-o", "gpu01").stdout
        return "DRAIN" in line and "Prolog error" in line

    wait_for(drained)
    assert job_state(cluster, job) in ("PENDING", "REQUEUED", "REQUEUE_HOLD")
    # The node kept the prolog's report: the port that is down, judged on the node itself.
    [report] = (cluster.reports / "gpu01").glob("prolog-*/report.json")
    assert '"ib-port-down"' in report.read_text() and '"fail"' in report.read_text()


def test_a_healthy_node_runs_the_job(cluster):
    job = submit(cluster, "gpu02")

    def done():
        """the job on gpu02 completed"""
        return job_state(cluster, job) == "COMPLETED"

    wait_for(done)
    assert "DRAIN" not in cluster.slurm("scontrol", "show", "node", "-o", "gpu02").stdout
