"""Shipping the node-side probe runner (``preflight/node/probe_runner.py``) and reading its records.

Both launchers that run a node's probes on the node itself use this: a Slurm task per node
(``slurm_fleet``) and one SSH channel per node (``batch``). The node needs only python3: it runs
``python3 -I -S -c BOOT`` (``runner_argv``) and reads on stdin the runner's source files and the plan, which the
controller builds as for any other run (the same probes, limits, per-node width and budget).
"""

from __future__ import annotations

import functools
from pathlib import Path

from preflight.collect.fanout import ExecPlan
from preflight.collect.node import now_iso
from preflight.collect.probe import Probe
from preflight.model import ProbeResult
from preflight.node import probe_runner

# Run on each node as `python3 -c BOOT` with {"files": [[name, source], ...], "plan": {...}} on
# stdin, written as a Python literal: the files become modules under their plain names, in
# order, then the runner runs. A literal, not JSON: `json` would make the node import `re` and
# `enum` for this one read (see preflight/node/frames.py); it is evaluated with no builtins, and
# the controller that writes it is the one that sends the code run beside it.
BOOT = """\
import sys
doc = eval(sys.stdin.buffer.read(), {"__builtins__": {}})
for name, source in doc["files"]:
    module = type(sys)(name)
    module.__file__ = "<preflight %s>" % name
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
sys.exit(sys.modules["probe_runner"].main(doc["plan"]))
"""


def runner_argv(python: str = "python3") -> list[str]:
    """The command that starts the runner on a node. ``-I -S``: no site-packages, user site or
    PYTHON* variables, which the stdlib-only runner does not need and a node's own (a PYTHONPATH
    shadowing ``json``, a conda install's many .pth files) could break or slow."""
    return [python, "-I", "-S", "-c", BOOT]


def runner_plan(plan: ExecPlan) -> dict:
    """The plan as the runner reads it: plain strings, numbers, booleans and lists."""
    return {
        "per_node": plan.per_node, "budget_s": float(plan.node_budget()),
        "probes": [{"id": p.id, "argv": list(p.argv), "tool": p.tool, "tools": list(p.tools),
                    "limit": float(plan.limit_for(p)), "active": p.active, "after_active": p.after_active}
                   for p in plan.probes],
    }


@functools.lru_cache(maxsize=8)
def node_payload(plan: ExecPlan) -> bytes:
    """What the runner reads on stdin: its files and the plan, as a Python literal (``repr`` of
    plain values is one); built once per plan, not once per node."""
    here = Path(probe_runner.__file__).parent
    files = [[name[:-3], (here / name).read_text()] for name in probe_runner.FILES]
    doc = {"files": files, "plan": runner_plan(plan)}
    return repr(doc).encode("utf-8")


def result_of(probe: Probe, host: str, header: dict, payload: bytes) -> ProbeResult:
    """One ``result`` record as the bundle's record of ``probe`` on ``host``."""
    return ProbeResult(
        probe.id, host, probe.argv, payload if header.get("has_stdout") else None,
        header.get("stderr") or "", header.get("exit_code"), header.get("started") or now_iso(),
        float(header.get("duration_s") or 0.0), bool(header.get("timed_out")), header.get("error"))
