"""Slurm's words about jobs, for the idle-node sweep: ``squeue -h -o '%i|%k|%T'`` lines and
``scontrol show job -o`` records. Pure text in, records out."""

from __future__ import annotations

import re
from dataclasses import dataclass

# squeue's states of a job that still holds, or may yet hold, its node (squeue(1) "JOB STATE CODES").
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD")


@dataclass(frozen=True)
class QueuedJob:
    job: int
    comment: str  # the sweep puts its run id here
    state: str

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def parse_squeue(text: str) -> list[QueuedJob]:
    """``squeue -h -o '%i|%k|%T'``; lines that are not three fields with a numeric id are skipped
    (an array's ``123_[1-4]`` is not the sweep's)."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0].isdigit():
            out.append(QueuedJob(int(parts[0]), parts[1], parts[2].strip()))
    return out


def preempt_time(record: str) -> str | None:
    """``PreemptTime=`` of one ``scontrol show job -o`` record: when Slurm chose the job for
    preemption; None when it never did ("None") or the field is absent."""
    m = re.search(r"(?:^|\s)PreemptTime=(\S+)", record)
    return m.group(1) if m and m.group(1) != "None" else None


def job_state(record: str) -> str | None:
    m = re.search(r"(?:^|\s)JobState=(\S+)", record)
    return m.group(1) if m else None
