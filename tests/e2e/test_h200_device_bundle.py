"""The bundle `preflight run --local` recorded on a real one-GPU H200 VM (tests/fixtures/h200-device).

A 1-GPU VM slice of an HGX board has no NVLink peer, no NVSwitch fabric and no RDMA NIC: all
of that must come out "not applicable", never as a failure, and the node must pass.
"""

import json
from pathlib import Path

from preflight.app.cli import main

BUNDLE = Path(__file__).parents[1] / "fixtures" / "h200-device" / "bundle"


def _analyze(tmp_path, *extra):
    code = main(["analyze", str(BUNDLE), "--out", str(tmp_path), "-q", "--no-html", *extra])
    [run] = tmp_path.iterdir()
    report = json.loads((run / "report.json").read_text())
    return code, report, {f["check"]: f for f in report["findings"] if f["host"] == "vm"}


def test_real_h200_vm_passes_with_multi_gpu_checks_not_applicable(tmp_path):
    code, report, by_check = _analyze(tmp_path)
    assert code == 0
    assert report["hosts"]["vm"] == {"status": "pass", "reachable": True, "profile": "generic",
                                     "profile_reason": "1 x NVIDIA H200 is not a NVIDIA HGX H200 8-GPU "
                                                       "(needs at least 2 GPUs): generic checks only"}
    assert not [f for f in by_check.values() if f["status"] in ("fail", "error")]
    assert by_check["nvlink"]["status"] == "skip"
    assert by_check["fabric-manager"]["status"] == "skip"
    nccl = by_check["nccl-all-reduce"]
    assert nccl["status"] == "skip" and nccl["summary"].startswith("single GPU: bandwidth not applicable")
    assert "3 of 3 repetitions completed" in nccl["summary"]
    assert by_check["gpu-memory"]["status"] == "pass" and by_check["xid"]["status"] == "pass"
    assert by_check["pcie-link"]["status"] == "pass" and "Gen5 x16" in by_check["pcie-link"]["summary"]
    assert by_check["probes"]["summary"] == "15 probes finished in time"


def test_forcing_the_hgx_profile_on_a_vm_slice_reports_the_missing_gpus(tmp_path):
    code, report, by_check = _analyze(tmp_path, "--profile", "hgx-h200")
    assert code == 1
    assert by_check["gpu-inventory"]["status"] == "fail"
    assert by_check["gpu-inventory"]["summary"].startswith("1 of 8 GPUs visible")
    assert [d["cause"] for d in report["diagnoses"] if d["cause"] == "gpu-missing"] == ["gpu-missing"]


def test_nccl_tests_and_the_torch_fallback_read_alike_on_the_real_h200():
    """The probe's real output on the H200 with nccl-tests and with the torch fallback
    (tests/fixtures/h200-device/MANIFEST.tsv): same sizes, same verdict."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from ctx import make_host, run_check

    from preflight.parse.nccl_probe import parse_probe_output

    outputs = {name: (Path(__file__).parents[1] / "fixtures" / "h200-device" / name).read_text()
               for name in ("probe-nccl-tests-3reps.txt", "probe-torch-fallback-3reps.txt")}
    sizes = []
    for name, text in outputs.items():
        out = parse_probe_output(text)
        assert [r.exit_code for r in out.repetitions] == [0, 0, 0], name
        sizes.append([row.size_bytes for row in out.repetitions[0].runs[0].rows])
        [f] = run_check("nccl-all-reduce", make_host({"nccl-all-reduce": text}, "generic", "vm"))
        assert f.status.value == "skip" and f.summary.startswith("single GPU: bandwidth not applicable"), name
    assert sizes[0] == sizes[1] and sizes[0][-1] == 8 << 30
