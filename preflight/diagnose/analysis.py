"""Bundle in, analysis out: the checks' judgement (``preflight.judge``) and its diagnosis.

``preflight run`` calls this on the bundle it just wrote and ``preflight analyze`` on one saved
earlier, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Mapping

from preflight.diagnose.engine import KnowledgeBase, diagnose
from preflight.evidence.bundle import Bundle
from preflight.judge.analyze import HostJudgement, judge
from preflight.knowledge.profiles import Profile
from preflight.model import Analysis, Check, HostHistory


def analyze(bundle: Bundle, checks: list[Check], profiles: dict[str, Profile], kb: KnowledgeBase,
            forced_profile: str | None = None, judged: Mapping[str, HostJudgement] | None = None,
            histories: Mapping[str, HostHistory] | None = None) -> Analysis:
    """``judged``: hosts a run already judged on the records the bundle holds (``judge.incremental``);
    ``histories``: each node's past from the results store (``--history``)."""
    hosts, findings = judge(bundle, checks, profiles, forced_profile, judged, histories)
    return Analysis(hosts, findings, diagnose(findings, kb), checks)
