"""``report.json`` (contract ``preflight-report/1``)."""

from __future__ import annotations

import json

from preflight.model import Analysis

FORMAT = "preflight-report/1"


def to_dict(analysis: Analysis) -> dict:
    return {
        "format": FORMAT,
        **analysis.meta,
        "hosts": {
            host: {"status": v.status, "reachable": v.reachable, "profile": v.profile,
                   "profile_reason": v.profile_why}
            for host, v in analysis.hosts.items()
        },
        "checks": [{"id": c.id, "scope": c.scope, "probes": list(c.probes), "summary": c.summary}
                   for c in analysis.checks],
        "findings": [f.to_dict() for f in analysis.findings],
        "diagnoses": [d.to_dict() for d in analysis.diagnoses],
    }


def render(analysis: Analysis) -> str:
    return json.dumps(to_dict(analysis), indent=2, sort_keys=False) + "\n"
