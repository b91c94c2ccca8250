"""``preflight lifecycle --once --slurm`` on the real Slurm cluster (tests/slurmcluster.py), the
readings recorded by real runs over SSH of simulated nodes with real faults: a single reading of a
confirm-first cause never drains, a fault one reading proves drains through scontrol, someone
else's drain is untouched, a step Slurm refuses leaves the node where it was, and two lifecycles
started at once drain a node once.

Not here yet: a RebootProgram that "reboots" a simulated node (docs/lifecycle.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nodes import gpu_fallen_off_bus, healthy_h200, nvlink_inactive
from slurmcluster import slurm_fleet

from preflight.app.cli import main

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    hosts = [healthy_h200("gpu01"), nvlink_inactive(healthy_h200("gpu02"), gpu=2, link=5),
             gpu_fallen_off_bus(healthy_h200("gpu03")), gpu_fallen_off_bus(healthy_h200("gpu04"))]
    with slurm_fleet(hosts, tmp_path_factory.mktemp("lifecycle")) as slurm:
        slurm.drain("gpu04", "someone else: memory test")
        yield slurm


def state(cluster, node: str) -> str:
    return cluster.states()[node].rstrip("*")


def reason(cluster, node: str) -> str:
    return cluster.slurm("scontrol", "show", "node", "-o", node).stdout.partition(" Reason=")[2].strip()


def probe(cluster, out: Path, run_id: str, db: str) -> None:
    sim = cluster.sim
    main(["run", "-H", "gpu[01-04]", "--ssh-config", str(sim.ssh_config), "--known-hosts", str(sim.known_hosts),
          "--identity", str(sim.identity), "--quick", "-q", "--no-html", "--out", str(out), "--run-id", run_id,
          "--db", db])


def lifecycle(capsys, *argv: str) -> dict:
    assert main(["lifecycle", "--once", "--slurm", "--json", *argv]) in (0, 1)
    return {s["node"]: s for s in json.loads(capsys.readouterr().out)["steps"]}


def test_the_way_from_a_reading_to_a_drain_on_real_slurm(cluster, tmp_path, capsys):
    store_url = f"sqlite:///{tmp_path}/store.sqlite"
    probe(cluster, tmp_path, "r1", store_url)
    steps = lifecycle(capsys, "--db", store_url)
    # An inactive NVLink, read once: suspect, and Slurm is not asked anything.
    assert steps["gpu02"]["to"] == "suspect" and steps["gpu02"]["actions"][0]["kind"] == "confirm"
    assert state(cluster, "gpu02") == "idle"
    # A GPU off the bus (Xid 79) is proven by one reading: drained, with preflight's reason.
    assert steps["gpu03"]["to"] == "drained" and steps["gpu03"]["done"] == [
        "drain gpu03 (preflight: drained gpu-fallen-off-bus r1)"]
    assert state(cluster, "gpu03") == "drained" and reason(cluster, "gpu03").startswith(
        "preflight: drained gpu-fallen-off-bus r1")
    # The same fault on a node someone else drained: left alone, their reason kept.
    assert "gpu04" not in steps and reason(cluster, "gpu04").startswith("someone else: memory test")

    # Next pass: gpu03 is idle, its cause's step is a reboot; this cluster has no RebootProgram,
    # so Slurm refuses, and the node stays drained with the refusal recorded.
    steps = lifecycle(capsys, "--db", store_url)
    assert steps["gpu03"]["to"] == "remediating" and steps["gpu03"]["refused"].startswith("reboot refused: ")
    assert state(cluster, "gpu03") == "drained"
    assert main(["lifecycle", "--json", "--db", store_url]) == 0
    listing = json.loads(capsys.readouterr().out)["states"]
    assert [n["node"] for n in listing["drained"]] == ["gpu03"] and [n["node"] for n in listing["suspect"]] == ["gpu02"]
    assert main(["history", "gpu03", "--since", "1d", "--json", "--db", store_url]) == 0
    kinds = [e["kind"] for e in json.loads(capsys.readouterr().out)["events"]]
    assert kinds == ["transition", "drain", "transition", "refused"]
    cluster.resume("gpu03")


def test_two_lifecycles_at_once_drain_a_confirmed_node_once(cluster, tmp_path, capsys, pg):
    """gpu02's NVLink is read inactive twice; the site confirms on a second reading at once and
    lets the breaker drain every node. Two lifecycle processes share a PostgreSQL store, as a
    fleet's controllers do, and start together: gpu02 is drained by exactly one of them."""
    store_url = pg.create_database("lifecycle_two")
    site = tmp_path / "site.yaml"
    site.write_text("format: preflight-lifecycle/1\ntimings: {confirm_delay_s: 0, breaker_fraction: 1.0}\n")
    probe(cluster, tmp_path, "c1", store_url)
    lifecycle(capsys, "--db", store_url, "--site", str(site))
    probe(cluster, tmp_path, "c2", store_url)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/local/bin:/usr/bin:/bin", "SLURM_CONF": str(cluster.conf)}
    argv = [sys.executable, "-m", "preflight", "lifecycle", "--once", "--slurm", "--json", "--db", store_url,
            "--site", str(site)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    passes = [json.loads(out) for out, _ in outs]
    drained = [s for p in passes for s in p["steps"] if s["node"] == "gpu02" and s["to"] == "drained" and s["done"]]
    assert len(drained) == 1, outs
    assert state(cluster, "gpu02") == "drained" and reason(cluster, "gpu02").startswith("preflight: drained nvlink-down")
    cluster.resume("gpu02")
    cluster.resume("gpu03")
