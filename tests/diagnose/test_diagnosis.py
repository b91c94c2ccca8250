import pytest
import yaml

from preflight.diagnose.engine import KnowledgeBase, PlaybookError, diagnose, load_knowledge
from preflight.model import Finding, Status

CONTRACT_CAUSES = """nic-fw-driver-mismatch nic-fw-inconsistent ib-port-down ib-link-degraded nvlink-down
nvlink-errors fabric-manager-down gpu-missing gpu-fallen-off-bus gpu-ecc-uncorrectable gpu-row-remap
pcie-link-degraded thermal-throttling power-capping throughput-cliff nccl-low-bandwidth nccl-unstable
nccl-hang nccl-data-corruption driver-version-drift host-unreachable tool-missing""".split()


def test_every_contract_cause_has_an_entry_with_actions():
    kb = load_knowledge()
    for cause in CONTRACT_CAUSES:
        assert cause in kb.causes, cause
        assert kb.causes[cause].actions and all(isinstance(a, str) for a in kb.causes[cause].actions)


def _f(host, symptoms, status=Status.FAIL, summary="s", action=None, **data):
    return Finding("c", host, status, summary, tuple(symptoms), data=data, action=action)


def _kb(rules):
    kb = load_knowledge()
    from preflight.diagnose.engine import Rule
    return KnowledgeBase(kb.causes, tuple(Rule(**r) for r in rules))


def test_symptom_that_is_a_cause_id_diagnoses_itself_and_merges_hosts():
    kb = load_knowledge()
    ds = diagnose([_f("a", ["gpu-missing"]), _f("b", ["gpu-missing"]), _f("c", [], Status.PASS)], kb)
    assert [(d.cause, d.hosts, d.confidence) for d in ds] == [("gpu-missing", ("a", "b"), "high")]
    assert ds[0].action == kb.causes["gpu-missing"].actions[0]


def test_passing_findings_and_unknown_symptoms_diagnose_nothing():
    kb = load_knowledge()
    assert diagnose([_f("a", ["gpu-missing"], Status.PASS), _f("b", ["no-such-symptom"])], kb) == []


def test_a_rule_explains_its_echoes_on_the_same_host_only():
    kb = _kb([dict(cause="nic-fw-driver-mismatch", all=frozenset({"nic-fw-older-than-driver"}),
                   any=frozenset({"nccl-hang", "nccl-unstable"}), confidence="high",
                   explains=frozenset({"nccl-hang", "nccl-unstable"}))])
    ds = diagnose([_f("a", ["nic-fw-older-than-driver"]), _f("a", ["nccl-hang"]), _f("b", ["nccl-hang"])], kb)
    got = {(d.cause, d.hosts) for d in ds}
    # On host a the hang is an echo of the firmware mismatch; on b it stands alone.
    assert got == {("nic-fw-driver-mismatch", ("a",)), ("nccl-hang", ("b",))}


def test_finding_specific_action_wins_over_the_generic_one():
    kb = load_knowledge()
    ds = diagnose([_f("a", ["driver-version-drift"], action="move a to driver 580")], kb)
    assert ds[0].action == "move a to driver 580"


def test_bad_rule_files_are_refused_with_their_location(tmp_path):
    (tmp_path / "causes.yaml").write_text(yaml.safe_dump({"x": {"title": "X", "actions": ["do"]}}))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump([{"cause": "y", "all": ["s"]}]))
    with pytest.raises(PlaybookError, match="rule 1: unknown cause 'y'"):
        load_knowledge(tmp_path)
    (tmp_path / "rules.yaml").write_text("- cause: x\n  all: [s\n")
    with pytest.raises(PlaybookError, match="rules.yaml:.*invalid YAML"):
        load_knowledge(tmp_path)
