"""Every symptom a check can emit leads somewhere an operator can read: a cause that
``preflight explain`` shows, or a rule of rules.yaml that weighs it into one.

Symptoms are gathered three ways: the literals checks pass as ``symptoms=`` (and the soak
analysis as a Finding's symptoms), the data files that name symptoms (the Xid catalog's causes,
the NCCL log signatures), and what the checks actually emit over the example fleet, whose hosts
carry real faults.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from preflight.app.cli import main
from preflight.diagnose.engine import load_knowledge
from preflight.diagnose.explain import explain
from preflight.knowledge.xid_catalog import load_xid_catalog
from preflight.parse.nccl_signatures import NCCL_SIGNATURES

ROOT = Path(__file__).resolve().parents[2]
KB = load_knowledge()
_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)+$")
# Symptoms that describe the run, not the node, and need no cause of their own.
RUN_SYMPTOMS = {
    "check-crashed": "a check raised: a bug to report against the check, named in the finding",
}


def _literals(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and _ID.match(n.value)]


def static_symptoms() -> dict[str, str]:
    files = sorted((ROOT / "checks").glob("*.py")) + sorted((ROOT / "preflight" / "soak").glob("*.py")) + [
        ROOT / "preflight" / "judge" / p for p in ("analyze.py", "missing.py", "facts.py")]
    found: dict[str, str] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            picked: list[str] = []
            if isinstance(node, ast.keyword) and node.arg == "symptoms":
                picked = _literals(node.value)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and "SYMPTOM" in t.id
                                                      for t in node.targets):
                picked = _literals(node.value)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" and len(node.args) > 4:
                picked = _literals(node.args[4])
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "EvidenceMissing" \
                    and len(node.args) > 1:
                picked = _literals(node.args[1])
            for s in picked:
                found.setdefault(s, path.relative_to(ROOT).as_posix())
    return found


def data_symptoms() -> dict[str, str]:
    found = {symptom: "preflight/parse/nccl_tests.py NCCL_SIGNATURES" for _, symptom, _ in NCCL_SIGNATURES}
    catalog = load_xid_catalog()
    entries = catalog.entries.values() if isinstance(catalog.entries, dict) else catalog.entries
    found.update({e.cause: "playbooks/xid.yaml" for e in entries if e.cause})
    return found


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("fleet")
    main(["analyze", str(ROOT / "examples" / "h200-fleet"), "--out", str(out), "-q", "--no-html"])
    import json

    [report] = out.glob("*/report.json")
    return {s: f"{f['check']} on {f['host']}" for f in json.loads(report.read_text())["findings"]
            for s in f["symptoms"]}


def leads_somewhere(symptom: str) -> bool:
    if symptom in KB.causes:
        return bool(explain(symptom, KB).strip())
    weighed = {s for r in KB.rules for s in r.all | r.any} | {s for r in KB.fleet_rules for s in r.any}
    return symptom in weighed or symptom in RUN_SYMPTOMS


def test_every_symptom_in_the_checks_has_a_cause_or_a_rule():
    lost = {s: where for s, where in static_symptoms().items() if not leads_somewhere(s)}
    assert not lost, f"symptoms no cause or rule reads: {lost}"


def test_every_symptom_the_data_files_name_has_a_cause_or_a_rule():
    lost = {s: where for s, where in data_symptoms().items() if not leads_somewhere(s)}
    assert not lost, f"symptoms no cause or rule reads: {lost}"


def test_every_symptom_emitted_over_the_example_fleet_has_a_cause_or_a_rule(emitted):
    assert {"nic-fw-driver-mismatch", "nccl-hang", "nvlink-down", "host-unreachable"} <= emitted.keys()
    lost = {s: where for s, where in emitted.items() if not leads_somewhere(s)}
    assert not lost, f"symptoms no cause or rule reads: {lost}"


def test_every_check_cause_is_explained_by_the_cli(capsys):
    for cause in sorted(s for s in static_symptoms() if s in KB.causes):
        assert main(["explain", cause]) == 0
        assert capsys.readouterr().out.startswith(f"{cause}: ")
