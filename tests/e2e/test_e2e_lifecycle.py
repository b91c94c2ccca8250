"""``preflight lifecycle --once --slurm`` on the real Slurm cluster (tests/slurmcluster.py), the
readings recorded by real runs over SSH of simulated nodes with real faults: a single reading of a
confirm-first cause never drains, a fault one reading proves drains through scontrol, someone
else's drain is untouched, two lifecycles started at once drain a node once; the whole way back:
drained, rebooted through the site's RebootProgram, retested by the lifecycle over SSH, resumed;
a GPU reset (over SSH) that clears the fault, held back while a job runs on the node; a fault that
returns, and a reset that never clears it, handed to a person (each step's outcome typed: cleared,
returned); the node's state kept before each step (the driver's bug report where the node has it,
the fallback set where not, a hung report cut at the capture's limit while the reset still
happens); the store lost mid-way.

The test RebootProgram "reboots" a simulated node: it starts the node's slurmd again inside a new
time namespace whose boot-time offset makes the node's uptime a few seconds, so slurmd reports a
boot time after the reboot request, as a node that really rebooted does; slurmctld then takes the
reboot as done (it waits for exactly that), and the node comes back DOWN as `nextstate=DOWN`
asks. A node marked for it has its fault cleared by the reboot (its shims replaced by a healthy
node's)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pgcluster
import pytest
from nodes import gpu_fallen_off_bus, healthy_h200, nvlink_inactive, row_remap_pending
from simcluster import Reply
from slurmcluster import slurm_fleet
from test_capture import SMI_Q_CAPTURE, journals, with_bug_report

from preflight.app.cli import main

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "recorded"
RESET_OK = RECORDED / "nvidia-smi-r-successfully-reset-nvsentinel-1692.txt"


def resettable(node, becomes: str | None = None, sleep_s: float = 0):
    """``nvidia-smi -r`` answers as it did on a real GPU (NVIDIA/NVSentinel#1692); ``becomes``: the
    reset clears the fault (the node answers as that healthy node from then on)."""
    return replace(node, commands={**node.commands, "nvidia-smi -r": Reply(RESET_OK, becomes=becomes,
                                                                          sleep_s=sleep_s)})


REBOOT = """#!/bin/sh
# The test RebootProgram (tests/e2e/test_e2e_lifecycle.py): run by the node's slurmd, in its namespaces.
node=$(hostname)
now=$(date +%s)
# slurmctld may send the reboot again to the slurmd this started (it never had its answer from
# the one that was killed): a request within seconds of a restart is that one, already done.
last=$(cat "{work}/restarted-$node" 2>/dev/null || echo 0)
[ $((now - last)) -lt 4 ] && exit 0
echo "$now $node" >> "{work}/reboots.log"
[ -f "{work}/clear-on-reboot/$node" ] && cp "$(cat "{work}/clear-on-reboot/$node")"/* "{sims}/$node/bin/"
# slurmctld takes the reboot as done when the node's boot time is later than the reboot it
# issued: the new slurmd gets an uptime of 1 s, 3 s after this program started. The offset is
# from the machine's own boot (its epoch below), not from this namespace's clock, which a
# slurmd restarted here before already moved.
setsid sh -c '
    sleep 2
    kill -9 "$(cat "$1")"; sleep 1
    date +%s > "$4"
    exec unshare --time --boottime=-$(( $(date +%s) - {booted} - 1 )) /usr/sbin/slurmd -D -f "$2" -N "$3"
' sh "{run}/slurmd-$node.pid" "{conf}" "$node" "{work}/restarted-$node" </dev/null >/dev/null 2>&1 &
exit 0
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("lifecycle")
    # The driver's bug report (its bytes opaque to preflight: a real nvidia-smi -q gzipped, as
    # tests/lifecycle/test_capture.py says): gpu06 has the script, gpu07's hangs, gpu05 has none
    # (the fallback set, with its services' journals).
    report = work / "stand-in.log.gz"
    report.write_bytes(gzip.compress(SMI_Q_CAPTURE.read_bytes()))
    hosts = [healthy_h200("gpu01"), nvlink_inactive(healthy_h200("gpu02"), gpu=2, link=5),
             gpu_fallen_off_bus(healthy_h200("gpu03")), gpu_fallen_off_bus(healthy_h200("gpu04")),
             journals(gpu_fallen_off_bus(healthy_h200("gpu05"))),
             with_bug_report(resettable(row_remap_pending(healthy_h200("gpu06")), becomes="gpu01"), report),
             with_bug_report(resettable(row_remap_pending(healthy_h200("gpu07"))), report, sleep_s=3600),
             resettable(row_remap_pending(healthy_h200("gpu08")), sleep_s=4), gpu_fallen_off_bus(healthy_h200("gpu09"))]
    script = work / "reboot"
    with slurm_fleet(hosts, work, [f"RebootProgram={script}", "ResumeTimeout=60"]) as slurm:
        booted = int(time.time() - float(Path("/proc/uptime").read_text().split()[0]))
        script.write_text(REBOOT.format(work=work, sims=slurm.sim.workdir_of("gpu01").parent, run=slurm.dir / "run",
                                        conf=slurm.conf, booted=booted))
        script.chmod(0o755)
        (work / "clear-on-reboot").mkdir()
        slurm.work = work
        slurm.drain("gpu04", "someone else: memory test")
        try:
            yield slurm
        finally:
            # A slurmd the RebootProgram started is not the cluster's own child: end it here.
            for pidfile in (slurm.dir / "run").glob("slurmd-*.pid"):
                with contextlib.suppress(ValueError, ProcessLookupError):
                    os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)


def state(cluster, node: str) -> str:
    return cluster.states()[node].rstrip("*")


def reason(cluster, node: str) -> str:
    return cluster.slurm("scontrol", "show", "node", "-o", node).stdout.partition(" Reason=")[2].strip()


def probe(cluster, out: Path, run_id: str, db: str, hosts: str = "gpu[01-04]") -> None:
    sim = cluster.sim
    main(["run", "-H", hosts, "--ssh-config", str(sim.ssh_config), "--known-hosts", str(sim.known_hosts),
          "--identity", str(sim.identity), "--quick", "-q", "--no-html", "--out", str(out), "--run-id", run_id,
          "--db", db])


def lifecycle(capsys, *argv: str) -> dict:
    """One pass; node -> its steps in the pass, in order (a reset's chain takes several)."""
    capsys.readouterr()  # what came before (a probing run's -q line) is not the pass's JSON
    assert main(["lifecycle", "--once", "--slurm", "--json", *argv]) in (0, 1)
    steps: dict[str, list] = {}
    for s in json.loads(capsys.readouterr().out)["steps"]:
        steps.setdefault(s["node"], []).append(s)
    return {node: {**got[-1], "chain": [g["to"] for g in got], "all_done": [d for g in got for d in g["done"]],
                   "captures": [c for g in got for c in g["captures"]],
                   "outcomes": [o for g in got for o in g["outcomes"]]}
            for node, got in steps.items()}


def reach(cluster, out: Path, hosts: str) -> list[str]:
    """The lifecycle's way onto the nodes: SSH, as a run has it. The retest's all_reduce runs
    once (a run's default is 5 times, 5 s apart)."""
    sim = cluster.sim
    return ["-H", hosts, "--ssh-config", str(sim.ssh_config), "--known-hosts", str(sim.known_hosts),
            "--identity", str(sim.identity), "--out", str(out), "--retest-arg=--nccl-reps=1"]


SITE = ("format: preflight-lifecycle/1\ntimings: {startup_grace_s: 0, breaker_fraction: 1.0, "
        "retest_dcgm_level: 1, capture_timeout_s: 20}\n")  # level 1: the simulated nodes answer DCGM with a real
# level-1 capture; 20 s: a hung bug report is cut within a second (the rest is the transport's grace
# and the read-back's reserve)



def wait_rebooted(cluster, node: str) -> None:
    """Until slurmctld has the node back from its reboot (DOWN, as nextstate=DOWN asks)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = cluster.slurm("scontrol", "show", "node", "-o", node).stdout
        if "State=DOWN" in line and "REBOOT" not in line:
            return
        time.sleep(0.5)
    raise AssertionError(f"{node} not back from its reboot: {line}")


def test_a_confirm_first_reading_never_drains_and_a_proven_fault_drains(cluster, tmp_path, capsys):
    """gpu02 read once: suspect, Slurm not asked. gpu03's GPU off the bus: drained at once, with
    preflight's reason. gpu04, drained by someone else with the same fault, is left alone."""
    db = f"sqlite:///{tmp_path}/store.sqlite"
    probe(cluster, tmp_path, "r1", db)
    steps = lifecycle(capsys, "--db", db)
    assert steps["gpu02"]["to"] == "suspect" and steps["gpu02"]["actions"][0]["kind"] == "confirm"
    assert state(cluster, "gpu02") == "idle"
    assert steps["gpu03"]["to"] == "drained" and steps["gpu03"]["done"] == [
        "drain gpu03 (preflight: drained gpu-fallen-off-bus r1)"]
    assert state(cluster, "gpu03") == "drained" and reason(cluster, "gpu03").startswith(
        "preflight: drained gpu-fallen-off-bus r1")
    assert "gpu04" not in steps and reason(cluster, "gpu04").startswith("someone else: memory test")
    assert main(["lifecycle", "--json", "--db", db]) == 0
    listing = json.loads(capsys.readouterr().out)["states"]
    assert [n["node"] for n in listing["drained"]] == ["gpu03"] and [n["node"] for n in listing["suspect"]] == ["gpu02"]
    assert main(["history", "gpu03", "--since", "1d", "--json", "--db", db]) == 0
    events = json.loads(capsys.readouterr().out)["events"]
    assert [(e["kind"], e["detail"].get("to")) for e in events] == [("transition", "drained"), ("drain", None)]
    cluster.resume("gpu03")


def test_two_lifecycles_at_once_drain_a_confirmed_node_once(cluster, tmp_path, capsys, pg):
    """gpu02's NVLink is read inactive twice; the site confirms on a second reading at once and
    lets the breaker drain every node. Two lifecycle processes share a PostgreSQL store, as a
    fleet's controllers do, and start together: gpu02 is drained by exactly one of them."""
    store_url = pg.create_database("lifecycle_two")
    site = tmp_path / "site.yaml"
    # (nvlink-down's step a person's here: the slower of the two finds gpu02 drained, not rebooted)
    site.write_text("format: preflight-lifecycle/1\ntimings: {confirm_delay_s: 0, breaker_fraction: 1.0}\n"
                    "causes: {nvlink-down: {confirm: again, step: none, person: reseat}}\n")
    probe(cluster, tmp_path, "c1", store_url, "gpu[01-02]")
    lifecycle(capsys, "--db", store_url, "--site", str(site))
    probe(cluster, tmp_path, "c2", store_url, "gpu[01-02]")
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


def test_drained_rebooted_retested_resumed(cluster, tmp_path, capsys):
    """gpu05's GPU fell off the bus: drained on its one reading; idle, so its state is kept (it
    has no nvidia-bug-report.sh: the fallback set) and it is rebooted through the RebootProgram
    (which clears the fault); seen rebooted by its new boot time; retested over SSH; passed
    (the reboot's outcome: cleared); resumed. Every step is in its history."""
    db = f"sqlite:///{tmp_path}/store.sqlite"
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    (cluster.work / "clear-on-reboot" / "gpu05").write_text(str(cluster.sim.workdir_of("gpu01") / "bin"))
    probe(cluster, tmp_path, "b1", db, "gpu05")
    assert lifecycle(capsys, "--db", db, "--site", str(site))["gpu05"]["to"] == "drained"
    assert state(cluster, "gpu05") == "drained"

    asked = time.time()
    steps = lifecycle(capsys, "--db", db, "--site", str(site), *reach(cluster, tmp_path / "retests", "gpu05"))
    assert steps["gpu05"]["chain"][0] == "remediating" and steps["gpu05"]["all_done"][0].startswith("reboot gpu05")
    [kept] = steps["gpu05"]["captures"]
    assert (kept["step"], kept["source"], kept["outcome"]) == ("reboot", "fallback", "complete"), kept
    evidence = Path(kept["directory"])
    assert evidence.parent == tmp_path / "retests" and evidence.name.startswith("capture-gpu05-")
    assert "GPU has fallen off the bus" in (evidence / "kernel-log.txt").read_text()  # before the reboot
    assert (evidence / "nvidia-fabricmanager.journal.txt").read_text().startswith("Jan 05 14:44:41")
    wait_rebooted(cluster, "gpu05")
    assert (cluster.work / "reboots.log").read_text().split()[1:] == ["gpu05"]

    # Seen rebooted: retested by the lifecycle itself over SSH (the fault is gone), resumed.
    steps = lifecycle(capsys, "--db", db, "--site", str(site), *reach(cluster, tmp_path / "retests", "gpu05"))
    assert steps["gpu05"]["chain"] == ["retesting", "retesting", "resumed"], (steps, cluster.slurm(
        "scontrol", "show", "node", "-o", "gpu05").stdout)
    [retest] = sorted(p.name for p in (tmp_path / "retests").iterdir() if p.name.startswith("retest-"))
    assert steps["gpu05"]["all_done"][1] == f"resume gpu05 (passes {retest})"
    assert state(cluster, "gpu05") == "idle"
    assert main(["history", "gpu05", "--since", "1d", "--json", "--db", db]) == 0
    events = json.loads(capsys.readouterr().out)["events"]
    moves = [e["detail"]["to"] for e in events if e["kind"] == "transition"]
    assert moves == ["drained", "remediating", "retesting", "resumed"]
    assert [e["kind"] for e in events if e["kind"] != "transition"] == ["drain", "capture", "reboot", "retest",
                                                                         "outcome", "resume"]
    [outcome] = [e for e in events if e["kind"] == "outcome"]
    assert (outcome["detail"]["step"], outcome["detail"]["outcome"], outcome["run_id"]) == ("reboot", "cleared",
                                                                                           retest)
    # The slurmd the RebootProgram started is the one that answers now.
    assert int((cluster.work / "restarted-gpu05").read_text()) >= int(asked)


def test_a_reset_clears_the_fault_a_busy_node_waits_a_return_goes_to_a_person(cluster, tmp_path, capsys):
    """gpu06's row remap is pending (a reset activates it, and clears the fault here); gpu07's
    reset never clears it. gpu06 runs a job when its fault is read: drained (Slurm lets the job
    finish), but not reset until the job is gone; then its bug report kept, reset over SSH,
    retested by the lifecycle (the blamed checks, DCGM diag, the single-node all_reduce) and
    resumed, in one pass: the reset cleared it. gpu07's bug report hangs: cut at the capture's
    limit, and the reset still happens; its retest fails with the same cause: the reset returned,
    gpu-row-remap has no other step, so a person decides (escalated, no RMA asked, no second
    reset). The fault comes back to gpu06: the reset returned too, and is not tried again."""
    db = f"sqlite:///{tmp_path}/store.sqlite"
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    faulty = tmp_path / "faulty-gpu06"
    shutil.copytree(cluster.sim.workdir_of("gpu06") / "bin", faulty)
    out = tmp_path / "retests"
    args = ["--db", db, "--site", str(site), *reach(cluster, out, "gpu[06-07]")]
    job = cluster.slurm("sbatch", "--parsable", "-N1", "--exclusive", "--nodelist=gpu06", "-o", "/dev/null", "--wrap",
                        "sleep 300").stdout.strip()
    cluster.wait_for_state(["gpu06"], "ALLOCATED")

    probe(cluster, tmp_path, "f1", db, "gpu[06-07]")
    steps = lifecycle(capsys, *args)
    assert steps["gpu06"]["chain"] == ["drained"] and steps["gpu07"]["chain"] == ["drained"]
    assert reason(cluster, "gpu06").startswith("preflight: drained gpu-row-remap f1")
    # gpu06 is busy: left drained, no reset. gpu07 is idle: its state kept (the report hangs: cut
    # at the limit), reset all the same, retested, the reset returned: a person's.
    steps = lifecycle(capsys, *args)
    assert "gpu06" not in steps and state(cluster, "gpu06") in ("draining", "drng")
    assert steps["gpu07"]["chain"] == ["remediating", "retesting", "retesting", "escalated"]
    assert steps["gpu07"]["all_done"][0] == "reset gpu07 (preflight: remediating gpu-row-remap f1: reset)"
    [hung] = steps["gpu07"]["captures"]
    assert (hung["step"], hung["outcome"]) == ("reset", "timed-out") and hung["seconds"] <= 20.5, hung
    # (On a machine loaded enough, the limit may pass in the SSH handshake, before the node has
    # said whether it has the script: the capture's watchdog cuts it there.)
    assert hung["source"] == "nvidia-bug-report" and "nvidia-bug-report.sh" in hung["why"] or (
        hung["source"] == "" and "passed in the SSH connection" in hung["why"]), hung
    assert [(o["step"], o["outcome"]) for o in steps["gpu07"]["outcomes"]] == [("reset", "returned")]
    assert reason(cluster, "gpu07").startswith("preflight: escalated gpu-row-remap f1: retest ")
    assert "a person decides" in reason(cluster, "gpu07")

    cluster.slurm("scancel", job)
    cluster.wait_for_state(["gpu06"], "DRAINED")
    steps = lifecycle(capsys, *args)
    assert steps["gpu06"]["chain"] == ["remediating", "retesting", "retesting", "resumed"]
    assert "gpu07" not in steps  # a person's now: nothing retried
    assert state(cluster, "gpu06") == "idle" and state(cluster, "gpu07") == "drained"
    [kept] = steps["gpu06"]["captures"]
    assert (kept["source"], kept["outcome"]) == ("nvidia-bug-report", "complete"), kept
    assert (Path(kept["directory"]) / "nvidia-bug-report.log.gz").read_bytes() == (
        cluster.work / "stand-in.log.gz").read_bytes()
    assert [(o["step"], o["outcome"]) for o in steps["gpu06"]["outcomes"]] == [("reset", "cleared")]
    retests = sorted(p.name for p in out.iterdir() if p.name.startswith("retest-"))
    assert len(retests) == 2
    first = json.loads((out / [r for r in retests if "gpu06" in r][0] / "report.json").read_text())
    assert {"dcgm-diag", "nccl-all-reduce", "gpu-memory"} <= {c["id"] for c in first["checks"]}, first["checks"]

    # The fault returns: drained, the reset recorded as returned, and the next pass hands the node
    # to a person instead of resetting it again.
    shutil.copytree(faulty, cluster.sim.workdir_of("gpu06") / "bin", dirs_exist_ok=True)
    probe(cluster, tmp_path, "f2", db, "gpu06")
    steps = lifecycle(capsys, *args)
    assert steps["gpu06"]["chain"] == ["drained"]
    assert [(o["step"], o["outcome"], o["reading"]) for o in steps["gpu06"]["outcomes"]] == [
        ("reset", "returned", "f2")]
    steps = lifecycle(capsys, *args)
    assert steps["gpu06"]["chain"] == ["escalated"] and not steps["gpu06"]["captures"]
    assert reason(cluster, "gpu06").startswith("preflight: escalated gpu-row-remap f2: reset returned")
    assert main(["lifecycle", "--json", "--db", db]) == 0
    listing = json.loads(capsys.readouterr().out)["states"]
    assert [n["node"] for n in listing["escalated"]] == ["gpu06", "gpu07"]
    # The RMA summary lists each step with the evidence kept before it and its outcomes.
    assert main(["lifecycle", "gpu06", "--rma", "--json", "--db", db]) == 0
    [step] = json.loads(capsys.readouterr().out)["steps"]
    assert [o["outcome"] for o in step["outcomes"]] == ["cleared", "returned"]
    assert step["evidence"]["directory"] == kept["directory"] and step["evidence"]["outcome"] == "complete"
    assert main(["lifecycle", "gpu07", "--rma", "--db", db]) == 0
    text = capsys.readouterr().out
    section = text[text.index("## Remediation steps"):]
    assert "reset (preflight: remediating gpu-row-remap f1: reset): returned (retest-gpu07-" in section, section
    assert "  - evidence kept before it: timed-out, " in text
    for node in ("gpu06", "gpu07"):
        cluster.resume(node)


def test_the_store_lost_mid_way_stops_the_pass_and_says_so(cluster, tmp_path, capsys):
    """A PostgreSQL store that dies while gpu08's reset runs: the reset's state was recorded
    before it ran, its outcome cannot be, so the pass stops there and says so: gpu09's drain
    (next in the pass) is not taken, nor gpu08's retest. With the store back, the next pass
    goes on from what was recorded."""
    why = pgcluster.why_not()
    if why:
        pytest.skip(why)
    pg = pgcluster.start(max_connections=20)
    try:
        db = pg.create_database("lost")
        site = tmp_path / "site.yaml"
        # No capture before the reset here: the store is to die during the reset itself.
        site.write_text(SITE.replace("capture_timeout_s: 20", "capture_timeout_s: 0"))
        probe(cluster, tmp_path, "s1", db, "gpu08")
        args = ["--once", "--slurm", "--json", "--db", db, "--site", str(site),
                *reach(cluster, tmp_path / "retests", "gpu[08-09]")]
        assert main(["lifecycle", *args]) == 0
        capsys.readouterr()
        assert state(cluster, "gpu08") == "drained"
        probe(cluster, tmp_path, "s2", db, "gpu09")
        capsys.readouterr()  # the probing run's -q line
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_CONF": str(cluster.conf)}
        proc = subprocess.Popen([sys.executable, "-m", "preflight", "lifecycle", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 30
        while "remediating" not in pg.psql("SELECT state FROM pf_node_state WHERE node = 'gpu08'", "lost"):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        pgcluster.halt(pg)  # during the 4 s reset
        out, err = proc.communicate(timeout=120)
        p = json.loads(out)
        assert proc.returncode == 1, err
        assert p["stopped"].startswith("reset done but not recorded:"), p
        assert [s["node"] for s in p["steps"]] == ["gpu08"]
        assert state(cluster, "gpu09") == "idle" and not (tmp_path / "retests").exists()

        pgcluster.resume(pg)
        # The dead controller could not let go of the lock: the next pass of this host takes it
        # over. (The test cluster commits without waiting for its WAL, so the crash may have lost
        # the lock, or the last state, too: either way the node goes on, and gpu09's drain comes now.)
        left = pg.psql("SELECT holder FROM pf_locks", "lost")
        assert main(["lifecycle", *args]) in (0, 1)
        p = json.loads(capsys.readouterr().out)
        assert p["lock_holder"] is None and (p["took_over"] or "") in left and str(proc.pid) in (p["took_over"] or
                                                                                                 str(proc.pid))
        chains = {n: [s["to"] for s in p["steps"] if s["node"] == n] for n in ("gpu08", "gpu09")}
        assert "retesting" in chains["gpu08"] and chains["gpu09"] == ["drained"], p
    finally:
        pgcluster.stop(pg)
        for node in ("gpu08", "gpu09"):
            with contextlib.suppress(Exception):
                cluster.resume(node)
