"""``run --slurm --nccl-multinode``: the multi-node collective as srun steps instead of mpirun.

Under Slurm the scheduler starts the ranks: one step per run, one task per GPU on each node
(``--ntasks-per-node=G``), each task ``all_reduce_perf -g 1``, wired into one MPI job by the
site's PMI plugin (slurm.conf ``MpiDefault``; all_reduce_perf built with MPI=1). No launcher
host, no hostfile, no SSH between the nodes. The same runs as over SSH
(``preflight.collect.multinode.run_pass``): the full fleet, the intra-node split
(``NCCL_TESTS_SPLIT="DIV G"``) and the inter-node split (``"MOD G"``), set on the task's own
command line through ``env``; then, if one of them did not pass, the bisection (preflight/fabric/bisection.py), whose
groups of a round run as concurrent steps of the one allocation.

Each task runs under ``timeout -k``, so a hung all_reduce ends on its nodes at the stage's limit.
A rank that dies ends the step (``--kill-on-bad-exit=1``) instead of leaving its peers to wait
for it; so does the first rank whose limit fires, and srun then returns its peers' 143
(terminated), the highest exit. The saved exit is therefore 124 (a hang, as over SSH) whenever
srun's stderr says a task exited 124 or 137, else srun's own. The saved output is the
mpirun stage's format (``preflight.collect.multinode``): ``# preflight: tool=srun ...``, the
members in rank order as ``# preflight: host NAME slots=G`` (srun's default block distribution
puts ranks 0..G-1 on the first node of the sorted node list, and so on), srun's stdout (rank 0
prints the table; NCCL prefixes its WARN lines with the host that saw them), srun's own stderr,
and ``# preflight: repetition 1 exit=C seconds=S``; so the same reader and check judge it.

The mpi engine (``--collective-tool mpi``) runs the same way, one task per node of
preflight/node/mpi_allreduce.py, the tasks wired by Slurm's PMIx plugin (``srun --mpi=pmix``,
see ``MPI_PLUGIN``): a real Open MPI job with no mpirun, whose ranks reach each other over
the nodes' own links. Its output is saved with ``tool=mpi4py``, so it is read as over SSH (the
ranks print their own hosts). ``--mpirun-args`` under Slurm may hold only ``--mca NAME VALUE``
pairs, which reach the tasks as ``OMPI_MCA_NAME=VALUE`` (both engines). The fleet runs repeat
``--collective-reps`` times, one step each.

The stage holds an allocation of its own (the per-node probes' allocations hold one task per
node and are released when those end), of every member node, released at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from ClusterShell.NodeSet import NodeSet

from preflight.collect.multinode import (
    _GRACE_S,
    PROBE_FULL,
    VARIANTS,
    Judge,
    MultinodeOptions,
    expect_note,
    program,
    record_not_run,
    run_pass,
    stage_members,
)
from preflight.collect.nccl import KILL_AFTER_S
from preflight.collect.slurm_job import SlurmOptions, SlurmUsageError, allocate, node_states, release, slurm
from preflight.contracts import SLURM_ERROR
from preflight.model import Host, ProbeResult
from preflight.parse.collective_run import MPI_TOOL, MultinodeRun, read_run
from preflight.parse.nccl_probe import TIMEOUT_EXITS
from preflight.parse.slurm import mpi_plugin_failure, task_exit_codes


def rank_order(members: Sequence[str]) -> list[str]:
    """The nodes in the order srun gives them ranks, as far as the controller can tell: the
    node list sorted (ClusterShell's order; Slurm's is its node table's, the same where
    slurm.conf lists nodes in order). The run's own device lines ("Rank R ... on HOST") say
    which rank ran where; NCCL's WARN lines name their host themselves."""
    return list(NodeSet.fromlist(members))


# The PMI the mpi engine's tasks are wired by. Debian's Open MPI 4.1 (openmpi-bin, libopenmpi3)
# is built --with-pmix against the system PMIx (ompi_info lists "MCA pmix: ext3x" and no PMI-1/2
# "s1"/"s2" components), so of the plugins Debian's slurm-wlm ships (srun --mpi=list: none, pmi2,
# pmix, pmix_v4, cray_shasta) only pmix lets its ranks find each other; without it every task
# starts as a singleton rank 0 of 1. Asked for on the step, so it runs whatever the site's
# slurm.conf MpiDefault is (Open MPI's "Running MPI jobs with Slurm" FAQ and Slurm's mpi_guide
# name srun --mpi=pmix as the direct launch of Open MPI built with PMIx).
MPI_PLUGIN = "pmix"
_MCA = ("--mca", "-mca", "--gmca", "-gmca")


def mca_env(args: Sequence[str]) -> list[str]:
    """``--mpirun-args`` as the tasks' environment under srun: each ``--mca NAME VALUE`` as
    ``OMPI_MCA_NAME=VALUE`` (Open MPI reads every MCA parameter from such a variable; there is no
    mpirun to take the option). Anything else is an mpirun option with no meaning when srun
    starts the ranks: ValueError naming it."""
    env, rest = [], list(args)
    while rest:
        flag = rest.pop(0)
        if flag not in _MCA:
            raise ValueError(f"{flag!r} is an mpirun option: under --slurm srun starts the ranks, and only "
                             "--mca NAME VALUE pairs apply (set as OMPI_MCA_NAME in the tasks' environment)")
        if len(rest) < 2:
            raise ValueError(f"{flag} needs a parameter name and a value")
        name, value = rest.pop(0), rest.pop(0)
        if not name or "=" in name or not name.replace("_", "").isalnum():
            raise ValueError(f"{flag} {name!r}: not an MCA parameter name")
        env.append(f"OMPI_MCA_{name}={value}")
    return env


def step_argv(job: int, members: Sequence[str], gpus: int, options: MultinodeOptions, split: str = "") -> list[str]:
    """nccl: one task per GPU running all_reduce_perf, wired by the site's MpiDefault; mpi: one
    task per node running preflight/node/mpi_allreduce.py, wired by PMIx (``MPI_PLUGIN``)."""
    if options.tool == "mpi":
        tasks, plugin, env = len(members), [f"--mpi={MPI_PLUGIN}"], ["env", *mca_env(options.mpirun_args)]
    else:
        tasks, plugin = len(members) * gpus, []
        env = ["env", "NCCL_DEBUG=WARN", *([f"NCCL_TESTS_SPLIT={split}"] if split else []),
               *mca_env(options.mpirun_args)]
    return ["srun", f"--jobid={job}", f"--nodes={len(members)}", f"--ntasks={tasks}",
            f"--ntasks-per-node={tasks // len(members)}", f"--nodelist={NodeSet.fromlist(members)}",
            "--kill-on-bad-exit=1", *plugin, *env, "timeout", "-k", str(KILL_AFTER_S), f"{options.timeout_s:g}",
            *program(options)]


Repetition = tuple[bytes, str, int | None, float]  # (stdout, stderr, exit or None when stopped, seconds)


def step_text(members: Sequence[str], gpus: int, reps: Sequence[Repetition], expect: str = "",
              tool: str = "srun") -> bytes:
    """A run's steps in the stage's saved format, one block per repetition closed by its marker;
    the last without it when srun itself had to be stopped (exit None), as a cut-off mpirun run
    is saved. ``expect``: what "slow" meant (``multinode.expect_note``), saved so the bundle is
    judged again alike."""
    head = f"# preflight: tool={tool} gpus={gpus} repetitions={len(reps)}\n"
    head += f"# preflight: expect {expect}\n" if expect else ""
    head += "".join(f"# preflight: host {h} slots={gpus}\n" for h in rank_order(members))
    text = head.encode()
    for i, (stdout, stderr, exit_code, seconds) in enumerate(reps, 1):
        text += stdout + (b"" if stdout.endswith(b"\n") or not stdout else b"\n")
        text += (stderr + ("" if stderr.endswith("\n") or not stderr else "\n")).encode()
        if exit_code is not None:
            text += f"# preflight: repetition {i} exit={exit_code} seconds={math.floor(seconds)}\n".encode()
    return text


def one_step(job: int, gpus: int, options: MultinodeOptions, on_result: Callable[[ProbeResult], None],
             fleet_host: str) -> Callable[..., MultinodeRun]:
    """The stage's ``one``: run ``probe`` as an srun step over ``members`` (the fleet runs
    ``--collective-reps`` times, one step each), record it, read it back."""

    def one(probe: str, members: Sequence[str], split: str = "") -> MultinodeRun:
        argv = step_argv(job, members, gpus, options, split)
        reps: list[Repetition] = []
        started = ""
        for _ in range(options.reps if probe in VARIANTS else 1):
            r = slurm(argv, timeout=options.timeout_s + KILL_AFTER_S + _GRACE_S)
            plugin = mpi_plugin_failure(r.stderr) if not r.stdout else None
            if r.stdout is None or r.exit_code in (126, 127) or plugin:
                # srun itself missing, the program on the nodes (timeout says 127), or srun's MPI
                # plugin (no task started): not run, and no node to blame.
                why = f"srun cannot start MPI tasks: {plugin}" if plugin else r.error
                result = ProbeResult(probe, fleet_host, tuple(argv), r.stdout, r.stderr, r.exit_code, r.started,
                                     r.duration_s, r.timed_out, why)
                on_result(result)
                return read_run(result)
            code = None if r.timed_out else r.exit_code
            if code is not None and any(c in TIMEOUT_EXITS for c in task_exit_codes(r.stderr)):
                # A rank's own limit fired: a hang, even when srun then terminated its peers
                # (--kill-on-bad-exit) and returns their 143 as the step's exit.
                code = TIMEOUT_EXITS[0]
            reps.append((r.stdout, r.stderr, code, r.duration_s))
            started = started or r.started
            if code is None:
                break  # srun had to be stopped: the run is cut off here
        text = step_text(members, gpus, reps, expect_note(options), MPI_TOOL if options.tool == "mpi" else "srun")
        result = ProbeResult(probe, fleet_host, tuple(argv), text, r.stderr, 0, started,
                             sum(rep[3] for rep in reps), r.timed_out, None)
        on_result(result)
        return read_run(result)

    return one


def run_multinode_slurm(hosts: Sequence[Host], evidence: Mapping[str, Mapping[str, ProbeResult]],
                        on_result: Callable[[ProbeResult], None], opts: SlurmOptions, options: MultinodeOptions,
                        run_id: str, fleet_host: str, judge: Judge, split_once: bool = False) -> str | None:
    """The stage through Slurm, after the per-node probes: one allocation of the member nodes,
    the runs as its steps, released at the end. Returns why it did not run, else None."""
    picked = stage_members(hosts, evidence, on_result, fleet_host, options.tool)
    if isinstance(picked, str):
        return picked
    members, gpus, failed = picked
    names = [h.name for h in members]
    # Three runs, then the bisection's rounds (about log2(N) + 2, more for a path between two
    # nodes): a generous bound, since the allocation is released as soon as the stage ends.
    budget = (3 + 2 * len(names)) * (options.timeout_s + KILL_AFTER_S + _GRACE_S)
    try:
        # The nodes' GPUs, as for the per-node probes (one salloc asks the same of every node).
        states = node_states(names)
        alloc = allocate(names, opts, f"preflight-{run_id}-nccl", budget, tasks_per_node=gpus,
                         gpus=min(opts.gpus_for(states.get(n)) for n in names))
    except SlurmUsageError as exc:
        why = str(exc)  # the run has started: its bundle says why, the exit code is 1
    else:
        why = alloc.why_not if alloc.job is None else None
    if why:
        record_not_run(VARIANTS if options.tool == "nccl" else [PROBE_FULL], on_result, fleet_host,
                       f"{SLURM_ERROR}{why}")
        return None
    try:
        run_pass(names, gpus, one_step(alloc.job, gpus, options, on_result, fleet_host), judge, options.tool,
                 split_once)
    finally:
        release(alloc.job)
    return None
