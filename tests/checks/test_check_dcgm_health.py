"""DCGM's background health check: the parser (preflight/parse/dcgm_health.py) and ``dcgm-health``
(checks/dcgm_diag.py) on the outputs of tests/fixtures/recorded (provenance in MANIFEST.tsv):
the real ``dcgmi health -s a`` / ``-c -j`` of NVIDIA/DCGM issue 263 (Healthy), and a report with
incidents CONSTRUCTED from NVIDIA's own health test (a volatile DBE on GPU 0: Memory system
Failure) and the real thermal Warning of DCGM issue 270 on GPU 2, as JSON and as the text tree
(no published report with incidents was found). The probe's marker lines are added where a test
needs them, and named there. dcgmi's host-engine error line is DCGM 4.6.0 dcgmi/Command.cpp's.
"""

from pathlib import Path

import pytest
from ctx import make_host, result, run_check

from preflight.collect.dcgm import HEALTH, PROBE, DcgmOptions
from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Status
from preflight.parse import ParseError
from preflight.parse.dcgm_health import parse_dcgmi_health

RECORDED = Path(__file__).parents[1] / "fixtures" / "recorded"
HEALTHY = (RECORDED / "dcgmi-health-c-j-healthy-gpu-recovery-reset-pending-dcgm-263.txt").read_text()
SET_OK = (RECORDED / "dcgmi-health-s-a-set-successfully-dcgm-263.txt").read_text()
INCIDENTS_JSON = (RECORDED / "dcgmi-health-c-j-failure-dbe-gpu0-thermal-warning-gpu2-constructed.txt").read_text()
INCIDENTS_TEXT = (RECORDED / "dcgmi-health-c-failure-dbe-gpu0-thermal-warning-gpu2-constructed.txt").read_text()
NO_ENGINE = "Error: unable to establish a connection to the specified host: localhost\n"
HEALTH_ID = "dcgmi-health"
KB = load_knowledge()


def probe_output(check: str, set_out: str = SET_OK, set_exit: int = 0, check_exit: int = 0) -> str:
    """What the probe's script prints: set, its marker, check, its marker."""
    return (f"{set_out}# preflight: dcgmi-health set exit={set_exit}\n{check}"
            f"# preflight: dcgmi-health check exit={check_exit}\n")


def judge(stdout, exit_code=0, extra=None, **kw):
    probes = {HEALTH_ID: result(HEALTH_ID, stdout, exit_code, command=HEALTH.argv, **kw), **(extra or {})}
    [f] = run_check("dcgm-health", make_host(probes))
    return f


def test_the_parser_reads_the_real_healthy_json_and_the_set_line():
    h = parse_dcgmi_health(probe_output(HEALTHY))
    assert (h.form, h.overall, h.entities, h.watches_set, h.exits) == ("json", "pass", (), True,
                                                                      {"set": 0, "check": 0})


@pytest.mark.parametrize("text", [INCIDENTS_JSON, INCIDENTS_TEXT], ids=["json", "text"])
def test_json_and_text_reports_give_the_same_incidents(text):
    h = parse_dcgmi_health(text)
    assert h.form == ("json" if text.lstrip().startswith("{") else "text")
    assert h.overall == "fail" and h.watches_set is None
    assert [(e.label, e.health) for e in h.entities] == [("GPU 0", "fail"), ("GPU 2", "warn")]
    (gpu0, dbe), (gpu2, thermal) = h.incidents
    assert (dbe.system, dbe.health, dbe.message) == ("Memory system", "fail",
                                                     "Detected 2 volatile double-bit ECC error(s) in GPU 0.")
    assert thermal.system == "Thermal system" and thermal.message.startswith(
        "Detected clocks event due to thermal violation in GPU 2. Verify that the cooling on this machine is "
        "functional, including external,")


def test_not_a_health_report_is_a_parse_error():
    with pytest.raises(ParseError, match="not dcgmi health output"):
        parse_dcgmi_health("Successfully ran diagnostic for group.\n")
    with pytest.raises(ParseError, match="does not parse"):
        parse_dcgmi_health(HEALTHY[:40])


def test_healthy_passes_with_nvidias_caveat():
    f = judge(probe_output(HEALTHY))
    assert f.status is Status.PASS
    assert f.summary.startswith("dcgmi health (json): overall Healthy, no incident; watches set by this probe")
    assert "does not mean every subsystem was watched or that a stress test passed" in f.summary


def test_incidents_fail_and_warn_with_dcgms_code_next_step_and_cause():
    f = judge(probe_output(INCIDENTS_JSON))
    assert f.status is Status.FAIL
    assert ("GPU 0 Memory system Failure: DCGM_FR_VOLATILE_DBE_DETECTED (4, severity isolate): Detected 2 volatile "
            "double-bit ECC error(s) in GPU 0.; NVIDIA: Drain the GPU and reset it or reboot the node.") in f.summary
    assert "GPU 2 Thermal system Warning: DCGM_FR_CLOCKS_EVENT_THERMAL (10, severity monitor)" in f.summary
    assert f.symptoms == ("gpu-ecc-uncorrectable", "thermal-throttling")
    assert {d.cause for d in diagnose([f], KB)} >= {"gpu-ecc-uncorrectable", "thermal-throttling"}
    assert f.action == "Drain the GPU and reset it or reboot the node."
    assert [c["entity"] for c in f.data["codes"]] == ["GPU 0", "GPU 2"]
    assert any("volatile double-bit" in e.excerpt for e in f.evidence)
    # The pasted text tree (no markers) is judged the same.
    t = judge(INCIDENTS_TEXT)
    assert t.status is Status.FAIL and t.symptoms == f.symptoms and t.summary.startswith("dcgmi health (text)")


def test_a_warning_alone_warns():
    # The constructed report with GPU 0's incident removed: only the real thermal Warning of issue 270.
    text = INCIDENTS_TEXT.replace("| Overall Health            | Failure", "| Overall Health            | Warning")
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("| -> 0"))
    end = next(i for i, line in enumerate(lines) if line.startswith("| -> 2"))
    f = judge("".join(lines[:start] + lines[end:]))
    assert f.status is Status.WARN and f.symptoms == ("thermal-throttling",)


def test_host_engine_down_is_an_error_with_the_way_to_start_it():
    f = judge(probe_output("", set_out=NO_ENGINE, set_exit=255) + NO_ENGINE + "# preflight: dcgmi-health check "
              "exit=255\n")
    assert f.status is Status.ERROR and f.symptoms == ("dcgm-hostengine-down",)
    assert "systemctl enable --now nvidia-dcgm" in f.action


def test_missing_dcgmi_skips_unless_dcgm_was_asked_for():
    missing = dict(exit_code=127, stderr="dcgmi not found on PATH (DCGM is not installed)\n")
    f = judge(None, **missing)
    assert f.status is Status.SKIP and "DCGM health watches not checked" in f.summary
    asked = result("dcgmi-diag", None, 127, command=PROBE.configured(DcgmOptions(2, True)).argv)
    f = judge(None, extra={"dcgmi-diag": asked}, **missing)
    assert f.status is Status.ERROR and f.symptoms == ("tool-missing",)
