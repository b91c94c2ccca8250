"""``LocalNode``: commands on this machine, for ``--local`` runs and soaks."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

from preflight.collect.node import KILL_AFTER_S, CommandResult, now_iso


class LocalNode:
    def __init__(self, name: str):
        self.name = name

    def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float) -> CommandResult:
        argv = tuple(argv)
        started, t0 = now_iso(), time.monotonic()
        try:
            # Its own session, so that a timeout ends the tool and everything it spawned.
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except FileNotFoundError:
            return CommandResult(argv, None, f"{argv[0]}: not found", 127, started, 0.0)
        except OSError as exc:
            return CommandResult(argv, None, f"{argv[0]}: {exc.strerror or exc}", 126, started, 0.0)
        try:
            stdout, stderr = proc.communicate(stdin or None, timeout=timeout)
        except subprocess.TimeoutExpired:
            stdout, stderr = _end_group(proc)
            return CommandResult(argv, stdout, stderr.decode("utf-8", "replace"), None, started,
                                 round(time.monotonic() - t0, 3), True)
        return CommandResult(argv, stdout, stderr.decode("utf-8", "replace"), proc.returncode, started,
                             round(time.monotonic() - t0, 3))

    def close(self) -> None:
        pass


def _end_group(proc: subprocess.Popen) -> tuple[bytes, bytes]:
    """SIGTERM to the process group, SIGKILL after the grace, as `timeout -k` does on a node."""
    for sig, wait in ((signal.SIGTERM, KILL_AFTER_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return b"", b""


def local_host_name() -> str:
    # The bundle stores it as a directory name; keep what a host name may hold.
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", socket.gethostname()) or "localhost"
