"""Finding checks: the built-in ``checks/`` folder, every ``--checks-dir``, and the
``preflight.checks`` entry point group of installed packages, in that order.

A checks folder is loaded as a package of its own (``preflight_checks_<n>``), so a check module
can import the helpers beside it (``from ._common import x``); files whose names start with
``_`` are helpers and are not searched for checks. A check is a function the decorators of
``preflight.check`` marked; the loader reads the marks, so importing a module twice, or a
helper that imports a check, declares nothing twice.

A bad check is refused at load with where it is and why (pluggy's ``PluginValidationError``
habit): a module that does not import, a fact or probe nobody declares, a function that does
not take one argument, an id taken by another check.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

from preflight.check import MARK
from preflight.collect.probes import PROBES
from preflight.judge.facts import FACTS, probes_of
from preflight.model import Check
from preflight.shipped import checks_dir

SCOPES = ("host", "fleet", "soak")


class CheckLoadError(Exception):
    pass


def _checks_in(module: types.ModuleType, origin: str) -> list[Check]:
    found: list[Check] = []
    for name, obj in vars(module).items():
        marks = getattr(obj, MARK, None)
        if not marks or getattr(obj, "__module__", None) != module.__name__:
            continue  # not a check, or one imported from elsewhere (it is found where it lives)
        where = f"{origin}: {name}()"
        for mark in marks:
            found.append(_resolved(mark, where))
    return found


def _resolved(mark: Check, where: str) -> Check:
    """The check with its full probe list, or CheckLoadError naming what is wrong."""
    if mark.scope not in SCOPES:
        raise CheckLoadError(f"{where}: unknown scope {mark.scope!r}")
    unknown_facts = [f for f in mark.facts if f not in FACTS]
    if unknown_facts:
        raise CheckLoadError(f"{where}: check {mark.id!r} reads unknown fact(s) {', '.join(unknown_facts)}; "
                             f"known: {', '.join(sorted(f for f in FACTS if not f.endswith('_evidence')))}")
    unknown_probes = [p for p in mark.probes if p not in PROBES]
    if unknown_probes:
        raise CheckLoadError(f"{where}: check {mark.id!r} needs unknown probe(s) {', '.join(unknown_probes)}")
    try:
        inspect.signature(mark.func).bind(object())
    except TypeError:
        raise CheckLoadError(f"{where}: a check takes one argument (the host or the fleet)") from None
    wanted = set(mark.probes) | probes_of(mark.facts)
    probes = tuple(p for p in PROBES if p in wanted)
    return Check(mark.id, probes, mark.summary, mark.func, mark.scope, where, mark.facts)


def _package_for(path: Path, namespace: str) -> None:
    """A package ``namespace`` whose modules are the files of ``path``, so that relative imports
    between them work without putting the folder on sys.path."""
    if namespace in sys.modules:
        return
    package = types.ModuleType(namespace)
    package.__path__ = [str(path)]
    package.__package__ = namespace
    sys.modules[namespace] = package


def _import(file: Path, namespace: str) -> types.ModuleType:
    name = f"{namespace}.{file.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_dir(path: Path, namespace: str) -> list[Check]:
    if not path.is_dir():
        raise CheckLoadError(f"{path}: not a directory")
    _package_for(path, namespace)
    checks: list[Check] = []
    for file in sorted(path.glob("*.py")):
        if file.name.startswith("_"):
            continue
        try:
            module = _import(file, namespace)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a broken plugin is reported with its origin
            # SystemExit too: a module that calls sys.exit() at import must not end preflight.
            raise CheckLoadError(f"{file}: {type(exc).__name__}: {exc}") from exc
        checks += _checks_in(module, str(file))
    return checks


def _namespace(path: Path) -> str:
    # One package per folder, stable across loads in one process.
    return "preflight_checks_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))


def load_checks(extra_dirs: Iterable[Path] = (), use_entry_points: bool = True) -> list[Check]:
    checks = load_dir(checks_dir(), "preflight_builtin_checks")
    for d in extra_dirs:
        checks += load_dir(Path(d), _namespace(Path(d)))
    if use_entry_points:
        for ep in entry_points(group="preflight.checks"):
            origin = f"entry point {ep.name} ({ep.value})"
            try:
                loaded = ep.load()
            except (Exception, SystemExit) as exc:  # noqa: BLE001
                raise CheckLoadError(f"{origin}: {type(exc).__name__}: {exc}") from exc
            modules = [loaded] if isinstance(loaded, types.ModuleType) else [sys.modules[loaded.__module__]]
            for module in modules:
                checks += _checks_in(module, origin)
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
    if not wanted:
        raise CheckLoadError("--checks: no check id given; `preflight checks` lists them")
    twice = sorted({w for w in wanted if wanted.count(w) > 1})
    if twice:
        raise CheckLoadError(f"--checks: {', '.join(twice)} named more than once")
    by_id = {c.id: c for c in checks}
    unknown = [w for w in wanted if w not in by_id]
    if unknown:
        raise CheckLoadError(f"unknown check(s): {', '.join(unknown)}; `preflight checks` lists them")
    return [by_id[w] for w in wanted]
