"""A soak check from --checks-dir runs on `preflight analyze SOAK_DIR`, beside the built-in ones,
and --checks narrows a soak's analysis as it narrows a bundle's."""

from __future__ import annotations

import json
from pathlib import Path

from preflight.app.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h200-soak-5min"
CHECK = '''\
from preflight.check import soak_check, warn


@soak_check("site-soak-length", summary="the site wants soaks of an hour")
def site_soak_length(soak):
    planned = soak.planned_s
    return [warn(f"planned {planned} s, the site wants 3600", host=h) for h in soak.hosts]
'''


def report(out: Path) -> dict:
    [path] = out.glob("*/report.json")
    return json.loads(path.read_text())


def test_a_checks_dir_soak_check_runs_on_a_soak_directory(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "site.py").write_text(CHECK)
    assert main(["analyze", str(EXAMPLE), "--checks-dir", str(d), "--out", str(tmp_path / "a"), "-q",
                 "--no-html"]) == 0
    checks = [f["check"] for f in report(tmp_path / "a")["findings"]]
    assert "site-soak-length" in checks and "soak-thermal" in checks
    [mine] = [f for f in report(tmp_path / "a")["findings"] if f["check"] == "site-soak-length"]
    assert mine["status"] == "warn" and mine["host"] == "vm"


def test_checks_narrows_a_soak_analysis(tmp_path):
    assert main(["analyze", str(EXAMPLE), "--checks", "soak-thermal", "--out", str(tmp_path / "b"), "-q",
                 "--no-html"]) == 0
    assert {f["check"] for f in report(tmp_path / "b")["findings"]} == {"soak-thermal"}
