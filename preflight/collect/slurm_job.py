"""Asking Slurm for nodes: their state, the partition, an allocation and its release.

Every call is an argv list run on this machine (``LocalNode``); node names and options reach
Slurm's commands as arguments, never through a shell. Slurm's refusals are quoted as they are
printed. A refusal of the request itself (unknown partition, node list Slurm rejects, no
slurmctld, the commands missing) is ``SlurmUsageError``, raised before anything is written;
resources that are not granted in time are not an input error: the caller gives the nodes of
that allocation their verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from preflight.collect.local import LocalNode
from preflight.collect.node import CommandResult
from preflight.parse.slurm import NodeState, first_error, granted_job, is_input_error, parse_show_node

QUERY_TIMEOUT_S = 60.0


class SlurmUsageError(Exception):
    """Slurm refused the request, or cannot be asked; the message quotes Slurm."""


@dataclass(frozen=True)
class SlurmOptions:
    """``run --slurm``'s own options."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None  # Slurm's time format; None: from the run's budget
    max_nodes_per_job: int = 256  # one job over ~300 nodes is a known failure mode of srun fan-outs
    extra: tuple[str, ...] = ()  # --sbatch-arg: passed to salloc as they are
    alloc_timeout_s: int = 300  # salloc --immediate: how long to wait for busy nodes
    node_python: str = "python3"  # what runs the node-side runner on each node
    # GPUs a job asks of each node (--gres=gpu:N): None asks for the GPUs slurm.conf gives the
    # node (its Gres), all of them, which is what a check of the node must see; 0 asks for none.
    # Under ConstrainDevices=yes a step sees no GPU it did not ask for.
    gpus_per_node: int | None = None
    exclusive: bool = False  # --exclusive: no other job on the nodes while preflight holds them
    allow_shared: bool = False  # the load probes may run on a node where another job runs

    def gpus_for(self, state: NodeState | None) -> int:
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        return state.gpus if state is not None else 0


def slurm(argv: Sequence[str], timeout: float = QUERY_TIMEOUT_S, stdin: bytes = b"") -> CommandResult:
    return LocalNode("controller").run(argv, stdin=stdin, timeout=timeout)


def _said(r: CommandResult) -> str:
    text = (r.stderr or "").strip() or (r.stdout or b"").decode("utf-8", "replace").strip()
    return first_error(text) or text.splitlines()[-1] if text else f"exit code {r.exit_code}"


def _require(r: CommandResult, what: str) -> CommandResult:
    if r.exit_code == 127:
        raise SlurmUsageError(f"{what}: {r.argv[0]} not found: is this a Slurm login node? "
                              "(the Slurm client commands must be on PATH)")
    if r.timed_out:
        raise SlurmUsageError(f"{what}: `{' '.join(r.argv)}` did not answer within {r.duration_s:g} s")
    return r


def expand(nodelist: str, what: str = "-w") -> list[str]:
    try:
        return list(NodeSet(nodelist))
    except NodeSetParseError as exc:
        raise SlurmUsageError(f"{what}: {nodelist!r}: {exc}") from None


def partition_nodes(partition: str | None) -> list[str]:
    """The nodes of ``partition`` (every node Slurm knows, without one)."""
    argv = ["sinfo", "-h", "-N", "-o", "%N"] + (["-p", partition] if partition else [])
    r = _require(slurm(argv), "sinfo")
    if r.exit_code != 0:
        raise SlurmUsageError(f"sinfo: {_said(r)}")
    nodes = list(dict.fromkeys((r.stdout or b"").decode().split()))
    if not nodes:
        raise SlurmUsageError(f"partition {partition!r} has no nodes" if partition else "Slurm lists no nodes")
    return nodes


def check_partition(partition: str) -> None:
    r = _require(slurm(["scontrol", "show", "partition", "-o", partition]), "scontrol")
    text = (r.stdout or b"").decode().strip()
    if r.exit_code != 0 or not text.startswith("PartitionName="):
        raise SlurmUsageError(f"--partition {partition}: Slurm says: {_said(r)}")


def node_states(names: Sequence[str]) -> dict[str, NodeState]:
    """``scontrol show node -o`` for ``names``; a name Slurm does not know is a usage error."""
    r = _require(slurm(["scontrol", "show", "node", "-o", str(NodeSet.fromlist(names))]), "scontrol")
    states, missing = parse_show_node((r.stdout or b"").decode("utf-8", "replace"))
    if missing:
        raise SlurmUsageError(f"node list: Slurm says: {'; '.join(f'Node {n} not found' for n in missing)}")
    if r.exit_code != 0 or not states:
        raise SlurmUsageError(f"scontrol show node: Slurm says: {_said(r)}")
    return states


def chunks(nodes: Sequence[str], size: int) -> list[list[str]]:
    return [list(nodes[i:i + size]) for i in range(0, len(nodes), size)]


def time_limit(budget_s: float) -> str:
    """A job time limit covering the node budget, whole minutes, with room for the launch."""
    return str(max(2, math.ceil(budget_s / 60) + 2))


@dataclass(frozen=True)
class Allocation:
    job: int | None  # None: not granted
    nodes: tuple[str, ...]
    why_not: str | None = None  # salloc's words when not granted


def gpu_groups(nodes: Sequence[str], states: dict[str, NodeState], opts: SlurmOptions) -> list[tuple[int, list[str]]]:
    """The allocations to ask for: nodes that get the same GPU request together (one salloc asks
    the same of every node), at most ``max_nodes_per_job`` each, in the nodes' order."""
    by_gpus: dict[int, list[str]] = {}
    for n in nodes:
        by_gpus.setdefault(opts.gpus_for(states.get(n)), []).append(n)
    return [(gpus, group) for gpus, same in by_gpus.items() for group in chunks(same, opts.max_nodes_per_job)]


def allocate(nodes: Sequence[str], opts: SlurmOptions, name: str, budget_s: float,
             tasks_per_node: int = 1, gpus: int = 0) -> Allocation:
    """One job holding ``nodes``, ``tasks_per_node`` tasks on each (one per GPU for an MPI
    all_reduce step) and ``gpus`` GPUs of each, until released. ``--gres=gpu:N`` rather than
    ``--gpus-per-node``: both work on Slurm 22.05 with select/cons_tres (tried on the test
    cluster), and only --gres also works with select/cons_res."""
    argv = ["salloc", "--no-shell", f"--job-name={name}", f"--nodes={len(nodes)}",
            f"--nodelist={NodeSet.fromlist(nodes)}", f"--ntasks-per-node={tasks_per_node}",
            f"--time={opts.time or time_limit(budget_s)}", f"--immediate={opts.alloc_timeout_s}"]
    argv += [f"--gres=gpu:{gpus}"] if gpus else []
    argv += ["--exclusive"] if opts.exclusive else []
    argv += [f"--partition={opts.partition}"] if opts.partition else []
    argv += [f"--account={opts.account}"] if opts.account else []
    argv += list(opts.extra)
    r = _require(slurm(argv, timeout=opts.alloc_timeout_s + QUERY_TIMEOUT_S), "salloc")
    job = granted_job(r.stderr) if r.exit_code == 0 else None
    if job is not None:
        return Allocation(job, tuple(nodes))
    said = _said(r)
    if is_input_error(said):
        raise SlurmUsageError(f"salloc: Slurm says: {said}")
    return Allocation(None, tuple(nodes), f"allocation not granted: {said}")


def release(job: int) -> None:
    slurm(["scancel", str(job)])


def set_state(node: str, state: str, reason: str | None = None) -> str | None:
    """``scontrol update NodeName=N State=S [Reason=R]``; returns Slurm's complaint, else None."""
    argv = ["scontrol", "update", f"NodeName={node}", f"State={state}"] + ([f"Reason={reason}"] if reason else [])
    r = slurm(argv)
    return None if r.exit_code == 0 else _said(r)
