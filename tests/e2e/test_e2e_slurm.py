"""`preflight run --slurm` end to end on a real Slurm 22.05 cluster (tests/slurmcluster.py):
slurmctld here, one slurmd inside each simulated HGX H200 host (tests/nodes.py), so every srun
task runs the probes on its own node with that node's recorded outputs and faults.

The same hosts also run sshd, so the same fleet is judged over SSH and through Slurm and the two
reports are compared: same findings, same diagnoses. Then what only Slurm can tell: a node
drained by someone else is reported with its reason and not probed (and its drain left alone), a
node whose slurmd died gets Slurm's launch error while the others of its step still pass, and a
request Slurm refuses exits 2 with Slurm's words and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodes import (
    gpu_fallen_off_bus,
    healthy_h200,
    mlx5_timeouts,
    nic_firmware,
    nvlink_inactive,
    pcie_gen4_x8,
    port_polling,
)
from simcluster import Reply, SimHost
from slurmcluster import slurm_fleet

from preflight.app.cli import main

pytestmark = pytest.mark.root
OLD_FW = "28.45.1020"  # as in test_e2e_faults: older than the nodes' DOCA 3.1.0 ships
NCCL = ["--nccl-reps", "2", "--nccl-timeout", "5", "--nccl-max-bytes", "8G"]
FAULTY = ["gpu03", "gpu04", "gpu05", "gpu06", "gpu07"]
EXPECTED_CAUSES = {"gpu03": {"nic-fw-driver-mismatch"}, "gpu04": {"ib-port-down"}, "gpu05": {"nvlink-down"},
                   "gpu06": {"gpu-fallen-off-bus"}, "gpu07": {"pcie-link-degraded"}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    hosts = [
        healthy_h200("gpu01"), healthy_h200("gpu02"),
        mlx5_timeouts(nic_firmware(healthy_h200("gpu03"), OLD_FW)),
        port_polling(healthy_h200("gpu04"), nic=3),
        nvlink_inactive(healthy_h200("gpu05"), gpu=2, link=5),
        gpu_fallen_off_bus(healthy_h200("gpu06")),
        pcie_gen4_x8(healthy_h200("gpu07"), gpu=1),
        healthy_h200("gpu08"),  # drained by someone else in one test
        healthy_h200("gpu09"),  # its slurmd killed in another
        # python3 broken on this node: its shim answers only `python3 -V` (tests/simcluster.py),
        # so the task's `python3 -c ...` prints nothing on stdout and exits 64
        SimHost("gpu10", {"python3 -V": Reply("Python 3.11.2\n")}),
        # its ibstat takes 60 s: the controller is killed while it runs
        SimHost("gpu11", {**healthy_h200("gpu11").commands, "ibstat": Reply("", sleep_s=60)},
                sysfs=healthy_h200("gpu11").sysfs),
    ]
    started = time.monotonic()
    # Every node has its 8 GPUs in slurm.conf (Gres=gpu:8, gres.conf File= lines): every run here
    # asks for them, as a site's would.
    with slurm_fleet(hosts, tmp_path_factory.mktemp("slurm"), gpus=8) as slurm:
        slurm.up_s = time.monotonic() - started
        yield slurm


def run(tmp_path: Path, run_id: str, *args: str) -> tuple[int, dict, float]:
    out = tmp_path / "reports"
    started = time.monotonic()
    code = main(["run", "--out", str(out), "--run-id", run_id, "-q", *args])
    return code, json.loads((out / run_id / "report.json").read_text()), time.monotonic() - started


def ssh(cluster, *hosts: str) -> list[str]:
    sim = cluster.sim
    return ["-H", ",".join(hosts), "--ssh-config", str(sim.ssh_config), "--known-hosts", str(sim.known_hosts),
            "--identity", str(sim.identity)]


def causes(report) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for d in report["diagnoses"]:
        for host in d["hosts"]:
            out.setdefault(host, set()).add(d["cause"])
    return out


def comparable(report) -> tuple[list, list]:
    """What a verdict is made of, without timings (which differ between any two runs)."""
    findings = sorted((f["host"] or "", f["check"], f["status"], f["summary"], tuple(f["symptoms"]),
                       tuple((e["probe"], e["excerpt"]) for e in f["evidence"])) for f in report["findings"])
    diagnoses = sorted((d["cause"], tuple(d["hosts"]), d["confidence"], d["action"], d["evidence"])
                       for d in report["diagnoses"])
    return findings, diagnoses


def test_healthy_nodes_pass_under_slurm_all_reduce_included(cluster, tmp_path):
    code, report, elapsed = run(tmp_path, "healthy", "--slurm", "-w", "gpu[01-02]", *NCCL)
    assert code == 0 and report["diagnoses"] == []
    assert {h: v["status"] for h, v in report["hosts"].items()} == {"gpu01": "pass", "gpu02": "pass"}
    assert [f for f in report["findings"] if f["status"] not in ("pass", "skip")] == []
    summaries = {f["check"]: f["summary"] for f in report["findings"] if f["host"] == "gpu01"}
    assert summaries["nccl-all-reduce"].startswith("busbw 475.0 GB/s at 8 GiB on 8 GPUs (median of 2")
    bundle = json.loads((tmp_path / "reports" / "healthy" / "bundle" / "bundle.json").read_text())
    assert bundle["launcher"] == "slurm" and len(bundle["slurm_jobs"]) == 1
    cluster.wait_idle()  # the allocation is released when the run ends
    assert elapsed < 60


@contextlib.contextmanager
def gpus_seen(cluster, node: str) -> Iterator[Path]:
    """While inside: every `nvidia-smi` the node's probes run first writes the GPUs Slurm gave its
    step (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS) and the GPU devices the step's cgroup lets it
    open to the file yielded, one line per call: `0,1|0,1|0,1,`. The devices have no driver
    behind them, so an open the cgroup allows fails "No such device or address" and one it
    denies "Operation not permitted" (ConstrainDevices=yes, tests/slurmcluster.py)."""
    shim = cluster.sim.workdir_of(node) / "bin" / "nvidia-smi"
    dev, seen = shim.parent.parent / "dev", shim.parent.parent / "gpus-seen"
    recorded = shim.read_text()
    head, _, rest = recorded.partition("\n")
    opens = (f"$(for i in 0 1 2 3 4 5 6 7; do (: < {dev}/nvidia$i) 2>&1 | grep -q 'not permitted' "
             "|| printf '%s,' $i; done)")
    shim.write_text(f'{head}\necho "$CUDA_VISIBLE_DEVICES|$SLURM_STEP_GPUS|{opens}" >> {seen}\n{rest}')
    try:
        yield seen
    finally:
        shim.write_text(recorded)
        seen.unlink(missing_ok=True)


def test_a_run_asks_for_every_gpu_slurm_gives_the_node_and_its_probes_see_them(cluster, tmp_path):
    """slurm.conf gives each node 8 GPUs and cgroup.conf constrains devices: by default a run's
    job asks for all of them (--gres=gpu:8), so the probes' step is given GPUs 0-7 and may open
    every one; --gpus-per-node 2 gives it two; --gpus-per-node 0, what a run asked before,
    leaves the step no GPU it may open."""
    with gpus_seen(cluster, "gpu01") as seen:
        code, report, _ = run(tmp_path, "gpus", "--quick", "--slurm", "-w", "gpu[01-02]")
        assert code == 0 and report["hosts"]["gpu01"]["status"] == "pass"
        lines = set(seen.read_text().split())
        assert lines == {given(cluster, 8)}, lines
        for n in (2, 0):
            seen.unlink()
            code, _, _ = run(tmp_path, f"gpus-{n}", "--quick", "--slurm", "-w", "gpu01", "--gpus-per-node", str(n))
            assert code == 0 and set(seen.read_text().split()) == {given(cluster, n)}, (n, seen.read_text())
    cluster.wait_idle()
    if not cluster.constrained:
        pytest.skip(f"the GPUs given checked, their confinement not: {cluster.why_unconstrained}")


def given(cluster, n: int) -> str:
    """What gpus_seen writes for a step given GPUs 0..n-1 of the node's 8."""
    ids = ",".join(map(str, range(n)))
    opened = "".join(f"{i}," for i in range(n if cluster.constrained else 8))
    return f"{ids}|{ids}|{opened}"


def test_the_load_probes_never_run_beside_another_job_unless_asked(cluster, tmp_path):
    """A CPU job runs on gpu02 (MIXED: a CPU of its two, no GPU). A run with the all_reduce
    probes gpu01 and leaves gpu02 out, saying why; --exclusive waits for gpu02 (not granted
    within --alloc-timeout); --allow-shared probes it beside the job, with all its GPUs."""
    job = cluster.slurm("sbatch", "--parsable", "-N1", "-n1", "--nodelist=gpu02", "-o", "/dev/null", "--wrap",
                        "sleep 300").stdout.strip()
    try:
        cluster.wait_for_state(["gpu02"], "MIXED")
        code, report, _ = run(tmp_path, "shared", "--slurm", "-w", "gpu[01-02]", *NCCL)
        assert code == 1 and report["hosts"]["gpu01"]["status"] == "pass"
        [conn] = [f for f in report["findings"] if f["host"] == "gpu02" and f["check"] == "connectivity"]
        assert conn["symptoms"] == ["slurm-node-unavailable"]
        assert conn["summary"] == ("not checked: slurm: node runs another job (State=MIXED): the load probes "
                                   "(nccl-all-reduce) are not run beside it; --exclusive waits for the node, "
                                   "--allow-shared runs them anyway"), conn["summary"]
        # --quick has no load probe: gpu02 is probed beside the job.
        code, report, _ = run(tmp_path, "quick", "--quick", "--slurm", "-w", "gpu02")
        assert code == 0 and report["hosts"]["gpu02"]["status"] == "pass"

        code, report, _ = run(tmp_path, "excl", "--slurm", "-w", "gpu02", "--exclusive", "--alloc-timeout", "2", *NCCL)
        [conn] = [f for f in report["findings"] if f["host"] == "gpu02" and f["check"] == "connectivity"]
        assert code == 1 and conn["summary"].startswith("not checked: slurm: allocation not granted"), conn

        with gpus_seen(cluster, "gpu02") as seen:
            code, report, _ = run(tmp_path, "allowed", "--slurm", "-w", "gpu02", "--allow-shared", *NCCL)
            assert code == 0 and report["hosts"]["gpu02"]["status"] == "pass"
            assert set(seen.read_text().split()) == {given(cluster, 8)}
    finally:
        cluster.slurm("scancel", job)
    cluster.wait_idle()


def test_the_faulty_fleet_gets_the_same_verdicts_through_slurm_as_over_ssh(cluster, tmp_path, capsys):
    hosts = ["gpu01", "gpu02", *FAULTY]
    code_ssh, over_ssh, ssh_s = run(tmp_path, "ssh", "--quick", *ssh(cluster, *hosts))
    # Seven nodes in jobs of at most four: two allocations, judged as one fleet.
    code_slurm, via_slurm, slurm_s = run(tmp_path, "slurm", "--quick", "--slurm", "-w", "gpu[01-07]",
                                         "--max-nodes-per-job", "4")
    assert code_ssh == code_slurm == 1
    assert len(json.loads((tmp_path / "reports/slurm/bundle/bundle.json").read_text())["slurm_jobs"]) == 2
    assert causes(via_slurm) == EXPECTED_CAUSES
    assert via_slurm["hosts"] == over_ssh["hosts"]
    slurm_findings, slurm_diagnoses = comparable(via_slurm)
    ssh_findings, ssh_diagnoses = comparable(over_ssh)
    assert slurm_diagnoses == ssh_diagnoses
    assert slurm_findings == ssh_findings
    # Both runs landed in the embedded results store (this test's own, tests/conftest.py), each
    # with its launcher, and the node's history reads them back.
    capsys.readouterr()
    assert main(["history", "gpu05", "--since", "1d", "--json"]) == 0
    timeline = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["launcher"], r["status"]) for r in timeline["runs"]] == [
        ("ssh", "ssh", "fail"), ("slurm", "slurm", "fail")]
    assert all([c["cause"] for c in r["causes"]] == ["nvlink-down"] for r in timeline["runs"])
    assert main(["history", "--fleet", "--since", "1d", "--json"]) == 0
    fleet = json.loads(capsys.readouterr().out)
    assert fleet["runs"] == 2 and fleet["host_runs"] == 14
    assert {r["cause"]: r["failures"] for r in fleet["rates"] if "cause" in r}["nvlink-down"] == 2
    print(f"\n7 nodes --quick: over SSH {ssh_s:.1f} s, through Slurm {slurm_s:.1f} s; cluster up in {cluster.up_s:.1f} s")


def test_merge_judges_per_node_runs_a_site_started_with_srun_itself(cluster, tmp_path):
    """The site's way: `srun preflight run --local --out /shared/...` (preflight installed where the
    nodes see it; here the repository, on the filesystem they share), then `preflight merge`."""
    shared = tmp_path / "shared"
    root = Path(__file__).resolve().parents[2]
    proc = cluster.slurm("srun", "-N3", "-w", "gpu[01-03]", f"--export=ALL,PYTHONPATH={root}", sys.executable, "-m",
                         "preflight", "run", "--local", "--quick", "-q", "--no-html", "--out", str(shared),
                         timeout=120, check=False)
    assert proc.stderr.strip() == "srun: error: gpu03: task 2: Exited with exit code 1"  # its run failed a check
    assert len(list(shared.iterdir())) == 3  # one run directory per node
    out = tmp_path / "merged"
    code = main(["merge", str(shared), "--expect", "gpu[01-04]", "--out", str(out), "--run-id", "m", "-q"])
    assert code == 1
    merged = json.loads((out / "m" / "report.json").read_text())
    assert {h: (v["status"], v["reachable"]) for h, v in merged["hosts"].items()} == {
        "gpu01": ("pass", True), "gpu02": ("pass", True), "gpu03": ("fail", True), "gpu04": ("error", False)}
    # gpu03's old firmware is judged against its driver and against the fleet the merge rebuilt.
    assert causes(merged) == {"gpu03": {"nic-fw-driver-mismatch"}, "gpu04": {"run-incomplete"}}


def test_a_node_drained_by_someone_else_is_reported_not_probed_and_its_drain_kept(cluster, tmp_path):
    cluster.drain("gpu08", "someone else: fan 3 failed")
    try:
        code, report, _ = run(tmp_path, "drained", "--quick", "--slurm", "-w", "gpu01,gpu08")
        assert code == 1
        assert report["hosts"]["gpu01"]["status"] == "pass"
        assert report["hosts"]["gpu08"]["status"] == "error" and report["hosts"]["gpu08"]["reachable"] is False
        [conn] = [f for f in report["findings"] if f["host"] == "gpu08" and f["check"] == "connectivity"]
        assert conn["symptoms"] == ["slurm-node-unavailable"]
        assert conn["summary"].startswith("not checked: slurm: node drained before the run (State=IDLE+DRAIN "
                                          "Reason=someone else: fan 3 failed [root@")
        [d] = report["diagnoses"]
        assert (d["cause"], d["hosts"]) == ("slurm-node-unavailable", ["gpu08"])
        assert d["action"].startswith("Read the node's state and reason (scontrol show node NODE)")
        # Not probed: no probe of gpu08 ran, every one carries Slurm's reason.
        records = [json.loads(p.read_text()) for p in (tmp_path / "reports/drained/bundle/hosts/gpu08").glob("*.json")]
        assert records and all(r["exit_code"] is None and r["error"].startswith("slurm: node drained") for r in records)
        # Someone else's drain is theirs: still drained, same reason.
        assert cluster.states()["gpu08"] == "drained"
        assert "Reason=someone else: fan 3 failed" in cluster.slurm("scontrol", "show", "node", "-o", "gpu08").stdout
    finally:
        cluster.resume("gpu08")


@pytest.mark.parametrize("args, said", [
    (["-w", "gpu01", "--partition", "nope"], "--partition nope: Slurm says: Partition nope not found"),
    (["-w", "gpu01,gpu99"], "node list: Slurm says: Node gpu99 not found"),
    (["-w", "gpu[01-"], "-w: 'gpu[01-': "),
    (["-w", "gpu01", "--sbatch-arg=--constraint=nosuch"], "salloc: Slurm says: salloc: error: Job submit/allocate failed: "
                                                           "Invalid feature specification"),
])
def test_a_request_slurm_refuses_exits_2_with_its_words_and_leaves_nothing(cluster, tmp_path, capsys, args, said):
    out = tmp_path / "reports"
    assert main(["run", "--slurm", "--quick", "--out", str(out), "--run-id", "bad", "-q", *args]) == 2
    assert said in " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert not (out / "bad").exists()
    assert cluster.slurm("squeue", "-h").stdout == ""  # no allocation left behind


def test_slurmctld_unreachable_exits_2(cluster, tmp_path, capsys, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text(cluster.conf.read_text().replace(f"SlurmctldPort={cluster.port}", "SlurmctldPort=9"))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert main(["run", "--slurm", "--quick", "-w", "gpu01", "--out", str(tmp_path / "r"), "-q"]) == 2
    assert "slurm_load_node error: Unable to contact slurm controller (connect failure)" in " ".join(
        capsys.readouterr().err.split())
    assert not (tmp_path / "r").exists()


def test_a_task_that_printed_nothing_gets_what_srun_said(cluster, tmp_path, monkeypatch):
    # The node's /usr/local/bin (its shims) first, as a site's PATH might put a broken python3.
    monkeypatch.setenv("PATH", "/usr/local/bin:" + os.environ["PATH"])
    code, report, _ = run(tmp_path, "mute", "--quick", "--slurm", "-w", "gpu01,gpu10")
    assert code == 1 and report["hosts"]["gpu01"]["status"] == "pass"
    assert report["hosts"]["gpu10"] == {**report["hosts"]["gpu10"], "status": "error", "reachable": False}
    [conn] = [f for f in report["findings"] if f["host"] == "gpu10" and f["check"] == "connectivity"]
    assert conn["summary"] == "not checked: slurm: task Exited with exit code 64"
    assert causes(report) == {"gpu10": {"slurm-node-unavailable"}}


def test_python3_missing_on_the_nodes_is_named_by_their_slurmstepd(cluster, tmp_path):
    code, report, _ = run(tmp_path, "nopython", "--quick", "--slurm", "-w", "gpu[01-02]",
                          "--node-python", "no-such-python3")
    assert code == 1
    for node in ("gpu01", "gpu02"):
        [conn] = [f for f in report["findings"] if f["host"] == node and f["check"] == "connectivity"]
        assert conn["summary"] == ("not checked: slurm: task Exited with exit code 2; "
                                   "execve(): no-such-python3: No such file or directory")


def test_a_controller_killed_mid_run_leaves_a_bundle_analyze_judges(cluster, tmp_path):
    out = tmp_path / "reports"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "preflight", "run", "--slurm", "-w", "gpu01,gpu11", "--quick",
                             "--timeout", "90", "--out", str(out), "--run-id", "killed", "-q"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gpu01, gpu11 = out / "killed/bundle/hosts/gpu01", out / "killed/bundle/hosts/gpu11"
    planned = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (out / "killed/bundle/bundle.json").exists():
            planned = json.loads((out / "killed/bundle/bundle.json").read_text())["probes"]
            # gpu01 done; gpu11 done but for its hung ibstat
            if len(list(gpu01.glob("*.json"))) == len(planned) and len(list(gpu11.glob("*.json"))) == len(planned) - 1:
                break
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    try:
        assert planned and not (out / "killed/report.json").exists()
        # What was measured is judged; the probe that never came back is a warning, as over SSH
        # (the ports are still judged from ibv-devinfo).
        assert main(["analyze", str(out / "killed"), "--out", str(tmp_path / "a"), "-q", "--no-html"]) == 0
        [report] = [json.loads(p.read_text()) for p in (tmp_path / "a").glob("*/report.json")]
        assert {h: v["status"] for h, v in report["hosts"].items()} == {"gpu01": "pass", "gpu11": "warn"}
        [probes] = [f for f in report["findings"] if f["host"] == "gpu11" and f["check"] == "probes"]
        assert probes["status"] == "warn"
        assert probes["summary"] == "1 planned probe(s) never recorded (the run stopped early?): ibstat"
    finally:
        # SIGKILL left the allocation to its time limit: what an operator runs then.
        cluster.slurm("scancel", "--name", "preflight-killed")
        cluster.wait_idle()


def test_a_node_whose_slurmd_died_gets_slurms_launch_error_and_the_others_still_pass(cluster, tmp_path):
    """Last in the module: Slurm keeps the dead node's job COMPLETING until slurmd answers again."""
    cluster.stop_slurmd("gpu09")
    try:
        code, report, elapsed = run(tmp_path, "dead", "--quick", "--slurm", "-w", "gpu[01-02],gpu09")
        assert code == 1
        assert {h: (v["status"], v["reachable"]) for h, v in report["hosts"].items()} == {
            "gpu01": ("pass", True), "gpu02": ("pass", True), "gpu09": ("error", False)}
        [conn] = [f for f in report["findings"] if f["host"] == "gpu09" and f["check"] == "connectivity"]
        assert conn["summary"] == "not checked: slurm: task launch failed: Communication connection failure"
        assert causes(report) == {"gpu09": {"slurm-node-unavailable"}}
        assert elapsed < 60  # srun's launch timeout, then the others again in a step of their own
    finally:
        cluster.start_slurmd("gpu09")
