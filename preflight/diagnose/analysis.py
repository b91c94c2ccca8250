"""Bundle in, analysis out: the checks' judgement (``preflight.judge``) and its diagnosis.

``preflight run`` calls this on the bundle it just wrote and ``preflight analyze`` on one saved
earlier, so the two always agree.
"""

from __future__ import annotations

from preflight.diagnose.engine import KnowledgeBase, diagnose
from preflight.evidence.bundle import Bundle
from preflight.judge.analyze import judge
from preflight.knowledge.profiles import Profile
from preflight.model import Analysis, Check


def analyze(bundle: Bundle, checks: list[Check], profiles: dict[str, Profile], kb: KnowledgeBase,
            forced_profile: str | None = None) -> Analysis:
    hosts, findings = judge(bundle, checks, profiles, forced_profile)
    return Analysis(hosts, findings, diagnose(findings, kb), checks)
