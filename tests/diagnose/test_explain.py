"""`preflight explain CAUSE` and `explain --list`, on the real playbooks."""

import pytest

from preflight.app.cli import main
from preflight.diagnose.engine import load_knowledge
from preflight.diagnose.explain import (
    UnknownCause,
    explain,
    find_cause,
    list_causes,
    pointing_symptoms,
)

KB = load_knowledge()


def test_explain_prints_title_meaning_symptoms_actions_in_order():
    text = explain("nic-fw-driver-mismatch", KB)
    assert text.startswith("nic-fw-driver-mismatch: NIC firmware outside what the mlx5 driver supports\n")
    sections = ["What it means:", "Symptoms that point to it:", "What to do, in order:"]
    assert [text.index(s) for s in sections] == sorted(text.index(s) for s in sections)
    assert "  - nic-fw-driver-mismatch reported by a check (high)" in text
    # A rule of rules.yaml that names the cause, with its confidence.
    assert "  - nic-fw-driver-mismatch with any of nccl-hang, nccl-unstable (high)" in text
    assert "mlx5-cmd-timeout with any of nccl-hang, nccl-unstable (medium)" in text
    # Actions numbered in the order of causes.yaml.
    first, second = KB.causes["nic-fw-driver-mismatch"].actions[:2]
    assert text.index("  1. " + first.split()[0]) < text.index("  2. " + second.split()[0])
    assert all(len(line) <= 100 for line in text.splitlines())


def test_explain_shows_evidence_references_and_fleet_patterns():
    text = explain("nccl-fleet-config", KB)
    assert "Evidence to look at:" in text and "References:" in text
    assert "docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html" in text
    assert "every host judged (at least 2) shows nccl-low-bandwidth (medium, fleet pattern)" in text
    assert "not when the run also shows driver-version-drift" in text.replace("\n    ", " ")


def test_every_cause_explains_and_every_rule_shows_up_under_its_cause():
    for cid in KB.causes:
        assert explain(cid, KB).startswith(f"{cid}: {KB.causes[cid].title}")
    for rule in KB.rules:
        lines = pointing_symptoms(rule.cause, KB)
        assert any(f"({rule.confidence})" in line and all(s in line for s in rule.all | rule.any) for line in lines)


def test_a_rule_with_its_own_action_shows_it():
    rule = next(r for r in KB.rules if r.action)
    assert any(f"action: {rule.action}" in line for line in pointing_symptoms(rule.cause, KB))


def test_unknown_cause_suggests_close_ids():
    with pytest.raises(UnknownCause, match="unknown cause 'gpu-missin'; did you mean gpu-missing"):
        find_cause("gpu-missin", KB)
    with pytest.raises(UnknownCause, match="explain --list"):
        find_cause("zzzz", KB)


def test_list_is_sorted_and_complete():
    lines = list_causes(KB).splitlines()
    assert [line.split()[0] for line in lines] == sorted(KB.causes)
    assert any(line.startswith("gpu-missing ") and line.endswith("Fewer GPUs than the platform has") for line in lines)


def test_cli_explain(capsys):
    assert main(["explain", "thermal-throttling"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("thermal-throttling: Thermal slowdown\n") and "thermal-throttling + throughput-cliff (high)" in out
    assert main(["explain", "--list"]) == 0
    assert "nic-fw-driver-mismatch" in capsys.readouterr().out
    assert main(["explain", "no-such-cause"]) == 2
    assert "unknown cause 'no-such-cause'" in capsys.readouterr().err.replace("\n", " ")
