"""parse_dcgmi_diag / parse_dcgmi_discovery on real DCGM outputs (tests/fixtures/corpus/dcgm,
provenance in tests/fixtures/corpus/MANIFEST.tsv). Values asserted were read off the files."""

from pathlib import Path

import pytest

from preflight.parse import ParseError
from preflight.parse.dcgm import parse_dcgmi_diag, parse_dcgmi_discovery

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus" / "dcgm"


def load(name: str) -> str:
    return (CORPUS / name).read_text()


def by_name(diag):
    return {t.name: t for t in diag.tests}


def test_dcgm4_json_keeps_fail_and_skips_apart():
    diag = parse_dcgmi_diag(load("gb10-dcgm4.2.3-diag-r2-json-software-fail-persistence-memory-pcie-skip.json"))
    assert (diag.form, diag.version, diag.driver) == ("json", "4.2.3", "580.82.09")
    tests = by_name(diag)
    assert [(t.name, t.category, t.status) for t in diag.tests] == [
        ("software", "Deployment", "fail"), ("memory", "Hardware", "skip"), ("pcie", "Integration", "skip")]
    assert [(r.gpu, r.status) for r in tests["memory"].results] == [(0, "skip")]
    (warning, info) = tests["software"].messages
    assert (warning.kind, warning.gpu, warning.code, warning.severity, warning.category) == ("warning", 0, 29, 5, 8)
    assert warning.text.startswith("Persistence Mode: Persistence mode for GPU 0 is disabled.")
    assert info.kind == "info" and "SRAM Threshold checking was skipped" in info.text


def test_dcgm45_json_summary_repeat_is_kept_once():
    diag = parse_dcgmi_diag(load("gb10-dcgm4.5.2-diag-r2-json-software-fail-persistence-memory-pcie-pass.json"))
    tests = by_name(diag)
    assert diag.version == "4.5.2"
    assert [m.code for m in tests["software"].messages if m.kind == "warning"] == [29]
    assert tests["memory"].status == "pass" and tests["pcie"].status == "pass"
    assert "GPU to Host bandwidth: 58.62 GB/s" in [m.text for m in tests["pcie"].messages]


def test_dcgm3_json_gpu_id_results():
    diag = parse_dcgmi_diag(load("t400-dcgm3-diag-r3-json-all-skip-excerpt.json"))
    assert [(t.name, t.status, [(r.gpu, r.status) for r in t.results]) for t in diag.tests] == [
        ("PCIe", "skip", [(0, "skip")]), ("GPU Memory", "skip", [(0, "skip")]),
        ("Diagnostic", "skip", [(0, "skip")]), ("EUD Test", "skip", [(0, "skip")])]
    assert diag.version is None


def test_dcgm4_table_per_gpu_rows_and_wrapped_warnings():
    diag = parse_dcgmi_diag(load("dcgm4.2.3-diag-r2-pcie-fail-internal-error-4gpu.txt"))
    assert (diag.form, diag.version, diag.driver) == ("text", "4.2.3", "570.148.08")
    pcie = by_name(diag)["pcie"]
    assert pcie.status == "fail" and [r.status for r in pcie.results] == ["pass"] * 4
    assert len(pcie.messages) == 4
    # rebuilt across the 45-character wrap ("non-zero s" / "tatus 1")
    assert pcie.messages[0].text.startswith(
        "There was an internal error during the test: 'A child process (152) exited with non-zero status 1'")
    assert diag.notes == ()


def test_dcgm3_table_gpu_lists_make_the_test_fail():
    diag = parse_dcgmi_diag(load("dcgmi-diag-r2-gpu-memory-fail-thermal-violation-excerpt.txt"))
    (memory,) = diag.tests
    assert memory.status == "fail"
    assert sorted((r.gpu, r.status) for r in memory.results) == [(0, "fail")] + [(g, "pass") for g in range(1, 8)]
    assert memory.messages[0].gpu == 0
    assert "Thermal violations totaling 13.3 seconds started at 9.7 seconds" in memory.messages[0].text


def test_table_deployment_error_belongs_to_the_run():
    diag = parse_dcgmi_diag(load("dcgmi-diag-r3-deployment-error-row-remap-pending-excerpt.txt"))
    assert diag.tests == ()
    (err,) = diag.messages
    assert (err.kind, err.gpu, err.text) == ("error", 3, "GPU 3 has uncorrectable memory errors and row "
                                                        "remappings are pending")


def test_dcgm2_fail_all():
    (pcie,) = parse_dcgmi_diag(load("dcgm2.4.6-diag-r2-pcie-fail-all-nvlink-down-on-pcie-a100.txt")).tests
    assert (pcie.name, pcie.status, [(r.gpu, r.status) for r in pcie.results]) == ("PCIe", "fail", [(None, "fail")])
    assert "GPU 0's NvLink link 4 is currently down" in pcie.messages[0].text


def test_probe_markers_become_the_run():
    text = ("# preflight: dcgmi-diag level=2 asked=1 limit=1200\n" + load("dcgm4.2.3-diag-r2-pcie-fail-internal-error-4gpu.txt")
            + "# preflight: dcgmi-diag exit=226 seconds=41.5\n")
    run = parse_dcgmi_diag(text).run
    assert (run.level, run.asked, run.limit_s, run.exit_code, run.seconds, run.timed_out) == (2, True, 1200.0, 226, 41.5, False)


def test_a_hang_has_no_document():
    text = "# preflight: dcgmi-diag level=2 asked=0 limit=1200\n# preflight: dcgmi-diag exit=124 seconds=1200\n"
    diag = parse_dcgmi_diag(text)
    assert (diag.form, diag.tests, diag.run.timed_out) == ("none", (), True)


def test_host_engine_error_line():
    # The line dcgmi prints when it cannot reach nv-hostengine (dcgmi/Command.cpp in NVIDIA/DCGM 4.6.0).
    diag = parse_dcgmi_diag("Error: unable to establish a connection to the specified host: localhost\n")
    assert diag.form == "none"
    assert diag.messages[0].text == "unable to establish a connection to the specified host: localhost"


def test_unknown_status_word_is_never_a_pass():
    diag = parse_dcgmi_diag(load("v100-dcgm4.1.1-drv570-diag-deployment-pass.txt").replace("| Pass ", "| Inconclusive ", 1))
    assert diag.tests[0].status == "unknown"


def test_not_dcgmi_output():
    with pytest.raises(ParseError):
        parse_dcgmi_diag("nvidia-smi: command not found here\n")


def test_discovery():
    disc = parse_dcgmi_discovery(load("v100-dcgmi-discovery-l-8gpus-0cpus.txt"))
    assert disc.counts == {"GPUs": 8, "NvSwitches": 0, "ConnectX": 0, "CPUs": 0}
    assert [g.id for g in disc.gpus] == list(range(8))
    assert disc.gpus[7].pci_bus_id == "00000000:8A:00.0" and disc.gpus[0].name == "Tesla V100-SXM2-32GB"
    with pytest.raises(ParseError):
        parse_dcgmi_discovery("hello\n")


def test_non_gpu_entities_are_not_read_as_gpus():
    # The real 4.2.3 document with its memory result's entity_group edited to "CPU" (4.x reports
    # CPU entities for the CPU EUD tests): no GPU result, the status still counts.
    import json
    doc = json.loads(load("gb10-dcgm4.2.3-diag-r2-json-software-fail-persistence-memory-pcie-skip.json"))
    memory = doc["DCGM Diagnostic"]["test_categories"][1]["tests"][0]
    memory["results"][0]["entity_group"] = "CPU"
    del memory["test_summary"]
    tests = by_name(parse_dcgmi_diag(json.dumps(doc)))
    assert tests["memory"].results == () and tests["memory"].status == "skip"
