"""The shipped examples analyse to the verdicts recorded before the code was reorganised into
layers (tests/golden/examples/*.json, written by `preflight analyze` on the commit before the
reorganisation): the same host verdicts, findings and diagnoses, field for field. A new check
adds its findings here, and only those: soak-sdc's SKIP on the soak examples (recorded before
the burn checked its results; since issue 34 the SKIP says so rather than "not the burn"), the DCGM
(diagnostics, host engine, health watches), IB-counter, clock-events, fabric-rails (its fleet SKIP:
not run outside `preflight fabric`) and pcie-errors (issue 33) checks' on the fleet example. The
unreachable gpu009 has one finding since issue 34, its connectivity ERROR listing the checks not run
in ``data.not_checked``, where it had one ERROR per check before."""

import json
from pathlib import Path

import pytest

from preflight.app.cli import main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parents[1] / "golden" / "examples"


@pytest.mark.parametrize("example", sorted(p.stem for p in GOLDEN.glob("*.json")))
def test_example_verdicts_unchanged(example, tmp_path):
    code = main(["analyze", str(ROOT / "examples" / example), "--out", str(tmp_path), "-q", "--no-html"])
    [report] = tmp_path.glob("*/report.json")
    got = json.loads(report.read_text())
    want = json.loads((GOLDEN / f"{example}.json").read_text())
    assert code == (1 if example == "h200-fleet" else 0)
    assert got["hosts"] == want["hosts"]
    assert got["diagnoses"] == want["diagnoses"]
    assert len(got["findings"]) == len(want["findings"])
    for mine, theirs in zip(got["findings"], want["findings"], strict=True):
        assert mine == theirs
