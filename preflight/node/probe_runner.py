"""The probes of one node, run on that node: what a Slurm task (or one SSH channel) executes.

The controller builds the plan (which probes, their argv and limits, how many at once, the
node's budget) exactly as for SSH; this runner only carries it out with the shared schedule
(``schedule``: per-node concurrency, hung-tool skip, node deadline) and local process-group
timeouts (``localexec``), and writes every outcome to stdout as framed records (``frames``) the
moment it exists. A task killed half-way has therefore already delivered what finished. It runs
the commands from one thread (``run_polled``): threads and ``subprocess`` cost a node's python3
more than all the rest of its work. Records: ``hello`` first, one ``result`` per probe (stdout
as the raw payload), ``end`` last; an ``end`` that never arrives tells the controller the task
did not finish.

Shipped with its siblings through stdin (``preflight.collect.node_runner.BOOT``), by a Slurm task
or one SSH channel: nothing is installed on the node, only python3 is needed.
"""

from __future__ import annotations

import os
import sys
import time

try:
    from . import frames, localexec, schedule
except ImportError:  # run from the shipped files, by plain name
    import frames
    import localexec
    import schedule

FILES = ("frames.py", "localexec.py", "schedule.py", "probe_runner.py")  # what travels, in load order


class PlannedProbe:
    """One probe of the plan, as the controller sent it."""

    __slots__ = ("id", "argv", "tool", "tools", "limit", "active", "after_active")

    def __init__(self, doc):
        self.id, self.argv, self.tool = doc["id"], tuple(doc["argv"]), doc["tool"]
        self.tools = tuple(doc.get("tools") or (self.tool,))
        self.limit, self.active = float(doc["limit"]), bool(doc.get("active"))
        self.after_active = bool(doc.get("after_active"))


class Result:
    """A probe's outcome in the shape the schedule reads and the record carries."""

    __slots__ = ("stdout", "stderr", "exit_code", "started", "duration_s", "timed_out", "error")

    def __init__(self, stdout, stderr, exit_code, started, duration_s, timed_out=False, error=None):
        self.stdout, self.stderr, self.exit_code, self.started = stdout, stderr, exit_code, started
        self.duration_s, self.timed_out, self.error = duration_s, timed_out, error

    def header(self, probe_id):
        return {"kind": "result", "probe": probe_id, "stderr": self.stderr, "exit_code": self.exit_code,
                "started": self.started, "duration_s": self.duration_s, "timed_out": self.timed_out,
                "error": self.error, "has_stdout": self.stdout is not None}


class Emitter:
    """Writes records to a stream, each whole and at once."""

    def __init__(self, node, stream):
        self.node, self.stream, self.seq = node, stream, 0

    def emit(self, header, payload=b""):
        self.seq += 1
        self.stream.write("".join(frames.encode(self.node, self.seq, header, payload)))
        self.stream.flush()


def node_name():
    # Slurm's name for the node is what the inventory and the bundle call it.
    return os.environ.get("SLURMD_NODENAME") or hostname().split(".")[0]


def hostname():
    # gethostname(2) is uname's nodename on Linux; `socket` would cost the node a few ms to import.
    return os.uname().nodename


def _result(run):
    return Result(run.stdout, run.stderr, run.exit_code, run.started, run.duration_s, run.timed_out)


def run_polled(probes, per_node, budget_s, deliver, skip):
    """The schedule's rule (``schedule.phases``, ``NodeSchedule``, ``limit_within``) with every
    command advanced by one ``localexec.Poller``: up to ``per_node`` static probes at once, then
    the active ones alone, then the after-active readings."""
    static, active, after = schedule.phases(probes)
    rule = schedule.NodeSchedule(static, time.monotonic() + budget_s)
    poller = localexec.Poller()

    def phase(width):
        running = {}
        while True:
            while len(running) < width:
                probe, skipped = rule.next()
                for passed_over, why in skipped:
                    skip(passed_over, why)
                if probe is None:
                    break
                command = localexec.Command(probe.argv, timeout=schedule.limit_within(rule, probe, probe.limit))
                running[command] = probe
                if command.result is None:
                    poller.add(command)
            if not running:
                return
            ended = [c for c in running if c.result is not None] or poller.wait(list(running))
            for command in ended:
                probe, result = running.pop(command), _result(command.result)
                rule.finished(probe, result, True)
                deliver(probe, result)

    phase(max(1, min(per_node, len(static))))
    rule.extend(active)
    phase(1)
    rule.extend(after)
    phase(1)
    return rule


def main(plan, stream=None):
    if not hasattr(os, "posix_spawnp"):
        # Before the hello: over SSH the controller then probes this node a channel per probe.
        sys.exit("preflight's node runner needs python3 >= 3.8 (os.posix_spawnp); this is %s"
                 % sys.version.split()[0])
    stream = stream if stream is not None else sys.stdout
    out = Emitter(node_name(), stream)
    probes = [PlannedProbe(p) for p in plan["probes"]]
    out.emit({"kind": "hello", "hostname": hostname(), "probes": len(probes),
              "python": sys.version.split()[0]})
    delivered = [0]

    def deliver(probe, result):
        out.emit(result.header(probe.id), result.stdout or b"")
        delivered[0] += 1

    def skip(probe, why):
        deliver(probe, Result(None, "", None, localexec.now_iso(), 0.0, False, why))

    run_polled(probes, int(plan["per_node"]), float(plan["budget_s"]), deliver, skip)
    out.emit({"kind": "end", "delivered": delivered[0]})
    return 0


if __name__ == "__main__":  # a plan as JSON on stdin, for running by hand on a node
    import json

    sys.exit(main(json.load(sys.stdin)))
