"""playbooks/lifecycle.yaml and a site's file: loaded, checked against the knowledge base, and
refused with the file and field when wrong."""

from __future__ import annotations

import pytest

from preflight.diagnose.engine import load_knowledge
from preflight.judge.loader import load_checks
from preflight.lifecycle.policy import PolicyError, load

CAUSES = set(load_knowledge().causes)
CHECKS = {c.id for c in load_checks()}


def test_the_shipped_policy_names_only_known_causes_and_sources_its_steps():
    policy, timings = load(causes_known=CAUSES, checks_known=CHECKS)  # its acceptance checks exist too
    assert policy.of("gpu-ecc-uncorrectable").confirm == "once"
    assert policy.of("gpu-fallen-off-bus").step == "reboot"
    assert policy.of("fabric-manager-down").service == "nvidia-fabricmanager"
    assert policy.of("thermal-throttling").confirm == "again" and policy.of("thermal-throttling").step == "none"
    assert policy.of("no-such-cause") == policy.default and policy.default.confirm == "again"
    assert timings["escalate_window_s"] == 7 * 86400 and policy.escalate_incidents == 3
    assert policy.of("nvlink-errors").ladder() == ("reset", "reboot")  # WORKFLOW_NVLINK_ERR: reset, or reboot
    assert policy.of("thermal-throttling").ladder() == ()
    assert (timings["capture_timeout_s"], timings["capture_max_bytes"]) == (300, 128 << 20)


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
    ("format: preflight-lifecycle/1\ntimings: {capture_timeout_s: 5}\n",
     "timings.capture_timeout_s: 0 (no capture before a step) or at least 20 seconds"),
    ("format: preflight-lifecycle/1\ntimings: {capture_timeout_s: .nan}\n", "timings.capture_timeout_s: a number >= 0"),
    ("format: preflight-lifecycle/1\ntimings: {capture_max_bytes: 1.5}\n",
     "timings.capture_max_bytes: a whole number"),
    ("format: preflight-lifecycle/1\ntimings: {capture_max_bytes: 0}\n", "timings.capture_max_bytes: at least 1 byte"),
    ("format: preflight-lifecycle/1\ncauses: {nvlink-errors: {step: reset, then: reboot}}\n",
     "causes.nvlink-errors.then: a list of steps"),
    ("format: preflight-lifecycle/1\ncauses: {nvlink-errors: {step: reset, then: [pray]}}\n",
     "causes.nvlink-errors.then: not a step: 'pray'"),
    ("format: preflight-lifecycle/1\ncauses: {nvlink-errors: {step: reset, then: [none]}}\n",
     "causes.nvlink-errors.then: not a step: 'none'"),
    ("format: preflight-lifecycle/1\ncauses: {nvlink-errors: {step: reset, then: [reboot, reset]}}\n",
     "causes.nvlink-errors.then: a step appears twice"),
    ("format: preflight-lifecycle/1\ncauses: {nvlink-errors: {step: none, then: [reboot]}}\n",
     "causes.nvlink-errors.then: a cause whose step is none has no next step"),
    ("format: preflight-lifecycle/1\ncauses: {nvlink-errors: {step: reset, then: [restart]}}\n",
     "causes.nvlink-errors.service: a restart names its service"),
    ("format: preflight-lifecycle/1\ntimings: {confirm_delay: 5}\n", "timings.confirm_delay: unknown"),
    ("format: preflight-lifecycle/1\ntimings: {confirm_k: -1}\n", "timings.confirm_k: a number >= 0"),
    ("format: preflight-lifecycle/1\nsilences: [{node: n1, cause: x, owner: bob}]\n",
     "silences[0]: missing reason, expires"),
    ("format: preflight-lifecycle/1\nsilences: [{node: n1, cause: nvlink-errors, owner: bob, reason: r, "
     "expires: soon}]\n",
     "silences[0]: expires must be a date"),
    # Sections of the wrong shape (issue 31: a traceback before).
    ("format: preflight-lifecycle/1\ntimings: [confirm_k, 3]\n", "timings: must be a mapping"),
    ("format: preflight-lifecycle/1\ncauses: [gpu-ecc-uncorrectable]\n", "causes: must be a mapping"),
    ("format: preflight-lifecycle/1\nsilences: {node: n1}\n", "silences: must be a list"),
    ("format: preflight-lifecycle/1\nsilences: 3\n", "silences: must be a list"),
    # A date that does not exist is a YAML error at its line, not a traceback.
    ("format: preflight-lifecycle/1\nsilences:\n  - {node: n1, cause: nvlink-errors, owner: bob, reason: r, "
     "expires: 2026-02-30}\n", ":3: invalid YAML ('2026-02-30' is not a date"),
    # Timings that were accepted silently: NaN, infinity, a fraction where a count belongs.
    ("format: preflight-lifecycle/1\ntimings: {confirm_delay_s: .nan}\n", "timings.confirm_delay_s: a number >= 0"),
    ("format: preflight-lifecycle/1\ntimings: {step_timeout_s: .inf}\n", "timings.step_timeout_s: a number >= 0"),
    ("format: preflight-lifecycle/1\ntimings: {confirm_k: 2.5}\n", "timings.confirm_k: a whole number"),
    ("format: preflight-lifecycle/1\ntimings: {breaker_drains: .nan}\n", "timings.breaker_drains: a number >= 0"),
    ("format: preflight-lifecycle/1\ntimings: {breaker_fraction: 1.5}\n", "timings.breaker_fraction: a share"),
    # Silences: a cause that does not exist, fields of the wrong type.
    ("format: preflight-lifecycle/1\nsilences: [{node: n1, cause: gpu-on-fire, owner: bob, reason: r, "
     "expires: 2026-12-31}]\n", "silences[0].cause: 'gpu-on-fire': no such cause"),
    ("format: preflight-lifecycle/1\nsilences: [{node: 17, cause: nvlink-errors, owner: bob, reason: r, "
     "expires: 2026-12-31}]\n", "silences[0].node: a text, not 17"),
    ("format: preflight-lifecycle/1\nsilences: [{node: n1, cause: nvlink-errors, owner: [bob], reason: r, "
     "expires: 2026-12-31}]\n", "silences[0].owner: a text, not ['bob']"),
    ("format: preflight-lifecycle/1\nsilences: [{node: n1, cause: nvlink-errors, owner: bob, reason: yes, "
     "expires: 2026-12-31}]\n", "silences[0].reason: a text, not True"),
    # An acceptance check that does not exist would fail every retest of the cause.
    ("format: preflight-lifecycle/1\ncauses: {gpu-ecc-uncorrectable: {acceptance: [dcgm-diagg]}}\n",
     "causes.gpu-ecc-uncorrectable.acceptance: no such check: dcgm-diagg"),
])
def test_a_bad_site_file_is_refused_with_file_and_field(tmp_path, body, message):
    site = tmp_path / "site.yaml"
    site.write_text(body)
    with pytest.raises(PolicyError) as caught:
        load(site, CAUSES, CHECKS)
    assert str(site) in str(caught.value) and message in str(caught.value)


def test_a_silence_may_name_every_cause_and_counts_may_be_written_as_whole_floats(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("format: preflight-lifecycle/1\ntimings: {confirm_k: 2.0, breaker_fraction: 0.25}\n"
                    "silences: [{node: '*', cause: '*', owner: bob, reason: maintenance, expires: 2026-12-31}]\n")
    policy, timings = load(site, CAUSES, CHECKS)
    assert policy.confirm_k == 2 and isinstance(policy.confirm_k, int) and timings["breaker_fraction"] == 0.25
    assert policy.silences[0].cause == "*"
