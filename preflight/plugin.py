"""The check plugin API: how a check declares itself, and how checks are found.

A check is one function in one short module::

    from preflight.plugin import host_check, fail, ok

    @host_check("gpu-inventory", probes=["nvidia-smi-q-x", "nvidia-smi-q"],
                summary="GPU count and model against the platform profile")
    def gpu_inventory(host):
        smi = host.smi                      # parsed on first use; missing -> ERROR finding
        if len(smi.gpus) < host.profile.gpu_count:
            return fail(f"{len(smi.gpus)} of {host.profile.gpu_count} GPUs", symptoms=["gpu-missing"])
        return ok(f"{len(smi.gpus)} GPUs")

``host_check`` functions get a ``HostContext`` and run once per reachable host;
``fleet_check`` functions get a ``FleetContext`` and return outcomes naming their host. Both
return one ``Outcome``, an iterable of them, or None (nothing to say). They are pure: all
they see is parsed evidence and the profile, so they run the same live and on a saved bundle.

Checks are found, in order, in the built-in ``checks/`` folder, in every ``--checks-dir``,
and in the ``preflight.checks`` entry point group of installed packages. A later check with
an id already taken is an error, not a silent override.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .model import Evidence, Status


@dataclass(frozen=True)
class Outcome:
    """What a check says about one host; the runner adds the check id and host name."""

    status: Status
    summary: str
    symptoms: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    host: str | None = None  # fleet checks name the host; host checks leave it to the runner


def _outcome(status: Status, summary: str, symptoms=(), evidence=(), data=None, host=None) -> Outcome:
    return Outcome(status, summary, tuple(symptoms), tuple(e for e in evidence if e), dict(data or {}), host)


def ok(summary: str, **kw) -> Outcome:
    return _outcome(Status.PASS, summary, **kw)


def warn(summary: str, **kw) -> Outcome:
    return _outcome(Status.WARN, summary, **kw)


def fail(summary: str, **kw) -> Outcome:
    return _outcome(Status.FAIL, summary, **kw)


def skip(summary: str, **kw) -> Outcome:
    return _outcome(Status.SKIP, summary, **kw)


def error(summary: str, **kw) -> Outcome:
    return _outcome(Status.ERROR, summary, **kw)


@dataclass(frozen=True)
class Check:
    id: str
    probes: tuple[str, ...]
    summary: str
    func: Callable[..., Any]
    scope: str  # "host" | "fleet"
    origin: str = ""  # where it was loaded from, for `preflight checks` and error messages


_pending: list[Check] = []


def _register(scope: str, id: str, probes: Iterable[str], summary: str):
    def decorate(func):
        _pending.append(Check(id, tuple(probes), summary, func, scope))
        return func

    return decorate


def host_check(id: str, *, probes: Iterable[str], summary: str):
    """Declare a per-host check."""
    return _register("host", id, probes, summary)


def fleet_check(id: str, *, probes: Iterable[str], summary: str):
    """Declare a check that compares hosts with each other."""
    return _register("fleet", id, probes, summary)


class CheckLoadError(Exception):
    pass


def _collect(origin: str, load: Callable[[], None]) -> list[Check]:
    start = len(_pending)
    try:
        load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin is reported with its origin
        del _pending[start:]
        raise CheckLoadError(f"{origin}: {type(exc).__name__}: {exc}") from exc
    found = [Check(c.id, c.probes, c.summary, c.func, c.scope, origin) for c in _pending[start:]]
    del _pending[start:]
    return found


def _load_file(path: Path, namespace: str) -> None:
    name = f"{namespace}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def load_dir(path: Path, namespace: str) -> list[Check]:
    if not path.is_dir():
        raise CheckLoadError(f"{path}: not a directory")
    checks: list[Check] = []
    for file in sorted(path.glob("*.py")):
        if file.name.startswith("_"):
            continue
        checks += _collect(str(file), lambda f=file: _load_file(f, namespace))
    return checks


BUILTIN_DIR = Path(__file__).resolve().parent / "builtin_checks"


def load_checks(extra_dirs: Iterable[Path] = (), use_entry_points: bool = True) -> list[Check]:
    checks = load_dir(BUILTIN_DIR, "preflight_builtin_checks")
    for i, d in enumerate(extra_dirs):
        checks += load_dir(Path(d), f"preflight_user_checks_{i}")
    if use_entry_points:
        for ep in entry_points(group="preflight.checks"):
            checks += _collect(f"entry point {ep.name} ({ep.value})", ep.load)
    seen: dict[str, Check] = {}
    for c in checks:
        if c.id in seen:
            raise CheckLoadError(f"check id {c.id!r} defined twice: {seen[c.id].origin} and {c.origin}")
        seen[c.id] = c
    return checks


def select(checks: list[Check], wanted: Iterable[str] | None) -> list[Check]:
    """Keep the checks named in ``wanted`` (all when None); unknown names are an error."""
    if wanted is None:
        return checks
    wanted = list(wanted)
    by_id = {c.id: c for c in checks}
    unknown = [w for w in wanted if w not in by_id]
    if unknown:
        raise CheckLoadError(f"unknown check(s): {', '.join(unknown)}; `preflight checks` lists them")
    return [by_id[w] for w in wanted]
