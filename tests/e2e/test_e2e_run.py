"""`preflight run --hosts` over real SSH against a simulated cluster (issue 2's proof).

Each host is a network namespace with its own sshd answering `nvidia-smi` with recorded
real output (tests/derived.py repeats the real H200 capture per GPU). preflight connects
exactly as it would to a real fleet: hosts file, ssh config, known_hosts, key.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from derived import h200_node_text, h200_node_xml
from simcluster import Reply, SimHost

from preflight.app.cli import main

pytestmark = pytest.mark.root


def gpu_node(name: str, gpus: int = 8, driver: str | None = None, hang_s: float = 0) -> SimHost:
    return SimHost(name, commands={
        "nvidia-smi -q -x": Reply(h200_node_xml(gpus, driver), sleep_s=hang_s),
        "nvidia-smi -q": Reply(h200_node_text(gpus, driver), sleep_s=hang_s),
    })


# The GPU inventory checks: these nodes answer nvidia-smi -q / -q -x only.
SMI_CHECKS = "gpu-inventory,persistence-mode,fleet-consistency,vbios-consistency"


def run(cluster, tmp_path: Path, *extra: str) -> tuple[int, dict, Path]:
    out = tmp_path / "reports"
    code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                 "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                 "--out", str(out), "--run-id", "r", "-q", "--checks", SMI_CHECKS, *extra])
    return code, json.loads((out / "r" / "report.json").read_text()), out / "r"


def start_run(cluster, out: Path, run_id: str, *extra: str) -> subprocess.Popen:
    """`preflight run` over ``cluster`` in a process of its own, for a test that kills it."""
    return subprocess.Popen(
        [sys.executable, "-m", "preflight", "run", "--hosts", str(cluster.hosts_file),
         "--ssh-config", str(cluster.ssh_config), "--known-hosts", str(cluster.known_hosts),
         "--identity", str(cluster.identity), "--out", str(out), "--run-id", run_id, "-q",
         "--checks", SMI_CHECKS, *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_healthy_fleet_passes(sim_cluster, tmp_path):
    cluster = sim_cluster([gpu_node(f"gpu{i:02d}") for i in range(1, 5)])
    code, report, run_dir = run(cluster, tmp_path)
    assert code == 0
    assert {h: v["status"] for h, v in report["hosts"].items()} == {f"gpu{i:02d}": "pass" for i in range(1, 5)}
    assert report["diagnoses"] == []
    assert all(v["profile"] == "hgx-h200" for v in report["hosts"].values())
    # The bundle holds each node's output byte for byte.
    saved = (run_dir / "bundle/hosts/gpu01/nvidia-smi-q-x.txt").read_text()
    assert saved == h200_node_xml(8)
    meta = json.loads((run_dir / "bundle/hosts/gpu01/nvidia-smi-q-x.json").read_text())
    assert meta["command"] == ["nvidia-smi", "-q", "-x"] and meta["exit_code"] == 0 and not meta["timed_out"]


def test_faulty_fleet_gets_exactly_its_findings(sim_cluster, tmp_path):
    cluster = sim_cluster([
        gpu_node("gpu01"), gpu_node("gpu02"), gpu_node("gpu03"),
        SimHost("gpu04", down=True),
        gpu_node("gpu05", gpus=7),
        gpu_node("gpu06", driver="570.195.03"),
        SimHost("gpu07"),                      # no nvidia-smi on this node
        gpu_node("gpu08", hang_s=60),          # nvidia-smi hangs in the driver
    ])
    t0 = time.monotonic()
    code, report, run_dir = run(cluster, tmp_path, "--timeout", "5")  # 3 s timed out healthy nodes under load
    elapsed = time.monotonic() - t0
    assert code == 1
    status = {h: v["status"] for h, v in report["hosts"].items()}
    assert status == {"gpu01": "pass", "gpu02": "pass", "gpu03": "pass", "gpu04": "error",
                      "gpu05": "fail", "gpu06": "fail", "gpu07": "error", "gpu08": "error"}
    causes = {d["cause"]: sorted(d["hosts"]) for d in report["diagnoses"]}
    assert causes == {"host-unreachable": ["gpu04"], "gpu-missing": ["gpu05"],
                      "driver-version-drift": ["gpu06"], "tool-missing": ["gpu07"],
                      "probe-timeout": ["gpu08"]}
    assert report["hosts"]["gpu04"]["reachable"] is False
    down = next(f for f in report["findings"] if f["host"] == "gpu04" and f["check"] == "connectivity")
    assert "connection refused" in down["summary"]
    drift = next(f for f in report["findings"] if f["host"] == "gpu06" and f["check"] == "fleet-consistency")
    assert "570.195.03" in drift["summary"] and "580.159.04" in drift["summary"]
    hung = json.loads((run_dir / "bundle/hosts/gpu08/nvidia-smi-q-x.json").read_text())
    assert hung["timed_out"] is True
    # Both hung probes were stopped by their 3 s limit, in parallel with the other hosts.
    assert elapsed < 60


def test_unknown_host_key_is_refused_by_default(sim_cluster, tmp_path):
    cluster = sim_cluster([gpu_node("gpu01")])
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    ssh_config = tmp_path / "ssh_config"
    # The cluster's config names its known_hosts; point it at an empty one instead.
    ssh_config.write_text("\n".join(
        line for line in cluster.ssh_config.read_text().splitlines()
        if "UserKnownHostsFile" not in line and "StrictHostKeyChecking" not in line
    ) + f"\n    UserKnownHostsFile {empty}\n")
    out = tmp_path / "reports"
    base = ["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(ssh_config),
            "--identity", str(cluster.identity), "--out", str(out), "-q", "--checks", SMI_CHECKS]
    assert main(base + ["--run-id", "strict"]) == 1
    report = json.loads((out / "strict" / "report.json").read_text())
    assert report["hosts"]["gpu01"]["reachable"] is False
    conn = next(f for f in report["findings"] if f["check"] == "connectivity")
    assert "host key unknown" in conn["summary"]
    assert main(base + ["--run-id", "accept", "--accept-new-host-keys"]) == 0


def test_a_bad_known_hosts_line_is_skipped_and_a_changed_key_refused(sim_cluster, tmp_path, capsys):
    # OpenSSH skips a line it cannot read, with a warning naming file and line; one bad line
    # must not make every host unreachable. A key that does not match is still refused.
    cluster = sim_cluster([gpu_node("gpu01"), gpu_node("gpu02")])
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = (tmp_path / "other.pub").read_text().split()[:2]
    lines = cluster.known_hosts.read_text().splitlines()
    swapped = [" ".join([line.split()[0], *other]) if line.split()[0].split(",")[0] == "gpu02" else line
               for line in lines]
    known = tmp_path / "known_hosts"
    known.write_text("gpu01 ssh-ed25519 AAAA-this-is-not-a-key\n" + "\n".join(swapped) + "\n")
    code, report, _ = run(cluster, tmp_path, "--known-hosts", str(known))
    assert code == 1
    assert report["hosts"]["gpu01"] == {**report["hosts"]["gpu01"], "status": "pass", "reachable": True}
    assert report["hosts"]["gpu02"]["reachable"] is False
    conn = next(f for f in report["findings"] if f["host"] == "gpu02" and f["check"] == "connectivity")
    assert "host key mismatch" in conn["summary"]
    assert f"{known}:1" in capsys.readouterr().err


def test_hostile_host_names_never_reach_a_shell(sim_cluster, tmp_path):
    sim_cluster([gpu_node("gpu01")])  # a real host beside the hostile line
    marker = tmp_path / "pwned"
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"gpu01\n$(touch {marker})\n")
    assert main(["run", "--hosts", str(hosts), "--out", str(tmp_path / "r"), "-q"]) == 2
    assert not marker.exists() and not (tmp_path / "r").exists()


def test_large_outputs_arrive_whole_over_ssh(sim_cluster, tmp_path):
    """sshd may send the exit status while output still waits behind the flow-control
    window; the executor must read to end-of-file (a 160 KiB output was once cut short)."""
    from preflight.collect.fanout import ExecPlan, run_fleet, ssh_nodes
    from preflight.collect.inventory import load_hosts_file
    from preflight.collect.probes import PROBES
    from preflight.collect.ssh import SshOptions

    big = (h200_node_xml(8) * 12).encode()  # ~2 MB, many windows' worth
    blob = tmp_path / "big.xml"
    blob.write_bytes(big)
    cluster = sim_cluster([SimHost(f"n{i}", commands={"nvidia-smi -q -x": Reply(blob)}) for i in range(6)])
    ssh = SshOptions(ssh_config=cluster.ssh_config, known_hosts=cluster.known_hosts, identity=cluster.identity)
    plan = ExecPlan((PROBES["nvidia-smi-q-x"],) * 3, timeout_s=30, ssh=ssh)
    results = []
    run_fleet(ssh_nodes(load_hosts_file(cluster.hosts_file), ssh), plan, results.append)
    assert len(results) == 18
    assert all(r.exit_code == 0 and r.stdout == big for r in results)


def test_controller_killed_mid_run_leaves_a_bundle_analyze_reads(sim_cluster, tmp_path):
    """kill -9 of `preflight run` while one host hangs: what was measured is on disk, whole,
    and `preflight analyze` judges it (the hung host is reported as never reached)."""
    import os
    import signal

    cluster = sim_cluster([gpu_node("gpu01"), gpu_node("gpu02"), gpu_node("gpu03", hang_s=120)])
    out = tmp_path / "reports"
    proc = start_run(cluster, out, "killed", "--timeout", "100")
    bundle = out / "killed" / "bundle"
    deadline = time.monotonic() + 60
    # Wait until the two healthy hosts have both probes on disk, then kill the controller.
    while time.monotonic() < deadline:
        # Probes of a node run concurrently: wait for both, not for the one that used to come last.
        done = [h for h in ("gpu01", "gpu02")
                if all((bundle / "hosts" / h / f"{p}.json").exists() for p in ("nvidia-smi-q-x", "nvidia-smi-q"))]
        if len(done) == 2:
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "killed" / "report.json").exists()  # it never got to judge

    code = main(["analyze", str(out / "killed"), "--out", str(tmp_path / "after"), "-q", "--checks", SMI_CHECKS])
    assert code == 1
    [run] = (tmp_path / "after").iterdir()
    report = json.loads((run / "report.json").read_text())
    assert report["hosts"]["gpu01"]["status"] == "pass" and report["hosts"]["gpu02"]["status"] == "pass"
    assert report["hosts"]["gpu03"]["status"] == "error"
    [conn] = [f for f in report["findings"] if f["host"] == "gpu03" and f["check"] == "connectivity"]
    assert "no evidence recorded for this host" in conn["summary"] and conn["symptoms"] == ["run-incomplete"]
    assert [d["cause"] for d in report["diagnoses"]] == ["run-incomplete"]
    assert (bundle / "hosts/gpu01/nvidia-smi-q-x.txt").read_text() == h200_node_xml(8)


def test_hosts_are_judged_while_the_fleet_is_probed_and_the_verdicts_are_analyzes(sim_cluster, tmp_path, monkeypatch):
    """Each host is judged as soon as its last record is saved (judge/incremental.py): the run's
    final pass judges no host again, and `preflight analyze` of the bundle decides the same."""
    import preflight.judge.analyze as analyze_mod

    cluster = sim_cluster([gpu_node("gpu01"), gpu_node("gpu02", gpus=7), SimHost("gpu03", down=True),
                           gpu_node("gpu04", driver="570.86.15")])
    judged_late = []
    real = analyze_mod.judge_host
    monkeypatch.setattr(analyze_mod, "judge_host",
                        lambda host, *a, **k: judged_late.append(host) or real(host, *a, **k))
    code, report, run_dir = run(cluster, tmp_path)
    assert code == 1
    assert judged_late == []
    # Host checks judged early (gpu02's missing GPU), the fleet check at the end (gpu04's driver).
    assert {h: v["status"] for h, v in report["hosts"].items()} == \
        {"gpu01": "pass", "gpu02": "fail", "gpu03": "error", "gpu04": "fail"}
    assert {(f["host"], f["check"]) for f in report["findings"] if f["status"] == "fail"} == \
        {("gpu02", "gpu-inventory"), ("gpu04", "fleet-consistency")}

    monkeypatch.setattr(analyze_mod, "judge_host", real)
    # No --checks: analyze judges the checks the run's bundle.json names, the run's own.
    assert main(["analyze", str(run_dir), "--out", str(tmp_path / "again"), "-q"]) == code
    [again] = (tmp_path / "again").iterdir()
    later = json.loads((again / "report.json").read_text())
    assert {k: later[k] for k in ("hosts", "checks", "findings", "diagnoses")} == \
        {k: report[k] for k in ("hosts", "checks", "findings", "diagnoses")}


def test_the_live_view_names_hosts_failing_their_own_checks_before_the_fleet_checks(sim_cluster, tmp_path,
                                                                                      monkeypatch):
    """On a terminal the live view gets each host's early verdict: gpu02 (a GPU missing) and gpu03
    (down) fail their own checks; gpu04's driver drift is a fleet finding, known only at the end."""
    import io

    from rich.console import Console

    import preflight.app.run_output as run_output
    import preflight.report.consoles as consoles

    views = []

    class Watched(run_output.RunProgress):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            views.append(self)

    monkeypatch.setattr(run_output, "RunProgress", Watched)
    monkeypatch.setattr(consoles, "Console", lambda **k: Console(force_terminal=True, file=io.StringIO(), **k))
    cluster = sim_cluster([gpu_node("gpu01"), gpu_node("gpu02", gpus=7), SimHost("gpu03", down=True),
                           gpu_node("gpu04", driver="570.86.15")])
    out = tmp_path / "reports"
    code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                 "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                 "--out", str(out), "--run-id", "live", "--checks", SMI_CHECKS])
    assert code == 1
    [view] = views
    seen = view.snapshot()
    assert seen.done == 4 and seen.judged == 4 and seen.failing == ("gpu02", "gpu03")
    report = json.loads((out / "live" / "report.json").read_text())
    assert report["hosts"]["gpu04"]["status"] == "fail"  # the fleet check, after the live view
