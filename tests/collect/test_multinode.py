"""Multi-node all_reduce: reading a run, the stage's flow (fleet runs, then the bisection of
preflight/fabric/bisection.py) with a fake launcher, and the nccl-multinode check with its
diagnoses. The planner itself is table-tested in tests/fabric/test_bisection.py.

Outputs are real corpus files (nccl-tests/) wrapped in the markers preflight/collect/multinode.py's
script prints around mpirun, or derivations of them (tests/derived.py: mpirun_all_reduce,
tagged_warn). Real mpirun cannot run here (no GPUs, no MPI): the stage is driven by a fake
launcher that replays outputs per hostfile, and by the e2e test over the simulated cluster.
"""

from __future__ import annotations

import shlex

import pytest
from ctx import _CHECKS, make_host
from derived import CORPUS, H200_RUN, h200_node_xml, mpirun_all_reduce, tagged_warn

from preflight.app.collective import judge_for
from preflight.collect.multinode import PROBE_FULL, PROBE_INTER, PROBE_INTRA, MultinodeOptions, gpus_of, run_stage
from preflight.collect.node import CommandResult
from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.evidence.bundle import FLEET_HOST
from preflight.fabric.bisection import pair_probe
from preflight.judge.analyze import _run_fleet_check
from preflight.judge.context import FleetContext
from preflight.model import ProbeResult, Status
from preflight.parse.collective_run import inventory_names, read_run

NCCL = CORPUS / "nccl-tests"
HOSTS = ["gpu01", "gpu02", "gpu03", "gpu04"]
KB = load_knowledge()


def stage_text(hosts, body: str, exit_code: int = 0, seconds: int = 40, gpus: int = 8) -> str:
    """What the stage's script prints around mpirun's output (preflight/collect/multinode.py SCRIPT)."""
    return (f"# preflight: tool=mpirun gpus={gpus} repetitions=1\n"
            + "".join(f"# preflight: host {h} slots={gpus}\n" for h in hosts)
            + body + f"# preflight: repetition 1 exit={exit_code} seconds={seconds}\n")


def fleet_result(probe: str, text: str | None, **kw) -> ProbeResult:
    return ProbeResult(probe, FLEET_HOST, ("sh", "-c", "..."), None if text is None else text.encode(),
                       exit_code=kw.pop("exit_code", 0), **kw)


def single_node(exit_code: int = 0) -> str:
    """A host's own nccl-all-reduce probe: the real H200 run, one repetition."""
    return ("# preflight: tool=/usr/bin/all_reduce_perf gpus=8 repetitions=1\n" + H200_RUN.read_text()
            + f"# preflight: repetition 1 exit={exit_code} seconds=12\n")


def judge(probes: dict[str, str | ProbeResult], hosts=HOSTS[:2], failing_single=()):
    ctxs = {h: make_host({"nccl-all-reduce": single_node(1 if h in failing_single else 0)}, "hgx-h200", h)
            for h in hosts}
    results = {p: v if isinstance(v, ProbeResult) else fleet_result(p, v) for p, v in probes.items()}
    findings = _run_fleet_check(_CHECKS["nccl-multinode"], FleetContext(ctxs, results))
    return findings, diagnose(findings, KB)


def healthy(hosts=HOSTS[:2]) -> dict[str, str]:
    return {PROBE_FULL: stage_text(hosts, mpirun_all_reduce(hosts)),
            PROBE_INTRA: stage_text(hosts, mpirun_all_reduce(hosts)),
            PROBE_INTER: stage_text(hosts, mpirun_all_reduce(hosts, busbw_scale=1 / 8))}


def test_printed_names_map_to_inventory_names_by_first_label():
    assert inventory_names(["gpu03", "r11i6n2"], ["gpu01.dc1", "gpu03.dc1"]) == ("gpu03.dc1",)


# --------------------------------------------------------------------------- reading runs


def test_healthy_derived_run_reads_as_passed_with_its_hosts():
    run = read_run(fleet_result(PROBE_FULL, healthy()[PROBE_FULL]))
    assert run.state == "passed" and run.ok and run.hosts == ("gpu01", "gpu02") and run.slots == 8
    assert run.output.repetitions[0].runs[0].nranks == 16 and run.named == ()


def test_azure_error12_names_the_host_that_logged_it():
    body = (NCCL / "azure-ib-error12-retry-exceeded-nccl-warn.txt").read_text()
    run = read_run(fleet_result(PROBE_INTER, stage_text(HOSTS[:2], body, exit_code=1)))
    # No results table before the WARN line: NCCL failed in its IB transport, and the reason says so.
    assert run.state == "failed" and run.why == "NCCL failed in NET/IB on node-2 before any results: mpirun exit 1"
    assert run.init_failure.transport == "NET/IB" and run.peers == ("10.2.0.5",)
    assert run.named == ("node-2",)
    assert [s.symptom for s in run.output.signatures] == ["nccl-ib-retry-exceeded"]


def test_tagged_warn_maps_its_rank_to_the_host_of_the_device_line():
    hosts = HOSTS[:2]
    body = mpirun_all_reduce(hosts, rows=3) + tagged_warn("jean-zay-nccl-warn-socket-connect-refused.txt", "gpu02", 9)
    run = read_run(fleet_result(PROBE_FULL, stage_text(hosts, body, exit_code=1)))
    assert run.named == ("gpu02",) and run.output.signatures[0].symptom == "nccl-socket-refused"


def test_launcher_unreachable_is_not_run():
    run = read_run(fleet_result(PROBE_FULL, None, exit_code=None, error="launcher gpu01: connection refused"))
    assert run.state == "not-run" and "connection refused" in run.why


# --------------------------------------------------------------------------- the check


def test_why_a_requested_run_did_not_happen_is_kept_in_the_finding():
    # --nccl-multinode with one reachable host: the stage records why, and the finding says it.
    from preflight.app.collective import collective_over_ssh
    from preflight.collect.ssh import SshOptions
    from preflight.model import Host

    recorded: list[ProbeResult] = []
    evidence = {"gpu01": {"nccl-all-reduce": make_host({"nccl-all-reduce": single_node()}, "hgx-h200",
                                                       "gpu01").probes["nccl-all-reduce"]}}
    why = collective_over_ssh([Host("gpu01"), Host("gpu02")], evidence, recorded.append, SshOptions(),
                              MultinodeOptions(), "r1", FLEET_HOST)
    assert why == "1 reachable host(s) with a known GPU count: a multi-node run needs two"
    (f,), _ = judge({PROBE_FULL: recorded[0]})
    assert f.status is Status.ERROR and f.summary == f"multi-node all_reduce could not run: {why}"


def test_not_run_is_skipped():
    (f,), _ = judge({})
    assert f.status is Status.SKIP and "--nccl-multinode" in f.summary


def test_healthy_two_node_h200_passes_against_the_per_nic_figure():
    (f,), diagnoses = judge(healthy())
    assert f.status is Status.PASS and f.host is None and diagnoses == []
    # 335.67 GB/s in-place at 8 GiB against 8 NICs x 46 GB/s; the MOD split against one NIC.
    assert "all hosts (2 hosts x 8 GPUs): busbw 335.7 GB/s at 8 GiB, 91% of 368 GB/s" in f.summary
    assert "inter-node only (2 hosts x 8 GPUs): busbw 42.0 GB/s at 8 GiB, 91% of 46 GB/s" in f.summary
    assert "intra-node figure is judged per host" in f.summary


def test_real_allgather_table_is_reported_not_judged():
    body = "".join(f"[1,0]<stdout>:{line}\n" for line in
                   (NCCL / "gcp-a3-ultra-h200-2node-allgather-rdma-healthy.txt").read_text().splitlines())
    (f,), _ = judge({PROBE_FULL: stage_text(HOSTS[:2], body)})
    assert f.status is Status.PASS
    assert "busbw 335.7 GB/s at 8 GiB (redop none, not all_reduce: no threshold)" in f.summary


def test_busbw_at_40_percent_fails_low_bandwidth():
    probes = healthy() | {PROBE_FULL: stage_text(HOSTS[:2], mpirun_all_reduce(HOSTS[:2], busbw_scale=0.4))}
    (f,), diagnoses = judge(probes)
    assert f.status is Status.FAIL and f.symptoms == ("nccl-low-bandwidth",)
    assert "low bandwidth: all hosts (2 hosts x 8 GPUs): busbw 134.3 GB/s at 8 GiB, 36% of 368 GB/s" in f.summary
    assert [d.cause for d in diagnoses] == ["nccl-low-bandwidth"]


def test_hang_with_inter_failing_and_intra_passing_is_the_fabric():
    # The 128-GPU run's table (old format) stopped after 131072 B: the full run hung there.
    hung = "".join(f"[1,0]<stdout>:{line}\n" for line in
                   (NCCL / "allreduce-128gpu-old-format-error-column-float-1e-06.txt").read_text().splitlines())
    inter = (NCCL / "azure-ib-error12-retry-exceeded-nccl-warn.txt").read_text()
    probes = {PROBE_FULL: stage_text(HOSTS[:2], hung, exit_code=124, seconds=300),
              PROBE_INTRA: stage_text(HOSTS[:2], mpirun_all_reduce(HOSTS[:2])),
              PROBE_INTER: stage_text(HOSTS[:2], inter, exit_code=1)}
    (f,), diagnoses = judge(probes)
    assert f.status is Status.FAIL
    assert "all hosts (2 hosts x 8 GPUs): hung (stopped by its timeout after 300 s (exit 124))" in f.summary
    assert "inter-node traffic fails while intra-node passes" in f.summary
    # The inter-node run printed no table before its IB WARN line: NCCL failed in NET/IB.
    assert set(f.symptoms) == {"nccl-hang", "nccl-failed", "nccl-ib-retry-exceeded", "nccl-inter-node-fabric",
                               "nccl-multinode-failed", "nccl-single-node-passed", "nccl-init-net-failed"}
    causes = {d.cause: (d.hosts, d.confidence) for d in diagnoses}
    assert causes == {"nccl-inter-node-fabric": ((), "high"), "nccl-ib-retry-exceeded": ((), "high"),
                      "nccl-init-net-failed": ((), "high")}


def test_intra_failing_while_inter_passes_points_at_a_node():
    body = mpirun_all_reduce(HOSTS[:2], rows=4) + tagged_warn(
        "hgx-nccl2.27-ibv-modify-qp-110-timeout-init-rtr-timestamped.txt", "gpu02", 13)
    probes = healthy() | {PROBE_INTRA: stage_text(HOSTS[:2], body, exit_code=1)}
    (f,), diagnoses = judge(probes)
    assert "intra-node traffic fails while inter-node passes" in f.summary
    assert "nccl-intra-node-failed" in f.symptoms and "nccl-ib-qp-timeout" in f.symptoms
    assert "nccl-intra-node-failed" in {d.cause for d in diagnoses}


def test_only_multinode_failing_while_every_host_passes_alone_is_the_fabric_by_rule():
    refused = (NCCL / "jean-zay-nccl-warn-socket-connect-refused.txt").read_text()
    (f,), diagnoses = judge({PROBE_FULL: stage_text(HOSTS[:2], refused, exit_code=1)})
    assert {"nccl-multinode-failed", "nccl-single-node-passed", "nccl-failed"} <= set(f.symptoms)
    causes = {d.cause: d.confidence for d in diagnoses}
    assert causes == {"nccl-inter-node-fabric": "medium", "nccl-socket-refused": "high"}


def test_a_host_failing_alone_is_no_proof_for_the_fabric():
    refused = (NCCL / "jean-zay-nccl-warn-socket-connect-refused.txt").read_text()
    (f,), diagnoses = judge({PROBE_FULL: stage_text(HOSTS[:2], refused, exit_code=1)}, failing_single={"gpu02"})
    assert "nccl-single-node-passed" not in f.symptoms
    assert "nccl-inter-node-fabric" not in {d.cause for d in diagnoses}


def _culprit_probes() -> dict[str, str]:
    """Full run hung, intra passed, inter failed with gpu02's error-12 line (gpu02 saw gpu03
    not answering). The bisection: halves gpu01+gpu02 pass, gpu03+gpu04 fail (gpu03's
    ibv_modify_qp 110 line); confirmation pairs: gpu03+gpu01 fails, gpu04+gpu02 passes."""
    four = HOSTS
    inter = mpirun_all_reduce(four, rows=2) + tagged_warn("azure-ib-error12-retry-exceeded-nccl-warn.txt", "gpu02", 8)

    def bad(hosts):
        return mpirun_all_reduce(hosts, rows=1) + tagged_warn(
            "hgx-nccl2.27-ibv-modify-qp-110-timeout-init-rtr-timestamped.txt", "gpu03", 5)

    return {PROBE_FULL: stage_text(four, mpirun_all_reduce(four, rows=5), exit_code=124, seconds=300),
            PROBE_INTRA: stage_text(four, mpirun_all_reduce(four)),
            PROBE_INTER: stage_text(four, inter, exit_code=1),
            "nccl-bisect-2-1": stage_text(["gpu01", "gpu02"], mpirun_all_reduce(["gpu01", "gpu02"])),
            "nccl-bisect-2-2": stage_text(["gpu03", "gpu04"], bad(["gpu03", "gpu04"]), exit_code=1),
            pair_probe("gpu03", "gpu01"): stage_text(["gpu03", "gpu01"], bad(["gpu03", "gpu01"]), exit_code=1),
            pair_probe("gpu04", "gpu02"): stage_text(["gpu04", "gpu02"], mpirun_all_reduce(["gpu04", "gpu02"]))}


def test_bisection_names_the_culprit_and_the_diagnosis_lands_on_it_only():
    findings, diagnoses = judge(_culprit_probes(), hosts=HOSTS)
    fleet = next(f for f in findings if f.host is None)
    assert fleet.status is Status.FAIL and fleet.symptoms == ()
    assert fleet.summary.startswith("isolated by bisection: gpu03 (see the host findings)")
    assert "bisection: 3 rounds, 5 runs, 12 node-runs" in fleet.summary
    # The inter-node run's error-12 line came from gpu02 (which saw its peer stop answering).
    assert "the failing fleet runs' output names: gpu02" in fleet.summary and fleet.data["named"] == ["gpu02"]
    assert fleet.data["bisection"]["culprits"] == ["gpu03"] and fleet.data["bisection"]["rounds"] == 3
    by_host = {f.host: f for f in findings if f.host}
    assert {h: f.status for h, f in by_host.items()} == {
        "gpu03": Status.FAIL, "gpu02": Status.PASS, "gpu01": Status.PASS, "gpu04": Status.PASS}
    culprit = by_host["gpu03"]
    assert culprit.symptoms == ("nccl-pair-failed", "nccl-ib-qp-timeout")
    assert "with gpu01: mpirun exit 1" in culprit.summary
    assert "partners that pass with others" in culprit.summary
    assert {d.cause: d.hosts for d in diagnoses} == {"nccl-pair-failed": ("gpu03",), "nccl-ib-qp-timeout": ("gpu03",)}


def test_culprit_with_firmware_older_than_its_driver_is_diagnosed_as_the_mismatch():
    findings, _ = judge(_culprit_probes(), hosts=HOSTS)
    culprit = next(f for f in findings if f.host == "gpu03")
    mismatch = culprit.__class__("nic-firmware", "gpu03", Status.FAIL, "fw 28.39 older than DOCA 3.1 expects",
                                 ("nic-fw-driver-mismatch",))
    diagnoses = diagnose([culprit, mismatch], KB)
    assert [(d.cause, d.hosts, d.confidence) for d in diagnoses][0] == ("nic-fw-driver-mismatch", ("gpu03",), "high")
    assert "nccl-pair-failed" not in {d.cause for d in diagnoses}


def test_launcher_that_could_not_be_reached_is_an_error():
    down = {p: fleet_result(p, None, exit_code=None, error="launcher gpu01: connection refused")
            for p in (PROBE_FULL, PROBE_INTRA, PROBE_INTER)}
    (f,), _ = judge(down)
    assert f.status is Status.ERROR and "could not run: launcher gpu01: connection refused" in f.summary


def test_mpirun_missing_is_tool_missing():
    gone = {p: fleet_result(p, None, exit_code=127, stderr="mpirun not found on the launcher\n")
            for p in (PROBE_FULL, PROBE_INTRA, PROBE_INTER)}
    (f,), diagnoses = judge(gone)
    assert f.status is Status.ERROR and f.symptoms == ("tool-missing",)
    assert "mpirun not found on the launcher" in f.summary


# --------------------------------------------------------------------------- the stage


class Launcher:
    """The launcher node, answering each command line with ``launch(command, stdin, limit)``."""

    name = "gpu01"

    def __init__(self, launch):
        self.launch = launch

    def run(self, argv, *, stdin=b"", timeout):
        out, err, code, timed_out = self.launch(shlex.join(argv), stdin, timeout)
        return CommandResult(tuple(argv), out, err.decode(), code, "2026-12-01T00:00:00+00:00", 0.0, timed_out)

    def close(self):
        pass


def test_stage_runs_variants_then_bisects_the_inter_node_traffic(tmp_path):
    """A fake launcher replays _culprit_probes' outputs per hostfile: the halves of the fleet
    run at once, the failing half's nodes are then paired with nodes of the passing one."""
    replies = _culprit_probes()
    seen: list[tuple[str, str, bytes]] = []

    def launch(command: str, stdin: bytes, limit: float):
        argv = shlex.split(command)
        probe = argv[5].removesuffix(".hosts")
        seen.append((probe, argv[7], stdin))
        text = replies[probe]
        body = text.split("slots=8\n")[-1]  # mpirun's part; the script's markers are re-added
        hosts = [line.split()[0] for line in stdin.decode().splitlines() if not line.startswith("#")]
        out = stage_text(hosts, body.rsplit("# preflight: repetition", 1)[0],
                         exit_code=int(text.rsplit("exit=", 1)[1].split()[0]))
        return out.encode(), b"", 0, False

    results: list[ProbeResult] = []
    options = MultinodeOptions(timeout_s=60, node_dir=str(tmp_path))
    found = run_stage(HOSTS, 8, Launcher(launch), options, "r", results.append, FLEET_HOST, judge_for(options))
    probes = [p for p, _, _ in seen]
    # The groups of a round run at once, so their order within the round is the threads'.
    assert probes[:3] == [PROBE_FULL, PROBE_INTRA, PROBE_INTER]
    assert set(probes[3:5]) == {"nccl-bisect-2-1", "nccl-bisect-2-2"}
    assert set(probes[5:]) == {"nccl-pair-gpu03-gpu01", "nccl-pair-gpu04-gpu02"}
    assert found.culprits == ("gpu03",) and found.rounds == 3
    # The bisection runs the traffic that failed: the inter-node split.
    assert [split for _, split, _ in seen] == ["", "DIV 8", "MOD 8"] + ["MOD 8"] * 4
    assert seen[0][2] == (b"# preflight: expect busbw=none ratio=0.5\n"
                          b"gpu01 slots=8\ngpu02 slots=8\ngpu03 slots=8\ngpu04 slots=8\n")
    assert dict((p, s) for p, _, s in seen)["nccl-pair-gpu03-gpu01"].endswith(b"gpu03 slots=8\ngpu01 slots=8\n")
    assert all(r.host == FLEET_HOST and r.command[:2] == ("sh", "-c") for r in results)
    assert results[0].command[9:14] == ("mpirun", "1", "-np", "32", "--tag-output")  # tool, repetitions
    assert results[0].command[-11:] == ("all_reduce_perf", "-b", "8", "-e", str(8 << 30), "-f", "2", "-g", "1",
                                        "-c", "1")


def test_stage_stops_after_the_variants_when_they_pass(tmp_path):
    replies = healthy(HOSTS[:2])
    calls = []

    def launch(command, stdin, limit):
        calls.append(command)
        return replies[shlex.split(command)[5].removesuffix(".hosts")].encode(), b"", 0, False

    options = MultinodeOptions(node_dir=str(tmp_path))
    assert run_stage(HOSTS[:2], 8, Launcher(launch), options, "r", lambda r: None, FLEET_HOST,
                     judge_for(options)) is None
    assert len(calls) == 3


@pytest.mark.parametrize("name", ["gpu01", "gpu01.dc1"])
def test_pair_probe_ids_are_bundle_safe(name):
    from preflight.evidence.bundle import _SAFE

    assert _SAFE.match(pair_probe(name, "gpu02"))


def test_gpus_of_a_host_whose_smi_xml_was_cut_short_is_unknown_not_the_gpus_before_the_cut():
    # The derived 8-GPU node's XML (tests/derived.py, from the real H200 capture) cut after GPU 2:
    # two GPUs read are not the host's slots. The whole output still counts 8.
    def smi(text: str) -> dict:
        return {"nvidia-smi-q-x": ProbeResult("nvidia-smi-q-x", "h", ("nvidia-smi",), text.encode(), exit_code=0)}

    xml = h200_node_xml(8)
    cut = xml[:xml.index("<gpu id=", xml.index("<gpu id=", xml.index("<gpu id=") + 1) + 1)]
    assert gpus_of(smi(xml)) == 8 and cut.count("<gpu id=") == 2
    assert gpus_of(smi(cut)) is None
