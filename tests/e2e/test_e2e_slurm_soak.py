"""`preflight soak --slurm` end to end on the real Slurm 22.05 cluster (tests/slurmcluster.py).

The agents run as the tasks of one srun step inside one allocation, on the simulated hosts,
with NVML replaced by the recorded real H200 burn (tests/fake_nvml.py, through the agent's
``--fake-nvml`` hook, which the command line does not offer: the tests add it to the plan) and
the ``none`` engine (no torch here), as the SSH soak's tests do. What is checked: every node gets
an outcome (a node drained by someone else is not started and keeps its drain), the telemetry of
the others is merged and judged, the allocation is gone afterwards; and a controller killed
mid-soak leaves the agents running in their step, so `--attach` collects the whole soak.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from agent_runs import heartbeat, read_csv, wait_for
from fake_nvml import FAKE_HOOK
from simcluster import SimHost
from slurmcluster import slurm_fleet

from preflight.app import soak_cli
from preflight.app.cli import main

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Each node has 8 GPUs in slurm.conf: the soak's allocation asks for them (--gres=gpu:8).
    with slurm_fleet([SimHost("gpu01"), SimHost("gpu02"), SimHost("gpu03")], tmp_path_factory.mktemp("slurm"),
                     gpus=8) as s:
        yield s


def soak_args(out: Path, node_dir: Path, run_id: str, seconds: float, *more: str) -> list[str]:
    return ["soak", "--slurm", "--engine", "none", "--minutes", repr(seconds / 60), "--interval", "0.2",
            "--poll", "0.5", "--python", sys.executable, "--node-dir", str(node_dir), "--out", str(out),
            "--run-id", run_id, "-q", *more]


@pytest.fixture
def fake_nvml(monkeypatch):
    real = soak_cli.plan_from_args

    def with_hook(*args, **kwargs):
        plan = real(*args, **kwargs)
        return replace(plan, agent_args=plan.agent_args + ("--fake-nvml", FAKE_HOOK))

    monkeypatch.setattr(soak_cli, "plan_from_args", with_hook)


def test_soak_through_slurm_every_node_gets_an_outcome(cluster, tmp_path, fake_nvml, capsys):
    cluster.drain("gpu03", "someone else: PSU 2")
    try:
        out, node_dir = tmp_path / "reports", tmp_path / "node"
        started = time.monotonic()
        code = main(soak_args(out, node_dir, "s1", 3.0, "-w", "gpu[01-03]"))
        elapsed = time.monotonic() - started
        printed = " ".join(capsys.readouterr().out.split())
        assert code == 1  # gpu03 could not be soaked
        meta = json.loads((out / "s1" / "soak.json").read_text())
        assert meta["hosts"] == ["gpu01", "gpu02"]
        agents = meta["agents"]
        assert (agents["gpu01"]["outcome"], agents["gpu02"]["outcome"]) == ("finished", "finished")
        assert agents["gpu03"]["outcome"] == "not started"
        assert agents["gpu03"]["note"].startswith("slurm: node drained before the run (State=IDLE+DRAIN "
                                                  "Reason=someone else: PSU 2 [root@")
        # Each node's agent wrote under its own Slurm name, in the one directory tree the nodes share.
        assert sorted(p.name for p in (node_dir / "s1").iterdir()) == ["gpu01", "gpu02"]
        rows = read_csv(out / "s1" / "telemetry.csv")
        assert {r["host"] for r in rows} == {"gpu01", "gpu02"} and {r["power_limit_w"] for r in rows} == {"700.0"}
        report = json.loads((out / "s1" / "report.json").read_text())
        assert {h: v["status"] for h, v in report["hosts"].items()} == {
            "gpu01": "pass", "gpu02": "pass", "gpu03": "error"}
        [gap] = [f for f in report["findings"] if f["host"] == "gpu03" and f["status"] == "error"]
        assert gap["summary"].startswith("soak incomplete: agent not started (slurm: node drained before the run")
        # One allocation, of the two usable nodes, released at the end; the other drain untouched.
        plan = json.loads((out / "s1" / "soak" / "run.json").read_text())
        [job] = plan["slurm"]["jobs"]
        assert job["nodes"] == ["gpu01", "gpu02"] and isinstance(job["job"], int)
        assert plan["slurm"]["options"]["time"] == "6"  # 3 s of soak + 90 s start + 240 s collection
        assert cluster.slurm("squeue", "-h").stdout == ""
        assert cluster.states()["gpu03"] == "drained"
        # -q: the one line (issue 34), not each node's start; the agents' outcomes above say they ran.
        assert printed == f"2 pass, 1 error — report in {out / 's1'}"
        print(f"\nsoak --slurm of 3 s on 2 nodes (+1 drained): {elapsed:.1f} s")
    finally:
        cluster.resume("gpu03")


def test_a_controller_killed_mid_soak_leaves_the_agents_running_and_attach_collects(cluster, tmp_path):
    out, node_dir = tmp_path / "reports", tmp_path / "node"
    # The command line in a process of its own, with the NVML hook added as the fixture above does.
    code = (f"import sys; sys.path[:0] = [{str(TESTS)!r}, {str(ROOT)!r}]\n"
            "from preflight.app import soak_cli\nfrom preflight.app.cli import main\n"
            "from dataclasses import replace\nreal = soak_cli.plan_from_args\n"
            "soak_cli.plan_from_args = lambda *a, **k: (lambda p: replace(p, agent_args="
            f"p.agent_args + ('--fake-nvml', {FAKE_HOOK!r})))(real(*a, **k))\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, *soak_args(out, node_dir, "k1", 6.0, "-w", "gpu[01-02]")],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    agents = [node_dir / "k1" / n for n in ("gpu01", "gpu02")]
    try:
        wait_for(lambda: all((heartbeat(d) or {}).get("state") == "running" for d in agents), 60)
        wait_for(lambda: (out / "k1" / "soak" / "gpu01" / "telemetry.csv").exists(), 30)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed_at = time.time()
    # The step outlived its controller: the agents sample on, to the soak's planned end.
    beats = [wait_for(lambda d=d: (b := heartbeat(d)) and b["state"] == "finished" and b, 30) for d in agents]
    assert all(b["elapsed_s"] >= 6.0 and b["now_epoch"] > killed_at for b in beats)
    assert not (out / "k1" / "report.json").exists()
    [job] = cluster.slurm("squeue", "-h", "-o", "%i").stdout.split()  # the allocation waits for --attach
    # It holds every GPU of both nodes, so the agents' step was given them all (srun(1): a step
    # gets all the generic resources its job requested).
    shown = cluster.slurm("scontrol", "show", "job", "-o", job).stdout
    assert " TresPerNode=gres:gpu:8 " in shown, shown
    code = main(["soak", "--attach", "k1", "--out", str(out), "-q"])
    assert code == 0
    meta = json.loads((out / "k1" / "soak.json").read_text())
    assert {h: a["outcome"] for h, a in meta["agents"].items()} == {"gpu01": "finished", "gpu02": "finished"}
    # What was sampled after the kill came back too: the merged rows run to the agents' end.
    rows = read_csv(out / "k1" / "telemetry.csv")
    for host, beat in zip(("gpu01", "gpu02"), beats, strict=True):
        last = max(float(r["time"]) for r in rows if r["host"] == host)
        assert last > killed_at and last >= beat["now_epoch"] - 0.5
    cluster.wait_idle()  # --attach released the allocation


def test_a_node_whose_slurmd_died_is_not_started_and_the_others_soak_in_a_step_without_it(cluster, tmp_path,
                                                                                          fake_nvml):
    """Last in the module: Slurm keeps the dead node's job COMPLETING until its slurmd answers again.
    srun aborts the step when gpu03's launch fails, killing the agents it had started on gpu01 and
    gpu02; they start again, in a step of their own, and soak to the end."""
    cluster.stop_slurmd("gpu03")
    try:
        out, node_dir = tmp_path / "reports", tmp_path / "node"
        assert main(soak_args(out, node_dir, "d1", 3.0, "-w", "gpu[01-03]")) == 1
        agents = json.loads((out / "d1" / "soak.json").read_text())["agents"]
        assert {h: a["outcome"] for h, a in agents.items()} == {
            "gpu01": "finished", "gpu02": "finished", "gpu03": "not started"}
        assert agents["gpu03"]["note"] == "slurm: task launch failed: Communication connection failure"
        soak = out / "d1" / "soak"
        [job] = json.loads((soak / "run.json").read_text())["slurm"]["jobs"]
        assert "failed on node gpu03" in (soak / f"slurm-{job['job']}.0.stderr").read_text()
        assert json.loads((soak / "slurm-steps.json").read_text())["gpu01"].endswith(".1.stderr")
        rows = read_csv(out / "d1" / "telemetry.csv")
        assert {r["host"] for r in rows} == {"gpu01", "gpu02"}
    finally:
        cluster.start_slurmd("gpu03")
