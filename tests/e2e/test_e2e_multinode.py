"""`preflight run --nccl-multinode` over real SSH against a simulated cluster.

Four simulated H200 hosts pass their own all_reduce (the real H200 run). On the launcher
(gpu01) `mpirun` is a shim that replays outputs per command line, i.e. per hostfile: the full
run hangs past its timeout, the intra-node-only variant passes, the inter-node-only one fails
with gpu02's real-format error-12 WARN line (gpu02 saw its peer gpu03 stop answering). The
bisection runs the inter-node split's halves at once: gpu01+gpu02 passes, gpu03+gpu04 fails
(ibv_modify_qp 110 from gpu03); then the failing half's nodes with nodes that passed:
gpu03+gpu01 fails, gpu04+gpu02 passes. The report must name gpu03, and only gpu03. mpirun is a
replay here because all_reduce_perf needs GPUs; real mpirun runs over the simulated cluster in
tests/e2e/test_e2e_collective_mpi.py (the MPI engine).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from derived import H200_RUN, h200_node_xml, mpirun_all_reduce, tagged_warn
from simcluster import Reply, SimHost

from preflight.app.cli import main

pytestmark = pytest.mark.root

HOSTS = ["gpu01", "gpu02", "gpu03", "gpu04"]
MAX = 1 << 30
ARGS = f"-b 8 -e {MAX} -f 2 -g 1 -c 1"


def mpirun(node_dir: Path, probe: str, ranks: int, split: bool = False) -> str:
    """The command line the stage's script runs on the launcher (preflight/collect/multinode.py SCRIPT)."""
    extra = " -x NCCL_TESTS_SPLIT" if split else ""
    return (f"mpirun --hostfile {node_dir}/r/{probe}.hosts -np {ranks} --tag-output -x NCCL_DEBUG "
            f"-x NCCL_DEBUG_SUBSYS{extra} all_reduce_perf {ARGS}")


def node(name: str, launcher_commands: dict | None = None) -> SimHost:
    commands = {
        "nvidia-smi -L": Reply("".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-88c58391-6001-919c-8431-20f011c2{i:04d})\n"
                                       for i in range(8))),
        "nvidia-smi -q -x": Reply(h200_node_xml(8)),
        f"all_reduce_perf -b 8 -e {MAX} -f 2 -g 8 -c 1 -n 20": Reply(H200_RUN),
    }
    return SimHost(name, commands=commands | (launcher_commands or {}))


def launcher_replies(node_dir: Path) -> dict[str, Reply]:
    inter = mpirun_all_reduce(HOSTS, rows=2) + tagged_warn("azure-ib-error12-retry-exceeded-nccl-warn.txt", "gpu02", 8)
    def bad(hosts):
        return mpirun_all_reduce(hosts, rows=1) + tagged_warn(
            "hgx-nccl2.27-ibv-modify-qp-110-timeout-init-rtr-timestamped.txt", "gpu03", 5)

    return {
        mpirun(node_dir, "nccl-multinode", 32): Reply(sleep_s=60),
        mpirun(node_dir, "nccl-multinode-intra", 32, split=True): Reply(mpirun_all_reduce(HOSTS)),
        mpirun(node_dir, "nccl-multinode-inter", 32, split=True): Reply(inter, exit_code=1),
        mpirun(node_dir, "nccl-bisect-2-1", 16, split=True): Reply(mpirun_all_reduce(["gpu01", "gpu02"])),
        mpirun(node_dir, "nccl-bisect-2-2", 16, split=True): Reply(bad(["gpu03", "gpu04"]), exit_code=1),
        mpirun(node_dir, "nccl-pair-gpu03-gpu01", 16, split=True): Reply(bad(["gpu03", "gpu01"]), exit_code=1),
        mpirun(node_dir, "nccl-pair-gpu04-gpu02", 16, split=True): Reply(mpirun_all_reduce(["gpu04", "gpu02"])),
    }


def test_multinode_names_the_culprit_host(sim_cluster, tmp_path):
    node_dir = tmp_path / "launcher"
    cluster = sim_cluster([node("gpu01", launcher_replies(node_dir))] + [node(h) for h in HOSTS[1:]])
    out = tmp_path / "reports"
    code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                 "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                 "--out", str(out), "--run-id", "r", "-q", "--checks", "nccl-multinode",
                 "--nccl-multinode", "--nccl-node-dir", str(node_dir), "--nccl-reps", "1",
                 "--nccl-max-bytes", str(MAX), "--nccl-timeout", "5"])
    # The evidence is in the bundle under the pseudo-host, with the hostfile the launcher got.
    assert_gpu03_isolated(code, out / "r", gpus=8)
    assert (node_dir / "r" / "nccl-pair-gpu03-gpu01.hosts").read_text().endswith("gpu03 slots=8\ngpu01 slots=8\n")
    # analyze of the saved bundle reaches the same verdicts.
    assert main(["analyze", str(out / "r"), "--out", str(tmp_path / "again"), "-q",
                 "--checks", "nccl-multinode"]) == 1


def assert_gpu03_isolated(code: int, run: Path, gpus: int) -> Path:
    """The verdict of the recorded fault fleet (gpu03's HCA times out), whichever launcher ran
    the all_reduce: gpu03 alone blamed by the bisection, every run's output saved. Returns the
    bundle's pseudo-host directory."""
    report = json.loads((run / "report.json").read_text())
    assert code == 1
    assert {h: v["status"] for h, v in report["hosts"].items()} == {
        "gpu01": "pass", "gpu02": "pass", "gpu03": "fail", "gpu04": "pass"}
    assert {d["cause"]: d["hosts"] for d in report["diagnoses"]} == {
        "nccl-pair-failed": ["gpu03"], "nccl-ib-qp-timeout": ["gpu03"]}
    fleet = next(f for f in report["findings"] if f["check"] == "nccl-multinode" and f["host"] is None)
    assert fleet["status"] == "fail" and fleet["summary"].startswith("isolated by bisection: gpu03")
    assert fleet["data"]["bisection"]["rounds"] == 3 and fleet["data"]["bisection"]["runs"] == 5
    assert f"all hosts (4 hosts x {gpus} GPUs): hung" in fleet["summary"]
    saved = run / "bundle" / "hosts" / "fleet-"
    assert sorted(p.name for p in saved.glob("*.txt")) == [
        "nccl-bisect-2-1.txt", "nccl-bisect-2-2.txt", "nccl-multinode-inter.txt", "nccl-multinode-intra.txt",
        "nccl-multinode.txt", "nccl-pair-gpu03-gpu01.txt", "nccl-pair-gpu04-gpu02.txt"]
    assert "# preflight: repetition 1 exit=124" in (saved / "nccl-multinode.txt").read_text()
    # What "slow" meant is saved with every run (no figure here: the hosts' profile was not detected,
    # only nccl-all-reduce ran on them), so analyze judges the bundle alike.
    assert "# preflight: expect busbw=none ratio=0.5\n" in (saved / "nccl-bisect-2-1.txt").read_text()
    return saved
