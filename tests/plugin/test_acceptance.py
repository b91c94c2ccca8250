"""preflight.pytest.acceptance.Report over reports judged from bundles of real (or corpus-derived) outputs.

Reports are made the way `preflight analyze` makes them (analyze, then report.json's JSON) and
read back through the contract only, as a saved report would be.
"""

from __future__ import annotations

import json
from functools import reduce
from pathlib import Path

import pytest
from derived import CORPUS, h200_node_xml
from test_cli import write_bundle

from preflight.app.cli import main
from preflight.diagnose.analysis import analyze
from preflight.diagnose.engine import load_knowledge
from preflight.evidence.bundle import read_bundle
from preflight.judge.loader import load_checks, select
from preflight.knowledge.profiles import load_profiles
from preflight.model import Status
from preflight.parse.smi_records import reasons_from_bitmask
from preflight.pytest.acceptance import MissingResult, Report, ReportError
from preflight.report import json_report

A100_8GPU = CORPUS / "nccl-tests" / "a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt"
V100_32MB = CORPUS / "nccl-tests" / "v100-2gpu-cross-socket-allreduce-32mb-low-busbw.txt"
H200_1GPU = CORPUS / "h200-vm" / "all_reduce_1gpu.txt"
BURN = CORPUS / "h200-vm" / "burn_samples.json"


def judged(root: Path, checks: list[str]) -> dict:
    analysis = analyze(read_bundle(root), select(load_checks(), checks), load_profiles(), load_knowledge())
    return json.loads(json_report.render(analysis))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Report:
    root = write_bundle(tmp_path_factory.mktemp("fleet") / "b", {
        "gpu01": {"nvidia-smi-q-x": h200_node_xml(8)},
        "gpu04": {"nvidia-smi-q-x": h200_node_xml(7)},
        "gpu05": {"nvidia-smi-q-x": h200_node_xml(8, driver="570.195.03")},
        "gpu07": {"nvidia-smi-q-x": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": None,
                                     "error": "connection refused: [Errno 111] Unable to connect to port 22"}},
    })
    return Report.from_dict(judged(root, ["gpu-inventory", "fleet-consistency"]))


def test_host_verdicts(fleet):
    assert fleet.hosts == ("gpu01", "gpu04", "gpu05", "gpu07")
    assert fleet.host("gpu01").passed and fleet.host("gpu01").status == "pass"
    assert fleet.host("gpu01").profile == "hgx-h200"
    assert not fleet.host("gpu04").passed and fleet.host("gpu04").status == "fail"
    assert fleet.host("gpu04").status_of("gpu-inventory") is Status.FAIL
    assert fleet.host("gpu04").status_of("fleet-consistency") is Status.PASS
    assert fleet.host("gpu04").status_of("nvlink") is None  # not run: says nothing
    assert fleet.host("gpu07").status == "error" and fleet.host("gpu07").reachable is False
    assert not fleet.passed
    with pytest.raises(MissingResult, match="'gpu99' is not in the report.*gpu01, gpu04"):
        fleet.host("gpu99")


def test_findings_filters(fleet):
    [missing] = fleet.findings(check="gpu-inventory", status="fail")
    assert missing.host == "gpu04" and missing.summary.startswith("7 of 8 GPUs visible")
    assert missing.symptoms == ("gpu-missing",) and missing.evidence[0].probe == "nvidia-smi-q-x"
    assert missing.data["gpu_count"] == 7
    [drift] = fleet.findings(check="fleet-consistency", status=Status.FAIL)
    assert drift.host == "gpu05" and "570.195.03" in drift.summary
    unreachable = fleet.findings(host="gpu07")
    # An unreached host is one finding, the checks it could not run listed in its data.
    [down] = unreachable
    assert down.check == "connectivity" and down.status is Status.ERROR
    assert down.data["not_checked"] == ["gpu-inventory"]
    assert len(fleet.findings(status=["fail", "error"])) == 3
    assert fleet.findings(check="gpu-inventory", host=["gpu01", "gpu05"], status="pass")[1].host == "gpu05"


def test_diagnoses_and_explain(fleet):
    assert {d.cause for d in fleet.diagnoses()} == {"gpu-missing", "driver-version-drift", "host-unreachable"}
    [gone] = fleet.diagnoses(cause="gpu-missing")
    assert gone.hosts == ("gpu04",) and gone.confidence == "high"
    assert [d.cause for d in fleet.diagnoses(host="gpu05")] == ["driver-version-drift"]
    assert "580.159.04" in fleet.diagnoses(host="gpu05")[0].action
    assert fleet.diagnoses(cause="thermal-throttling") == ()
    [missing] = fleet.findings(check="gpu-inventory", status="fail")
    assert [d.cause for d in fleet.explain(missing)] == ["gpu-missing"]
    assert fleet.explain(fleet.findings(host="gpu01", check="gpu-inventory")[0]) == ()


def test_load_saved_report_file_or_run_dir(tmp_path):
    root = write_bundle(tmp_path / "b", {"gpu01": {"nvidia-smi-q-x": h200_node_xml(8)},
                                         "gpu02": {"nvidia-smi-q-x": h200_node_xml(7)}})
    main(["analyze", str(root), "--out", str(tmp_path / "out"), "--checks", "gpu-inventory", "-q"])
    [run_dir] = (tmp_path / "out").iterdir()
    for where in (run_dir, run_dir / "report.json"):
        report = Report.load(where)
        assert report.hosts == ("gpu01", "gpu02")
        assert report.host("gpu02").status_of("gpu-inventory") == "fail"


def test_not_a_report_is_refused(tmp_path):
    bad = tmp_path / "report.json"
    bad.write_text('{"format": "preflight-bundle/1", "hosts": []}')
    with pytest.raises(ReportError, match="not a preflight-report/1 report"):
        Report.load(bad)
    bad.write_text('{"format": "preflight-report/1",\n "hosts": {')
    with pytest.raises(ReportError, match=r"report.json:2: not JSON"):
        Report.load(bad)
    with pytest.raises(ReportError, match="cannot read"):
        Report.load(tmp_path / "absent.json")
    with pytest.raises(ReportError, match="does not follow"):
        Report.from_dict({"format": "preflight-report/1", "hosts": {"a": {"reachable": True}}})


@pytest.fixture(scope="module")
def nccl(tmp_path_factory) -> Report:
    a100 = A100_8GPU.read_text()
    # Derived: the same real run with its 8 GiB row slowed (out-of-place 235.26 -> 210.00 and
    # in-place 235.03 -> 209.50 GB/s), a second node that is a little slower.
    slower = a100.replace("235.26", "210.00").replace("235.03", "209.50")
    assert slower != a100
    root = write_bundle(tmp_path_factory.mktemp("nccl") / "b", {
        "gpu01": {"nvidia-smi-q-x": h200_node_xml(8), "nccl-all-reduce": a100},
        "gpu02": {"nvidia-smi-q-x": h200_node_xml(8), "nccl-all-reduce": V100_32MB.read_text()},
        "gpu03": {"nvidia-smi-q-x": h200_node_xml(1), "nccl-all-reduce": H200_1GPU.read_text()},
        "gpu04": {"nvidia-smi-q-x": h200_node_xml(8), "nccl-all-reduce": slower},
    })
    return Report.from_dict(judged(root, ["nccl-all-reduce"]))


def test_busbw_per_host_at_the_largest_size(nccl):
    # a100: busbw 235.26 (out-of-place) at 8589934592 B, the higher of the two halves.
    assert nccl.busbw("all_reduce", hosts="gpu01") == pytest.approx(235.26)
    assert nccl.busbw("all_reduce", hosts=["gpu01", "gpu04"]) == pytest.approx(210.00)
    # v100 pair: one size only, 32 MiB, busbw 5.75.
    assert nccl.busbw("all_reduce", hosts="gpu02") == pytest.approx(5.75)


def test_busbw_refuses_hosts_without_a_comparable_figure(nccl):
    with pytest.raises(MissingResult) as exc:
        nccl.busbw("all_reduce", hosts="all")
    # gpu03 is a single GPU (no busbw); gpu02 stopped at 32 MiB while the others reached 8 GiB.
    assert str(exc.value) == ("no nccl-all-reduce bandwidth for gpu03; measured below the largest size "
                              "8589934592 B on gpu02 (up to 33554432 B)")
    with pytest.raises(MissingResult, match="no nccl-all-gather bandwidth for gpu01"):
        nccl.busbw("all_gather", hosts="gpu01")


def burn_soak_section(temperature_offset: float = 0, decay: float | None = None) -> dict:
    """The contract's per-host soak entry, computed straight from the real 60 s H200 burn.

    ``temperature_offset`` and ``decay`` derive a hotter / decaying host from the same capture
    (the capture itself has no throughput, so its decay is unknown: None).
    """
    samples = json.loads(BURN.read_text())
    loaded = [s for s in samples if s["util"] >= 80]
    reasons = reduce(lambda mask, s: mask | s["reasons"], samples, 0)
    return {"engine": "burn", "duration_s": samples[-1]["t"] - samples[0]["t"],
            "max_temperature_c": max(s["temp"] for s in samples) + temperature_offset,
            "min_sm_clock_mhz": min(s["sm"] for s in loaded),
            "throttle_reasons_seen": sorted(reasons_from_bitmask(reasons)),
            "throughput_baseline": None if decay is None else 100.0,
            "throughput_final": None if decay is None else 100.0 * (1 - decay),
            "throughput_decay": decay}


def test_soak_of_the_real_burn(fleet):
    data = dict(fleet.data, soak={"gpu01": burn_soak_section()})
    soak = Report.from_dict(data).soak
    assert soak.ran
    assert soak.max_temperature == 66  # hottest sample of the capture
    assert soak.min_sm_clock_mhz == 1155  # lowest SM clock at >= 80 % utilisation
    assert soak.duration_s == pytest.approx(60.67)
    assert soak.throttle_reasons_seen == ("sw_power_cap",)  # 0x4 only: power capped, never thermal
    assert soak.throughput_decay is None
    assert soak.host("gpu01").engine == "burn"


def test_soak_takes_the_worst_host(fleet):
    data = dict(fleet.data, soak={"gpu01": burn_soak_section(decay=0.02),
                                  "gpu04": burn_soak_section(temperature_offset=20, decay=0.08)})
    soak = Report.from_dict(data).soak
    assert soak.max_temperature == 86
    assert soak.throughput_decay == pytest.approx(0.08)
    assert soak.host("gpu01").throughput_decay == pytest.approx(0.02)


def test_no_soak_section_is_none_safe(fleet):
    soak = fleet.soak
    assert not soak.ran
    assert (soak.max_temperature, soak.throughput_decay, soak.duration_s, soak.min_sm_clock_mhz) == (None,) * 4
    assert soak.throttle_reasons_seen == ()
    with pytest.raises(MissingResult, match="no soak result for host 'gpu01'"):
        soak.host("gpu01")
