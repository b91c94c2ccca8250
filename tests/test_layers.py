"""The package's layers, enforced: read every module's imports (ast) and fail when a module
imports a layer above its own, when code that runs on nodes imports preflight, when an import
cycle appears, or when an import hides inside a function without a heavy optional dependency
as the reason.

The order is the data's, from the bottom up: the records and contracts every stage shares,
then pure parsing and knowledge, the fabric tests' plans, then collecting and storing evidence, judging, the results
store (finished reports in, history out; it shares the judgement's rules of time), diagnosing,
reporting, and the drivers (soak, the command line, the pytest plugin). ``node`` sits apart:
it is shipped to nodes and imports nothing of preflight.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "preflight"

# Lowest first; a module may import its own layer and the ones before it.
LAYERS: list[tuple[str, ...]] = [
    ("node",),
    ("model", "contracts", "shipped", "printable"),
    ("parse",),
    ("knowledge",),
    ("fabric",),
    ("collect",),
    ("evidence",),
    ("judge", "check", "plugin"),
    ("store",),
    ("diagnose",),
    ("lifecycle",),
    ("report",),
    ("soak",),
    ("app", "__main__"),
    ("pytest",),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
# Function-level imports allowed for these (heavy, optional, or only on a node), and
# within the node layer, the sibling modules it imports by plain name when run as a script.
HEAVY = ("pandas", "numpy", "matplotlib", "rich.live", "rich.progress", "torch", "pynvml", "vllm",
         "fabric", "paramiko", "psycopg")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = modules()
MODULE_NAMES = set(MODULES)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "preflight":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path, module: str, type_only_too: bool = False) -> list[tuple[str, int, bool]]:
    """(imported name, line, inside a function) for every import in the file; a ``from m import
    n`` gives both ``m`` and ``m.n`` (n may be a submodule). Imports under ``TYPE_CHECKING`` are
    left out (they never run) unless ``type_only_too``: a cycle through them is still two modules
    that each need the other to be read."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []

    def visit(node: ast.AST, nested: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(child, inner, not type_only_too)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, inner) for a in child.names if not type_only)
            elif isinstance(child, ast.ImportFrom) and not type_only:
                if child.level and module.startswith("preflight.node"):
                    continue  # a sibling of node code, by relative import: still node code
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                # `from preflight.x import y` names the submodule y where there is one
                for a in child.names:
                    sub = f"{target}.{a.name}"
                    found.append((sub if sub in MODULE_NAMES else target, child.lineno, inner))
            visit(child, inner, type_only)

    visit(tree, False, False)
    return found




def edges(type_only_too: bool = False) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        graph[name] = {t for t, _, nested in imports(path, name, type_only_too)
                       if t in MODULES and t != name and not nested}
    return graph


def test_every_module_is_in_a_layer():
    unknown = sorted({layer_of(m) for m in MODULES} - RANK.keys() - {"__init__"})
    assert not unknown, f"folders or modules with no layer in tests/test_layers.py: {unknown}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_layer_above_it(module):
    mine = layer_of(module)
    if mine == "__init__":
        return
    bad = []
    for target, line, _ in imports(MODULES[module], module):
        theirs = layer_of(target)
        if theirs in (None, "__init__") and target != "preflight":
            continue
        if mine == "node":
            if target.startswith("preflight"):
                bad.append(f"line {line}: node code imports {target} (it runs where preflight is not installed)")
            continue
        if theirs in RANK and RANK[theirs] > RANK[mine]:
            bad.append(f"line {line}: {mine} imports {target} ({theirs} is above it)")
    assert not bad, f"{MODULES[module].relative_to(ROOT)}: " + "; ".join(bad)


def test_checks_import_only_the_check_api_and_below():
    # Built-in checks sit at the judge layer: they may not reach into diagnosis, reports or the CLI.
    bad = []
    for path in sorted((ROOT / "checks").glob("*.py")):
        for target, line, _ in imports(path, f"checks.{path.stem}"):
            theirs = layer_of(target)
            if theirs in RANK and RANK[theirs] > RANK["judge"]:
                bad.append(f"{path.name}:{line}: {target}")
    assert not bad


def test_no_import_cycles():
    # Imports under TYPE_CHECKING count too: they hide a cycle from the interpreter, not from a reader.
    graph = edges(type_only_too=True)
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def heavy_at_top(module: str, seen: set[str] | None = None) -> bool:
    """Whether importing ``module`` pulls in a heavy dependency at import time."""
    seen = seen if seen is not None else set()
    if module in seen or module not in MODULES:
        return False
    seen.add(module)
    for target, _, nested in imports(MODULES[module], module):
        if nested:
            continue
        if target.startswith(HEAVY) or heavy_at_top(target, seen):
            return True
    return False


def test_hidden_imports_are_for_heavy_dependencies_only():
    """An import inside a function hides a dependency from the reader; keep it only where a heavy
    or optional package is the reason (directly, or through the module imported), with a comment
    on the line or just above it."""
    bad = set()
    for module, path in MODULES.items():
        if layer_of(module) == "node":
            continue  # node code imports torch/pynvml/siblings where they exist, by design
        lines = path.read_text().splitlines()
        for target, line, nested in imports(path, module):
            if not nested:
                continue
            heavy = target.startswith(HEAVY) or heavy_at_top(target)
            commented = any("#" in lines[i] for i in range(max(0, line - 3), line))
            if not (heavy and commented):
                bad.add(f"{path.relative_to(ROOT)}:{line}: {target}"
                        + ("" if heavy else " (not heavy: import it at the top)") + ("" if commented else " (no comment)"))
    assert not bad, "function-level imports: " + ", ".join(sorted(bad))
