"""From findings to diagnoses: symptoms weighed into likely causes, each with its action.

The knowledge is data (``playbooks/causes.yaml``, ``playbooks/rules.yaml``); this module
only applies it. Per host, the symptoms of every non-passing finding are pooled; each rule
whose symptoms are all there yields its cause; a symptom that is itself a cause id yields
that cause. A diagnosis whose symptoms are all explained by a stronger one on the same host
is dropped, so the report leads with the root cause. Diagnoses of the same cause and
confidence are then merged across hosts, which is how the report says "3 hosts".

Fleet rules (entries of ``rules.yaml`` with a ``fleet:`` key) then look across hosts, because
the same symptom means different things depending on how many hosts show it:

- ``every-host``: every host the symptom's checks judged shows it, and nothing in the run says
  the hosts differ (no ``unless`` symptom anywhere, e.g. driver or firmware drift). Eight
  identical nodes all slow point at something they share (NCCL environment, GPUDirect RDMA
  off) rather than eight broken nodes: one diagnosis of the rule's cause for the fleet
  replaces the per-host ones those symptoms alone would give.
- ``few-hosts``: at most ``max_fraction`` of the judged hosts show it: the rest are the
  control group, so the fault is on those hosts. Their diagnoses keep their cause, are raised
  to the rule's confidence, and say "only N of M hosts".

The population of a fleet rule is the set of hosts that the checks which emit its symptoms
judged (PASS, WARN or FAIL): an unreachable host or a check that could not run is not
evidence either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from preflight.knowledge.datafile import read_yaml
from preflight.model import Diagnosis, Finding, Status
from preflight.shipped import playbooks_dir

PLAYBOOK_DIR = playbooks_dir()
_CONFIDENCE = {"high": 3, "medium": 2, "low": 1}


class PlaybookError(ValueError):
    pass


@dataclass(frozen=True)
class Cause:
    id: str
    title: str
    meaning: str
    actions: tuple[str, ...]
    references: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()  # what to look at to confirm it (shown by `preflight explain`)


@dataclass(frozen=True)
class Rule:
    cause: str
    all: frozenset[str]
    any: frozenset[str] = frozenset()
    confidence: str = "medium"
    explains: frozenset[str] = frozenset()
    action: str | None = None

    def matches(self, symptoms: set[str]) -> bool:
        return self.all <= symptoms and (not self.any or bool(self.any & symptoms))


FLEET_PATTERNS = ("every-host", "few-hosts")


@dataclass(frozen=True)
class FleetRule:
    """A pattern across hosts (see the module docstring); ``any`` are the symptoms it weighs."""

    pattern: str  # one of FLEET_PATTERNS
    any: frozenset[str]
    cause: str | None = None  # every-host: the shared cause; few-hosts: None (the hosts' own)
    confidence: str = "medium"
    unless: frozenset[str] = frozenset()
    min_hosts: int = 2
    max_fraction: float = 0.25
    action: str | None = None


@dataclass(frozen=True)
class KnowledgeBase:
    causes: dict[str, Cause]
    rules: tuple[Rule, ...] = field(default=())
    fleet_rules: tuple[FleetRule, ...] = field(default=())


def _load_yaml(path: Path):
    return read_yaml(path, PlaybookError)


def load_knowledge(directory: Path = PLAYBOOK_DIR) -> KnowledgeBase:
    raw_causes = _load_yaml(directory / "causes.yaml") or {}
    causes = {}
    for cid, entry in raw_causes.items():
        if not isinstance(entry, dict) or not entry.get("title") or not entry.get("actions"):
            raise PlaybookError(f"{directory / 'causes.yaml'}: cause {cid!r} needs a title and actions")
        for key in ("actions", "references", "evidence"):
            if not all(isinstance(line, str) for line in entry.get(key) or ()):
                raise PlaybookError(f"{directory / 'causes.yaml'}: cause {cid!r}: every item of {key} must be "
                                    "text (quote an item holding ': ', which YAML reads as a mapping)")
        causes[cid] = Cause(cid, entry["title"], entry.get("meaning", ""), tuple(entry["actions"]),
                            tuple(entry.get("references") or ()), tuple(entry.get("evidence") or ()))
    rules = []
    fleet_rules = []
    for i, entry in enumerate(_load_yaml(directory / "rules.yaml") or []):
        where = f"{directory / 'rules.yaml'}: rule {i + 1}"
        if "fleet" in entry:
            fleet_rules.append(_fleet_rule(entry, causes, where))
            continue
        if entry.get("cause") not in causes:
            raise PlaybookError(f"{where}: unknown cause {entry.get('cause')!r}")
        if entry.get("confidence", "medium") not in _CONFIDENCE:
            raise PlaybookError(f"{where}: confidence must be high, medium or low")
        if not entry.get("all") and not entry.get("any"):
            raise PlaybookError(f"{where}: needs 'all' or 'any' symptoms")
        rules.append(Rule(entry["cause"], frozenset(entry.get("all") or ()), frozenset(entry.get("any") or ()),
                          entry.get("confidence", "medium"), frozenset(entry.get("explains") or ()),
                          entry.get("action")))
    return KnowledgeBase(causes, tuple(rules), tuple(fleet_rules))


def _fleet_rule(entry: dict, causes: dict[str, Cause], where: str) -> FleetRule:
    pattern = entry["fleet"]
    if pattern not in FLEET_PATTERNS:
        raise PlaybookError(f"{where}: fleet must be one of {', '.join(FLEET_PATTERNS)}, not {pattern!r}")
    if not entry.get("any"):
        raise PlaybookError(f"{where}: a fleet rule needs 'any' symptoms")
    if entry.get("confidence", "medium") not in _CONFIDENCE:
        raise PlaybookError(f"{where}: confidence must be high, medium or low")
    cause = entry.get("cause")
    if pattern == "every-host" and cause not in causes:
        raise PlaybookError(f"{where}: unknown cause {cause!r}")
    if pattern == "few-hosts" and cause is not None:
        raise PlaybookError(f"{where}: a few-hosts rule keeps each host's own cause; remove 'cause'")
    min_hosts, max_fraction = entry.get("min_hosts", 2), entry.get("max_fraction", 0.25)
    if not isinstance(min_hosts, int) or min_hosts < 1 or not 0 < max_fraction < 1:
        raise PlaybookError(f"{where}: min_hosts must be a positive integer and max_fraction between 0 and 1")
    return FleetRule(pattern, frozenset(entry["any"]), cause, entry.get("confidence", "medium"),
                     frozenset(entry.get("unless") or ()), min_hosts, max_fraction, entry.get("action"))


@dataclass
class _Candidate:
    cause: str
    confidence: str
    symptoms: frozenset[str]
    explains: frozenset[str]
    action: str | None
    note: str | None = None  # set by a few-hosts fleet rule


def diagnose(findings: list[Finding], kb: KnowledgeBase) -> list[Diagnosis]:
    by_host: dict[str | None, list[Finding]] = {}
    for f in findings:
        if f.status in (Status.FAIL, Status.WARN, Status.ERROR) and f.symptoms:
            by_host.setdefault(f.host, []).append(f)
    symptoms_of = {host: {s for f in fs for s in f.symptoms} for host, fs in by_host.items()}
    candidates = {host: _host_candidates(symptoms, kb) for host, symptoms in symptoms_of.items()}
    fleet_diagnoses = [d for rule in kb.fleet_rules
                       if (d := _apply_fleet_rule(rule, findings, by_host, symptoms_of, candidates, kb))]

    merged: dict[tuple[str, str, str], dict] = {}
    for host, host_findings in by_host.items():
        for cand in candidates[host]:
            # The finding that names the cause itself speaks for it (its action is the specific
            # one, e.g. the firmware version to flash), not an echo it explains (a hung all_reduce).
            evidence_finding = (next((f for f in host_findings if cand.cause in f.symptoms), None)
                                or next((f for f in host_findings if cand.symptoms & set(f.symptoms)), None))
            action = cand.action or (evidence_finding.action if evidence_finding else None)
            action = action or kb.causes[cand.cause].actions[0]
            key = (cand.cause, cand.confidence, action)
            slot = merged.setdefault(key, {"hosts": [], "symptoms": set(), "evidence": [], "notes": []})
            if host is not None:
                slot["hosts"].append(host)
            slot["symptoms"] |= cand.symptoms
            if evidence_finding:
                prefix = f"{host}: " if host else ""
                slot["evidence"].append(prefix + evidence_finding.summary)
            if cand.note and cand.note not in slot["notes"]:
                slot["notes"].append(cand.note)

    diagnoses = [
        Diagnosis(cause, tuple(slot["hosts"]), conf, tuple(sorted(slot["symptoms"])), action,
                  kb.causes[cause].title, "; ".join([_join_evidence(slot["evidence"])] + slot["notes"]))
        for (cause, conf, action), slot in merged.items()
    ] + fleet_diagnoses
    diagnoses.sort(key=lambda d: (-_CONFIDENCE[d.confidence], -len(d.hosts), d.cause, d.hosts))
    return diagnoses


def _join_evidence(lines: list[str]) -> str:
    return "; ".join(lines[:3]) + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")


def _apply_fleet_rule(rule: FleetRule, findings: list[Finding], by_host: dict[str | None, list[Finding]],
                      symptoms_of: dict[str | None, set[str]], candidates: dict[str | None, list[_Candidate]],
                      kb: KnowledgeBase) -> Diagnosis | None:
    """Apply one fleet rule: edit the per-host candidates, and return the fleet's own diagnosis
    when the rule names one."""
    emitters = {f.check for f in findings if rule.any.intersection(f.symptoms)}
    population = sorted({f.host for f in findings if f.check in emitters and f.host is not None
                         and f.status in (Status.PASS, Status.WARN, Status.FAIL)})
    affected = [h for h in population if rule.any & symptoms_of.get(h, set())]
    if len(population) < rule.min_hosts or not affected:
        return None
    seen = rule.any & set().union(*(symptoms_of[h] for h in affected))
    if rule.pattern == "every-host":
        if len(affected) < len(population) or rule.unless & set().union(*symptoms_of.values()):
            return None
        for h in affected:
            candidates[h] = [c for c in candidates[h] if not c.symptoms <= rule.any]
        assert rule.cause is not None  # load_knowledge refuses an every-host rule without one
        evidence = [f"{h}: {f.summary}" for h in affected for f in by_host[h] if rule.any & set(f.symptoms)]
        return Diagnosis(rule.cause, tuple(affected), rule.confidence, tuple(sorted(seen)),
                         rule.action or kb.causes[rule.cause].actions[0], kb.causes[rule.cause].title,
                         f"all {len(population)} hosts judged show it: {_join_evidence(evidence)}")
    if len(affected) <= rule.max_fraction * len(population):
        others = len(population) - len(affected)
        note = (f"only {len(affected)} of {len(population)} hosts show {', '.join(sorted(seen))}; "
                f"the other {others} do not, so the fault is on {'this host' if len(affected) == 1 else 'these hosts'}")
        for h in affected:
            for c in candidates[h]:
                if c.symptoms & rule.any:
                    c.confidence = max(c.confidence, rule.confidence, key=_CONFIDENCE.__getitem__)
                    c.note = note
    return None


def _host_candidates(symptoms: set[str], kb: KnowledgeBase) -> list[_Candidate]:
    cands: list[_Candidate] = []
    for rule in kb.rules:
        if rule.matches(symptoms):
            used = frozenset((rule.all | rule.any) & symptoms)
            cands.append(_Candidate(rule.cause, rule.confidence, used, rule.explains | used, rule.action))
    # A symptom that is a cause id diagnoses itself, unless a matching rule claims it: a rule
    # that names a symptom in `explains` was written to say what that symptom means in that
    # combination, so its cause replaces the symptom's own even at a lower confidence.
    claimed = frozenset().union(*(c.explains for c in cands))
    for s in sorted(symptoms):
        if s in kb.causes and s not in claimed and not any(c.cause == s for c in cands):
            cands.append(_Candidate(s, "high", frozenset({s}), frozenset({s}), None))
    # Drop a candidate whose every symptom a stronger (or more specific) one explains.
    cands.sort(key=lambda c: (-_CONFIDENCE[c.confidence], -len(c.symptoms)))
    kept: list[_Candidate] = []
    for c in cands:
        if any(k.cause != c.cause and c.symptoms <= k.explains and _stronger(k, c) for k in kept):
            continue
        same = next((k for k in kept if k.cause == c.cause), None)
        if same:  # several rules reach one cause on this host: one diagnosis, the strongest's
            same.symptoms |= c.symptoms
            same.explains |= c.explains
            continue
        kept.append(c)
    return kept


def _stronger(a: _Candidate, b: _Candidate) -> bool:
    return (_CONFIDENCE[a.confidence], len(a.symptoms)) >= (_CONFIDENCE[b.confidence], len(b.symptoms))
