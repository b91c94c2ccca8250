"""``preflight fabric --slurm`` on the real Slurm 22.05 test cluster (tests/slurmcluster.py): the
rail listing as the run's per-node tasks, each rail test's two sides as concurrent srun steps of
one allocation, real iperf3 across the simulated hosts' links, a real tbf-shaped host blamed."""

from __future__ import annotations

import json
import shutil

import pytest
from netfaults import slow_host
from simcluster import SimHost
from slurmcluster import slurm_fleet

from preflight.app.cli import main

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 missing (apt-get install iperf3)")]

HOSTS = ["fa1", "fa2", "fa3", "fa4"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_fleet([SimHost(h) for h in HOSTS], tmp_path_factory.mktemp("slurm-fabric")) as slurm:
        yield slurm


def test_fabric_through_srun_steps_blames_the_slow_host(cluster, tmp_path):
    with slow_host(cluster.sim, "fa2", rate="20mbit"):
        code = main(["fabric", "--slurm", "-w", "fa[1-4]", "--pair-tool", "iperf3", "--seconds", "1",
                     "--reps", "1", "--bitrate", "200M", "--out", str(tmp_path), "--run-id", "s", "-q", "--no-db"])
    report = json.loads((tmp_path / "s" / "report.json").read_text())
    found = {f["host"]: (f["status"], f["symptoms"]) for f in report["findings"]
             if f["check"] == "fabric-rails" and f["host"]}
    assert code == 1 and found.pop("fa2") == ("fail", ["fabric-rail-slow"])
    assert {s for s, _ in found.values()} == {"pass"}
    # Each pair's record holds both sides' srun-run iperf3 output.
    record = json.loads(next((tmp_path / "s" / "bundle" / "hosts").glob("*/fabric-rail-1.txt")).read_text())
    assert record["format"] == "preflight-fabric-rail/1" and record["tool"] == "iperf3"
    assert all(json.loads(run["client"]["stdout"])["end"] for run in record["runs"])
    cluster.wait_idle()  # the stage's allocation released
