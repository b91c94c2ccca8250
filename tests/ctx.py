"""Test helpers: a HostContext from probe outputs, and a check run on it, without a bundle."""

from __future__ import annotations

from preflight.judge.analyze import _run_fleet_check, _run_host_check
from preflight.judge.context import FleetContext, HostContext
from preflight.judge.loader import load_checks
from preflight.knowledge.profiles import load_profiles
from preflight.model import Finding, ProbeResult

_PROFILES = load_profiles()
_CHECKS = {c.id: c for c in load_checks(use_entry_points=False)}


def result(probe: str, stdout: str | bytes | None, exit_code: int | None = 0, **kw) -> ProbeResult:
    data = stdout.encode() if isinstance(stdout, str) else stdout
    return ProbeResult(probe, kw.pop("host", "node1"), kw.pop("command", (probe,)), data,
                       exit_code=exit_code, **kw)


def make_host(probes: dict[str, str | bytes | ProbeResult], profile: str = "generic",
              name: str = "node1") -> HostContext:
    """probes: probe id -> its stdout (a clean run) or a full ProbeResult."""
    results = {p: v if isinstance(v, ProbeResult) else result(p, v, host=name) for p, v in probes.items()}
    return HostContext(name, results, _PROFILES[profile].chosen("test"))


def run_check(check_id: str, host: HostContext) -> list[Finding]:
    return _run_host_check(_CHECKS[check_id], host)


def run_fleet_check(check_id: str, hosts: list[HostContext]) -> list[Finding]:
    return _run_fleet_check(_CHECKS[check_id], FleetContext({h.name: h for h in hosts}))
