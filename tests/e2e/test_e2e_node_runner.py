"""`run` over real sshd with the node runner (the default): each node runs its own probes (the
Slurm task's runner) through one SSH channel, with the verdicts of `--no-node-runner`'s channel
per probe."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from derived import h200_node_xml
from simcluster import Reply, SimHost
from test_e2e_run import SMI_CHECKS, gpu_node, start_run

from preflight.app.cli import main
from preflight.collect.batch import run_node_batched
from preflight.collect.fanout import ExecPlan
from preflight.collect.inventory import load_hosts_file
from preflight.collect.probes import PROBES
from preflight.collect.ssh import SshNode, SshOptions

pytestmark = pytest.mark.root


def _run(cluster, out, *extra):
    code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                 "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                 "--out", str(out), "--run-id", "r", "-q", "--checks", SMI_CHECKS, "--timeout", "5", *extra])
    return code, json.loads((out / "r" / "report.json").read_text())


def test_the_node_runner_gives_the_verdicts_of_a_channel_per_probe(sim_cluster, tmp_path):
    cluster = sim_cluster([gpu_node("gpu01"), SimHost("gpu02", down=True), gpu_node("gpu03", gpus=7),
                           gpu_node("gpu04", driver="570.195.03"), SimHost("gpu05"), gpu_node("gpu06", hang_s=60)])
    default = _run(cluster, tmp_path / "default", "--no-node-runner")  # a channel per probe
    batched = _run(cluster, tmp_path / "batched")
    assert batched[0] == default[0] == 1
    assert batched[1]["hosts"] == default[1]["hosts"]
    # The same diagnoses; their evidence quotes each probe's own duration.
    assert [{k: v for k, v in d.items() if k != "evidence"} for d in batched[1]["diagnoses"]] == \
        [{k: v for k, v in d.items() if k != "evidence"} for d in default[1]["diagnoses"]]

    def findings(report):
        return [(f["host"], f["check"], f["status"], f["symptoms"]) for f in report["findings"]]
    assert findings(batched[1]) == findings(default[1])
    causes = {d["cause"]: d["hosts"] for d in batched[1]["diagnoses"]}
    assert causes["probe-timeout"] == ["gpu06"] and causes["gpu-missing"] == ["gpu03"]
    # The hung tool cost one timeout on the node: both nvidia-smi probes started together and
    # were stopped at their 5 s limit there, as over a channel each.
    hung = [json.loads(p.read_text()) for p in (tmp_path / "batched/r/bundle/hosts/gpu06").glob("nvidia-smi-q*.json")]
    assert len(hung) == 2 and all(m["timed_out"] and 5 <= m["duration_s"] < 8 for m in hung)


def test_a_node_whose_python_cannot_run_the_runner_is_probed_the_default_way(sim_cluster):
    cluster = sim_cluster([gpu_node("gpu01")])
    ssh = SshOptions(ssh_config=cluster.ssh_config, known_hosts=cluster.known_hosts, identity=cluster.identity)
    plan = ExecPlan((PROBES["nvidia-smi-q-x"], PROBES["nvidia-smi-q"]), timeout_s=60, ssh=ssh)  # not what is tested: room for a loaded CI
    [host] = load_hosts_file(cluster.hosts_file)
    got = []
    run_node_batched(SshNode(host, ssh), plan, got.append, python="python3-not-installed")
    assert sorted(r.probe for r in got) == ["nvidia-smi-q", "nvidia-smi-q-x"]
    assert all(r.exit_code == 0 and r.stdout and r.command[0] == "nvidia-smi" for r in got)


def test_results_stream_back_as_the_node_finishes_them(sim_cluster, tmp_path):
    """One node, one probe answering at once and one hanging: the answer is in the bundle while
    the channel is still open, so a controller killed then keeps it."""
    cluster = sim_cluster([SimHost("gpu01", commands={"nvidia-smi -q -x": Reply(h200_node_xml(8)),
                                                      "nvidia-smi -q": Reply("", sleep_s=120)})])
    out = tmp_path / "reports"
    proc = start_run(cluster, out, "s", "--timeout", "100")
    host = out / "s" / "bundle" / "hosts" / "gpu01"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and not (host / "nvidia-smi-q-x.json").exists():
        time.sleep(0.1)
    arrived = time.monotonic() - t0
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Well before the hung probe's 100 s limit, which is when the channel would end.
    assert arrived < 60 and json.loads((host / "nvidia-smi-q-x.json").read_text())["exit_code"] == 0
    assert (host / "nvidia-smi-q-x.txt").read_text() == h200_node_xml(8)
    assert not (host / "nvidia-smi-q.json").exists()
