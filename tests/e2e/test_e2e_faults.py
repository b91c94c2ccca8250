"""The simulated-cluster proofs of issues 3, 4 and 5: `preflight run --hosts` over real SSH
against fleets of complete HGX H200 nodes (tests/nodes.py), healthy and with seeded faults.

Each scenario is one cluster whose hosts run in parallel. The healthy hosts must pass every
check that ran, and each seeded fault must come out as exactly its cause, on exactly its host,
with its action and the evidence lines that show it. Issues 3 and 4 are judged from static
evidence (`--quick`, no all_reduce); issue 5 and the healthy fleet run all_reduce too, with
short repetitions and timeouts so that a hang costs seconds.

Also here, without a cluster: the diagnosis fix the field lesson needed (a diagnosis takes the
action of the finding that names its cause), and the shipped example bundle (examples/h200-fleet,
built by examples/build_examples.py from these nodes).
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path

import pytest
from ctx import make_host, run_check
from derived import h200_node_xml
from nodes import (
    CX7_FW,
    DOCA32_CX7_FW,
    doca_ofed_info,
    doca_upgraded,
    fabric_insufficient,
    gpu_buses,
    gpu_fallen_off_bus,
    healthy_h200,
    mlx5_timeouts,
    nccl_flaky,
    nccl_low_busbw,
    nccl_table,
    nic_devinfo,
    nic_firmware,
    nic_modinfo,
    nvlink_inactive,
    pcie_gen4_x8,
    port_polling,
    row_remap_pending,
)

from preflight.app.cli import main
from preflight.collect.probes import PROBES
from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.judge.loader import load_checks

root = pytest.mark.root
OLD_FW = "28.45.1020"  # what DOCA 3.0.0 ships: older than the 28.46.1006 of the nodes' DOCA 3.1.0
FW_ACTION = f"update NIC firmware to {CX7_FW} with mlxfwmanager -u (or the OEM package), reboot, re-run nccl all_reduce"
NCCL = ["--nccl-reps", "3", "--nccl-timeout", "5", "--nccl-max-bytes", "8G"]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet"


def run(cluster, tmp_path: Path, *extra: str) -> tuple[int, dict, float]:
    out = tmp_path / "reports"
    started = time.monotonic()
    code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                 "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                 "--out", str(out), "--run-id", "r", "-q", *extra])
    return code, json.loads((out / "r" / "report.json").read_text()), time.monotonic() - started


def causes(report) -> dict[str, set[str]]:
    """host -> the causes diagnosed on it."""
    out: dict[str, set[str]] = {}
    for d in report["diagnoses"]:
        for host in d["hosts"]:
            out.setdefault(host, set()).add(d["cause"])
    return out


def diagnosis(report, host: str, cause: str) -> dict:
    [d] = [d for d in report["diagnoses"] if d["cause"] == cause and host in d["hosts"]]
    return d


def finding(report, host: str, check: str) -> dict:
    [f] = [f for f in report["findings"] if f["host"] == host and f["check"] == check and f["status"] != "pass"]
    return f


def excerpts(f: dict, probe: str) -> str:
    return "\n".join(e["excerpt"] for e in f["evidence"] if e["probe"] == probe)


def assert_all_pass(report, hosts) -> None:
    odd = [(f["host"], f["check"], f["status"], f["summary"]) for f in report["findings"]
           if f["host"] in hosts and f["status"] != "pass"]
    assert odd == []


@root
def test_healthy_fleet_passes_every_check(sim_cluster, tmp_path):
    """The guard: a coherent healthy node passes every check over real SSH, all_reduce included."""
    names = [f"gpu{i:02d}" for i in range(1, 5)]
    cluster = sim_cluster([healthy_h200(n) for n in names])
    code, report, elapsed = run(cluster, tmp_path, *NCCL)
    assert code == 0 and report["diagnoses"] == []
    assert {h: v["status"] for h, v in report["hosts"].items()} == dict.fromkeys(names, "pass")
    assert_all_pass(report, names)
    # Every host check judged every host (fleet checks speak per host, or for the fleet when
    # they have nothing to compare), and nothing anywhere warns, fails or errs.
    # (The checks of a node's past run with --history only: tests/store/test_history_judgement.py.)
    host_checks = {c.id for c in load_checks(use_entry_points=False) if c.scope == "host" and "history" not in c.facts}
    for name in names:
        judged = {f["check"] for f in report["findings"] if f["host"] == name}
        assert host_checks <= judged, host_checks - judged
        assert {"fleet-consistency", "vbios-consistency", "nic-fw-fleet-consistency"} <= judged
    assert [f for f in report["findings"] if f["status"] not in ("pass", "skip")] == []
    by_check = {f["check"]: f["summary"] for f in report["findings"] if f["host"] == "gpu01"}
    assert by_check["nccl-all-reduce"].startswith("busbw 475.0 GB/s at 8 GiB on 8 GPUs (median of 3, CV 0.0%)")
    assert by_check["nvlink"] == "8 GPUs x 18 links active at 26.562 GB/s; NV18 between all 28 GPU pairs"
    assert by_check["nic-fw-driver-mismatch"].startswith(
        f"8 x ConnectX-7 (mlx5_0, mlx5_1, mlx5_2, mlx5_3, ...): firmware {CX7_FW} is the {CX7_FW} that DOCA 3.1.0 ships")
    assert by_check["ib-link-degraded"] == "8 port(s) at >= 400 Gb/s (from ibv-devinfo)"
    assert by_check["pcie-link"].startswith("8 GPUs in P0 at their max link (Gen5 x16); 8 NIC links at full speed")
    assert elapsed < 60


@root
def test_issue3_nic_firmware_and_ports(sim_cluster, tmp_path):
    cluster = sim_cluster([
        healthy_h200("gpu01"), healthy_h200("gpu02"),
        mlx5_timeouts(nic_firmware(healthy_h200("gpu03"), OLD_FW)),  # the field lesson
        port_polling(healthy_h200("gpu04"), nic=3),
        doca_upgraded(healthy_h200("gpu05")),  # DOCA 3.2.0 and its firmware: fine alone, not the fleet's
    ])
    code, report, elapsed = run(cluster, tmp_path, "--quick")
    assert code == 1 and elapsed < 60
    assert {h: v["status"] for h, v in report["hosts"].items()} == {
        "gpu01": "pass", "gpu02": "pass", "gpu03": "fail", "gpu04": "fail", "gpu05": "fail"}
    assert_all_pass(report, ["gpu01", "gpu02"])
    # gpu03's old firmware is also not the fleet's: the fleet comparison names it too.
    # gpu03 also differs from the fleet, as an echo of its old firmware: one diagnosis.
    assert causes(report) == {"gpu03": {"nic-fw-driver-mismatch"},
                              "gpu04": {"ib-port-down"}, "gpu05": {"nic-fw-inconsistent"}}

    mismatch = diagnosis(report, "gpu03", "nic-fw-driver-mismatch")
    assert mismatch["confidence"] == "high" and mismatch["action"] == FW_ACTION
    # The command timeouts and the odd-one-out firmware are the mismatch's echoes, not causes.
    assert set(mismatch["symptoms"]) == {"nic-fw-driver-mismatch", "mlx5-cmd-timeout", "nic-fw-inconsistent"}
    fw = finding(report, "gpu03", "nic-fw-driver-mismatch")
    assert fw["summary"].startswith(f"8 x ConnectX-7 (mlx5_0, mlx5_1, mlx5_2, mlx5_3, ...): firmware {OLD_FW} is "
                                    f"older than the {CX7_FW} that DOCA 3.1.0 ships")
    assert f"fw_ver:                         {OLD_FW}" in excerpts(fw, "ibv-devinfo")
    assert excerpts(fw, "ofed-info") == "OFED-internal-25.07-0.9.7:"
    log = finding(report, "gpu03", "mlx5-kernel-log")
    assert "mlx5_core 0000:17:00.0: wait_func:1189:(pid 72061): ACCESS_REG(0x805) timeout. Will cause a leak" \
        in excerpts(log, "kernel-log")

    port = finding(report, "gpu04", "ib-port-down")
    assert port["summary"] == ("1 ConnectX-7 port(s) down: mlx5_3 port 1 DOWN/Polling: no link partner (cable, "
                               "transceiver or switch port), InfiniBand (from ibv-devinfo)")
    assert "phys_state:             POLLING (2)" in excerpts(port, "ibv-devinfo")
    assert diagnosis(report, "gpu04", "ib-port-down")["action"].startswith("Check the cable and the switch port")

    drift = finding(report, "gpu05", "nic-fw-fleet-consistency")
    assert drift["summary"].startswith(f"ConnectX-7 on {DOCA32_CX7_FW}, the fleet runs {CX7_FW} [ConnectX-7: "
                                       f"3 hosts on {CX7_FW}, 1 on {OLD_FW} (gpu03), 1 on {DOCA32_CX7_FW} (gpu05)]")
    assert f"fw_ver:                         {DOCA32_CX7_FW}" in excerpts(drift, "ibv-devinfo")
    assert diagnosis(report, "gpu05", "nic-fw-inconsistent")["action"].startswith(
        f"bring gpu05's ConnectX-7 NICs to {CX7_FW} as on the other hosts")
    # Its own driver ships its firmware: only the fleet comparison objects.
    [own] = [f for f in report["findings"] if f["host"] == "gpu05" and f["check"] == "nic-fw-driver-mismatch"]
    assert own["status"] == "pass" and "is the 28.47.1026 that DOCA 3.2.0 ships" in own["summary"]


@root
def test_issue4_nvlink_fabric_and_gpu_health(sim_cluster, tmp_path):
    cluster = sim_cluster([
        healthy_h200("gpu01"), healthy_h200("gpu02"),
        nvlink_inactive(healthy_h200("gpu03"), gpu=2, link=5),
        fabric_insufficient(healthy_h200("gpu04")),
        gpu_fallen_off_bus(healthy_h200("gpu05")),
        row_remap_pending(healthy_h200("gpu06"), gpu=5),
        pcie_gen4_x8(healthy_h200("gpu07"), gpu=1),
    ])
    code, report, elapsed = run(cluster, tmp_path, "--quick")
    assert code == 1 and elapsed < 60
    assert {h: v["status"] for h, v in report["hosts"].items()} == {
        "gpu01": "pass", "gpu02": "pass", "gpu03": "fail", "gpu04": "fail", "gpu05": "fail", "gpu06": "fail",
        "gpu07": "fail"}
    assert_all_pass(report, ["gpu01", "gpu02"])
    assert causes(report) == {"gpu03": {"nvlink-down"}, "gpu04": {"fabric-manager-down"},
                              "gpu05": {"gpu-fallen-off-bus"}, "gpu06": {"gpu-row-remap"},
                              "gpu07": {"pcie-link-degraded"}}

    nvlink = finding(report, "gpu03", "nvlink")
    assert nvlink["summary"].startswith("GPU2: 1 of 18 links inactive (link 5); topology: 7 of 28 GPU pairs below "
                                        "NV18 (GPU0-GPU2 NV17,")
    assert excerpts(nvlink, "nvidia-smi-nvlink-status").endswith("20f011c20002)\nLink 5: <inactive>")
    assert diagnosis(report, "gpu03", "nvlink-down")["action"].startswith("drain the node, then reset the GPU (nvidia-smi -r)")

    fabric = finding(report, "gpu04", "fabric-manager")
    assert fabric["summary"].startswith("fabric status Insufficient Resources on 8 of 8 GPUs (GPU0, ")
    assert "<status>Insufficient Resources</status>" in excerpts(fabric, "nvidia-smi-q-x")
    assert diagnosis(report, "gpu04", "fabric-manager-down")["action"].startswith(
        "systemctl status nvidia-fabricmanager (journalctl -u nvidia-fabricmanager for why); its version must "
        "equal the driver version (580.159.04)")

    fallen = diagnosis(report, "gpu05", "gpu-fallen-off-bus")
    # The GPU gone from nvidia-smi is the same fault as the Xid: one diagnosis.
    assert set(fallen["symptoms"]) == {"gpu-fallen-off-bus", "gpu-missing"}
    assert fallen["action"] == "Xid 79 on 0000:db:00 (RESTART_BM): Full power cycle of the node."
    assert fallen["evidence"].startswith("gpu05: Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS on 0000:db:00")
    xid = finding(report, "gpu05", "xid")
    assert xid["summary"].startswith("Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS on 0000:db:00, 1 line")
    assert "NVRM: Xid (PCI:0000:db:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." \
        in excerpts(xid, "kernel-log")
    # lspci still lists the GPU the driver lost (issue 15: the census names a disagreeing source), and
    # so does DCGM's host engine, whose discovery the fault leaves as it was (issue 33: the census
    # reads dcgmi discovery -l).
    assert finding(report, "gpu05", "gpu-inventory")["summary"] == (
        "7 of 8 GPUs visible (counted by nvidia-smi -q -x, while dcgmi discovery -l shows 8, lspci shows 8; "
        "driver 580.159.04, CUDA 13.0)")

    remap = diagnosis(report, "gpu06", "gpu-row-remap")
    assert remap["action"].startswith("drain the node and reset the GPU (nvidia-smi -r -i 5) or reboot")
    # The pending remap fails the node (as DCGM's diagnostic does); the Xid 63 line alone warns.
    assert {(f["check"], f["status"]) for f in report["findings"]
            if f["host"] == "gpu06" and f["status"] in ("warn", "fail")} == {("gpu-memory", "fail"), ("xid", "warn")}
    assert ("NVRM: Xid (PCI:0000:ab:00): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to "
            "activate.") in excerpts(finding(report, "gpu06", "xid"), "kernel-log")
    assert "GPU5 00000000:AB:00.0: Remapped Rows Pending: Yes" in excerpts(finding(report, "gpu06", "gpu-memory"),
                                                                          "nvidia-smi-q-x")

    pcie = finding(report, "gpu07", "pcie-link")
    assert pcie["summary"].startswith("PCIe link below capability: GPU1 00000000:2A:00.0 in P0 at Gen4 x8 of Gen5 x16")
    assert "0000:2a:00.0 3D controller: NVIDIA Corporation Device 2335 (rev a1): LnkSta 16GT/s x8, LnkCap 32GT/s x16" \
        in excerpts(pcie, "lspci")
    assert diagnosis(report, "gpu07", "pcie-link-degraded")["action"].startswith("reseat GPU1 00000000:2A:00.0")


@root
def test_issue5_all_reduce_hang_low_bandwidth_and_the_culprit(sim_cluster, tmp_path):
    cluster = sim_cluster([
        healthy_h200("gpu01"), healthy_h200("gpu02"), healthy_h200("gpu03"),
        nccl_flaky(healthy_h200("gpu04")),  # good, hang, good
        nccl_low_busbw(healthy_h200("gpu05")),
        nccl_flaky(nic_firmware(healthy_h200("gpu06"), OLD_FW)),  # the field lesson, end to end
    ])
    code, report, elapsed = run(cluster, tmp_path, *NCCL)
    assert code == 1
    assert elapsed < 60  # three 5 s hangs and the cooldowns, in parallel: the run finishes
    assert {h: v["status"] for h, v in report["hosts"].items()} == {
        "gpu01": "pass", "gpu02": "pass", "gpu03": "pass", "gpu04": "fail", "gpu05": "fail", "gpu06": "fail"}
    assert_all_pass(report, ["gpu01", "gpu02", "gpu03"])
    assert causes(report) == {"gpu04": {"nccl-hang", "nccl-unstable"}, "gpu05": {"nccl-low-bandwidth"},
                              "gpu06": {"nic-fw-driver-mismatch"}}

    flaky = finding(report, "gpu04", "nccl-all-reduce")
    # The script counts whole seconds: a 5 s timeout reads 5 or 6.
    assert re.match(r"1 of 3 repetitions hung \(#2: stopped by its timeout after [56] s \(exit 124\)\); "
                    r"intermittent: 2 of 3 repetitions passed", flaky["summary"])
    assert re.search(r"^# preflight: repetition 2 exit=124 seconds=[56]$", excerpts(flaky, "nccl-all-reduce"),
                     re.MULTILINE)
    assert diagnosis(report, "gpu04", "nccl-hang")["action"].startswith("Check NIC firmware/driver, port state")
    assert diagnosis(report, "gpu04", "nccl-unstable")["action"].startswith("Check the NIC firmware/driver match")

    slow = finding(report, "gpu05", "nccl-all-reduce")
    assert slow["summary"].startswith("low bandwidth: busbw 235.3 GB/s at 8 GiB on 8 GPUs (median of 3, CV 0.0%), "
                                      "49.5% of the 475 GB/s hgx-h200 expects")
    assert "8589934592    2147483648     float     sum      -1    63896  134.44  235.26" in excerpts(slow, "nccl-all-reduce")
    assert diagnosis(report, "gpu05", "nccl-low-bandwidth")["action"].startswith("Check NVLink and PCIe state")

    # A hanging all_reduce on a node whose firmware is older than its driver is that mismatch.
    field = diagnosis(report, "gpu06", "nic-fw-driver-mismatch")
    assert field["hosts"] == ["gpu06"] and field["confidence"] == "high" and field["action"] == FW_ACTION
    assert {"nccl-hang", "nccl-unstable", "nic-fw-driver-mismatch"} <= set(field["symptoms"])


def test_a_diagnosis_takes_the_action_of_the_finding_that_names_its_cause():
    """preflight/diagnose/engine.py: a host with firmware older than its driver ships and a hanging
    all_reduce is diagnosed as the mismatch (rules.yaml); its action must be the firmware
    finding's own ("update NIC firmware to 28.46.1006 ..."), not the generic one of the cause,
    although the all_reduce finding comes first. The nccl probe output is the nodes' table
    between the probe's markers (preflight/collect/nccl.py), the second repetition hung."""
    table = nccl_table("gpu06", gpu_buses(h200_node_xml(8)))
    probe = ("# preflight: tool=/usr/local/bin/all_reduce_perf gpus=8 repetitions=2\n" + table
             + "# preflight: repetition 1 exit=0 seconds=3\n# preflight: repetition 2 exit=124 seconds=5\n")
    host = make_host({"ibv-devinfo": nic_devinfo(OLD_FW), "mlx5-modinfo": nic_modinfo(), "ofed-info": doca_ofed_info(),
                      "nccl-all-reduce": probe}, profile="hgx-h200", name="gpu06")
    findings = run_check("nccl-all-reduce", host) + run_check("nic-fw-driver-mismatch", host)
    assert [(f.check, f.status.value, f.symptoms) for f in findings] == [
        ("nccl-all-reduce", "fail", ("nccl-hang", "nccl-unstable")),
        ("nic-fw-driver-mismatch", "fail", ("nic-fw-driver-mismatch",))]
    [d] = diagnose(findings, load_knowledge())
    assert (d.cause, d.hosts, d.confidence, d.action) == ("nic-fw-driver-mismatch", ("gpu06",), "high", FW_ACTION)
    assert d.evidence.startswith(f"gpu06: 8 x ConnectX-7 (mlx5_0, mlx5_1, mlx5_2, mlx5_3, ...): firmware {OLD_FW}")


def test_the_shipped_example_shows_a_fault_of_each_issue(tmp_path):
    """`preflight analyze examples/h200-fleet`, the README's first command."""
    assert main(["analyze", str(EXAMPLE), "--out", str(tmp_path), "-q", "--no-html"]) == 1
    [run_dir] = tmp_path.iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert {h: v["status"] for h, v in report["hosts"].items()} == {
        **{f"gpu00{i}": "pass" for i in range(1, 6)}, "gpu006": "fail", "gpu007": "fail", "gpu008": "fail",
        "gpu009": "error"}
    assert causes(report) == {"gpu006": {"nic-fw-driver-mismatch"}, "gpu007": {"nvlink-down"},
                              "gpu008": {"driver-version-drift"}, "gpu009": {"host-unreachable"}}
    field = diagnosis(report, "gpu006", "nic-fw-driver-mismatch")
    assert field["action"] == FW_ACTION
    assert {"nccl-hang", "nccl-unstable", "mlx5-cmd-timeout"} <= set(field["symptoms"])
    assert diagnosis(report, "gpu008", "driver-version-drift")["action"].startswith(
        "move gpu008 to driver 580.159.04 (it runs 570.195.03)")


def test_the_shipped_example_is_what_its_builder_makes_of_the_nodes():
    """Every output in the example has a SOURCES.tsv row, and each plain command's output is what
    tests/nodes.py answers today for that host: the example cannot drift from the nodes."""
    spec = importlib.util.spec_from_file_location("build_examples", EXAMPLE.parent / "build_examples.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    rows = [line.split("\t") for line in (EXAMPLE / "SOURCES.tsv").read_text().splitlines()[1:]]
    listed = {(host, probe) for host, probes, _ in rows for probe in probes.split(",")}
    saved = {(p.parent.name, p.stem) for p in (EXAMPLE / "hosts").glob("*/*.json")}
    assert listed == saved
    compared = 0
    for host, faults in builder.FLEET.items():
        node, _ = builder.build_node(host, faults)
        for saved_output in (EXAMPLE / "hosts" / host).glob("*.txt"):
            probe = PROBES[saved_output.stem]
            if probe.argv[0] != "sh":  # sh -c probes: the script's own output around the replies
                assert saved_output.read_text() == node.commands[" ".join(probe.argv)].stdout, saved_output
                compared += 1
    assert compared == 8 * 11
