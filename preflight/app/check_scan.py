"""What a check can say, read from its code: the statuses it returns and the symptoms it reports.

A check declares what it reads (facts, probes) but not what it answers, so the reference reads its
source (``ast``) instead of a second list that could drift: from the check's function, through the
functions and constants of its module it uses, the helper modules beside it (``_nic.py``) and the
preflight modules it imports names from, it gathers the calls of ``ok``/``warn``/``fail``/``skip``/
``error`` and every string that is a known symptom. A playbook file such a module reads
(``xid.yaml``) counts with it. It is a reading of what the code can reach, so it may name a symptom a
branch never takes; it never misses one spelled out in the code it reaches.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass
from functools import cache

import yaml

from preflight.diagnose.engine import KnowledgeBase
from preflight.model import Check
from preflight.shipped import playbooks_dir

STATUS_CALLS = {"ok": "pass", "warn": "warn", "fail": "fail", "skip": "skip", "error": "error"}
# The check API and the records: every check imports them, none of their strings is a check's word.
NOT_A_SOURCE = ("preflight.check", "preflight.model", "preflight.judge.context")
SOAK_CONTEXT = ("preflight.soak.context", "SoakContext")


@dataclass(frozen=True)
class CheckWords:
    statuses: tuple[str, ...]  # in pass, warn, fail, skip, error order
    symptoms: tuple[str, ...]
    causes: tuple[str, ...]  # what the symptoms diagnose, directly or through a rule


def symptom_universe(kb: KnowledgeBase) -> set[str]:
    words = set(kb.causes)
    for rule in kb.rules:
        words |= rule.all | rule.any | rule.explains
    for rule in kb.fleet_rules:
        words |= rule.any | rule.unless
    return words


def causes_of(symptoms: set[str], kb: KnowledgeBase) -> set[str]:
    out = {s for s in symptoms if s in kb.causes}
    out |= {r.cause for r in kb.rules if (r.all | r.any) & symptoms}
    out |= {r.cause for r in kb.fleet_rules if r.cause and r.any & symptoms}
    return out


@dataclass
class _Module:
    tree: ast.Module
    name: str
    functions: dict[str, ast.AST]
    constants: dict[str, ast.AST]
    imports: dict[str, tuple[str, str | None]]  # local name -> (module, name or None for `import m`)


@cache
def _module(name: str) -> _Module | None:
    try:
        source = inspect.getsource(importlib.import_module(name))
    except (ImportError, OSError, TypeError):
        return None
    tree = ast.parse(source)
    functions: dict[str, ast.AST] = {}
    constants: dict[str, ast.AST] = {}
    imports: dict[str, tuple[str, str | None]] = {}
    package = name.rsplit(".", 1)[0]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            functions[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        constants[n.id] = node
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                imports[a.asname or a.name] = (base, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                imports[a.asname or a.name.split(".")[0]] = (a.name, None)
    return _Module(tree, name, functions, constants, imports)


def _yaml_strings(node: ast.AST) -> set[str]:
    """Every string in the playbook files a module names (``"xid.yaml"``)."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith(".yaml"):
            path = playbooks_dir() / n.value
            if path.is_file():
                out |= _strings_in(yaml.safe_load(path.read_text()))
    return out


def _strings_in(data) -> set[str]:
    if isinstance(data, str):
        return {data}
    if isinstance(data, dict):
        return set().union(*(_strings_in(k) | _strings_in(v) for k, v in data.items())) if data else set()
    if isinstance(data, list):
        return set().union(*(_strings_in(v) for v in data)) if data else set()
    return set()


class _Reader:
    def __init__(self, receivers: dict[str, tuple[_Module, ast.ClassDef]] | None = None) -> None:
        # A parameter whose methods are followed: a soak check's context, and `self` inside it.
        self.receivers = receivers or {}
        self.statuses: set[str] = set()
        self.strings: set[str] = set()
        self.seen: set[tuple[str, str]] = set()
        self.whole: set[str] = set()

    def node(self, mod: _Module, node: ast.AST) -> None:
        for n in ast.walk(node):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                self.strings.add(n.value)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                self.name(mod, n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
                self.attribute(mod, n.value.id, n.attr)
        self.strings |= _yaml_strings(node)

    def attribute(self, mod: _Module, owner: str, attr: str) -> None:
        if owner == "Status" and attr.lower() in STATUS_CALLS.values():
            self.statuses.add(attr.lower())  # Outcome(Status.FAIL, ...), as the soak's verdicts write them
            return
        if owner in self.receivers:  # soak.judge_thermal(...), self.judge_*: a method of the context
            cls_mod, cls = self.receivers[owner]
            for item in cls.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == attr:
                    key = (f"{cls_mod.name}.{cls.name}", attr)
                    if key not in self.seen:
                        self.seen.add(key)
                        self.node(cls_mod, item)
            return
        target = mod.imports.get(owner)
        if target is None:
            return
        module = target[0] if target[1] is None else f"{target[0]}.{target[1]}"
        other = _module(module)
        if other is not None and not module.startswith(NOT_A_SOURCE):
            self.name(other, attr)  # gpu_verdicts.thermal: that function, not the whole module

    def name(self, mod: _Module, name: str) -> None:
        key = (mod.name, name)
        if key in self.seen:
            return
        self.seen.add(key)
        if name in mod.functions:
            self.node(mod, mod.functions[name])
        elif name in mod.constants:
            self.node(mod, mod.constants[name])
        elif name in mod.imports:
            source, imported = mod.imports[name]
            if source == "preflight.check" and imported in STATUS_CALLS:
                self.statuses.add(STATUS_CALLS[imported])
            elif source.startswith(NOT_A_SOURCE):
                return
            elif imported is not None and _module(f"{source}.{imported}") is not None:
                return  # a module imported by name: its functions are followed where used (attribute)
            elif source.startswith("preflight") or source.rsplit(".", 1)[-1].startswith("_"):
                self.whole_module(source)

    def whole_module(self, name: str) -> None:
        if name in self.whole or name.startswith(NOT_A_SOURCE):
            return
        self.whole.add(name)
        mod = _module(name)
        if mod is None:
            return
        for n in ast.walk(mod.tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                self.strings.add(n.value)
        self.strings |= _yaml_strings(mod.tree)
        # a helper beside the checks (checks/_nic.py) returns outcomes for them
        for local, (source, imported) in mod.imports.items():
            if source == "preflight.check" and imported in STATUS_CALLS and local in _names_used(mod.tree):
                self.statuses.add(STATUS_CALLS[imported])


def _names_used(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def check_words(check: Check, kb: KnowledgeBase) -> CheckWords:
    func = inspect.unwrap(check.func)
    mod = _module(func.__module__)
    reader = _Reader(_soak_receivers(func) if check.scope == "soak" else None)
    if mod is not None and func.__name__ in mod.functions:
        reader.node(mod, mod.functions[func.__name__])
    symptoms = reader.strings & symptom_universe(kb)
    order = list(STATUS_CALLS.values())
    return CheckWords(tuple(s for s in order if s in reader.statuses), tuple(sorted(symptoms)),
                      tuple(sorted(causes_of(symptoms, kb))))


def _soak_receivers(func) -> dict[str, tuple[_Module, ast.ClassDef]]:
    """A soak check's one parameter is the soak's context (SoakContext): its judge_* methods hold
    the verdicts (checks/soak.py)."""
    mod = _module(SOAK_CONTEXT[0])
    cls = mod.functions.get(SOAK_CONTEXT[1]) if mod else None
    if not isinstance(cls, ast.ClassDef):
        return {}
    params = list(inspect.signature(func).parameters)
    return {name: (mod, cls) for name in [*params[:1], "self"]}
