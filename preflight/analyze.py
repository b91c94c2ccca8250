"""Bundle in, verdicts out: profiles chosen, checks run, findings diagnosed.

This is the whole judgement, and it reads nothing but the bundle: ``preflight run`` calls it
on the bundle it just wrote, ``preflight analyze`` on one saved earlier, so the two always
agree. A check that raises never takes the analysis down: it becomes an ERROR finding.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .bundle import Bundle
from .context import EvidenceMissing, FleetContext, HostContext
from .diagnosis import KnowledgeBase, diagnose
from .model import Diagnosis, Evidence, Finding, Status, worst
from .plugin import Check, Outcome
from .profiles import GENERIC, Profile, detect

CONNECTIVITY = "connectivity"
PROBES = "probes"


@dataclass(frozen=True)
class HostVerdict:
    status: str  # pass | warn | fail | error  (report contract)
    reachable: bool
    profile: str
    profile_why: str


@dataclass
class Analysis:
    hosts: dict[str, HostVerdict]
    findings: list[Finding]
    diagnoses: list[Diagnosis]
    checks: list[Check]
    meta: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        # A fleet check's finding with no host (a multi-node run no host is blamed for) counts too.
        return (any(v.status in ("fail", "error") for v in self.hosts.values())
                or any(f.host is None and f.status in (Status.FAIL, Status.ERROR) for f in self.findings))


def host_reachability(bundle: Bundle, host: str) -> tuple[bool, str | None]:
    """(reachable, why not): a host is unreachable when no probe got past the connection."""
    results = bundle.probes_of(host)
    if not results:
        return False, "no evidence recorded for this host (the run did not reach it)"
    errors = [r.error for r in results.values() if r.error]
    if len(errors) == len(results):
        return False, errors[0]
    return True, None


def analyze(bundle: Bundle, checks: list[Check], profiles: dict[str, Profile], kb: KnowledgeBase,
            forced_profile: str | None = None) -> Analysis:
    findings: list[Finding] = []
    contexts: dict[str, HostContext] = {}
    verdict_profile: dict[str, Profile] = {}

    for host in bundle.hosts:
        reachable, why = host_reachability(bundle, host)
        if not reachable:
            # No record at all means the run stopped before this host (the controller died):
            # that says nothing about the host, unlike a connection that failed.
            recorded = bool(bundle.probes_of(host))
            symptom, short = ("host-unreachable", "host unreachable") if recorded else ("run-incomplete", "no evidence")
            findings.append(Finding(CONNECTIVITY, host, Status.ERROR, f"not checked: {why}", (symptom,)))
            findings.extend(Finding(c.id, host, Status.ERROR, f"not checked: {short}")
                            for c in checks if c.scope == "host")
            verdict_profile[host] = profiles[GENERIC].chosen(short)
            continue
        ctx = HostContext(host, bundle.probes_of(host), profiles[GENERIC])
        ctx.profile = _profile_for(ctx, profiles, forced_profile)
        verdict_profile[host] = ctx.profile
        contexts[host] = ctx
        findings.append(Finding(CONNECTIVITY, host, Status.PASS, "connected"))
        findings.append(_probe_health(ctx, bundle.header.get("probes") or []))
        for check in checks:
            if check.scope == "host":
                findings.extend(_run_host_check(check, ctx))

    fleet = FleetContext(contexts, bundle.fleet)
    for check in checks:
        if check.scope == "fleet":
            findings.extend(_run_fleet_check(check, fleet))

    hosts = {}
    for host in bundle.hosts:
        mine = [f.status for f in findings if f.host == host]
        status = worst(mine)
        reachable = host in contexts
        hosts[host] = HostVerdict(
            "pass" if status in (Status.PASS, Status.SKIP) else status.value,
            reachable, verdict_profile[host].id, verdict_profile[host].why,
        )
    return Analysis(hosts, findings, diagnose(findings, kb), checks)


def _probe_health(ctx: HostContext, planned: list[str]) -> Finding:
    """A probe that hung is a symptom in itself (nvidia-smi stuck in the driver), even where
    a check could judge from another probe, so it is reported once per host here; so are
    probes the run planned but never recorded (the controller died before reaching them)."""
    hung = [r for r in ctx.probes.values() if r.timed_out]
    lost = [p for p in planned if p not in ctx.probes]
    if not hung and not lost:
        return Finding(PROBES, ctx.name, Status.PASS, f"{len(ctx.probes)} probes finished in time")
    parts, symptoms = [], []
    if hung:
        names = ", ".join(f"{' '.join(r.command) or r.probe} ({r.duration_s}s)" for r in hung)
        parts.append(f"{len(hung)} probe(s) hung and were stopped: {names}")
        symptoms.append("probe-timeout")
    if lost:
        parts.append(f"{len(lost)} planned probe(s) never recorded (the run stopped early?): {', '.join(lost)}")
    return Finding(PROBES, ctx.name, Status.WARN, "; ".join(parts), tuple(symptoms),
                   tuple(Evidence(r.probe, (r.text.strip()[-300:] or "(no output)")) for r in hung[:3]))


def _profile_for(ctx: HostContext, profiles: dict[str, Profile], forced: str | None) -> Profile:
    if forced:
        return profiles[forced].chosen("chosen with --profile")
    try:
        names = [g.name for g in ctx.smi.gpus if g.name]
    except EvidenceMissing:
        names = []
    return detect(profiles, names)


def _as_outcomes(returned) -> Iterable[Outcome]:
    if returned is None:
        return []
    if isinstance(returned, Outcome):
        return [returned]
    return list(returned)


def _finding(check: Check, host: str | None, o: Outcome) -> Finding:
    return Finding(check.id, o.host or host, o.status, o.summary, o.symptoms, o.evidence, o.data)


def _run_host_check(check: Check, ctx: HostContext) -> list[Finding]:
    try:
        outcomes = _as_outcomes(check.func(ctx))
    except EvidenceMissing as exc:
        if not exc.collected:
            return [Finding(check.id, ctx.name, Status.SKIP, f"not judged: {exc}")]
        return [Finding(check.id, ctx.name, Status.ERROR, f"cannot judge: {exc}", exc.symptoms, exc.evidence)]
    except Exception as exc:  # noqa: BLE001 - a broken check is reported, not fatal
        return [Finding(check.id, ctx.name, Status.ERROR,
                        f"check crashed: {type(exc).__name__}: {exc} ({check.origin})", ("check-crashed",))]
    if not outcomes:
        return [Finding(check.id, ctx.name, Status.SKIP, "nothing to check")]
    return [_finding(check, ctx.name, o) for o in outcomes]


def _run_fleet_check(check: Check, fleet: FleetContext) -> list[Finding]:
    try:
        return [_finding(check, None, o) for o in _as_outcomes(check.func(fleet))]
    except Exception as exc:  # noqa: BLE001
        return [Finding(check.id, None, Status.ERROR,
                        f"check crashed: {type(exc).__name__}: {exc} ({check.origin})", ("check-crashed",))]
