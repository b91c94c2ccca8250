"""``run --slurm --nccl-multinode``: the multi-node all_reduce as srun steps instead of mpirun.

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

The stage holds an allocation of its own (the per-node probes' allocations hold one task per
node and are released when those end), of every member node, released at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from ClusterShell.NodeSet import NodeSet

from preflight.collect.multinode import (
    _GRACE_S,
    VARIANTS,
    Judge,
    MultinodeOptions,
    expect_note,
    record_not_run,
    run_pass,
    stage_members,
)
from preflight.collect.nccl import KILL_AFTER_S
from preflight.collect.slurm_job import SlurmOptions, SlurmUsageError, allocate, release, slurm
from preflight.contracts import SLURM_ERROR
from preflight.model import Host, ProbeResult
from preflight.parse.collective_run import MultinodeRun, read_run
from preflight.parse.nccl_probe import TIMEOUT_EXITS
from preflight.parse.slurm import task_exit_codes


def rank_order(members: Sequence[str]) -> list[str]:
    """The nodes in the order srun gives them ranks, as far as the controller can tell: the
    node list sorted (ClusterShell's order; Slurm's is its node table's, the same where
    slurm.conf lists nodes in order). The run's own device lines ("Rank R ... on HOST") say
    which rank ran where; NCCL's WARN lines name their host themselves."""
    return list(NodeSet.fromlist(members))


def step_argv(job: int, members: Sequence[str], gpus: int, options: MultinodeOptions, split: str = "") -> list[str]:
    binary = f"{options.tests_dir.rstrip('/')}/all_reduce_perf" if options.tests_dir else "all_reduce_perf"
    env = ["env", "NCCL_DEBUG=WARN"] + ([f"NCCL_TESTS_SPLIT={split}"] if split else [])
    return ["srun", f"--jobid={job}", f"--nodes={len(members)}", f"--ntasks={len(members) * gpus}",
            f"--ntasks-per-node={gpus}", f"--nodelist={NodeSet.fromlist(members)}", "--kill-on-bad-exit=1",
            *env, "timeout", "-k", str(KILL_AFTER_S), f"{options.timeout_s:g}",
            binary, "-b", "8", "-e", str(options.max_bytes), "-f", "2", "-g", "1", "-c", "1"]


def step_text(members: Sequence[str], gpus: int, stdout: bytes, stderr: str, exit_code: int | None,
              seconds: float, expect: str = "") -> bytes:
    """One step's output in the stage's saved format; without the closing marker when srun
    itself had to be stopped (``exit_code`` None), as a cut-off mpirun run is saved. ``expect``:
    what "slow" meant (``multinode.expect_note``), saved so the bundle is judged again alike."""
    head = f"# preflight: tool=srun gpus={gpus} repetitions=1\n" + (f"# preflight: expect {expect}\n" if expect else "")
    head += "".join(f"# preflight: host {h} slots={gpus}\n" for h in rank_order(members))
    body = stdout + (b"" if stdout.endswith(b"\n") or not stdout else b"\n")
    said = stderr + ("" if stderr.endswith("\n") or not stderr else "\n")
    tail = "" if exit_code is None else f"# preflight: repetition 1 exit={exit_code} seconds={math.floor(seconds)}\n"
    return head.encode() + body + said.encode() + tail.encode()


def one_step(job: int, gpus: int, options: MultinodeOptions, on_result: Callable[[ProbeResult], None],
             fleet_host: str) -> Callable[..., MultinodeRun]:
    """The stage's ``one``: run ``probe`` as an srun step over ``members``, record it, read it back."""

    def one(probe: str, members: Sequence[str], split: str = "") -> MultinodeRun:
        argv = step_argv(job, members, gpus, options, split)
        r = slurm(argv, timeout=options.timeout_s + KILL_AFTER_S + _GRACE_S)
        if r.stdout is None or r.exit_code in (126, 127):
            # srun itself missing, or the program on the nodes (timeout says 127): not run.
            result = ProbeResult(probe, fleet_host, tuple(argv), r.stdout, r.stderr, r.exit_code, r.started,
                                 r.duration_s, r.timed_out, r.error)
        else:
            code = None if r.timed_out else r.exit_code
            if code is not None and any(c in TIMEOUT_EXITS for c in task_exit_codes(r.stderr)):
                # A rank's own limit fired: a hang, even when srun then terminated its peers
                # (--kill-on-bad-exit) and returns their 143 as the step's exit.
                code = TIMEOUT_EXITS[0]
            text = step_text(members, gpus, r.stdout, r.stderr, code, r.duration_s, expect_note(options))
            result = ProbeResult(probe, fleet_host, tuple(argv), text,
                                 r.stderr, 0, r.started, r.duration_s, r.timed_out, None)
        on_result(result)
        return read_run(result)

    return one


def run_multinode_slurm(hosts: Sequence[Host], evidence: Mapping[str, Mapping[str, ProbeResult]],
                        on_result: Callable[[ProbeResult], None], opts: SlurmOptions, options: MultinodeOptions,
                        run_id: str, fleet_host: str, judge: Judge, split_once: bool = False) -> str | None:
    """The stage through Slurm, after the per-node probes: one allocation of the member nodes,
    the runs as its steps, released at the end. Returns why it did not run, else None."""
    picked = stage_members(hosts, evidence, on_result, fleet_host)
    if isinstance(picked, str):
        return picked
    members, gpus, failed = picked
    names = [h.name for h in members]
    # Three runs, then the bisection's rounds (about log2(N) + 2, more for a path between two
    # nodes): a generous bound, since the allocation is released as soon as the stage ends.
    budget = (3 + 2 * len(names)) * (options.timeout_s + KILL_AFTER_S + _GRACE_S)
    try:
        alloc = allocate(names, opts, f"preflight-{run_id}-nccl", budget, tasks_per_node=gpus)
    except SlurmUsageError as exc:
        why = str(exc)  # the run has started: its bundle says why, the exit code is 1
    else:
        why = alloc.why_not if alloc.job is None else None
    if why:
        record_not_run(VARIANTS, on_result, fleet_host, f"{SLURM_ERROR}{why}")
        return None
    try:
        run_pass(names, gpus, one_step(alloc.job, gpus, options, on_result, fleet_host), judge, "nccl", split_once)
    finally:
        release(alloc.job)
    return None
