"""The soak agent's readings of the RDMA port counters: before the load, every few minutes, after.

Part of the agent (standard library only, never imports preflight). Each reading is the files
the run's ``ib-counters`` probe greps (``counters/*``, ``hw_counters/*``, ``state``,
``phys_state``, ``link_layer`` of every ``/sys/class/infiniband/DEV/ports/N``), as the same
``path:value`` lines, so the controller parses a soak's readings with the probe's parser. They
are appended to ``ib-counters.txt`` in the soak directory, one block per reading:

    # preflight-ib-counters/1 host=gpu01 time=1764603000.512 phase=before
    /sys/class/infiniband/mlx5_0/ports/1/counters/link_downed:0
    ...
    # end

``phase`` is ``before`` (ahead of the engine's start), ``during`` (every ``--ib-interval``
seconds) or ``after`` (once the engine finished). A block with no line between its two markers
is a reading of a node without RDMA devices. Each block goes out in one ``write`` on an
``O_APPEND`` descriptor, so a ``kill -9`` leaves whole blocks; a reader drops a block that has
no ``# end`` (its copy was cut) and says so.
"""

from __future__ import annotations

import os
from pathlib import Path

IB_COUNTERS_TXT = "ib-counters.txt"
FORMAT = "preflight-ib-counters/1"
END = "# end"
SYSFS = Path("/sys/class/infiniband")
# A few snapshots an hour place a counter's growth within minutes, for a file of about 40 kB
# a reading on an 8-NIC node; the window's verdict takes only the first and the last.
DEFAULT_INTERVAL_S = 300.0
_PORT_FILES = ("state", "phys_state", "link_layer")


def read_lines(root: Path = SYSFS) -> list[str]:
    """``path:value`` lines of every port's counters and state under ``root``, as
    ``grep -Hs .`` prints them (paths as found under ``root``; empty files and unreadable ones
    left out, as grep -s leaves them)."""
    lines: list[str] = []
    for port in sorted(root.glob("*/ports/*")):
        files = [f for kind in ("counters", "hw_counters") for f in sorted((port / kind).glob("*"))]
        files += [port / name for name in _PORT_FILES]
        for f in files:
            try:
                text = f.read_text(errors="replace")
            except OSError:  # absent, or a counter the driver refuses to read: grep -s is silent too
                continue
            lines += [f"{f}:{v}" for v in text.splitlines() if v]
    return lines


def block(host: str, time_s: float, phase: str, lines: list[str]) -> str:
    head = f"# {FORMAT} host={host} time={time_s:.3f} phase={phase}\n"
    return head + "".join(line + "\n" for line in lines) + END + "\n"


class IbCounterLog:
    """Takes the readings and appends them to ``out/ib-counters.txt``. ``interval_s`` 0 means
    off: nothing is read and no file is written."""

    def __init__(self, out: Path, host: str, interval_s: float, root: Path = SYSFS):
        self.path = out / IB_COUNTERS_TXT
        self.host = host
        self.interval_s = interval_s
        self.root = root
        self.last: float | None = None
        self.readings = 0

    @property
    def on(self) -> bool:
        return self.interval_s > 0

    def take(self, phase: str, now: float) -> None:
        if not self.on:
            return
        text = block(self.host, now, phase, read_lines(self.root)).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text)
        finally:
            os.close(fd)
        self.last = now
        self.readings += 1

    def due(self, now: float) -> bool:
        return self.on and self.last is not None and now - self.last >= self.interval_s
