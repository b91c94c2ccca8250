"""``soak --slurm``'s poll, one srun step per allocation (preflight/soak/slurm_poll.py): the
step's command line, and the tasks' replies read back from real srun output, whose long lines
srun cuts into labelled pieces of 1,024 bytes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from preflight.soak.slurm_poll import replies

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "srun-label-pull-two-tasks-lines-cut-at-1024.txt"


def test_the_pieces_of_each_task_make_its_reply():
    data = CAPTURE.read_bytes()
    assert max(len(line) for line in data.split(b"\n")) == len(b"0: ") + 1024  # srun did cut them
    got = replies(data)
    assert sorted(got) == ["gpu01", "gpu02"]
    for node, doc in got.items():
        beat = json.loads(base64.b64decode(doc["files"]["heartbeat.json"]["data"]))
        assert beat["host"] == node and doc["exists"] is True


def test_a_task_whose_pieces_are_cut_short_is_left_out():
    lines = CAPTURE.read_bytes().split(b"\n")
    last_of_0 = max(i for i, line in enumerate(lines) if line.startswith(b"0: "))
    damaged = b"\n".join(line for i, line in enumerate(lines) if i != last_of_0)
    assert sorted(replies(damaged)) == [n for n in ("gpu01", "gpu02") if n != _node_of(lines, b"0: ")]


def _node_of(lines: list[bytes], label: bytes) -> str:
    whole = b"".join(line[len(label):] for line in lines if line.startswith(label))
    return json.loads(whole)["node"]
