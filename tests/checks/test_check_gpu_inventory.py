"""gpu-inventory counts GPUs from whatever evidence has them, not only nvidia-smi -q (issue 15).

Real captures: a Dell XE9780 (8-GPU HGX B300 board) showing 7 GPUs in nvidia-smi nvlink
--status and topo -m, an AWS p5.48xlarge (8 x H100) nvlink --status, an 8 x H100 topo -m, and
a B300 host's lspci (provenance: tests/fixtures/corpus/MANIFEST.tsv).
"""

import json

from captures import B300_LSPCI, B300_NVLINK, B300_TOPO, CORPUS, H100_P5_NVLINK
from ctx import make_host, result, run_check
from test_cli import read_report, write_bundle

from preflight.app.cli import main
from preflight.knowledge.profiles import Profile
from preflight.model import Status

H100_TOPO = (CORPUS / "topo" / "h100-80gb-hbm3-8gpu-rhelai-nv18-tabs.txt").read_text()


def test_seven_of_eight_from_nvlink_status_is_gpu_missing_and_names_the_source():
    host = make_host({"nvidia-smi-nvlink-status": B300_NVLINK, "nvidia-smi-topo": B300_TOPO}, "hgx-b300")
    [f] = run_check("gpu-inventory", host)
    assert f.status is Status.FAIL and f.symptoms == ("gpu-missing",)
    assert f.summary.startswith("7 of 8 GPUs visible (counted by nvidia-smi nvlink --status;")
    assert f.evidence[0].probe == "nvidia-smi-nvlink-status"
    assert f.evidence[0].excerpt.splitlines()[0].startswith("GPU 0: NVIDIA B300 SXM6 AC")
    assert f.data["counted_by"] == "nvidia-smi-nvlink-status"


def test_seven_rows_of_topo_alone_are_gpu_missing():
    [f] = run_check("gpu-inventory", make_host({"nvidia-smi-topo": B300_TOPO}, "hgx-b300"))
    assert f.status is Status.FAIL and "7 of 8" in f.summary and "nvidia-smi topo -m" in f.summary


def test_eight_healthy_gpus_without_q_pass():
    [f] = run_check("gpu-inventory", make_host({"nvidia-smi-nvlink-status": H100_P5_NVLINK}, "hgx-h100"))
    assert f.status is Status.PASS and f.summary.startswith("8 x NVIDIA H100 80GB HBM3 (counted by nvidia-smi nvlink")
    [f] = run_check("gpu-inventory", make_host({"nvidia-smi-topo": H100_TOPO}, "hgx-h100"))
    assert f.status is Status.PASS and f.summary.startswith("8 GPUs (counted by nvidia-smi topo -m")


def test_lspci_alone_fails_a_short_board_but_never_passes_one():
    [f] = run_check("gpu-inventory", make_host({"lspci": B300_LSPCI}, "hgx-b300"))
    assert f.status is Status.FAIL and "2 of 8" in f.summary and "counted by lspci" in f.summary
    # The same two GPUs against a 2-GPU expectation: on the bus, but the driver is unheard.
    host = make_host({"lspci": B300_LSPCI}, "hgx-b300")
    b300 = host.profile
    host.profile = Profile(b300.id, b300.name, {**b300.data, "gpu": {"count": 2}}, b300.source_file, "test")
    [f] = run_check("gpu-inventory", host)
    assert f.status is Status.SKIP and "on the PCI bus" in f.summary


def test_lspci_is_not_used_when_nvidia_smi_ran_and_failed():
    failed = result("nvidia-smi-q-x", "", exit_code=9, stderr="NVIDIA-SMI has failed")
    [f] = run_check("gpu-inventory", make_host({"nvidia-smi-q-x": failed, "lspci": B300_LSPCI}, "hgx-b300"))
    assert f.status is Status.ERROR


def test_analyze_detects_the_platform_from_nvlink_names_and_fails_the_short_node(tmp_path):
    bundle = write_bundle(tmp_path / "b", {
        "xe9780": {"nvidia-smi-nvlink-status": B300_NVLINK, "nvidia-smi-topo": B300_TOPO},
        "p5": {"nvidia-smi-nvlink-status": H100_P5_NVLINK},
    })
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "out"), "-q", "--no-html"]) == 1
    report = read_report(tmp_path / "out")
    hosts = report["hosts"]
    assert (hosts["xe9780"]["status"], hosts["xe9780"]["profile"]) == ("fail", "hgx-b300")
    assert "nvidia-smi nvlink --status" in hosts["xe9780"]["profile_reason"]
    assert (hosts["p5"]["status"], hosts["p5"]["profile"]) == ("pass", "hgx-h100")
    assert {d["cause"]: d["hosts"] for d in report["diagnoses"]} == {"gpu-missing": ["xe9780"]}
    inventory = {f["host"]: f for f in report["findings"] if f["check"] == "gpu-inventory"}
    assert inventory["p5"]["status"] == "pass" and inventory["xe9780"]["status"] == "fail"
    json.dumps(report)


def test_profile_still_overrides_what_the_evidence_says(tmp_path):
    bundle = write_bundle(tmp_path / "b", {"xe9780": {"nvidia-smi-topo": B300_TOPO}})
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "out"), "-q", "--no-html",
                 "--profile", "hgx-b300"]) == 1
    report = read_report(tmp_path / "out")
    assert report["hosts"]["xe9780"]["profile"] == "hgx-b300"
    assert report["hosts"]["xe9780"]["profile_reason"] == "chosen with --profile"


def test_a_parser_crash_while_choosing_the_profile_is_a_finding_not_a_traceback(tmp_path, monkeypatch):
    def broken(text):
        raise RuntimeError("parser bug")

    monkeypatch.setattr("preflight.parse.topo.parse_topo", broken)
    bundle = write_bundle(tmp_path / "b", {"xe9780": {"nvidia-smi-topo": B300_TOPO}})
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "out"), "-q", "--no-html"]) == 1
    report = read_report(tmp_path / "out")
    assert report["hosts"]["xe9780"]["profile"] == "generic"
    assert "could not be read (RuntimeError)" in report["hosts"]["xe9780"]["profile_reason"]
    crashed = [f for f in report["findings"] if "check-crashed" in f["symptoms"]]
    assert {f["check"] for f in crashed} >= {"gpu-inventory"}
