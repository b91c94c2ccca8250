"""From findings to diagnoses: symptoms weighed into likely causes, each with its action.

The knowledge is data (``playbooks/causes.yaml``, ``playbooks/rules.yaml``); this module
only applies it. Per host, the symptoms of every non-passing finding are pooled; each rule
whose symptoms are all there yields its cause; a symptom that is itself a cause id yields
that cause. A diagnosis whose symptoms are all explained by a stronger one on the same host
is dropped, so the report leads with the root cause. Diagnoses of the same cause and
confidence are then merged across hosts, which is how the report says "3 hosts".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .model import Diagnosis, Finding, Status

PLAYBOOK_DIR = Path(__file__).resolve().parent / "playbooks"
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


@dataclass(frozen=True)
class KnowledgeBase:
    causes: dict[str, Cause]
    rules: tuple[Rule, ...] = field(default=())


def _load_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise PlaybookError(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None


def load_knowledge(directory: Path = PLAYBOOK_DIR) -> KnowledgeBase:
    raw_causes = _load_yaml(directory / "causes.yaml") or {}
    causes = {}
    for cid, entry in raw_causes.items():
        if not isinstance(entry, dict) or not entry.get("title") or not entry.get("actions"):
            raise PlaybookError(f"{directory / 'causes.yaml'}: cause {cid!r} needs a title and actions")
        causes[cid] = Cause(cid, entry["title"], entry.get("meaning", ""), tuple(entry["actions"]),
                            tuple(entry.get("references") or ()))
    rules = []
    for i, entry in enumerate(_load_yaml(directory / "rules.yaml") or []):
        where = f"{directory / 'rules.yaml'}: rule {i + 1}"
        if entry.get("cause") not in causes:
            raise PlaybookError(f"{where}: unknown cause {entry.get('cause')!r}")
        if entry.get("confidence", "medium") not in _CONFIDENCE:
            raise PlaybookError(f"{where}: confidence must be high, medium or low")
        if not entry.get("all") and not entry.get("any"):
            raise PlaybookError(f"{where}: needs 'all' or 'any' symptoms")
        rules.append(Rule(entry["cause"], frozenset(entry.get("all") or ()), frozenset(entry.get("any") or ()),
                          entry.get("confidence", "medium"), frozenset(entry.get("explains") or ()),
                          entry.get("action")))
    return KnowledgeBase(causes, tuple(rules))


@dataclass
class _Candidate:
    cause: str
    confidence: str
    symptoms: frozenset[str]
    explains: frozenset[str]
    action: str | None


def diagnose(findings: list[Finding], kb: KnowledgeBase) -> list[Diagnosis]:
    by_host: dict[str | None, list[Finding]] = {}
    for f in findings:
        if f.status in (Status.FAIL, Status.WARN, Status.ERROR) and f.symptoms:
            by_host.setdefault(f.host, []).append(f)

    merged: dict[tuple[str, str, str], dict] = {}
    for host, host_findings in by_host.items():
        symptoms = {s for f in host_findings for s in f.symptoms}
        for cand in _host_candidates(symptoms, kb):
            evidence_finding = next((f for f in host_findings if cand.symptoms & set(f.symptoms)), None)
            action = cand.action or (evidence_finding.data.get("action") if evidence_finding else None)
            action = action or kb.causes[cand.cause].actions[0]
            key = (cand.cause, cand.confidence, action)
            slot = merged.setdefault(key, {"hosts": [], "symptoms": set(), "evidence": []})
            if host is not None:
                slot["hosts"].append(host)
            slot["symptoms"] |= cand.symptoms
            if evidence_finding:
                prefix = f"{host}: " if host else ""
                slot["evidence"].append(prefix + evidence_finding.summary)

    diagnoses = [
        Diagnosis(cause, tuple(slot["hosts"]), conf, tuple(sorted(slot["symptoms"])), action,
                  kb.causes[cause].title, "; ".join(slot["evidence"][:3])
                  + (f"; and {len(slot['evidence']) - 3} more" if len(slot["evidence"]) > 3 else ""))
        for (cause, conf, action), slot in merged.items()
    ]
    diagnoses.sort(key=lambda d: (-_CONFIDENCE[d.confidence], -len(d.hosts), d.cause))
    return diagnoses


def _host_candidates(symptoms: set[str], kb: KnowledgeBase) -> list[_Candidate]:
    cands: list[_Candidate] = []
    for rule in kb.rules:
        if rule.matches(symptoms):
            used = frozenset((rule.all | rule.any) & symptoms)
            cands.append(_Candidate(rule.cause, rule.confidence, used, rule.explains | used, rule.action))
    for s in symptoms:
        if s in kb.causes and not any(c.cause == s for c in cands):
            cands.append(_Candidate(s, "high", frozenset({s}), frozenset({s}), None))
    # Drop a candidate whose every symptom a stronger (or more specific) one explains.
    cands.sort(key=lambda c: (-_CONFIDENCE[c.confidence], -len(c.symptoms)))
    kept: list[_Candidate] = []
    for c in cands:
        if any(k.cause != c.cause and c.symptoms <= k.explains and _stronger(k, c) for k in kept):
            continue
        kept.append(c)
    return kept


def _stronger(a: _Candidate, b: _Candidate) -> bool:
    return (_CONFIDENCE[a.confidence], len(a.symptoms)) >= (_CONFIDENCE[b.confidence], len(b.symptoms))
