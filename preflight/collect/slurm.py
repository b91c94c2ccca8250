"""``SlurmNode``: the ``Node`` protocol through Slurm, one srun step per command, for stages that
run single commands on nodes (the soak, the multi-node all_reduce) under ``--slurm`` later.

The command runs on the node as ``timeout -k KILL LIMIT ARGV...``, as over SSH, so a timeout
ends its process group on the node; srun itself is bounded on this machine too. Inside an
allocation (``job``) steps may overlap, as several probes of one node do at once. What Slurm
says about the step (a launch that failed, an allocation refused) is the result's ``error``,
prefixed ``slurm:``; the command's own exit status is its ``exit_code``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from preflight.collect.node import KILL_AFTER_S, TIMEOUT_EXIT, CommandResult, now_iso
from preflight.collect.slurm_job import slurm
from preflight.contracts import SLURM_ERROR
from preflight.parse.slurm import first_error, parse_step_stderr

GRACE_S = 30.0  # srun's own launch and teardown, beyond the command's limit


class SlurmNode:
    def __init__(self, name: str, job: int | None = None, srun_args: Sequence[str] = ()):
        self.name, self.job, self.srun_args = name, job, tuple(srun_args)

    def srun_argv(self, argv: Sequence[str], timeout: float) -> list[str]:
        within = [f"--jobid={self.job}", "--overlap"] if self.job is not None else []
        return ["srun", *within, "--nodes=1", "--ntasks=1", f"--nodelist={self.name}", "--kill-on-bad-exit=0",
                *self.srun_args, "timeout", "-k", str(KILL_AFTER_S), f"{timeout:g}", *argv]

    def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float) -> CommandResult:
        argv = tuple(argv)
        r = slurm(self.srun_argv(argv, timeout), timeout=timeout + KILL_AFTER_S + GRACE_S, stdin=stdin)
        said = parse_step_stderr(r.stderr)
        why = said.launch_failed.get(self.name)
        if why is None and any("Unable to allocate resources" in e or "Unable to create step" in e
                               for e in said.errors):
            why = first_error(r.stderr)
        if r.exit_code == 127 and r.stdout is None:
            why = "srun not found"
        if why:
            return replace(r, argv=argv, stdout=None, exit_code=None, error=f"{SLURM_ERROR}{why}")
        return replace(r, argv=argv, timed_out=r.timed_out or r.exit_code == TIMEOUT_EXIT)

    def close(self) -> None:
        pass


class UnavailableNode:
    """A node Slurm will not run anything on for this run (drained before it, its allocation
    not granted): every command is answered at once with that reason, never sent to srun,
    which would otherwise queue a job of its own for it."""

    def __init__(self, name: str, why: str):
        self.name, self.why = name, why

    def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float) -> CommandResult:
        return CommandResult(tuple(argv), None, "", None, now_iso(), 0.0, False, f"{SLURM_ERROR}{self.why}")

    def close(self) -> None:
        pass
