"""``report.json`` (contract ``preflight-report/1``)."""

from __future__ import annotations

import json
import math
from typing import Any

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
    """Strict JSON (RFC 8259): ``allow_nan=False``, so a non-finite number that got past every
    reader and check fails here rather than writing ``NaN`` or ``Infinity``, which JSON has not;
    ``strict`` turns them into null first."""
    return json.dumps(strict(to_dict(analysis)), indent=2, sort_keys=False, allow_nan=False) + "\n"


def strict(value: Any) -> Any:
    """``value`` with JSON's values only: a non-finite float becomes None (not measured), a
    numpy scalar its Python number, tuples lists, keys strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return strict(value.item())
    return str(value)
