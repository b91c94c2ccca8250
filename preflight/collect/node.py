"""One way to run a command on a node: the ``Node`` protocol and its ``CommandResult``.

Every transport (``LocalNode`` on this machine, ``SshNode`` over SSH; a Slurm step or a
container would be one more short file) runs an argv list, feeds it ``stdin``, and bounds it
by ``timeout`` seconds with the same meaning everywhere: when the limit passes, the command's
whole process group is ended (SIGTERM, then SIGKILL ``KILL_AFTER_S`` later for tools stuck in
the driver), and the result says ``timed_out``. Nothing a transport does raises: a refused
connection or a broken channel is a result with ``error`` set. The probe fan-out, the
multi-node all_reduce stage and the soak controller all reach nodes through this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol

from preflight.node.localexec import KILL_AFTER_S  # noqa: F401 - the one grace, on every transport

# Exit status GNU `timeout` gives when it had to stop the command.
TIMEOUT_EXIT = 124


@dataclass(frozen=True)
class CommandResult:
    """What running one command produced. ``stdout`` is kept byte for byte."""

    argv: tuple[str, ...]
    stdout: bytes | None  # None: nothing ran, so nothing was printed
    stderr: str
    exit_code: int | None  # None: it did not exit on its own (timed out) or never started
    started: str  # ISO-8601, UTC
    duration_s: float
    timed_out: bool = False
    error: str | None = None  # the transport failed around the command (connect, channel)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and self.exit_code == 0

    @property
    def fault(self) -> str | None:
        """Why the command did not run to its own end (transport error, timeout), else None."""
        if self.error:
            return self.error
        return f"timed out after {self.duration_s:g} s" if self.timed_out else None


class Node(Protocol):
    """A machine commands can run on."""

    name: str

    def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float) -> CommandResult:
        """Run ``argv`` to completion or until ``timeout`` seconds; never raises."""
        ...

    def close(self) -> None:
        """Release the transport (a connection); the node can still be ``run`` again."""
        ...


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def not_run(argv: Sequence[str], why: str, started: str | None = None) -> CommandResult:
    """The result of a command the transport could not start."""
    return CommandResult(tuple(argv), None, "", None, started or now_iso(), 0.0, False, why)
