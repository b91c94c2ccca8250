"""Judging hosts as their records complete (preflight/judge/incremental.py), on the recorded
example fleet: the early judgements change no verdict, and stale ones are never used."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import preflight.judge.analyze as analyze_mod
from preflight.diagnose.analysis import analyze
from preflight.diagnose.engine import load_knowledge
from preflight.evidence.bundle import read_bundle
from preflight.judge.analyze import judge
from preflight.judge.incremental import IncrementalJudge
from preflight.judge.loader import load_checks
from preflight.knowledge.profiles import load_profiles

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "h200-fleet"


@pytest.fixture(scope="module")
def setting():
    return read_bundle(FLEET), load_checks(use_entry_points=False), load_profiles()


def _offer_as_a_run_would(early: IncrementalJudge, bundle, cut_short: str | None = None) -> None:
    """Each host's records handed over one at a time, growing, as the run's writer does; the
    last record of ``cut_short`` never comes (its run was still going when the fleet ended)."""
    for host in bundle.hosts:
        records = list(bundle.probes_of(host).items())
        so_far = {}
        for probe, record in records[:-1] if host == cut_short else records:
            so_far[probe] = record
            early.offer(host, dict(so_far))


def test_hosts_judged_early_give_the_verdicts_and_findings_of_judging_at_the_end(setting):
    bundle, checks, profiles = setting
    planned = bundle.header["probes"]
    early = IncrementalJudge(checks, profiles, planned)
    _offer_as_a_run_would(early, bundle, cut_short="gpu004")
    judged = early.judged(bundle)
    assert set(judged) == set(bundle.hosts) - {"gpu004"}
    assert judge(bundle, checks, profiles, judged=judged) == judge(bundle, checks, profiles)
    kb = load_knowledge()
    early_run, at_end = analyze(bundle, checks, profiles, kb, judged=judged), analyze(bundle, checks, profiles, kb)
    assert (early_run.hosts, early_run.findings, early_run.diagnoses) == (at_end.hosts, at_end.findings, at_end.diagnoses)
    # The example fleet's faults are there to be found: the comparison is of real verdicts.
    assert {v.status for v in early_run.hosts.values()} >= {"pass", "fail"}


def test_the_final_pass_judges_only_the_hosts_not_judged_early(setting, monkeypatch):
    bundle, checks, profiles = setting
    planned = bundle.header["probes"]
    early = IncrementalJudge(checks, profiles, planned)
    _offer_as_a_run_would(early, bundle, cut_short="gpu002")
    judged = early.judged(bundle)
    seen = []
    real = analyze_mod.judge_host
    monkeypatch.setattr(analyze_mod, "judge_host", lambda host, *a, **k: seen.append(host) or real(host, *a, **k))
    judge(bundle, checks, profiles, judged=judged)
    assert seen == ["gpu002"]


def test_a_host_whose_records_changed_after_its_judgement_is_judged_again(setting):
    bundle, checks, profiles = setting
    host = next(h for h in bundle.hosts if set(bundle.header["probes"]) <= bundle.probes_of(h).keys())
    early = IncrementalJudge(checks, profiles, bundle.header["probes"])
    early.offer(host, bundle.probes_of(host))
    # A later record for the host (the multinode stage, say): the bundle now holds another object.
    records = dict(bundle.probes_of(host))
    records["kernel-log"] = replace(records["kernel-log"])
    later = replace(bundle, results={**bundle.results, host: records})
    assert early.judged(later) == {}


def test_records_missing_a_planned_probe_are_not_judged_early(setting):
    bundle, checks, profiles = setting
    host = bundle.hosts[0]
    records = dict(bundle.probes_of(host))
    early = IncrementalJudge(checks, profiles, [*bundle.header["probes"], "a-probe-still-running"])
    early.offer(host, records)
    assert early.judged(bundle) == {}


def test_a_judgement_that_raised_is_left_to_the_final_pass(setting):
    bundle, checks, profiles = setting
    host = next(h for h in bundle.hosts if set(bundle.header["probes"]) <= bundle.probes_of(h).keys())
    early = IncrementalJudge(checks, {}, bundle.header["probes"])  # no generic profile: judge_host raises
    early.offer(host, bundle.probes_of(host))
    assert early.judged(bundle) == {}


def test_each_judgement_is_handed_on_once_it_is_made(setting):
    bundle, checks, profiles = setting
    seen = []
    early = IncrementalJudge(checks, profiles, bundle.header["probes"], on_judged=lambda j: seen.append((j.host, j.status)))
    _offer_as_a_run_would(early, bundle, cut_short="gpu003")
    judged = early.judged(bundle)
    assert sorted(seen) == sorted((h, j.status) for h, j in judged.items())
    assert "gpu003" not in dict(seen) and {status for _, status in seen} >= {"pass", "fail"}


def test_the_last_two_records_of_a_host_arriving_at_once_start_one_judgement(setting, monkeypatch):
    """With a channel per probe, two threads can save a host's last records together; each then
    offers the complete set, and the host is judged once."""
    import threading

    import preflight.judge.incremental as incremental

    bundle, checks, profiles = setting
    host = bundle.hosts[0]
    calls = []
    real = incremental.judge_host
    monkeypatch.setattr(incremental, "judge_host", lambda h, *a: calls.append(h) or real(h, *a))
    early = IncrementalJudge(checks, profiles, bundle.header["probes"])
    records = bundle.probes_of(host)
    go = threading.Barrier(8)

    def offer():
        go.wait()
        early.offer(host, dict(records))

    threads = [threading.Thread(target=offer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(early.judged(bundle)) == {host} and calls == [host]
