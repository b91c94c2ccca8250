"""A soak is evidence for as long as it ran: one whose agent died, or that covered less than its
plan, is not a pass (preflight/soak/coverage.py), in ``analyze`` and in the pytest plugin alike.

The soak directory is the real five-minute H200 burn of examples/h200-soak-5min (planned 300 s,
agent finished); the incomplete ones are that capture with its soak.json's agent record edited,
or its telemetry cut after its first 24 s (as a killed agent leaves it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preflight.app.cli import main
from preflight.diagnose.engine import load_knowledge
from preflight.model import Status
from preflight.soak.judge import judge_soak


def _edit_meta(soak: Path, **changes) -> None:
    meta = json.loads((soak / "soak.json").read_text())
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    (soak / "soak.json").write_text(json.dumps(meta))


def _cut_telemetry(soak: Path, seconds: float) -> None:
    """Keep the first ``seconds`` of telemetry and throughput, as an agent killed then leaves them."""
    for name in ("telemetry.csv", "throughput.csv"):
        lines = (soak / name).read_text().splitlines(keepends=True)
        t0 = float(lines[1].split(",")[0])
        (soak / name).write_text("".join([lines[0]] + [ln for ln in lines[1:] if float(ln.split(",")[0]) <= t0 + seconds]))


def _telemetry_finding(soak: Path):
    [f] = [f for f in judge_soak(soak, load_knowledge()).findings if f.check == "soak-telemetry"]
    return f


def test_a_complete_soak_passes_and_says_what_it_covered(soak):
    f = _telemetry_finding(soak)
    assert f.status is Status.PASS
    assert "for 5.0 min" in f.summary and "(planned 5.0 min)" in f.summary
    assert main(["analyze", str(soak), "--out", str(soak.parent / "r"), "-q"]) == 0


def test_an_agent_that_died_is_not_a_pass(soak):
    meta = json.loads((soak / "soak.json").read_text())
    meta["agents"]["vm"].update(outcome="died", note="the agent is gone without finishing (killed?)")
    (soak / "soak.json").write_text(json.dumps(meta))
    f = _telemetry_finding(soak)
    assert f.status is Status.ERROR and f.symptoms == ("soak-incomplete",)
    assert f.summary.startswith("soak incomplete: agent died (the agent is gone without finishing (killed?))")
    assert "covered 5.0 min of the planned 5.0 min" in f.summary
    assert main(["analyze", str(soak), "--out", str(soak.parent / "r"), "-q"]) == 1


def test_a_one_hour_soak_killed_after_24_s_is_not_a_pass(soak):
    _cut_telemetry(soak, 24)
    _edit_meta(soak, planned_s=3600.0)
    f = _telemetry_finding(soak)
    assert f.status is Status.ERROR and f.symptoms == ("soak-incomplete",)
    assert "covered 23.0 s of the planned 60.0 min (1%" in f.summary
    assert f.data["covered_s"] == pytest.approx(24, abs=1.5) and f.data["planned_s"] == 3600.0
    assert main(["analyze", str(soak), "--out", str(soak.parent / "r"), "-q"]) == 1


def test_a_shortfall_within_the_tolerance_passes(soak):
    # The capture covers 301.4 s; a plan 5 % longer (316 s) is still covered, 10 % (332 s) is not.
    _edit_meta(soak, planned_s=316.0)
    assert _telemetry_finding(soak).status is Status.PASS
    _edit_meta(soak, planned_s=332.0)
    assert _telemetry_finding(soak).status is Status.ERROR


def test_without_a_plan_the_soak_is_judged_on_what_it_holds(soak):
    _edit_meta(soak, planned_s=None, agents=None)
    f = _telemetry_finding(soak)
    assert f.status is Status.PASS and "planned" not in f.summary


def test_a_host_whose_agent_delivered_nothing_counts(soak):
    _edit_meta(soak, missing={"vm2": "unreachable"},
               agents={"vm": {"outcome": "finished"}, "vm2": {"outcome": "unreachable", "note": "connection refused"}})
    analysis = judge_soak(soak, load_knowledge())
    assert analysis.hosts["vm2"].status == "error" and analysis.failed
    [f] = [f for f in analysis.findings if f.host == "vm2" and f.check == "soak-telemetry"]
    assert f.summary.startswith("soak incomplete: agent unreachable (connection refused)")


def test_a_host_only_the_telemetry_names_gets_a_verdict(soak):
    lines = (soak / "telemetry.csv").read_text().splitlines(keepends=True)
    (soak / "telemetry.csv").write_text("".join(lines + [ln.replace(",vm,", ",ghost,", 1) for ln in lines[1:]]))
    analysis = judge_soak(soak, load_knowledge())
    assert "ghost" in analysis.hosts
    assert any(f.host == "ghost" and f.check == "soak-telemetry" for f in analysis.findings)


def test_a_soak_with_no_host_is_not_a_pass(soak):
    _edit_meta(soak, hosts=[], agents=None)
    (soak / "telemetry.csv").write_text((soak / "telemetry.csv").read_text().splitlines()[0] + "\n")
    (soak / "throughput.csv").write_text((soak / "throughput.csv").read_text().splitlines()[0] + "\n")
    analysis = judge_soak(soak, load_knowledge())
    assert analysis.failed
    assert any(f.host is None and f.status is Status.ERROR and "nothing was soaked" in f.summary
               for f in analysis.findings)


def test_a_node_without_nvml_says_why(soak):
    # The burn agent on a node without NVML fails at once, its reason in the heartbeat, which the
    # controller keeps as the agent's note: the report says why there is no telemetry.
    reason = "NVML: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    _edit_meta(soak, agents={"vm": {"outcome": "failed", "note": reason}})
    for name in ("telemetry.csv", "throughput.csv"):
        (soak / name).write_text((soak / name).read_text().splitlines()[0] + "\n")
    f = _telemetry_finding(soak)
    assert f.status is Status.ERROR and f"agent failed ({reason})" in f.summary
