"""The output of preflight/node/mpi_allreduce.py (the CPU engine's all_reduce under mpirun):
which ranks started, which finished, and the figures of the run. Format in that module's
docstring; lines may carry mpirun --tag-output's ``[1,R]<stdout>:`` prefix."""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parse.nccl_signatures import MPI_TAG

_HEAD = re.compile(r"^# preflight mpi all_reduce: ranks=(\d+) bytes=(\d+) iters=(\d+)\s*$")
_READY = re.compile(r"^rank (\d+) host (\S+) ready\s*$")
_DONE = re.compile(r"^rank (\d+) host (\S+) done seconds ([0-9.]+) busbw ([0-9.]+) wrong (\d+)\s*$")
_RESULT = re.compile(r"^result bytes (\d+) seconds ([0-9.]+) algbw ([0-9.]+) busbw ([0-9.]+) wrong (\d+)\s*$")


@dataclass(frozen=True)
class MpiAllreduce:
    ranks: int | None  # from rank 0's first line
    nbytes: int | None
    ready: dict[int, str]  # rank -> host, ranks that reached the collective
    done: dict[int, str]  # rank -> host, ranks that finished it
    seconds: float | None  # the slowest rank's time per iteration (rank 0's result line)
    busbw_gbs: float | None
    wrong: int

    @property
    def stopped(self) -> dict[int, str]:
        """Ranks that reached the collective and never finished it."""
        return {r: h for r, h in self.ready.items() if r not in self.done}

    @property
    def complete(self) -> bool:
        return self.busbw_gbs is not None and self.ranks is not None and len(self.done) == self.ranks


def is_mpi_allreduce(text: str) -> bool:
    return any(_HEAD.match(MPI_TAG.sub("", line).strip()) for line in text.splitlines()[:400])


def parse_mpi_allreduce(text: str) -> MpiAllreduce:
    """Never raises: lines it does not know (mpirun's own, a rank's traceback) are skipped."""
    ranks = nbytes = None
    ready: dict[int, str] = {}
    done: dict[int, str] = {}
    seconds = busbw = None
    wrong = 0
    for raw in text.splitlines():
        line = MPI_TAG.sub("", raw).strip()
        if m := _HEAD.match(line):
            ranks, nbytes = int(m.group(1)), int(m.group(2))
        elif m := _READY.match(line):
            ready[int(m.group(1))] = m.group(2)
        elif m := _DONE.match(line):
            done[int(m.group(1))] = m.group(2)
            ready.setdefault(int(m.group(1)), m.group(2))
        elif m := _RESULT.match(line):
            seconds, busbw, wrong = float(m.group(2)), float(m.group(4)), int(m.group(5))
    return MpiAllreduce(ranks, nbytes, ready, done, seconds, busbw, wrong)
