"""Which probe runs when on one node: the rule every transport shares (SSH from the controller,
the Slurm task on the node itself), written once.

Up to ``per_node`` probes run at once. A tool that hangs costs one timeout per node, not one per
probe: once a probe of a tool times out, the node's probes that need that tool (as their own
``tool`` or among the ``tools`` their script calls) and have not started are passed over, naming
the hung tool and the probe it hung in (a GPU that fell off the bus makes every ``nvidia-smi``
call hang, which is exactly when preflight is run). ``budget_s`` bounds the node as a whole; a
static probe never outlives it. Active probes (benchmarks) run alone after the static ones,
each with its own limit.

Probes and results are duck-typed so that the controller's ``Probe``/``ProbeResult`` and the
node runner's plain records both fit: a probe has ``id``, ``tool``, ``argv`` and ``active``, and
may have ``tools``; a result has ``timed_out``, ``duration_s`` and ``error``.
Stdlib only: this file is shipped to nodes.

Two drivers carry the rule out: ``run_schedule`` with a thread per probe slot, for transports
whose ``execute`` blocks (a channel of an SSH connection, ``LocalNode``), and the node runner's
``probe_runner.run_polled``, which runs the commands from one thread. Both take their phases,
limits and passing-over from here.
"""

from __future__ import annotations

import time

# A probe passed over for a tool that hung earlier on the node: "not run: TOOL hung in PROBE on
# this node (how)". The judge reads it back (``hung_tool_of``): the hang is reported once, where
# it happened, and the probes passed over for it are skipped, not failed a second time.
_HUNG = "not run: %s hung in %s on this node (%s)"
_HUNG_MARK = " hung in "
_OLD_HUNG_MARK = " hung on this node"  # bundles written before the probe was named


def needs(probe):
    """The programs a probe needs: ``tools`` where it declares them, else its one ``tool``."""
    return tuple(getattr(probe, "tools", None) or (probe.tool,))


def hung_tool_of(error):
    """The tool named by a "passed over because TOOL hung" record's error; None for any other."""
    if not error or not error.startswith("not run: "):
        return None
    rest = error[len("not run: "):]
    for mark in (_HUNG_MARK, _OLD_HUNG_MARK):
        if mark in rest:
            tool = rest.split(mark, 1)[0]
            return tool if tool and " " not in tool else None
    return None


class _Unlocked:
    """The lock of a schedule that only one thread drives: ``threading`` (and ``functools`` and
    ``collections`` behind it) is not worth importing on a node for it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class NodeSchedule:
    """Which probe runs next on one node, and which are not run: after a hang of their tool, past
    the node's deadline, or after the transport died. Pure bookkeeping, no I/O; thread-safe
    when given a ``threading.Lock`` (the thread driver's), else for one thread."""

    def __init__(self, probes, deadline, clock=time.monotonic, lock=None):
        self._waiting = list(probes)
        self._deadline = deadline
        self._clock = clock
        self._lock = lock if lock is not None else _Unlocked()
        self.hung = {}  # tool -> (id of the probe it hung in, how it was stopped)
        self.lost = None  # why the transport is gone

    def next(self):
        """The next probe to start (None: nothing left), and the probes passed over with why."""
        skipped = []
        with self._lock:
            while self._waiting:
                probe = self._waiting.pop(0)
                if self.lost:
                    skipped.append((probe, "connection lost: %s" % self.lost))
                elif any(tool in self.hung for tool in needs(probe)):
                    tool = next(tool for tool in needs(probe) if tool in self.hung)
                    skipped.append((probe, _HUNG % ((tool,) + self.hung[tool])))
                elif self._clock() >= self._deadline:
                    skipped.append((probe, "not run: the node's deadline passed (--node-timeout)"))
                else:
                    return probe, skipped
            return None, skipped

    def extend(self, probes):
        with self._lock:
            self._waiting.extend(probes)

    def time_left(self):
        return self._deadline - self._clock()

    def finished(self, probe, result, connected):
        with self._lock:
            # A timeout blames the probe's own tool: of a script's several calls, that is the
            # one the probe exists to run.
            if result.timed_out and probe.tool not in self.hung:
                self.hung[probe.tool] = (getattr(probe, "id", probe.tool),
                                         "%s stopped after %g s" % (" ".join(probe.argv[:3]), result.duration_s))
            if result.error and not connected:
                self.lost = result.error


def phases(probes):
    """(static, active, after): active probes load the node, so they run alone after the static
    ones, in catalogue order; probes marked after_active (second readings of counters) run once
    those are done."""
    after = [p for p in probes if getattr(p, "after_active", False)]
    static = [p for p in probes if not p.active and p not in after]
    active = [p for p in probes if p.active and p not in after]
    return static, active, after


def limit_within(schedule, probe, limit):
    """A probe never outlives the node's deadline, except a benchmark's own limit."""
    return limit if probe.active else max(1.0, min(limit, schedule.time_left()))


def run_schedule(probes, per_node, budget_s, limit_of, execute, deliver, skip, connected=lambda: True,
                 name="node"):
    """Run ``probes`` on one node under the rule above, a thread per probe slot.

    ``limit_of(probe)`` is a probe's own limit in seconds; ``execute(probe, limit)`` runs it and
    returns its result; ``deliver(probe, result)`` and ``skip(probe, why)`` hand each outcome on as
    soon as it exists (from worker threads); ``connected()`` says whether the transport still
    stands after a result with an error.
    """
    import threading

    static, active, after = phases(probes)
    schedule = NodeSchedule(static, time.monotonic() + budget_s, lock=threading.Lock())

    def worker():
        while True:
            probe, skipped = schedule.next()
            for passed_over, why in skipped:
                skip(passed_over, why)
            if probe is None:
                return
            result = execute(probe, limit_within(schedule, probe, limit_of(probe)))
            schedule.finished(probe, result, connected())
            deliver(probe, result)

    width = max(1, min(per_node, len(static)))
    threads = [threading.Thread(target=worker, name="preflight-%s-%d" % (name, i), daemon=True) for i in range(width)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    schedule.extend(active)
    worker()
    schedule.extend(after)
    worker()
    return schedule
