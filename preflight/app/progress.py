"""The live view of a long ``preflight run``: hosts done, failed, partly heard from and not
heard from yet, the hosts furthest behind (a node whose tool hangs shows there with its
count), and the hosts whose own checks already fail: a run judges each host as soon as its
records are in, so an operator sees a bad node while the rest of the fleet is still probed
(fleet checks, which compare hosts, come only at the end). ``RunProgress`` is fed each result
and each host's early verdict as they arrive (thread-safe, O(1) each); ``render`` draws a
snapshot, so what the view shows is testable without a terminal. The command line shows it on
a terminal unless ``-q``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.table import Table

from preflight.model import ProbeResult

SLOWEST_SHOWN = 5


@dataclass
class _Host:
    done: int = 0
    failed: int = 0  # probes that could not run (connection, channel, not run after a hang)
    finished: bool = False


@dataclass(frozen=True)
class Snapshot:
    total: int
    done: int  # hosts whose every probe has a result
    failed: int  # of those, hosts with a probe that could not run
    running: int  # hosts with some results, not all
    waiting: int  # hosts not heard from yet
    elapsed_s: float
    behind: tuple[tuple[str, int], ...]  # (host, probes done) of unfinished hosts, fewest done first
    judged: int = 0  # hosts whose own checks have been run
    failing: tuple[str, ...] = ()  # of those, the hosts with a FAIL or ERROR, in inventory order


class RunProgress:
    def __init__(self, hosts: Sequence[str], probes_per_host: int, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._t0 = clock()
        self._per_host = probes_per_host
        self._hosts = {h: _Host() for h in hosts}
        self._done = self._failed = self._started = 0
        self._verdicts: dict[str, str] = {}
        self._lock = threading.Lock()

    def record(self, result: ProbeResult) -> None:
        with self._lock:
            host = self._hosts.setdefault(result.host, _Host())
            if host.finished:
                return  # a stage after the probes (multi-node) reports under the fleet's name
            self._started += host.done == 0
            host.done += 1
            host.failed += result.error is not None
            if host.done >= self._per_host:
                host.finished = True
                self._done += 1
                self._failed += host.failed > 0

    def judged(self, host: str, verdict: str) -> None:
        """``host``'s verdict from its own checks ("pass", "warn", "fail", "error"); a later one
        (the host judged again on more records) replaces it."""
        with self._lock:
            self._verdicts[host] = verdict

    def snapshot(self) -> Snapshot:
        with self._lock:
            unfinished = [(name, h.done) for name, h in self._hosts.items() if not h.finished]
            unfinished.sort(key=lambda item: item[1])  # stable: inventory order among equals
            failing = tuple(h for h in self._hosts if self._verdicts.get(h) in ("fail", "error"))
            return Snapshot(len(self._hosts), self._done, self._failed, self._started - self._done,
                            len(self._hosts) - self._started, self._clock() - self._t0,
                            tuple(unfinished[:SLOWEST_SHOWN]), len(self._verdicts), failing)


def render(s: Snapshot, probes_per_host: int) -> Table:
    table = Table(title=f"preflight run: {s.done} of {s.total} hosts done, {s.elapsed_s:.0f} s", show_edge=False)
    for column in ("done", "failed", "partly heard", "not heard yet", "judged", "failing"):
        table.add_column(column, justify="right")
    table.add_row(str(s.done), f"[red]{s.failed}[/]" if s.failed else "0", str(s.running), str(s.waiting),
                  str(s.judged), f"[red]{len(s.failing)}[/]" if s.failing else "0")
    lines = []
    if s.failing:
        more = f" and {len(s.failing) - SLOWEST_SHOWN} more" if len(s.failing) > SLOWEST_SHOWN else ""
        lines.append(f"failing their own checks: {', '.join(s.failing[:SLOWEST_SHOWN])}{more}")
    if s.behind:
        lines.append("furthest behind: " + ", ".join(f"{host} ({done}/{probes_per_host})" for host, done in s.behind))
    if lines:
        table.caption = "\n".join(lines)
    return table
