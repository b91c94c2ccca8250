"""checks/dcgm_diag.py (dcgm-diag, dcgm-hostengine) on real DCGM outputs (tests/fixtures/corpus/dcgm,
provenance in MANIFEST.tsv). The probe's framing lines are added around a real capture where a
test needs them (level, exit code); each such edit is named in the test."""

from pathlib import Path

from ctx import make_host, result, run_check

from preflight.collect.dcgm import PROBE, DcgmOptions
from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Status

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus" / "dcgm"
DIAG, DISCOVERY = "dcgmi-diag", "dcgmi-discovery"
KB = load_knowledge()


def load(name: str) -> str:
    return (CORPUS / name).read_text()


def framed(body: str, level=1, asked=False, exit_code=0, limit=300) -> str:
    return (f"# preflight: dcgmi-diag level={level} asked={int(asked)} limit={limit}\n{body}\n"
            f"# preflight: dcgmi-diag exit={exit_code} seconds=12\n")


def probe_result(stdout, level=1, asked=False, exit_code=0, **kw):
    command = PROBE.configured(DcgmOptions(level, asked)).argv
    return result(DIAG, stdout, exit_code, command=command, **kw)


def diag(stdout, profile="generic", **kw):
    [finding] = run_check("dcgm-diag", make_host({DIAG: probe_result(stdout, **kw)}, profile))
    return finding


def causes(finding):
    return {d.cause for d in diagnose([finding], KB)}


def test_healthy_level1_table_passes():
    f = diag(framed(load("v100-dcgm4.1.1-drv570-diag-deployment-pass.txt")), profile="generic")
    assert f.status is Status.PASS, f.summary
    assert f.data["tests"] == {"software": "pass"} and f.data["gpus"][7] == {"software": "pass"}
    assert "DCGM 4.1.1" in f.summary


def test_fail_with_passing_gpu_rows_is_a_failure_of_the_diagnostic():
    f = diag(framed(load("b200-dcgm4.4.1-diag-r2-pcie-fail-internal-error-slurm.txt"), level=2, exit_code=226))
    assert f.status is Status.FAIL
    assert "pcie failed (every GPU row says Pass, but DCGM failed the test)" in f.summary
    assert "DCGM_FR_INTERNAL (44" in f.summary
    assert causes(f) == {"dcgm-diag-incomplete"}
    assert f.action.startswith("DCGM's next step for DCGM_FR_INTERNAL: Check DCGM and system logs")


def test_skips_are_never_a_pass_and_config_failure_names_its_cause():
    f = diag(load("gb10-dcgm4.2.3-diag-r2-json-software-fail-persistence-memory-pcie-skip.json"))
    assert f.status is Status.FAIL
    assert "software failed on GPU 0: DCGM_FR_PERSISTENCE_MODE (29, severity config" in f.summary
    assert "2 test(s) not run, so not judged (a skip is not a pass): memory (skip); pcie (skip)" in f.summary
    assert {"persistence-mode-off", "dcgm-diag-incomplete"} <= causes(f)
    assert f.data["counts"] == {"pass": 0, "fail": 1, "warn": 0, "skip": 2, "not-run": 0}


def test_all_skipped_warns_that_nothing_was_judged():
    f = diag(load("t400-dcgm3-diag-r3-json-all-skip-excerpt.json"))
    assert f.status is Status.WARN
    # PCIe, GPU Memory and Diagnostic are required; the EUD skip is only noted.
    assert "3 test(s) not run" in f.summary and "no test judged the hardware" in f.summary
    assert "so not judged: EUD Test (skip)" in f.summary
    assert f.symptoms == ("dcgm-diag-incomplete",)


def test_text_table_failure_gets_its_code_from_the_message():
    f = diag(load("dcgmi-diag-r2-gpu-memory-fail-thermal-violation-excerpt.txt"), profile="hgx-h200")
    assert f.status is Status.FAIL
    assert "GPU Memory failed on GPU 0: DCGM_FR_THERMAL_VIOLATIONS_TS (41" in f.summary
    assert "thermal-throttling" in causes(f)
    assert f.data["gpus"][0] == {"GPU Memory": "fail"} and f.data["gpus"][3] == {"GPU Memory": "pass"}


def test_deployment_error_row_remap_pending():
    f = diag(load("dcgmi-diag-r3-deployment-error-row-remap-pending-excerpt.txt"))
    assert f.status is Status.FAIL
    assert "DCGM_FR_PENDING_ROW_REMAP (85, severity reset: Drain and reset GPU)" in f.summary
    assert "gpu-row-remap" in causes(f)


def test_nvlink_down_in_old_table():
    f = diag(load("dcgm2.4.6-diag-r2-pcie-fail-all-nvlink-down-on-pcie-a100.txt"))
    assert f.status is Status.FAIL and "PCIe failed on all GPUs: DCGM_FR_NVLINK_DOWN (14" in f.summary
    assert "nvlink-down" in causes(f)


def test_a_pass_with_a_warning_is_not_a_clean_pass():
    # Real 4.5.2 document; its failing software test is taken out so only the memory and pcie
    # passes remain, and the memory pass gets the allocation warning DCGM issue 284 reports
    # (DCGM_FR_MEMORY_ALLOC, message from dcgm_errors.h): an edit, named here.
    import json
    doc = json.loads(load("gb10-dcgm4.5.2-diag-r2-json-software-fail-persistence-memory-pcie-pass.json"))
    cats = doc["DCGM Diagnostic"]["test_categories"]
    del cats[0]
    cats[0]["tests"][0]["results"][0]["warnings"] = [
        {"error_category": 8, "error_id": 56, "error_severity": 4,
         "warning": "Couldn't allocate at least 75.0% of GPU memory on GPU 0"}]
    f = diag(json.dumps(doc))
    assert f.status is Status.WARN
    assert "memory passed while reporting DCGM_FR_MEMORY_ALLOC (56" in f.summary and "not a clean pass" in f.summary
    clean = diag(load("gb10-dcgm4.5.2-diag-r2-json-software-fail-persistence-memory-pcie-pass.json"))
    assert "memory passed while" not in clean.summary


def test_hang_is_a_result():
    f = diag(framed("", level=2, exit_code=124, limit=1200), level=2)
    assert f.status is Status.FAIL
    assert "dcgmi diag -r 2 did not finish within 1200 s" in f.summary
    assert causes(f) == {"dcgm-diag-hang"}


def test_host_engine_down_during_diag():
    text = framed("Error: unable to establish a connection to the specified host: localhost", exit_code=255)
    f = diag(text)
    assert f.status is Status.ERROR and "dcgm-hostengine-down" in f.symptoms
    assert "systemctl enable --now nvidia-dcgm" in f.action


def test_missing_dcgmi_skips_by_default_and_errors_when_asked():
    missing = dict(stdout="# preflight: dcgmi-diag level=1 asked=0 limit=300\n", exit_code=127,
                   stderr="dcgmi not found on PATH (DCGM is not installed)\n")
    f = diag(**missing)
    assert f.status is Status.SKIP and "dcgmi not found on PATH" in f.summary
    f = diag(**missing, level=3, asked=True)
    assert f.status is Status.ERROR and f.symptoms == ("tool-missing",)
    assert "--dcgm-level 3 asked for DCGM diagnostics" in f.summary


def test_not_run_is_a_skip():
    [f] = run_check("dcgm-diag", make_host({}))
    assert f.status is Status.SKIP and "active test" in f.summary


def test_missing_gpu_results_are_reported():
    f = diag(framed(load("dcgm4.2.3-diag-r2-pcie-fail-internal-error-4gpu.txt")), profile="hgx-h200")
    assert "no result for GPU(s) 4, 5, 6, 7 of the 8" in f.summary


def test_hostengine_check():
    [f] = run_check("dcgm-hostengine", make_host({DISCOVERY: load("v100-dcgmi-discovery-l-8gpus-0cpus.txt")}))
    assert f.status is Status.PASS and f.data["gpus"] == 8
    down = result(DISCOVERY, "Error: unable to establish a connection to the specified host: localhost\n", 255)
    [f] = run_check("dcgm-hostengine", make_host({DISCOVERY: down}))
    assert f.status is Status.FAIL and causes(f) == {"dcgm-hostengine-down"}
    [f] = run_check("dcgm-hostengine", make_host({DISCOVERY: result(DISCOVERY, "", 127)}))
    assert f.status is Status.SKIP
    [f] = run_check("dcgm-hostengine", make_host({DISCOVERY: load("v100-dcgmi-discovery-l-8gpus-0cpus.txt")
                                                  .replace("8 GPUs found.", "7 GPUs found.")}, "hgx-h200"))
    assert f.status is Status.WARN


# ---- level 3: optional tests, and a Targeted Power failure ---------------------------------
# The real DCGM 3.3.9 `dcgmi diag -r 3` table (corpus dcgm/rtxpro6000-..., every test Skip) with the
# stated edits of each test below.
R3 = "rtxpro6000-dcgm3.3.9-diag-r3-table-all-skip-eud.txt"


def r3_with(passed=("PCIe", "GPU Memory", "Targeted Stress", "Targeted Power", "Memory Bandwidth"), rows=None) -> str:
    text = load(R3)
    for name in passed:
        text = text.replace(f"| {name:<25} | Skip - All ", f"| {name:<25} | Pass - All ")
    for name, lines in (rows or {}).items():
        old = f"| {name:<25} | Skip - All                                     |\n"
        assert old in text
        text = text.replace(old, "".join(f"| {a:<25} | {b:<46} |\n" for a, b in lines))
    return text


def test_a_healthy_level3_run_with_the_eud_plugin_skipped_passes_with_a_note():
    f = diag(framed(r3_with(), level=3), level=3)
    assert f.status is Status.PASS, f.summary
    assert "not required at level 3, so not judged: EUD Test (skip) (the EUD plugin is installed separately" \
        in f.summary
    assert f.symptoms == () and f.data["optional_skipped"] == ["EUD Test (skip)"]


def test_a_skipped_memory_bandwidth_is_a_note_but_a_skipped_targeted_power_never_passes():
    f = diag(framed(r3_with(passed=("PCIe", "GPU Memory", "Targeted Stress")), level=3), level=3)
    assert f.status is Status.WARN and f.symptoms == ("dcgm-diag-incomplete",)
    assert "1 test(s) not run, so not judged (a skip is not a pass): Targeted Power (skip)" in f.summary
    assert "so not judged: Memory Bandwidth (skip); EUD Test (skip)" in f.summary


# DCGM_FR_TARGET_POWER's message as DCGM formats it (dcgm_errors.h DCGM_FR_TARGET_POWER_MSG, "Max power of
# %.1f did not reach desired power minimum %s of %.1f for GPU %u"; the %s is the plugin's parameter
# name), cut every 45 characters into the value column as the real tables wrap warnings (corpus
# dcgm/dcgmi-diag-r2-gpu-memory-fail-thermal-violation-excerpt.txt).
_WARNING = "GPU 0 Max power of 212.0 did not reach desired power minimum target_power_min_ratio of 285.0 for GPU 0"
TARGET_POWER = [("Targeted Power", "Pass - GPU: 1"), ("", "Fail - GPU: 0"),
                *((("Warning" if i == 0 else ""), _WARNING[i:i + 45]) for i in range(0, len(_WARNING), 45))]


def test_a_targeted_power_failure_is_dcgm_diag_failed_with_its_code_and_power_capping_only_possible():
    f = diag(framed(r3_with(passed=("PCIe", "GPU Memory", "Targeted Stress", "Memory Bandwidth"),
                            rows={"Targeted Power": TARGET_POWER}), level=3, exit_code=226), level=3)
    assert f.status is Status.FAIL
    assert "Targeted Power failed on GPU 0: DCGM_FR_TARGET_POWER (63, severity triage" in f.summary
    assert f.symptoms[0] == "dcgm-diag-failed" and "power-capping-possible" in f.symptoms
    assert "power-capping" not in f.symptoms
    assert "possibly power-capping, not established" in f.summary
    found = {d.cause: d.confidence for d in diagnose([f], KB)}
    assert found["dcgm-diag-failed"] == "high" and found.get("power-capping") == "low"
