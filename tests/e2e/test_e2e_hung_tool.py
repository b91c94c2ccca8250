"""A tool that hangs costs one timeout per node, not one per probe: over real SSH, a node whose
nvidia-smi never answers (a GPU that fell off the bus makes it hang) holds the fleet for about
one probe timeout, and its report names the hung tool once."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from nodes import healthy_h200
from simcluster import Reply

from preflight.app.cli import main

pytestmark = pytest.mark.root
TIMEOUT = 10


def hung_nvidia_smi(node):
    """The node with every nvidia-smi call sleeping far past any timeout."""
    return replace(node, commands={cmd: (Reply(sleep_s=3600) if cmd.startswith("nvidia-smi") else reply)
                                   for cmd, reply in node.commands.items()})


def test_a_hung_nvidia_smi_costs_one_timeout_and_is_named_once(sim_cluster, tmp_path):
    hosts = [healthy_h200(f"gpu0{i}") for i in range(1, 7)] + [hung_nvidia_smi(healthy_h200("gpu07"))]
    cluster = sim_cluster(hosts)
    out = tmp_path / "reports"
    started = time.monotonic()
    code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                 "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                 "--out", str(out), "--run-id", "r", "-q", "--quick", "--timeout", str(TIMEOUT)])
    elapsed = time.monotonic() - started
    report = json.loads((out / "r" / "report.json").read_text())
    # Before, the host's nvidia-smi probes ran one after another, each waiting out its timeout
    # (113 s for this fleet); now the hung ones run at once and the rest are not started.
    assert elapsed < 2 * (TIMEOUT + 5) + 15, elapsed
    assert code == 1
    assert report["hosts"]["gpu07"]["status"] in ("fail", "error") and report["hosts"]["gpu01"]["status"] == "pass"
    [health] = [f for f in report["findings"] if f["host"] == "gpu07" and f["check"] == "probes"]
    assert health["status"] == "warn" and health["symptoms"] == ["probe-timeout"]
    assert health["summary"].startswith("nvidia-smi hung: ")
    assert health["summary"].count("nvidia-smi hung") == 1 + health["summary"].count("not run: nvidia-smi hung")
    bundle = out / "r" / "bundle" / "hosts" / "gpu07"
    metas = {p.stem: json.loads(p.read_text()) for p in bundle.glob("nvidia-smi-*.json")}
    timed_out = sorted(k for k, m in metas.items() if m["timed_out"])
    passed_over = sorted(k for k, m in metas.items() if (m.get("error") or "").startswith("not run: nvidia-smi hung"))
    assert timed_out and set(timed_out) | set(passed_over) == set(metas)
    assert len(timed_out) <= 4  # at most the probes that were running at once (--per-node 4)
    # The other tools of that node still ran and were judged.
    assert json.loads((bundle / "kernel-log.json").read_text())["exit_code"] == 0


def test_a_hung_nvidia_smi_costs_one_timeout_in_a_full_run(sim_cluster, tmp_path):
    """Issue 26: in a full run (the active probes too), the node whose nvidia-smi hung used to
    wait a second time in the all_reduce probe, whose script called `nvidia-smi -L` under a fixed
    60 s limit: 72 s for `--timeout 10`. The probe declares the tools it calls, so it is not run
    there, and the run takes one timeout, its kill grace and the healthy nodes' own all_reduce."""
    hosts = [healthy_h200(f"gpu0{i}") for i in range(1, 4)] + [hung_nvidia_smi(healthy_h200("gpu04"))]
    cluster = sim_cluster(hosts)
    out = tmp_path / "reports"
    started = time.monotonic()
    code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                 "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                 "--out", str(out), "--run-id", "r", "-q", "--timeout", str(TIMEOUT), "--nccl-reps", "2"])
    elapsed = time.monotonic() - started
    bundle = out / "r" / "bundle" / "hosts"
    healthy_nccl = max(json.loads((bundle / h.name / "nccl-all-reduce.json").read_text())["duration_s"]
                       for h in hosts[:3])
    grace = 5  # `timeout -k 5` (docs/contracts.md section 4)
    # What the run may take besides: SSH connections, the judge and the report (a few seconds
    # on this 2-core machine; the run without a hung node takes as long).
    overhead = 10
    assert elapsed < TIMEOUT + grace + healthy_nccl + overhead, (elapsed, healthy_nccl)
    assert code == 1
    nccl = json.loads((bundle / "gpu04" / "nccl-all-reduce.json").read_text())
    assert nccl["exit_code"] is None and nccl["duration_s"] == 0.0
    assert nccl["error"].startswith("not run: nvidia-smi hung in nvidia-smi-"), nccl["error"]
    report = json.loads((out / "r" / "report.json").read_text())
    [all_reduce] = [f for f in report["findings"] if f["host"] == "gpu04" and f["check"] == "nccl-all-reduce"]
    # Skipped for the hang already reported, not a second failure of its own.
    assert all_reduce["status"] == "skip", all_reduce
    assert "nvidia-smi hung" in all_reduce["summary"]
