"""The healthcheck's rule (preflight/app/healthcheck.py `decide`): drain on FAIL, resume only
preflight's own drains once healthy, never act on ERROR, never touch someone else's drain. Node
states are read from real `scontrol show node -o` captures (tests/fixtures/slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.app.cli import main
from preflight.app.healthcheck import decide, plan_for
from preflight.collect.probes import PROBES
from preflight.parse.slurm import parse_show_node

FIX = Path(__file__).parents[1] / "fixtures" / "slurm"
IDLE = parse_show_node((FIX / "scontrol-show-node-not-found.txt").read_text())[0]["n1"]
OTHERS = parse_show_node((FIX / "scontrol-show-node-drained.txt").read_text())[0]["n2"]
line = (FIX / "scontrol-show-node-drained.txt").read_text().replace(
    "Reason=someone else: bad fan", "Reason=preflight: nvlink-down healthcheck-20261201-140000-abcd")
OURS = parse_show_node(line)[0]["n2"]


@pytest.mark.parametrize("status, node, kind", [
    ("fail", IDLE, "drain"), ("fail", OURS, "drain"), ("fail", OTHERS, "none"),
    ("pass", OURS, "resume"), ("warn", OURS, "resume"), ("pass", OTHERS, "none"), ("pass", IDLE, "none"),
    ("error", OURS, "none"), ("error", IDLE, "none"), ("error", OTHERS, "none"),
])
def test_the_rule(status, node, kind):
    action = decide(status, "nvlink-down", "healthcheck-1", node)
    assert action.kind == kind
    if kind == "drain":
        assert action.reason == "preflight: nvlink-down healthcheck-1"
    if node is OTHERS:
        assert "someone else (someone else: bad fan [root@2026-12-01T13:53:35])" in action.why or status == "error"


def test_the_budget_bounds_every_probe_and_the_node():
    plan = plan_for(PROBES.values(), budget_s=60)
    assert all(not p.active for p in plan.probes) and "nccl-all-reduce" not in {p.id for p in plan.probes}
    assert max(plan.limit_for(p) for p in plan.probes) == 20  # mlxfwmanager's own 120 s does not fit
    assert plan.node_budget() == 45


def test_without_slurm_the_verdict_is_kept_and_nothing_is_changed(tmp_path, monkeypatch, capsys):
    """On this machine (no GPU, no Slurm commands on PATH): the node fails or errs, its report is
    written, and the healthcheck says why it changed nothing instead of failing itself."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["healthcheck", "--budget", "10", "--node", "n1", "--out", str(tmp_path / "hc")]) == 1
    [run] = (tmp_path / "hc").iterdir()
    assert (run / "report.json").is_file() and run.name.startswith("healthcheck-")
    said = " ".join(capsys.readouterr().out.split())
    assert "healthcheck: none: Slurm not asked: scontrol: scontrol not found" in said
