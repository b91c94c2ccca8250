"""`preflight drain RUN` and `preflight resume RUN` on a real Slurm cluster (tests/slurmcluster.py):
the breaker refuses a mass drain, a node a diagnosis blames is drained with the cause in the
reason, a drain someone else set is never touched, and a node that passes again is resumed."""

from __future__ import annotations

import getpass
import json
import shutil
from pathlib import Path

import pytest
from nodes import healthy_h200, nvlink_inactive
from slurmcluster import slurm_fleet

from preflight.app.cli import main

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    hosts = [healthy_h200("gpu01"), nvlink_inactive(healthy_h200("gpu02"), gpu=2, link=5),
             nvlink_inactive(healthy_h200("gpu03"), gpu=1, link=0), healthy_h200("gpu04")]
    with slurm_fleet(hosts, tmp_path_factory.mktemp("drain")) as slurm:
        slurm.drain("gpu03", "someone else: memory test")
        yield slurm


def state(cluster, node: str) -> str:
    # "idle*": slurmctld has not heard from the node's slurmd lately (a loaded machine); the
    # drain is what these tests are about.
    return cluster.states()[node].rstrip("*")


def reason(cluster, node: str) -> str:
    return cluster.slurm("scontrol", "show", "node", "-o", node).stdout.partition(" Reason=")[2].strip()


def probe_over_ssh(cluster, out: Path, run_id: str, *db: str) -> Path:
    sim = cluster.sim
    main(["run", "-H", "gpu[01-04]", "--ssh-config", str(sim.ssh_config), "--known-hosts", str(sim.known_hosts),
          "--identity", str(sim.identity), "--quick", "-q", "--out", str(out), "--run-id", run_id, *db])
    return out / run_id


@pytest.fixture
def db(request) -> list[str]:
    """A real PostgreSQL store when the machine has one (as a fleet's controllers share), else none."""
    try:
        return ["--db", request.getfixturevalue("pg").create_database("drain")]
    except pytest.skip.Exception:
        return []


def test_drain_behind_the_breaker_then_resume_once_fixed(cluster, tmp_path, capsys, db):
    run = probe_over_ssh(cluster, tmp_path, "r1", *db)
    report = json.loads((run / "report.json").read_text())
    assert {h for d in report["diagnoses"] if d["cause"] == "nvlink-down" for h in d["hosts"]} == {"gpu02", "gpu03"}

    # Two of four nodes: past the default 10 %, so nothing is drained and the reason is said.
    assert main(["drain", str(run), *db]) == 1
    said = capsys.readouterr().out
    assert "refused: would drain 1 of the run's 4 nodes, more than the breaker allows (0" in said
    assert state(cluster, "gpu02") == "idle"

    assert main(["drain", str(run), "--max-fraction", "0.5", "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "would drain gpu02: preflight: nvlink-down r1: " in said
    assert "leave gpu03: " in said and "drained by someone else (someone else: memory test" in said
    assert state(cluster, "gpu02") == "idle"

    assert main(["drain", str(run), "--max-fraction", "0.5", *db]) == 0
    capsys.readouterr()
    assert state(cluster, "gpu02") == "drained" and reason(cluster, "gpu02").startswith("preflight: nvlink-down r1")
    assert reason(cluster, "gpu03").startswith("someone else: memory test")

    # Not fixed yet: a new run still fails gpu02, and resume leaves it drained.
    run2 = probe_over_ssh(cluster, tmp_path, "r2", *db)
    assert main(["resume", str(run2), *db]) == 0
    assert "leave gpu02: (still fail in this run)" in capsys.readouterr().out
    assert state(cluster, "gpu02") == "drained"

    # Fixed: gpu02's nvidia-smi now answers as the healthy gpu01's does.
    shutil.copy(cluster.sim.workdir_of("gpu01") / "bin" / "nvidia-smi", cluster.sim.workdir_of("gpu02") / "bin")
    run3 = probe_over_ssh(cluster, tmp_path, "r3", *db)
    assert main(["resume", str(run3), *db]) == 0
    said = capsys.readouterr().out
    assert "resume gpu02: (passes in this run; the drain was preflight's (preflight: nvlink-down r1" in said
    assert state(cluster, "gpu02") == "idle"
    assert state(cluster, "gpu03") == "drained" and reason(cluster, "gpu03").startswith("someone else")

    # The store kept the node's life: three runs, the drain and the resume, with who and why.
    assert main(["history", "gpu02", "--since", "1d", "--json", *db]) == 0
    timeline = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["status"]) for r in timeline["runs"]] == [("r1", "fail"), ("r2", "fail"), ("r3", "pass")]
    assert [(e["kind"], e["run_id"]) for e in timeline["events"]] == [("drain", "r1"), ("resume", "r3")]
    drain, resume = timeline["events"]
    assert drain["reason"].startswith("preflight: nvlink-down r1") and drain["actor"] == getpass.getuser()
    assert "passes in this run" in resume["detail"]["why"]
    # The fleet's precision reads the commands' own events: one drain of nvlink-down, resumed with no
    # step taken a moment ago, so its 7 days without the cause are still to come: pending, not a guess.
    assert main(["history", "--fleet", "--since", "1d", "--json", *db]) == 0
    precision = json.loads(capsys.readouterr().out)["precision"]
    [cause] = precision["causes"]
    assert cause["cause"] == "nvlink-down" and (cause["drains"], cause["pending"]) == (1, 1)
    assert precision["to_resume"]["n"] == 1 and precision["to_drain"]["n"] == 1
    # Nothing was done to gpu03 (someone else's drain), so nothing is recorded for it.
    assert main(["history", "gpu03", "--since", "1d", "--json", *db]) == 0
    assert json.loads(capsys.readouterr().out)["events"] == []


def test_a_run_that_cannot_be_read_is_bad_input(cluster, tmp_path, capsys):
    def said() -> str:
        return " ".join(capsys.readouterr().err.split())
    assert main(["drain", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'}: no such run directory" in said()
    assert main(["drain", str(tmp_path)]) == 2
    assert f"{tmp_path / 'report.json'}: no such file" in said()
    (tmp_path / "report.json").write_text("{not json")
    assert main(["resume", str(tmp_path)]) == 2
    assert "report.json: not valid JSON" in said()
