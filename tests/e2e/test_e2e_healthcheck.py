"""`preflight healthcheck` as slurm.conf's HealthCheckProgram, run by the real slurmd of each
simulated node (tests/slurmcluster.py) every HealthCheckInterval: a faulty node drains itself
with a `preflight:` reason, is resumed once fixed, and a drain someone else set on a healthy
node is never touched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from nodes import healthy_h200, nvlink_inactive
from slurmcluster import shipped_wrapper, slurm_fleet
from waiting import wait_for

from preflight.app.cli import main

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg):
    work = tmp_path_factory.mktemp("healthcheck")
    hosts = [nvlink_inactive(healthy_h200("gpu01"), gpu=2, link=5), healthy_h200("gpu02")]
    script = work / "preflight-healthcheck"
    conf = [f"HealthCheckProgram={script}", f"HealthCheckInterval={INTERVAL_S}", "HealthCheckNodeState=ANY"]
    with slurm_fleet(hosts, work, conf) as slurm:
        slurm.work, slurm.script, slurm.reports = work, script, work / "reports"
        slurm.faulty = work / "nvidia-smi-gpu01"  # gpu01's faulty shim, for the lifecycle's turn
        shutil.copy(slurm.sim.workdir_of("gpu01") / "bin" / "nvidia-smi", slurm.faulty)
        install_wrapper(slurm, drain=True)
        slurm.drain("gpu02", "someone else: memory test")  # before preflight's first verdict counts
        # One PostgreSQL for every node's healthcheck, named in the root-only file the shipped
        # wrapper reads. The cluster trusts local connections, so the password is never checked:
        # it is there to be looked for where it must never show.
        url = pg.create_database("healthcheck_fleet")
        slurm.store = url.replace(f"//{pg.user}@", f"//{pg.user}:{SECRET}@", 1)
        assert SECRET in slurm.store
        store_file = work / "store.url"
        store_file.write_text(slurm.store + "\n")
        store_file.chmod(0o600)
        # Until env.sh exists (slurmd runs the program once at its start) the wrapper does nothing.
        (work / "env.sh").write_text(f"export PYTHONPATH={ROOT} SLURM_CONF={slurm.conf}\n")
        yield slurm


SECRET = "pw-of-the-fleet-store"


def install_wrapper(cluster, drain: bool) -> None:
    """examples/slurm/preflight-healthcheck as HealthCheckProgram, with the test's own python,
    budget and report directory; ``drain=False``: the fleet's variant, where the lifecycle drains."""
    env, out = cluster.work / "env.sh", cluster.reports
    tmp = cluster.script.with_suffix(".new")
    shipped_wrapper("preflight-healthcheck", tmp, store_file=cluster.work / "store.url",
                    prelude=f"[ -f {env} ] || exit 0\n. {env}",
                    exec_line=f"exec {sys.executable} -m preflight healthcheck --budget 20 -q"
                              + ("" if drain else " --no-drain") + f' --out "{out}/$(hostname)"')
    tmp.replace(cluster.script)  # at once: slurmd never finds half a script


def reason(cluster, node: str) -> str:
    line = cluster.slurm("scontrol", "show", "node", "-o", node).stdout
    return line.partition(" Reason=")[2].strip()


def test_a_faulty_node_drains_itself_and_is_resumed_once_fixed_and_another_drain_is_kept(cluster):
    def drained_by_preflight():
        """gpu01 drained by preflight"""
        return cluster.states()["gpu01"] == "drained" and reason(cluster, "gpu01").startswith("preflight: ")

    wait_for(drained_by_preflight, 90)
    said = reason(cluster, "gpu01")
    assert said.startswith("preflight: nvlink-down healthcheck-")
    # The node keeps its report: the run named in the reason, judged on the node itself.
    run_id = said.split()[2]
    report = json.loads((cluster.reports / "gpu01" / run_id / "report.json").read_text())
    assert report["hosts"]["gpu01"]["status"] == "fail"
    assert {d["cause"] for d in report["diagnoses"]} == {"nvlink-down"}
    assert report["healthcheck"]["action"] == "drain"
    # Static probes only: the all_reduce would load GPUs under running jobs.
    planned = json.loads((cluster.reports / "gpu01" / run_id / "bundle" / "bundle.json").read_text())["probes"]
    assert "nccl-all-reduce" not in planned and "nvidia-smi-nvlink-status" in planned

    # Fixed: gpu01's nvidia-smi now answers as the healthy gpu02's does.
    shutil.copy(cluster.sim.workdir_of("gpu02") / "bin" / "nvidia-smi", cluster.sim.workdir_of("gpu01") / "bin")

    def resumed():
        """gpu01 resumed"""
        return cluster.states()["gpu01"] == "idle"

    wait_for(resumed, 90)
    # gpu02 is healthy all along, but its drain is someone else's: never resumed by preflight.
    assert cluster.states()["gpu02"] == "drained"
    assert reason(cluster, "gpu02").startswith("someone else: memory test [root@")
    runs = sorted((cluster.reports / "gpu02").glob("healthcheck-*"))
    assert runs and json.loads((runs[-1] / "report.json").read_text())["hosts"]["gpu02"]["status"] == "pass"

    # Every healthcheck of both nodes is in the store, with the drain and the resume it made.
    timeline = history(cluster, "gpu01")
    assert {r["kind"] for r in timeline["runs"]} == {"healthcheck"} and timeline["runs"][0]["launcher"] == "local"
    assert [r["status"] for r in timeline["runs"]][:1] == ["fail"] and timeline["runs"][-1]["status"] == "pass"
    events = [(e["kind"], e["actor"]) for e in timeline["events"]]
    assert events[0] == ("drain", "healthcheck") and ("resume", "healthcheck") in events
    assert said.startswith(timeline["events"][0]["reason"])  # Slurm adds "[user@time]"
    assert history(cluster, "gpu02")["events"] == []  # someone else's drain: preflight did nothing
    # The fleet's precision reads those events: one drain, however often a healthcheck drained
    # the node again while it failed; each time it did is a reading that failed again (confirmed);
    # drained once and resumed a moment ago, its 7 days without the cause are still to come.
    again = [k for k, _ in events[:events.index(("resume", "healthcheck"))]].count("drain") > 1
    [cause] = history(cluster, "--fleet")["precision"]["causes"]
    assert cause["cause"] == "nvlink-down" and cause["drains"] == 1
    assert (cause["confirmed_by"]["retest_failed"], cause["pending"]) == ((1, 0) if again else (0, 1))
    # Both nodes' readings are in the one PostgreSQL the shipped wrapper named.
    assert {r["launcher"] for r in history(cluster, "gpu02")["runs"]} == {"local"}
    assert_secret_kept(cluster)


def test_the_lifecycle_drains_from_what_every_node_recorded(cluster, tmp_path, capsys):
    """The fleet's way: every node's healthcheck only records (--no-drain) into the one
    PostgreSQL, and `lifecycle --once --slurm` on the controller reads it: gpu01's NVLink fails
    again, a confirm-first cause, so the first pass makes it suspect and the pass after its next
    failing reading drains it through scontrol; gpu02 (someone else's drain) is left alone."""
    install_wrapper(cluster, drain=False)
    switched = time.time()

    def recorded_since(node: str, since: float, status: str | None = None) -> list[dict]:
        # in this process: a poll every half second costs no interpreter start
        assert main(["history", node, "--since", "1d", "--json", "--db", cluster.store]) == 0
        runs = json.loads(capsys.readouterr().out)["runs"]
        return [r for r in runs if started(r) > since and status in (None, r["status"])]

    # A whole healthcheck of gpu01 started after the switch: no run with --drain is left.
    wait_for(lambda: recorded_since("gpu01", switched + 0.5), 60)
    shutil.copy(cluster.faulty, cluster.sim.workdir_of("gpu01") / "bin" / "nvidia-smi")
    faulted = time.time()
    wait_for(lambda: recorded_since("gpu01", faulted, "fail"), 60)
    assert cluster.states()["gpu01"] == "idle"  # the healthcheck recorded, and drained nothing

    site = tmp_path / "site.yaml"
    site.write_text("format: preflight-lifecycle/1\n"
                    "timings: {confirm_delay_s: 0, startup_grace_s: 0, breaker_fraction: 1.0}\n")
    argv = ["lifecycle", "--once", "--slurm", "--json", "--db", cluster.store, "--site", str(site)]
    assert main(argv) == 0
    first = {s["node"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    assert first["gpu01"]["to"] == "suspect" and "gpu02" not in first, first
    assert cluster.states()["gpu01"] == "idle"

    passed = time.time()
    wait_for(lambda: recorded_since("gpu01", passed, "fail"), 60)
    assert main(argv) in (0, 1)
    second = {s["node"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    assert second["gpu01"]["to"] == "drained", second
    [done] = second["gpu01"]["done"]
    assert done.startswith("drain gpu01 (preflight: drained nvlink-down healthcheck-"), done
    # The run behind the drain is one of gpu01's own healthchecks, read from the store.
    run_id = done.split()[5].rstrip(")")
    assert run_id in {r["run_id"] for r in recorded_since("gpu01", faulted, "fail")}, run_id
    assert cluster.states()["gpu01"] == "drained"
    assert reason(cluster, "gpu01").startswith(f"preflight: drained nvlink-down {run_id}")
    assert "gpu02" not in second and reason(cluster, "gpu02").startswith("someone else: memory test")
    assert_secret_kept(cluster)


def started(run: dict) -> float:
    return datetime.fromisoformat(run["started"]).timestamp()


def assert_secret_kept(cluster) -> None:
    """The store's password is in no report, no Slurm log, no wrapper and no recorded command line."""
    for root in (cluster.reports, cluster.dir / "log", cluster.script.parent):
        for path in root.rglob("*"):
            if path.is_file() and path.name != "store.url":
                assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in json.dumps(history(cluster, "gpu01"))



def history(cluster, node: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "preflight", "history", node, "--since", "1d", "--json", "--db",
                           cluster.store], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
