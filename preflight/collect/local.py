"""``LocalNode``: commands on this machine, for ``--local`` runs and soaks."""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence

from preflight.collect.node import CommandResult
from preflight.node.localexec import run_local


class LocalNode:
    def __init__(self, name: str):
        self.name = name

    def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float) -> CommandResult:
        # The one local runner, shared with the Slurm task on a node (preflight/node/localexec.py).
        r = run_local(argv, stdin, timeout)
        return CommandResult(r.argv, r.stdout, r.stderr, r.exit_code, r.started, r.duration_s, r.timed_out)

    def close(self) -> None:
        pass


def local_host_name() -> str:
    # The bundle stores it as a directory name; keep what a host name may hold.
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", socket.gethostname()) or "localhost"
