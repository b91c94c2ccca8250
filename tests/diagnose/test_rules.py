"""Every rule of playbooks/rules.yaml, and the seed field table, against preflight.diagnose.engine.

The per-rule cases are generated from the rules file itself, so a rule added there is tested
without touching this file:

- positive: on one host, the rule's `all` symptoms plus the first of its `any` yield its cause
  at its confidence, carrying those symptoms; its `action` when it has one; and a high rule
  leaves no separate diagnosis for a symptom it `explains`.
- negative: the same evidence less one required symptom (each of `all`, or every `any`) does
  not yield the rule's diagnosis (its cause, at its confidence, carrying its symptoms).

Fleet rules (`fleet:` entries) get their own generated cases. The seed table cases below build
their evidence from the real checks where one exists (the soak analysis on telemetry derived
from the real H200 burn, the NIC checks on the derived ConnectX-8 node, the persistence check
on the derived H200 XML); the symptoms no check emits yet (vLLM and tensor-parallel ones) are
synthetic findings, as their emitters will report them.
"""

from __future__ import annotations

import math

import pytest
import soak_scenarios
from ctx import make_host, run_check
from derived import (
    MLX5_CMD_TIMEOUT_DMESG,
    cx8_ibstat,
    doca_ethtool,
    doca_ofed_info,
    h200_node_xml,
    with_gpu_values,
)

from preflight.diagnose.engine import FleetRule, KnowledgeBase, Rule, diagnose, load_knowledge
from preflight.model import Finding, Status
from preflight.soak.analysis import analyze as analyze_soak

KB = load_knowledge()
# A real cause on its own that no rule mentions: the context of every negative case.
UNRELATED = next(c for c in sorted(KB.causes)
                 if not any(c in r.all | r.any | r.explains for r in KB.rules)
                 and not any(c in r.any | r.unless for r in KB.fleet_rules))


def finding(host, symptom, status=Status.FAIL, check=None):
    return Finding(check or f"check-{symptom}", host, status, f"{symptom} seen on {host}", (symptom,))


def on_host(symptoms, host="gpu01"):
    return [finding(host, s) for s in sorted(symptoms)]


def signature(rule: Rule) -> set[str]:
    return set(rule.all) | ({min(rule.any)} if rule.any else set())


def carries_rule(diagnoses, rule: Rule) -> list:
    """Diagnoses that can only have come from this rule: its cause and confidence, carrying a
    symptom of the rule other than the cause id itself (which any check may report directly)."""
    mine = (rule.all | rule.any) - {rule.cause}
    return [d for d in diagnoses if d.cause == rule.cause and d.confidence == rule.confidence
            and set(d.symptoms) & mine]


RULES = [pytest.param(r, id=f"{i + 1}-{r.cause}") for i, r in enumerate(KB.rules)]


def test_the_rules_file_has_rules_and_fleet_rules():
    assert len(KB.rules) >= 10 and len(KB.fleet_rules) >= 2
    assert {r.pattern for r in KB.fleet_rules} == {"every-host", "few-hosts"}


@pytest.mark.parametrize("rule", RULES)
def test_rule_positive(rule):
    sig = signature(rule)
    diagnoses = diagnose(on_host(sig), KB)
    hits = [d for d in diagnoses if d.cause == rule.cause and d.confidence == rule.confidence and sig <= set(d.symptoms)]
    assert hits, [(d.cause, d.confidence, d.symptoms) for d in diagnoses]
    assert hits[0].hosts == ("gpu01",)
    assert hits[0].title == KB.causes[rule.cause].title
    if rule.action:
        assert hits[0].action == rule.action
    if rule.confidence == "high":
        echoes = (rule.explains & sig) - {rule.cause}
        assert not [d.cause for d in diagnoses if d.cause in echoes]


@pytest.mark.parametrize("rule", RULES)
def test_rule_negative(rule):
    sig = signature(rule)
    near_misses = [sig - {s} for s in sorted(rule.all)]
    if rule.any:
        near_misses.append(sig - rule.any)
    for symptoms in near_misses:
        diagnoses = diagnose(on_host(symptoms | {UNRELATED}), KB)
        assert not carries_rule(diagnoses, rule), (sorted(symptoms), [(d.cause, d.symptoms) for d in diagnoses])
        assert any(d.cause == UNRELATED for d in diagnoses)


# ---- fleet rules, generated ---------------------------------------------------------------------

EVERY = [pytest.param(r, id=f"every-host-{r.cause}") for r in KB.fleet_rules if r.pattern == "every-host"]
FEW = [pytest.param(r, id=f"few-hosts-{i}") for i, r in enumerate(KB.fleet_rules) if r.pattern == "few-hosts"]


def fleet(n, affected, symptom, extra=None):
    """n hosts judged by one check; the first `affected` show `symptom`, the rest pass it."""
    hosts = [f"gpu{i:02d}" for i in range(1, n + 1)]
    out = [finding(h, symptom, Status.FAIL if i < affected else Status.PASS, check="the-check")
           for i, h in enumerate(hosts)]
    return out + (extra or [])


@pytest.mark.parametrize("rule", EVERY)
def test_every_host_positive(rule: FleetRule):
    symptom = min(rule.any)
    n = max(rule.min_hosts, 3)
    diagnoses = diagnose(fleet(n, n, symptom), KB)
    [shared] = [d for d in diagnoses if d.cause == rule.cause]
    assert shared.hosts == tuple(f"gpu{i:02d}" for i in range(1, n + 1))
    assert shared.confidence == rule.confidence
    assert shared.evidence.startswith(f"all {n} hosts judged show it: gpu01: {symptom} seen on gpu01")
    assert shared.action == (rule.action or KB.causes[rule.cause].actions[0])
    # The shared cause replaces the per-host diagnoses that symptom alone would give.
    assert not [d for d in diagnoses if d.cause == symptom]


@pytest.mark.parametrize("rule", EVERY)
def test_every_host_negative(rule: FleetRule):
    symptom = min(rule.any)
    n = max(rule.min_hosts, 3)
    one_passes = diagnose(fleet(n, n - 1, symptom), KB)
    assert not [d for d in one_passes if d.cause == rule.cause]
    if symptom in KB.causes:  # then each slow host keeps its own diagnosis
        assert [d.hosts for d in one_passes if d.cause == symptom] == [tuple(f"gpu{i:02d}" for i in range(1, n))]
    for differ in sorted(rule.unless):
        drift = diagnose(fleet(n, n, symptom, [finding("gpu01", differ)]), KB)
        assert not [d for d in drift if d.cause == rule.cause], differ
    too_few = diagnose(fleet(rule.min_hosts - 1, rule.min_hosts - 1, symptom), KB) if rule.min_hosts > 1 else []
    assert not [d for d in too_few if d.cause == rule.cause]


@pytest.mark.parametrize("rule", FEW)
def test_few_hosts_positive(rule: FleetRule):
    n = max(rule.min_hosts, math.ceil(1 / rule.max_fraction))
    for symptom in sorted(rule.any):
        diagnoses = diagnose(fleet(n, 1, symptom), KB)
        mine = [d for d in diagnoses if "gpu01" in d.hosts]
        assert mine, symptom
        for d in mine:
            assert f"only 1 of {n} hosts show {symptom}; the other {n - 1} do not" in d.evidence
            assert d.confidence == rule.confidence or rule.confidence != "high"


@pytest.mark.parametrize("rule", FEW)
def test_few_hosts_negative(rule: FleetRule):
    n = max(rule.min_hosts, math.ceil(1 / rule.max_fraction))
    symptom = min(rule.any)
    half = diagnose(fleet(2 * n, n, symptom), KB)
    assert half and not [d for d in half if "only " in d.evidence]
    small = diagnose(fleet(rule.min_hosts - 1, 1, symptom), KB)
    assert not [d for d in small if "only " in d.evidence]


def test_few_hosts_raises_a_weaker_rule_to_its_confidence():
    """The confidence raise, with a medium rule (generated cases use cause-id symptoms, which
    are high already)."""
    kb = KnowledgeBase(KB.causes, (Rule("nccl-low-bandwidth", frozenset({"busbw-dip"}), confidence="medium"),),
                       (FleetRule("few-hosts", frozenset({"busbw-dip"}), confidence="high", min_hosts=4),))
    one = diagnose(fleet(8, 1, "busbw-dip"), kb)
    assert [(d.cause, d.hosts, d.confidence) for d in one] == [("nccl-low-bandwidth", ("gpu01",), "high")]
    three = diagnose(fleet(8, 3, "busbw-dip"), kb)
    assert [(d.cause, d.confidence) for d in three] == [("nccl-low-bandwidth", "medium")]


@pytest.mark.parametrize("entry, message", [
    ({"fleet": "most-hosts", "any": ["x"]}, "fleet must be one of every-host, few-hosts"),
    ({"fleet": "every-host", "any": ["x"], "cause": "nope"}, "unknown cause 'nope'"),
    ({"fleet": "few-hosts", "any": ["x"], "cause": "gpu-missing"}, "keeps each host's own cause"),
    ({"fleet": "few-hosts", "any": []}, "needs 'any' symptoms"),
    ({"fleet": "few-hosts", "any": ["x"], "max_fraction": 1.5}, "max_fraction between 0 and 1"),
])
def test_bad_fleet_rules_are_refused(tmp_path, entry, message):
    import yaml

    from preflight.diagnose.engine import PlaybookError

    (tmp_path / "causes.yaml").write_text(yaml.safe_dump({"gpu-missing": {"title": "X", "actions": ["do"]}}))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump([entry]))
    with pytest.raises(PlaybookError, match=message):
        load_knowledge(tmp_path)


def test_causes_with_a_non_text_item_are_refused(tmp_path):
    """`- Check lspci -d 15b3: for ...` unquoted is a mapping to YAML, not an action."""
    from preflight.diagnose.engine import PlaybookError

    (tmp_path / "causes.yaml").write_text("x:\n  title: X\n  actions:\n    - Check lspci -d 15b3: for the NICs\n")
    (tmp_path / "rules.yaml").write_text("[]\n")
    with pytest.raises(PlaybookError, match="cause 'x': every item of actions must be text"):
        load_knowledge(tmp_path)


def test_several_rules_reaching_one_cause_on_a_host_give_one_diagnosis():
    """Three rules of rules.yaml name nic-fw-driver-mismatch for this evidence: one diagnosis,
    the strongest rule's, carrying every symptom they used."""
    diagnoses = diagnose(on_host({"nic-fw-driver-mismatch", "nccl-hang", "mlx5-cmd-timeout"}), KB)
    assert [(d.cause, d.confidence) for d in diagnoses] == [("nic-fw-driver-mismatch", "high")]
    assert set(diagnoses[0].symptoms) == {"nic-fw-driver-mismatch", "nccl-hang", "mlx5-cmd-timeout"}


# ---- the seed field table -----------------------------------------------------------------------

def causes(diagnoses):
    return {d.cause: d for d in diagnoses}


def test_seed_throughput_drops_after_a_while_is_thermal():
    """Soak telemetry derived from the real H200 burn with a thermal cliff at 15 min."""
    result = analyze_soak(soak_scenarios.thermal_cliff())
    got = causes(diagnose(list(result.findings), KB))
    assert set(got) == {"thermal-throttling"}
    assert got["thermal-throttling"].confidence == "high"
    assert "throughput-cliff" in got["thermal-throttling"].symptoms
    assert "airflow" in got["thermal-throttling"].action
    # Negative: the steady hour (same samples, no cliff) diagnoses nothing.
    assert diagnose(list(analyze_soak(soak_scenarios.steady()).findings), KB) == []


def cx8_node(fw, **probes):
    base = {"ibstat": cx8_ibstat(8, fw), "ethtool-i": doca_ethtool(fw), "ofed-info": doca_ofed_info()}
    return make_host({**base, **probes}, profile="hgx-b300", name="gpu017")


def nic_findings(host):
    return run_check("nic-fw-driver-mismatch", host) + run_check("mlx5-kernel-log", host)


def test_seed_intermittent_nccl_is_the_nic_firmware():
    """The field lesson: CX-8 fw 40.44.1036 under DOCA 3.1 (which ships 40.46.1006), mlx5 command
    timeouts in dmesg, and all_reduce unstable on that node."""
    host = cx8_node("40.44.1036", **{"kernel-log": MLX5_CMD_TIMEOUT_DMESG})
    unstable = Finding("nccl-all-reduce", "gpu017", Status.WARN, "busbw varies 18% between repetitions",
                       ("nccl-unstable",))
    got = causes(diagnose(nic_findings(host) + [unstable], KB))
    assert set(got) == {"nic-fw-driver-mismatch"}
    d = got["nic-fw-driver-mismatch"]
    assert d.confidence == "high" and d.hosts == ("gpu017",)
    assert {"nccl-unstable", "mlx5-cmd-timeout"} <= set(d.symptoms)
    assert d.action.startswith("update NIC firmware to 40.46.1006 with mlxfwmanager -u")
    # Negative: the same node on the firmware DOCA 3.1 ships; the instability stands alone.
    fixed = causes(diagnose(nic_findings(cx8_node("40.46.1006")) + [unstable], KB))
    assert set(fixed) == {"nccl-unstable"}


def test_seed_intermittent_nccl_with_mlx5_timeouts_but_no_firmware_verdict():
    got = causes(diagnose(on_host({"nccl-hang", "mlx5-cmd-timeout"}), KB))
    assert got["nic-fw-driver-mismatch"].confidence == "medium"
    assert "re-run nccl-tests all_reduce" in got["nic-fw-driver-mismatch"].action
    assert "nic-fw-unresponsive" not in got


def test_seed_vllm_quantized_graph_capture_error_says_enforce_eager():
    got = causes(diagnose(on_host({"vllm-quantized-model", "vllm-illegal-memory-access", "xid-31", "gpu-app-fault"}), KB))
    assert set(got) == {"vllm-cuda-graph-quantized"}
    assert "--enforce-eager" in got["vllm-cuda-graph-quantized"].action
    # Negative: an Xid 31 on a host that serves no quantized model is the application's fault.
    assert set(causes(diagnose(on_host({"xid-31", "gpu-app-fault"}), KB))) == {"gpu-app-fault"}


def test_seed_cross_node_tensor_parallel_keeps_tp_inside_nvlink():
    got = causes(diagnose(on_host({"tp-cross-node-slow"}), KB))
    assert "NVLink domain" in got["tp-across-nodes"].action
    with_gdr_off = causes(diagnose(on_host({"tp-cross-node-slow", "nccl-gdr-disabled"}), KB))
    assert set(with_gdr_off) == {"nccl-gdr-disabled"}
    assert "nvidia-peermem" in with_gdr_off["nccl-gdr-disabled"].action


def test_seed_gpu_links_degraded_to_pcie_says_topo():
    got = causes(diagnose(on_host({"nvlink-down", "nccl-low-bandwidth"}), KB))
    assert set(got) == {"nvlink-down"} and got["nvlink-down"].confidence == "high"
    assert "nvidia-smi topo -m" in got["nvlink-down"].action


def test_seed_latency_spikes_point_at_persistence_mode():
    """The persistence-mode check on the derived 8-GPU H200 XML with GPU 3's persistence off."""
    xml = with_gpu_values(h200_node_xml(8), 3, {"persistence_mode": "Disabled"})
    checked = run_check("persistence-mode", make_host({"nvidia-smi-q-x": xml}, profile="hgx-h200", name="gpu01"))
    assert checked[0].symptoms == ("persistence-mode-off",)
    spikes = finding("gpu01", "latency-spikes", Status.WARN)
    got = causes(diagnose(checked + [spikes], KB))
    assert set(got) == {"persistence-mode-off"}
    assert "latency-spikes" in got["persistence-mode-off"].symptoms
    assert "nvidia-persistenced" in got["persistence-mode-off"].action
    # Persistence on: the spikes point at host power saving, with low confidence.
    healthy = run_check("persistence-mode", make_host({"nvidia-smi-q-x": h200_node_xml(8)}, profile="hgx-h200", name="gpu01"))
    got = causes(diagnose(healthy + [spikes], KB))
    assert set(got) == {"latency-power-saving"} and got["latency-power-saving"].confidence == "low"


def test_seed_fleet_one_hot_host_is_that_host():
    """Soak telemetry derived from the real burn on 4 hosts, vm3 running 15 K hotter."""
    result = analyze_soak(soak_scenarios.hot_host_in_fleet())
    diagnoses = diagnose(list(result.findings), KB)
    assert [d.hosts for d in diagnoses] == [("vm3",)]
    assert "only 1 of 4 hosts show gpu-outlier" in diagnoses[0].evidence


def test_seed_fleet_all_hosts_slow_alike_is_configuration():
    slow = [Finding("nccl-all-reduce", f"gpu{i:02d}", Status.FAIL, "busbw 310 GB/s, expected >= 430", ("nccl-low-bandwidth",))
            for i in range(1, 9)]
    inventory = [Finding("fleet-consistency", f"gpu{i:02d}", Status.PASS, "same driver / CUDA as the fleet")
                 for i in range(1, 9)]
    got = causes(diagnose(slow + inventory, KB))
    assert set(got) == {"nccl-fleet-config"}
    assert len(got["nccl-fleet-config"].hosts) == 8
    drifted = inventory[:7] + [Finding("fleet-consistency", "gpu08", Status.FAIL, "driver 570", ("driver-version-drift",))]
    assert "nccl-fleet-config" not in causes(diagnose(slow + drifted, KB))
