"""Bundle in, verdicts out: profiles chosen, checks run, findings diagnosed.

This is the whole judgement, and it reads nothing but the bundle: ``preflight run`` calls it
on the bundle it just wrote, ``preflight analyze`` on one saved earlier, so the two always
agree. A check that raises never takes the analysis down: it becomes an ERROR finding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from preflight.check import Outcome
from preflight.collect.probes import PROBES as PROBES_BY_ID
from preflight.contracts import CONNECTIVITY_CHECK, NOT_CHECKED, SLURM_ERROR
from preflight.evidence.bundle import Bundle, reachability
from preflight.judge import partial
from preflight.judge.census import COMMANDS
from preflight.judge.context import EvidenceMissing, FleetContext, HostContext
from preflight.judge.figures import HISTORY_FACT, readings_of
from preflight.judge.outcomes import CheckOutputError, outcomes_of
from preflight.knowledge.profiles import GENERIC, Profile, detect
from preflight.model import Check, Evidence, Finding, HostHistory, HostVerdict, ProbeResult, Status, worst

CONNECTIVITY = CONNECTIVITY_CHECK
PROBES = "probes"


@dataclass
class HostJudgement:
    """One host judged from its own records: its findings, in order, the profile it was judged
    against, and the context the fleet checks read it through (None: the host was not reached)."""

    host: str
    findings: list[Finding]
    profile: Profile
    context: HostContext | None

    @property
    def status(self) -> str:
        """The host's verdict from its own checks alone (a fleet check may still add to it)."""
        return verdict_word(worst(f.status for f in self.findings))


def verdict_word(status: Status) -> str:
    """A host's verdict as reports write it: PASS and SKIP alike are "pass"."""
    return "pass" if status in (Status.PASS, Status.SKIP) else status.value


def judge_host(host: str, records: Mapping[str, ProbeResult], checks: list[Check], profiles: dict[str, Profile],
               planned: Sequence[str] = (), forced_profile: str | None = None,
               history: HostHistory | None = None) -> HostJudgement:
    """Every host check on one host's records (``planned``: the probe ids the run meant to record).
    Needs nothing from the other hosts, so a run can call it the moment a host's last record
    arrives; ``judge`` calls it for each host of a bundle.

    ``history``: the node's past from the results store (``run --history``). The checks that
    read it (``facts=["history"]``) run after the host's other checks, so that they see this
    run's own readings (``host.readings``: the figures those checks measured) beside the past."""
    reachable, why = reachability(records)
    if not reachable:
        # No record at all means the run stopped before this host (the controller died):
        # that says nothing about the host, unlike a connection that failed.
        recorded = bool(records)
        symptom, short = ("host-unreachable", "host unreachable") if recorded else ("run-incomplete", "no evidence")
        if recorded and why and why.startswith(SLURM_ERROR):
            # Slurm would not (or could not) run the node's task: its reason, its cause.
            symptom, short = "slurm-node-unavailable", "not run by Slurm"
        # One fact, one finding: the host's checks did not run, and they are listed once, in
        # its data, rather than each reporting an ERROR of its own (docs/contracts.md §5).
        not_checked = [c.id for c in checks if c.scope == "host"]
        findings = [Finding(CONNECTIVITY, host, Status.ERROR, f"not checked: {why}", (symptom,),
                            data={NOT_CHECKED: not_checked})]
        return HostJudgement(host, findings, profiles[GENERIC].chosen(short), None)
    ctx = HostContext(host, dict(records), profiles[GENERIC], past=history)
    ctx.profile = _profile_for(ctx, profiles, forced_profile)
    findings = [Finding(CONNECTIVITY, host, Status.PASS, "connected"), _probe_health(ctx, planned)]
    later = [c for c in checks if c.scope == "host" and HISTORY_FACT in c.facts]
    for check in checks:
        if check.scope == "host" and check not in later:
            findings.extend(_run_host_check(check, ctx))
    if later:
        ctx.readings = readings_of(findings)
        ctx.verdicts = {f.check: f.status in (Status.FAIL, Status.ERROR) for f in findings
                        if f.status is not Status.SKIP and f.check not in (CONNECTIVITY, PROBES)}
        for check in later:
            findings.extend(_run_host_check(check, ctx))
    return HostJudgement(host, findings, ctx.profile, ctx)


def judge(bundle: Bundle, checks: list[Check], profiles: dict[str, Profile], forced_profile: str | None = None,
          judged: Mapping[str, HostJudgement] | None = None,
          histories: Mapping[str, HostHistory] | None = None) -> tuple[dict[str, HostVerdict], list[Finding]]:
    """Per-host verdicts and every finding, from the bundle (and, when given, each node's past
    from the results store). ``judged``: hosts already judged on exactly the records the bundle
    holds for them (``preflight run`` judges each host while the others are still being probed);
    every other host is judged here."""
    planned = bundle.header.get("probes") or []
    judged = judged or {}
    histories = histories or {}
    per_host = [judged.get(host) or judge_host(host, bundle.probes_of(host), checks, profiles, planned, forced_profile,
                                               histories.get(host))
                for host in bundle.hosts]
    findings = [f for j in per_host for f in j.findings]
    if not bundle.hosts:
        # Nothing was checked, which is not the same as everything passing.
        findings.append(Finding(CONNECTIVITY, None, Status.ERROR,
                                "the bundle lists no host (bundle.json \"hosts\" is empty): nothing was checked",
                                ("run-incomplete",)))
    fleet = FleetContext({j.host: j.context for j in per_host if j.context is not None}, bundle.fleet)
    for check in checks:
        if check.scope == "fleet":
            findings.extend(_run_fleet_check(check, fleet, tuple(bundle.hosts)))

    statuses: dict[str | None, list[Status]] = {}
    for f in findings:
        statuses.setdefault(f.host, []).append(f.status)
    hosts = {}
    for j in per_host:
        status = worst(statuses.get(j.host, ()))
        hosts[j.host] = HostVerdict(verdict_word(status), j.context is not None, j.profile.id, j.profile.why)
    return hosts, findings


def _probe_health(ctx: HostContext, planned: Sequence[str]) -> Finding:
    """A probe that hung is a symptom in itself (nvidia-smi stuck in the driver), even where
    a check could judge from another probe, so it is reported once per host here, naming the
    tool, with the probes that were not run because of it; so are probes the run planned but
    never recorded (the controller died before reaching them)."""
    hung = [r for r in ctx.probes.values() if r.timed_out]
    passed_over = [r for r in ctx.probes.values() if r.error and r.error.startswith("not run: ")]
    lost = [p for p in planned if p not in ctx.probes]
    if not hung and not passed_over and not lost:
        n = len(ctx.probes)
        return Finding(PROBES, ctx.name, Status.PASS, f"{n} probe{'s' if n != 1 else ''} finished in time")
    parts, symptoms = [], []
    if hung:
        tools = ", ".join(dict.fromkeys(PROBES_BY_ID[r.probe].tool if r.probe in PROBES_BY_ID
                                        else (r.command[0] if r.command else r.probe) for r in hung))
        names = ", ".join(f"{' '.join(r.command[:3]) or r.probe} ({r.duration_s}s)" for r in hung)
        parts.append(f"{tools} hung: {len(hung)} probe(s) stopped by their timeout: {names}")
        symptoms.append("probe-timeout")
    if passed_over:
        parts.append(f"{len(passed_over)} probe(s) not run: "
                     + "; ".join(sorted({r.error.removeprefix("not run: ") for r in passed_over}))
                     + f" ({', '.join(r.probe for r in passed_over)})")
    if lost:
        parts.append(f"{len(lost)} planned probe(s) never recorded (the run stopped early?): {', '.join(lost)}")
    return Finding(PROBES, ctx.name, Status.WARN, "; ".join(parts), tuple(symptoms),
                   tuple(Evidence(r.probe, (r.text.strip()[-300:] or "(no output)")) for r in hung[:3]))


def _profile_for(ctx: HostContext, profiles: dict[str, Profile], forced: str | None) -> Profile:
    if forced:
        return profiles[forced].chosen("chosen with --profile")
    try:
        census = ctx.optional("gpu_census")
    except Exception as exc:  # noqa: BLE001 - a parser bug must not take the whole analysis down
        # The checks that read the same evidence report the crash as their own finding.
        return profiles[GENERIC].chosen(f"GPU evidence could not be read ({type(exc).__name__}): generic checks only")
    if census is None:
        return detect(profiles, [])
    # -q is the usual source and keeps its short reason; any other one is named.
    source = None if census.model_probe in (None, "nvidia-smi-q-x", "nvidia-smi-q") \
        else COMMANDS[census.model_probe]
    # The platform is known from the GPUs counted, else from how many a selection says there are.
    count = census.count if census.count is not None else census.attached
    return detect(profiles, list(census.models), source=source, pci_device_ids=census.pci_device_ids,
                  gpu_count=count)


def _finding(check: Check, host: str | None, o: Outcome) -> Finding:
    return Finding(check.id, o.host or host, o.status, o.summary, o.symptoms, o.evidence, o.data, o.action)


def _crashed(check: Check, host: str | None, exc: BaseException) -> Finding:
    what = str(exc) if isinstance(exc, CheckOutputError) else f"{type(exc).__name__}: {exc}"
    return Finding(check.id, host, Status.ERROR, f"check crashed: {what} ({check.origin})", ("check-crashed",))


def _run_host_check(check: Check, ctx: HostContext) -> list[Finding]:
    try:
        ctx.forget_reads()
        # A host check speaks of its own host only.
        outcomes = outcomes_of(check.func(ctx), hosts=(ctx.name,))
        if not outcomes:
            outcomes = [Outcome(Status.SKIP, "nothing to check")]
        # What a check read from output that broke off part-way passes nothing it did not show.
        outcomes = partial.mark(outcomes, check.facts, ctx.reads(), ctx.derived())
    except EvidenceMissing as exc:
        if not exc.collected:
            return [Finding(check.id, ctx.name, Status.SKIP, f"not judged: {exc}")]
        return [Finding(check.id, ctx.name, Status.ERROR, f"cannot judge: {exc}", exc.symptoms, exc.evidence)]
    except Exception as exc:  # noqa: BLE001 - a broken check is reported, not fatal
        return [_crashed(check, ctx.name, exc)]
    return [_finding(check, ctx.name, o) for o in outcomes]


def _run_fleet_check(check: Check, fleet: FleetContext, inventory: tuple[str, ...] | None = None) -> list[Finding]:
    try:
        return [_finding(check, None, o) for o in outcomes_of(check.func(fleet), hosts=inventory)]
    except Exception as exc:  # noqa: BLE001
        return [_crashed(check, None, exc)]
