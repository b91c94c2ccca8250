"""playbooks/lifecycle.yaml and a site's file: loaded, checked against the knowledge base, and
refused with the file and field when wrong."""

from __future__ import annotations

import pytest

from preflight.diagnose.engine import load_knowledge
from preflight.lifecycle.policy import PolicyError, load

CAUSES = set(load_knowledge().causes)


def test_the_shipped_policy_names_only_known_causes_and_sources_its_steps():
    policy, timings = load(causes_known=CAUSES)
    assert policy.of("gpu-ecc-uncorrectable").confirm == "once"
    assert policy.of("gpu-fallen-off-bus").step == "reboot"
    assert policy.of("fabric-manager-down").service == "nvidia-fabricmanager"
    assert policy.of("thermal-throttling").confirm == "again" and policy.of("thermal-throttling").step == "none"
    assert policy.of("no-such-cause") == policy.default and policy.default.confirm == "again"
    assert timings["escalate_window_s"] == 7 * 86400 and policy.escalate_incidents == 3


def test_a_site_file_overrides_and_silences(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("format: preflight-lifecycle/1\ntimings: {confirm_delay_s: 60}\n"
                    "causes: {thermal-throttling: {confirm: once, step: none, person: call facilities}}\n"
                    "silences:\n  - {node: gpu017, cause: nvlink-errors, owner: alice, reason: RMA 4711 open, "
                    "expires: 2026-12-31}\n")
    policy, _ = load(site, CAUSES)
    assert policy.confirm_delay_s == 60 and policy.of("thermal-throttling").confirm == "once"
    (s,) = policy.silences
    assert (s.node, s.cause, s.owner) == ("gpu017", "nvlink-errors", "alice")
    assert policy.silenced("gpu017", "nvlink-errors", s.expires - 1) and not policy.silenced("gpu017", "nvlink-errors",
                                                                                            s.expires + 1)


@pytest.mark.parametrize("body, message", [
    ("timings: {}\n", "not a preflight-lifecycle/1 file"),
    ("format: preflight-lifecycle/1\ncauses: {gpu-ecc-uncorrectable: {confirm: twice}}\n",
     "causes.gpu-ecc-uncorrectable.confirm: 'once' or 'again', not 'twice'"),
    ("format: preflight-lifecycle/1\ncauses: {gpu-ecc-uncorrectable: {step: pray}}\n", ".step: one of reset"),
    ("format: preflight-lifecycle/1\ncauses: {fabric-manager-down: {step: restart}}\n", "a restart names its service"),
    ("format: preflight-lifecycle/1\ncauses: {gpu-on-fire: {}}\n", "causes.gpu-on-fire: no such cause"),
    ("format: preflight-lifecycle/1\ntimings: {confirm_delay: 5}\n", "timings.confirm_delay: unknown"),
    ("format: preflight-lifecycle/1\ntimings: {confirm_k: -1}\n", "timings.confirm_k: a number >= 0"),
    ("format: preflight-lifecycle/1\nsilences: [{node: n1, cause: x, owner: bob}]\n",
     "silences[0]: missing reason, expires"),
    ("format: preflight-lifecycle/1\nsilences: [{node: n1, cause: x, owner: bob, reason: r, expires: soon}]\n",
     "silences[0]: expires must be a date"),
])
def test_a_bad_site_file_is_refused_with_file_and_field(tmp_path, body, message):
    site = tmp_path / "site.yaml"
    site.write_text(body)
    with pytest.raises(PolicyError) as caught:
        load(site, CAUSES)
    assert str(site) in str(caught.value) and message in str(caught.value)
