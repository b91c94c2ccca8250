"""``soak --slurm``'s polls: one srun step per allocation, not one per node.

A step is a request slurmctld serves (a step create, a launch, a completion). One short step
per node every few seconds is thousands a minute at a thousand nodes, which a shared
slurmctld notices; one step per allocation (256 nodes each by default) is a few. The step runs
one task per pending node of the allocation (``--overlap``, beside the agents' own step); each
task reads its own node's offsets from the one JSON argument, by its Slurm name, and prints one
line: the single-node pull's reply with the node's name in it. srun's ``--label`` tells the
tasks' output apart (``replies``). A node whose line is missing or unreadable has this poll's error
and is polled again next time; what Slurm says about the step (a launch that failed) is every
missing node's error, as a single-node poll's would be.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ClusterShell.NodeSet import NodeSet

from preflight.collect.node import KILL_AFTER_S
from preflight.collect.slurm import GRACE_S, SlurmNode
from preflight.collect.slurm_job import slurm
from preflight.contracts import SLURM_ERROR
from preflight.parse.slurm import first_error, parse_step_stderr
from preflight.soak.follow import _PULL, PULL_CAP, HostWatch
from preflight.soak.plan import SoakPlan

POLL_TIMEOUT_S = 120.0

# `python3 -c _PULL_EACH NODE_DIR CAP JSON`: JSON maps node -> [run subdir, name, offset, ...];
# the task takes its own entry and runs the single-node pull on it, naming the node in its line.
_PULL_EACH = (
    "import json, os, sys\n"
    "node = os.environ.get('SLURMD_NODENAME') or os.uname().nodename.split('.')[0]\n"
    "entry = json.loads(sys.argv[3]).get(node)\n"
    "if entry is None:\n"
    "    sys.stdout.write(json.dumps({'node': node, 'unknown': True}) + '\\n'); sys.exit(0)\n"
    "sys.argv = [sys.argv[0], sys.argv[1], entry[0], sys.argv[2]] + entry[1:]\n"
    + _PULL.replace("sys.stdout.write(json.dumps(out))", "sys.stdout.write(json.dumps(dict(out, node=node)) + '\\n')")
)


def step_argv(plan: SoakPlan, job: int, watches: Sequence[HostWatch]) -> list[str]:
    entries = {w.name: [plan.node_subdir(w.name), *w.mirror.pairs()] for w in watches}
    nodes = [w.name for w in watches]
    return ["srun", f"--jobid={job}", "--overlap", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={NodeSet.fromlist(nodes)}", "--kill-on-bad-exit=0", "--label",
            "timeout", "-k", str(KILL_AFTER_S), f"{POLL_TIMEOUT_S:g}",
            plan.node_python, "-c", _PULL_EACH, plan.node_dir, str(PULL_CAP), json.dumps(entries)]


def replies(stdout: bytes) -> dict[str, dict]:
    """node -> its reply, from srun's labelled output. srun cuts a task's long line into pieces
    of 1,024 bytes, each on a line of its own behind the task's label ("3: ..."), and interleaves
    the tasks' pieces; each task prints one JSON line, so a task's pieces joined in order are its
    reply. A task whose pieces do not make one is left out (its node's poll failed this time)."""
    pieces: dict[str, list[str]] = {}
    for line in stdout.decode("utf-8", "replace").splitlines():
        label, sep, text = line.partition(": ")
        if sep and label.strip().isdigit():
            pieces.setdefault(label.strip(), []).append(text)
    out: dict[str, dict] = {}
    for parts in pieces.values():
        try:
            doc = json.loads("".join(parts))
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("node"), str):
            out[doc["node"]] = doc
    return out


def poll_allocation(plan: SoakPlan, job: int, watches: Sequence[HostWatch]) -> None:
    """One step for every pending node of allocation ``job``; each watch takes its node's reply."""
    r = slurm(step_argv(plan, job, watches), timeout=POLL_TIMEOUT_S + KILL_AFTER_S + GRACE_S)
    got = replies(r.stdout or b"")
    said = parse_step_stderr(r.stderr or "")
    for w in watches:
        doc = got.get(w.name)
        if doc is not None and not doc.get("unknown"):
            w.take(doc, None)
            continue
        why = said.launch_failed.get(w.name) or (first_error(r.stderr or "") if said.errors else None)
        w.take(None, f"{SLURM_ERROR}{why}" if why else (r.error or "no reply from its task in the poll's step"))


def poll_all(plan: SoakPlan, pending: list[HostWatch], pool: ThreadPoolExecutor) -> None:
    """``follow.watch``'s poll under Slurm: a step per allocation, the allocations at once. A node
    Slurm would not run anything on answers at once through its own node, never through srun."""
    by_job: dict[int, list[HostWatch]] = {}
    for w in pending:
        if isinstance(w.node, SlurmNode) and w.node.job is not None:
            by_job.setdefault(w.node.job, []).append(w)
        else:
            w.poll()
    list(pool.map(lambda jw: poll_allocation(plan, *jw), sorted(by_job.items())))
