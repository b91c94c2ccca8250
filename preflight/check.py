"""The check API: the one module a check imports.

A check is a function in a module of ``checks/`` (or of a ``--checks-dir``, or of a package's
``preflight.checks`` entry point), marked with what it reads::

    from preflight.check import fail, host_check, ok

    @host_check("gpu-inventory", facts=["smi"],
                summary="GPU count and model against the platform profile")
    def gpu_inventory(host):
        smi = host.smi                      # parsed on first use; missing -> ERROR finding
        if len(smi.gpus) < host.profile.gpu_count:
            return fail(f"{len(smi.gpus)} of {host.profile.gpu_count} GPUs",
                        symptoms=["gpu-missing"], action="reseat the GPU, then re-run")
        return ok(f"{len(smi.gpus)} GPUs")

``facts`` names the parsed facts the check reads (``preflight facts`` lists them, each with
the probes behind it); the run collects exactly the probes those facts need. ``probes`` adds
raw probes a check reads itself (``host.excerpt``, ``host.result``).

Marking changes nothing at import (pluggy's way): the decorator only sets an attribute, and
``preflight.judge.loader`` finds marked functions in the modules it loads. So a check module
can import a helper module beside it, and importing a check twice registers nothing twice.

``host_check`` functions get a ``HostContext`` and run once per reachable host;
``fleet_check`` functions get a ``FleetContext`` and return outcomes naming their host;
``soak_check`` functions judge a soak's telemetry (``preflight.soak``). All
return one ``Outcome``, an iterable of them, or None (nothing to say). They are pure: all they
see is parsed evidence and the profile, so they run the same live and on a saved bundle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from preflight.judge.context import EvidenceMissing, FleetContext, HostContext
from preflight.model import Check, Evidence, Status

__all__ = [
    "Check", "Evidence", "EvidenceMissing", "FleetContext", "HostContext", "Outcome", "Status",
    "error", "fail", "fleet_check", "host_check", "ok", "skip", "soak_check", "warn",
]

MARK = "__preflight_check__"


@dataclass(frozen=True)
class Outcome:
    """What a check says about one host; the runner adds the check id and host name."""

    status: Status
    summary: str
    symptoms: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    host: str | None = None  # fleet checks name the host; host checks leave it to the runner
    action: str | None = None  # a next step more specific than the diagnosed cause's own


def _outcome(status: Status, summary: str, symptoms: Iterable[str] = (),
             evidence: Iterable[Evidence | None] = (), data: dict[str, Any] | None = None,
             host: str | None = None, action: str | None = None) -> Outcome:
    data = dict(data or {})
    # Checks written before ``action=`` existed passed it as data["action"].
    action = action or data.pop("action", None)
    return Outcome(status, summary, tuple(symptoms), tuple(e for e in evidence if e), data, host, action)


def ok(summary: str, **kw: Any) -> Outcome:
    """The node passes this check."""
    return _outcome(Status.PASS, summary, **kw)


def warn(summary: str, **kw: Any) -> Outcome:
    """Usable, but an operator should look."""
    return _outcome(Status.WARN, summary, **kw)


def fail(summary: str, **kw: Any) -> Outcome:
    """The node is bad."""
    return _outcome(Status.FAIL, summary, **kw)


def skip(summary: str, **kw: Any) -> Outcome:
    """The check does not apply here."""
    return _outcome(Status.SKIP, summary, **kw)


def error(summary: str, **kw: Any) -> Outcome:
    """We could not tell: the evidence is missing or unreadable."""
    return _outcome(Status.ERROR, summary, **kw)


def _mark(scope: str, id: str, summary: str, facts: Iterable[str], probes: Iterable[str]
          ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        marks = getattr(func, MARK, ())
        setattr(func, MARK, (*marks, Check(id, tuple(probes), summary, func, scope, facts=tuple(facts))))
        return func

    return decorate


def host_check(id: str, *, summary: str, facts: Iterable[str] = (), probes: Iterable[str] = ()
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a per-host check: ``func(host: HostContext) -> Outcome | Iterable[Outcome] | None``."""
    return _mark("host", id, summary, facts, probes)


def fleet_check(id: str, *, summary: str, facts: Iterable[str] = (), probes: Iterable[str] = ()
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a check that compares hosts: ``func(fleet: FleetContext) -> Iterable[Outcome]``."""
    return _mark("fleet", id, summary, facts, probes)


def soak_check(id: str, *, summary: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a check of soak telemetry: ``func(soak) -> Iterable[Outcome]``, run by the soak's
    analysis over a ``preflight-soak/1`` directory rather than over a bundle."""
    return _mark("soak", id, summary, (), ())
