"""The dcgmi-diag probe: options into the fixed script's arguments, and the script itself run
against a stand-in dcgmi that replays a real capture (tests/fixtures/corpus/dcgm) or hangs."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

from preflight.app.cli import build_parser, run_request
from preflight.app.errors import UsageError
from preflight.collect.dcgm import LEVEL_LIMIT_S, PROBE, DcgmOptions, asked_level
from preflight.parse.dcgm import parse_dcgmi_diag

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus" / "dcgm"
PASS_TABLE = CORPUS / "v100-dcgm4.1.1-drv570-diag-deployment-pass.txt"


def test_level_and_limit_become_arguments():
    p = PROBE.configured(DcgmOptions(3, asked=True))
    assert p.argv[-3:] == ("3", "1", f"{LEVEL_LIMIT_S[3]:g}") and p.timeout_s > LEVEL_LIMIT_S[3]
    assert asked_level(p.argv) == (3, True)
    assert PROBE.configured(None).argv[-3:] == ("1", "0", "300")
    with pytest.raises(ValueError):
        PROBE.configured(DcgmOptions(5))


def _request(tmp_path, *argv):
    args = build_parser().parse_args(["run", "--local", "--out", str(tmp_path), "--checks", "dcgm-diag", *argv])
    return run_request(args)


def test_cli_level_reaches_the_probe_and_quick_refuses_it(tmp_path):
    (probe,) = _request(tmp_path, "--dcgm-level", "2").plan.probes
    assert asked_level(probe.argv) == (2, True) and probe.argv[-1] == f"{LEVEL_LIMIT_S[2]:g}"
    (probe,) = _request(tmp_path).plan.probes
    assert asked_level(probe.argv) == (1, False)
    with pytest.raises(UsageError, match="--quick"):
        _request(tmp_path, "--quick", "--dcgm-level", "2")
    assert _request(tmp_path, "--quick").plan.probes == ()


def _fake_dcgmi(tmp_path: Path, body: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "dcgmi"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


def _run(argv, env, timeout=30):
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def test_script_frames_a_real_capture(tmp_path):
    env = _fake_dcgmi(tmp_path, f"cat '{PASS_TABLE}'; exit 0")
    out = _run(PROBE.configured(DcgmOptions(1)).argv, env)
    assert out.returncode == 0
    diag = parse_dcgmi_diag(out.stdout)
    assert (diag.run.level, diag.run.exit_code, diag.tests[0].status) == (1, 0, "pass")


def test_script_stops_a_hang_and_says_so(tmp_path):
    env = _fake_dcgmi(tmp_path, "sleep 30")
    out = _run(PROBE.configured(DcgmOptions(2, timeout_s=1)).argv, env)
    diag = parse_dcgmi_diag(out.stdout)
    assert out.returncode == 0 and diag.run.timed_out and diag.run.exit_code == 124


def test_script_without_dcgmi_exits_127(tmp_path):
    env = {**os.environ, "PATH": "/nonexistent:/usr/bin:/bin"}
    if any(Path(d, "dcgmi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has dcgmi")
    out = _run(PROBE.configured(None).argv, env)
    assert out.returncode == 127 and "dcgmi not found" in out.stderr
