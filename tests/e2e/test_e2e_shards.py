"""The SSH fan-out split over worker processes (collect/shards.py), over real sshd: the same
verdicts as one process, and a worker that dies costs only what it had not sent."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import pytest
from test_e2e_run import SMI_CHECKS, gpu_node

from preflight.app.cli import main
from preflight.collect.fanout import ExecPlan
from preflight.collect.inventory import load_hosts_file
from preflight.collect.probes import PROBES
from preflight.collect.shards import auto_workers, run_sharded
from preflight.collect.ssh import SshOptions
from preflight.model import ProbeResult

pytestmark = pytest.mark.root


def test_workers_by_fleet_size():
    assert [auto_workers(n, cpus=16) for n in (1, 64, 65, 256, 10_000)] == [1, 1, 2, 4, 16]
    assert auto_workers(10_000, cpus=2) == 2


def test_two_workers_give_the_verdicts_of_one(sim_cluster, tmp_path):
    from simcluster import SimHost

    cluster = sim_cluster([gpu_node("gpu01"), gpu_node("gpu02", gpus=7), SimHost("gpu03", down=True),
                           gpu_node("gpu04", driver="570.195.03"), gpu_node("gpu05")])
    reports = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                     "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                     "--out", str(out), "--run-id", "r", "-q", "--checks", SMI_CHECKS, "--workers", str(workers)])
        assert code == 1
        reports[workers] = json.loads((out / "r" / "report.json").read_text())
        assert len(list((out / "r" / "bundle" / "hosts").glob("*/*.json"))) == 5 * 2  # every record saved once

    def verdicts(report):
        return (report["hosts"], sorted((f["host"] or "", f["check"], f["status"], f["summary"]) for f in report["findings"]),
                sorted((d["cause"], tuple(d["hosts"])) for d in report["diagnoses"]))
    assert verdicts(reports[2]) == verdicts(reports[1])
    assert reports[2]["hosts"]["gpu02"]["status"] == "fail" and reports[2]["hosts"]["gpu03"]["reachable"] is False


def test_a_worker_that_dies_costs_only_what_it_had_not_sent(sim_cluster):
    # Dealt round robin: the hung node is worker 0's only host, the healthy one worker 1's.
    cluster = sim_cluster([gpu_node("hung", hang_s=120), gpu_node("fine")])
    ssh = SshOptions(ssh_config=cluster.ssh_config, known_hosts=cluster.known_hosts, identity=cluster.identity)
    plan = ExecPlan((PROBES["nvidia-smi-q-x"], PROBES["nvidia-smi-q"]), timeout_s=60, ssh=ssh)
    got: list[ProbeResult] = []

    def on_result(result: ProbeResult) -> None:
        got.append(result)
        if result.host == "fine" and len([r for r in got if r.host == "fine"]) == 1:
            worker0 = next(p for p in multiprocessing.active_children() if p.name == "preflight-shard-0")
            os.kill(worker0.pid, signal.SIGKILL)

    started = time.monotonic()
    run_sharded(load_hosts_file(cluster.hosts_file), plan, on_result, workers=2)
    assert time.monotonic() - started < 30  # not the hung tool's 60 s
    assert sorted((r.host, r.probe) for r in got) == sorted(
        (h, p) for h in ("hung", "fine") for p in ("nvidia-smi-q", "nvidia-smi-q-x"))
    fine = [r for r in got if r.host == "fine"]
    assert all(r.exit_code == 0 and r.stdout for r in fine)
    hung = [r for r in got if r.host == "hung"]
    assert all(r.error == "not run: the controller's worker process died (exit code -9)" for r in hung)
