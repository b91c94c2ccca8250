"""The idle-node sweep's dealings with Slurm: its jobs in the queue, submitting one, and, on the
node, whether Slurm preempted the job it runs in.

A sweep job is ``sbatch`` of a two-line script: one ``srun`` step running ``preflight sweep
--job`` on the node. The step, not the batch script, because at preemption Slurm signals a job's
*tasks* at once (SIGCONT, SIGTERM) and the batch script only when the grace time ends
(slurm.conf(5), GraceTime): in a step the sweep hears of it at once, stops, and frees the node
for the real job before the grace is out. Every value reaches sbatch as an argument and the
script through ``shlex.quote``; nothing a node or site names is read by a shell unquoted."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from preflight.collect.slurm_job import SlurmUsageError, _require, _said, slurm
from preflight.parse.slurm import first_error, is_input_error
from preflight.parse.slurm_jobs import QueuedJob, parse_squeue, preempt_time

JOB_NAME = "preflight-sweep"


def queued() -> list[QueuedJob]:
    """The sweep's jobs Slurm still lists (any state; a finished one for MinJobAge)."""
    r = _require(slurm(["squeue", "-h", "-t", "all", f"--name={JOB_NAME}", "-o", "%i|%k|%T"]), "squeue")
    if r.exit_code != 0:
        raise SlurmUsageError(f"squeue: Slurm says: {_said(r)}")
    return parse_squeue((r.stdout or b"").decode("utf-8", "replace"))


def script(node_argv: Sequence[str], run_id: str, node: str) -> str:
    return ("#!/bin/sh\n"
            f"# preflight sweep {shlex.quote(run_id)} on {shlex.quote(node)} (docs/sweep.md)\n"
            "exec srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1 "
            + " ".join(shlex.quote(a) for a in node_argv) + "\n")


def sbatch_argv(node: str, run_id: str, time_min: int, deadline_min: int, partition: str | None,
                qos: str | None, account: str | None) -> list[str]:
    argv = ["sbatch", "--parsable", f"--job-name={JOB_NAME}", f"--comment={run_id}", f"--nodelist={node}",
            "--nodes=1", "--exclusive", "--no-requeue", f"--time={time_min}", f"--deadline=now+{deadline_min}minutes",
            "--output=/dev/null", "--error=/dev/null"]
    argv += [f"--partition={partition}"] if partition else []
    argv += [f"--qos={qos}"] if qos else []
    argv += [f"--account={account}"] if account else []
    return argv


def submit(argv: Sequence[str], body: str) -> tuple[int | None, str | None]:
    """(job id, None) or (None, Slurm's refusal). A refusal of the request itself (an unknown
    partition or QOS) is ``SlurmUsageError``: every node's job would be refused alike. The job
    gets this process's environment (sbatch's default ``--export=ALL``): the store's URL goes
    that way, never on a command line."""
    r = _require(slurm(list(argv), stdin=body.encode()), "sbatch")
    out = (r.stdout or b"").decode("utf-8", "replace").strip()
    head = out.split(";")[0]
    if r.exit_code == 0 and head.isdigit():
        return int(head), None
    said = first_error(r.stderr or "") or _said(r)
    if is_input_error(said):
        raise SlurmUsageError(f"sbatch: Slurm says: {said}")
    return None, said


def preempted(job: int) -> bool | None:
    """On the node: whether Slurm chose ``job`` for preemption (its PreemptTime is set); None when
    Slurm cannot be asked."""
    r = slurm(["scontrol", "show", "job", "-o", str(job)], timeout=10)
    if r.exit_code != 0 or r.timed_out:
        return None
    return preempt_time((r.stdout or b"").decode("utf-8", "replace")) is not None
