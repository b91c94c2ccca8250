"""Reports in the ``preflight-report/1`` shape for the store's tests: a run at a given time over
given nodes, each node's verdict, failed checks, causes and busbw. The store reads only these
keys; the real reports it is also tested on come from ``preflight analyze`` of the shipped
example (test_store.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
CHECKS = ("gpu-inventory", "xid", "nvlink", "nccl-all-reduce")


def at(day: float) -> str:
    return (T0 + timedelta(days=day)).isoformat(timespec="seconds")


def report(run_id: str, day: float, nodes: dict[str, dict], kind: str = "run", checks=CHECKS) -> dict:
    """``nodes``: name -> {"status": ..., "fail": [check, ...], "causes": [cause, ...], "busbw": float,
    "reachable": bool}."""
    findings, diagnoses = [], {}
    for name, n in nodes.items():
        for check in n.get("fail", ()):
            findings.append({"host": name, "check": check, "status": "fail", "summary": f"{check} failed on {name}",
                             "symptoms": [check], "evidence": []})
        if "busbw" in n:
            findings.append({"host": name, "check": "nccl-all-reduce", "status": "pass", "summary": "ok",
                             "symptoms": [], "evidence": [], "data": {"busbw_median_gbs": n["busbw"]}})
        for cause in n.get("causes", ()):
            diagnoses.setdefault(cause, []).append(name)
    return {
        "format": "preflight-report/1", "run_id": run_id, "kind": kind, "created": at(day),
        "preflight_version": "0.1.0", "launcher": "ssh",
        "hosts": {name: {"status": n.get("status", "fail" if n.get("fail") else "pass"),
                         "reachable": n.get("reachable", True), "profile": "hgx-h200", "profile_reason": "test"}
                  for name, n in nodes.items()},
        "checks": [{"id": c, "scope": "host", "probes": [], "summary": ""} for c in checks],
        "findings": findings,
        "diagnoses": [{"cause": c, "title": c, "hosts": hs, "confidence": "high", "symptoms": [c],
                       "action": f"fix {c}", "evidence": ""} for c, hs in diagnoses.items()],
    }
