"""Run one command on this machine with a timeout that ends its whole process group: SIGTERM,
then SIGKILL after a grace (what ``timeout -k`` does on a node reached over SSH). Used by
``LocalNode`` on the controller and by the Slurm task runner on a node, so a timeout means the
same thing on both. Stdlib only: this file is shipped to nodes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

# How long after SIGTERM a command that ignores it gets SIGKILL (the `timeout -k` grace).
KILL_AFTER_S = 5


class LocalRun:
    """What one command produced. ``stdout`` is None when nothing started."""

    __slots__ = ("argv", "stdout", "stderr", "exit_code", "started", "duration_s", "timed_out")

    def __init__(self, argv, stdout, stderr, exit_code, started, duration_s, timed_out=False):
        self.argv, self.stdout, self.stderr, self.exit_code = argv, stdout, stderr, exit_code
        self.started, self.duration_s, self.timed_out = started, duration_s, timed_out


def now_iso():
    # datetime.now(timezone.utc).isoformat(timespec="seconds"), without importing datetime on the node.
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


def run_local(argv, stdin=b"", timeout=30.0):
    """Run ``argv`` to completion or ``timeout`` seconds; never raises. A missing program is exit
    127, one that cannot be executed 126, as a shell would say."""
    argv = tuple(argv)
    started, t0 = now_iso(), time.monotonic()
    try:
        # Its own session, so that a timeout ends the tool and everything it spawned.
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        return LocalRun(argv, None, "%s: not found" % argv[0], 127, started, 0.0)
    except OSError as exc:
        return LocalRun(argv, None, "%s: %s" % (argv[0], exc.strerror or exc), 126, started, 0.0)
    try:
        stdout, stderr = proc.communicate(stdin or None, timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = end_group(proc)
        return LocalRun(argv, stdout, stderr.decode("utf-8", "replace"), None, started,
                        round(time.monotonic() - t0, 3), True)
    return LocalRun(argv, stdout, stderr.decode("utf-8", "replace"), proc.returncode, started,
                    round(time.monotonic() - t0, 3))


def end_group(proc):
    """SIGTERM to the process group, SIGKILL after the grace; what was printed until then."""
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
