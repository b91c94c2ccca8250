"""Shipping the soak agent: its files in one tar through the command's stdin, started detached.

A node needs nothing but ``python3`` (with pynvml, and torch for the burn): ``agent_bundle``
tars the agent and its sibling modules from ``preflight/node`` (``NODE_FILES``; they import
each other by plain name when they run from one directory) and, for a vllm soak with a
built-in model, ``models/<name>.json``. A fixed ``python3 -c _START`` unpacks the tar into
``<node-dir>/<run-id>/`` and execs the agent with ``--detach``, so the agent outlives the SSH
session and the controller; its reply (one JSON line) comes once it samples, or failed. Nodes
are reached through ``preflight.collect`` (``SshNode``, or ``LocalNode`` for this machine);
every command is an argv list, the agent's options positional parameters, never code.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rich.console import Console

from preflight.collect.local import LocalNode
from preflight.collect.node import Node
from preflight.collect.slurm import SlurmNode, UnavailableNode
from preflight.collect.ssh import SshNode
from preflight.soak.plan import MODELS_DIR, NODE_SOURCES, SoakPlan, write_plan

AGENT_PATH = NODE_SOURCES / "agent.py"
# Shipped beside agent.py: the modules it imports, and the vllm and endpoint engines' (which it
# imports only for those engines; tests/soak/test_soak_controller.py checks the list is complete).
NODE_FILES = ("agent_options.py", "records.py", "sampler.py", "burn.py", "ib_snapshots.py", "vllm_engine.py",
              "vllm_log.py", "loadgen.py", "loadgen_config.py", "loadgen_bench.py", "loadgen_http.py",
              "loadgen_windows.py")
SIBLING_PATHS = tuple(NODE_SOURCES / name for name in NODE_FILES)

# Run on the node as `python3 -c _START NODE_DIR RUN_ID AGENT_ARGS...` with the agent's tar
# (agent_bundle) on stdin: regular files only, each written under the run's directory.
# UNPACK writes the tar on stdin into directory ``d``; the Slurm soak's start (slurm_soak.py)
# uses it too.
UNPACK = """\
with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read())) as tar:
    for m in tar.getmembers():
        parts = m.name.split("/")
        if not m.isfile() or m.name.startswith("/") or ".." in parts:
            sys.exit("preflight soak: refusing %r from the agent's bundle" % m.name)
        path = os.path.join(d, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(tar.extractfile(m).read())
"""
_START = """\
import io, os, sys, tarfile
d = os.path.abspath(os.path.join(os.path.expanduser(sys.argv[1]), sys.argv[2]))
os.makedirs(d, exist_ok=True)
""" + UNPACK + """\
os.execv(sys.executable, [sys.executable, os.path.join(d, "agent.py"), "--out", d, "--detach"] + sys.argv[3:])
"""


@dataclass(frozen=True)
class Started:
    host: str
    ok: bool
    detail: str  # the agent's pid and directory, or why it did not start


def make_nodes(plan: SoakPlan) -> list[Node]:
    if not plan.hosts:
        return [LocalNode(plan.local_name)]
    if plan.slurm is not None:
        # Under Slurm a node is reached by a step inside its allocation; a node outside any
        # (drained before the run, not granted) is never asked, or srun would queue a new job.
        return [UnavailableNode(h.name, why) if (why := plan.slurm.why_not(h.name)) else
                SlurmNode(h.name, plan.slurm.job_of(h.name)) for h in plan.hosts]
    return [SshNode(h, plan.ssh) for h in plan.hosts]


def agent_argv(plan: SoakPlan, host: str) -> list[str]:
    return [plan.node_python, "-c", _START, plan.node_dir, plan.run_id, "--host", host, "--engine", plan.engine,
            "--seconds", repr(float(plan.seconds)), "--interval", repr(float(plan.interval_s)), *plan.agent_args]


def agent_bundle(builtin_model: str | None) -> bytes:
    """The tar that _START unpacks on the node: agent.py, its sibling modules, and the model config."""
    files = [(AGENT_PATH, AGENT_PATH.name)] + [(p, p.name) for p in SIBLING_PATHS]
    if builtin_model:
        files.append((MODELS_DIR / f"{builtin_model}.json", f"models/{builtin_model}.json"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, name in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def start_agent(node, plan: SoakPlan) -> Started:
    """Ship the agent and start it detached; its reply comes once it samples (or failed)."""
    reply = node.run(agent_argv(plan, node.name), stdin=agent_bundle(plan.builtin_model), timeout=90.0)
    if reply.fault:
        return Started(node.name, False, reply.fault)
    report = last_json_line(reply.stdout or b"")
    if reply.exit_code == 0 and report:
        return Started(node.name, True, f"agent pid {report.get('pid')} in {report.get('dir')}")
    why = (report or {}).get("last_error") or reply.stderr.strip().splitlines()[-1:] or [f"exit code {reply.exit_code}"]
    return Started(node.name, False, why if isinstance(why, str) else why[0])


def last_json_line(stdout: bytes) -> dict | None:
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def start(plan: SoakPlan, console: Console) -> list[Started]:
    """Write run.json, then start the agent on every node (in parallel)."""
    write_plan(plan)
    nodes = make_nodes(plan)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(64, len(nodes)))) as pool:
            started = list(pool.map(lambda n: start_agent(n, plan), nodes))
    finally:
        for node in nodes:
            node.close()
    for s in started:
        console.print(f"soak {plan.run_id}: {s.host}: {'started, ' if s.ok else 'NOT started: '}{s.detail}",
                      highlight=False, markup=False)
    return started
