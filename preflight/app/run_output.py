"""What ``run``, ``fabric``, ``analyze`` and ``merge`` print, for a person and for a script.

- On a terminal, a run shows the live table (progress.py); when the console is not a terminal
  (CI logs, ``| tee``), plain progress lines go to stderr instead, one per host as it is judged
  and one every ``HEARTBEAT_S`` while hosts are still out, so a log says what a hung run waits on.
- ``-q`` leaves one line: the hosts' verdicts counted and the report's path.
- ``--json`` prints the report on stdout and nothing else there: report.json's bytes, exactly
  (docs/contracts.md §1.2); whatever people read (the summary, progress, warnings) goes to stderr.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from preflight.app.progress import RunProgress, Snapshot
from preflight.app.progress import render as render_progress
from preflight.app.run import RunRequest, execute
from preflight.collect.local import local_host_name
from preflight.model import Analysis
from preflight.printable import printable
from preflight.report import terminal
from preflight.report.wording import plural

HEARTBEAT_S = 30.0


class ProgressLines:
    """The live view's facts as lines a log keeps: a host's verdict as soon as it is judged (again
    only if a later judgement changes it), and, every ``every_s`` while hosts are still out, how
    many are done and which are furthest behind."""

    def __init__(self, tracker: RunProgress, probes_per_host: int, write: Callable[[str], None],
                 every_s: float = HEARTBEAT_S, clock: Callable[[], float] = time.monotonic):
        self._tracker = tracker
        self._per_host = probes_per_host
        self._write = write
        self._every_s = every_s
        self._clock = clock
        self._said: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, hosts: int) -> None:
        self._say(f"preflight run: {plural(hosts, 'host')}, {plural(self._per_host, 'probe')} each")
        if self._every_s > 0:
            self._thread = threading.Thread(target=self._beat, name="preflight-progress", daemon=True)
            self._thread.start()

    def judged(self, host: str, verdict: str) -> None:
        self._tracker.judged(host, verdict)
        with self._lock:
            if self._said.get(host) == verdict:
                return
            self._said[host] = verdict
        s = self._tracker.snapshot()
        self._say(f"preflight run: {printable(host)} {verdict.upper()} "
                  f"({s.judged} of {s.total} hosts judged, {s.elapsed_s:.0f} s)")

    def heartbeat(self) -> None:
        self._say(heartbeat_line(self._tracker.snapshot(), self._per_host))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._every_s):
            self.heartbeat()

    def _say(self, line: str) -> None:
        with self._lock:
            self._write(line)


def heartbeat_line(s: Snapshot, probes_per_host: int) -> str:
    if s.done >= s.total:
        return (f"preflight run: all {plural(s.total, 'host')} probed, {s.elapsed_s:.0f} s; "
                "the fleet's stages and the judgement go on")
    line = (f"preflight run: {s.done} of {plural(s.total, 'host')} done, {s.running} partly heard, "
            f"{s.waiting} not heard yet, {s.elapsed_s:.0f} s")
    if s.behind:
        line += "; furthest behind: " + ", ".join(f"{printable(h)} ({n}/{probes_per_host})" for h, n in s.behind)
    return line


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def execute_shown(req: RunRequest, console: Console, quiet: bool,
                  write: Callable[[str], None] = _stderr_line) -> tuple[Path, Analysis]:
    """``execute``, with the live table on a terminal, plain lines on stderr otherwise, or
    nothing with ``-q``."""
    if quiet:
        return execute(req)
    names = [h.name for h in req.hosts] or [local_host_name()]
    per_host = len(req.plan.probes)
    tracker = RunProgress(names, per_host)
    if console.is_terminal:
        from rich.live import Live  # only for a live terminal

        with Live(console=console, transient=True, refresh_per_second=2,
                  get_renderable=lambda: render_progress(tracker.snapshot(), per_host)):
            return execute(req, tracker.record, lambda j: tracker.judged(j.host, j.status))
    lines = ProgressLines(tracker, per_host, write)
    lines.start(len(names))
    try:
        return execute(req, tracker.record, lambda j: lines.judged(j.host, j.status))
    finally:
        lines.stop()


def show(analysis: Analysis, console: Console, report_dir: Path, quiet: bool) -> None:
    """The summary for a person, or with ``-q`` its one line."""
    if quiet:
        terminal.show_line(analysis, console, str(report_dir))
    else:
        terminal.show(analysis, console, str(report_dir))


def print_json(report_dir: Path) -> None:
    """report.json on stdout, byte for byte as written: one contract for the file and the pipe."""
    data = (report_dir / "report.json").read_bytes()
    sys.stdout.flush()
    raw = getattr(sys.stdout, "buffer", None)
    if raw is not None:
        raw.write(data)
        raw.flush()
    else:  # a stream without bytes (a test's capture): the same text
        sys.stdout.write(data.decode("utf-8"))
        sys.stdout.flush()
