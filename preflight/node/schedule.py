"""Which probe runs when on one node: the rule every transport shares (SSH from the controller,
the Slurm task on the node itself), written once.

Up to ``per_node`` probes run at once. A tool that hangs costs one timeout per node, not one per
probe: once a probe of a tool times out, the node's probes of that tool that have not started
are passed over, naming the hung tool (a GPU that fell off the bus makes every ``nvidia-smi``
call hang, which is exactly when preflight is run). ``budget_s`` bounds the node as a whole; a
static probe never outlives it. Active probes (benchmarks) run alone after the static ones,
each with its own limit.

Probes and results are duck-typed so that the controller's ``Probe``/``ProbeResult`` and the
node runner's plain records both fit: a probe has ``tool``, ``argv`` and ``active``; a result
has ``timed_out``, ``duration_s`` and ``error``. Stdlib only: this file is shipped to nodes.
"""

from __future__ import annotations

import threading
import time


class NodeSchedule:
    """Which probe runs next on one node, and which are not run: after a hang of their tool, past
    the node's deadline, or after the transport died. Pure bookkeeping, no I/O; thread-safe."""

    def __init__(self, probes, deadline, clock=time.monotonic):
        self._waiting = list(probes)
        self._deadline = deadline
        self._clock = clock
        self._lock = threading.Lock()
        self.hung = {}  # tool -> the probe record that hung
        self.lost = None  # why the transport is gone

    def next(self):
        """The next probe to start (None: nothing left), and the probes passed over with why."""
        skipped = []
        with self._lock:
            while self._waiting:
                probe = self._waiting.pop(0)
                if self.lost:
                    skipped.append((probe, "connection lost: %s" % self.lost))
                elif probe.tool in self.hung:
                    skipped.append((probe, "not run: %s hung on this node (%s)" % (probe.tool, self.hung[probe.tool])))
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
            if result.timed_out and probe.tool not in self.hung:
                self.hung[probe.tool] = "%s stopped after %g s" % (" ".join(probe.argv[:3]), result.duration_s)
            if result.error and not connected:
                self.lost = result.error


def run_schedule(probes, per_node, budget_s, limit_of, execute, deliver, skip, connected=lambda: True,
                 name="node"):
    """Run ``probes`` on one node under the rule above.

    ``limit_of(probe)`` is a probe's own limit in seconds; ``execute(probe, limit)`` runs it and
    returns its result; ``deliver(probe, result)`` and ``skip(probe, why)`` hand each outcome on as
    soon as it exists (from worker threads); ``connected()`` says whether the transport still
    stands after a result with an error.
    """
    # Active probes load the node: they run alone, after the static ones, in catalogue order;
    # probes marked after_active (second readings of counters) run once those are done.
    after = [p for p in probes if getattr(p, "after_active", False)]
    static = [p for p in probes if not p.active and p not in after]
    active = [p for p in probes if p.active and p not in after]
    schedule = NodeSchedule(static, time.monotonic() + budget_s)

    def worker():
        while True:
            probe, skipped = schedule.next()
            for passed_over, why in skipped:
                skip(passed_over, why)
            if probe is None:
                return
            # A probe never outlives the node's deadline, except a benchmark's own limit.
            limit = limit_of(probe)
            if not probe.active:
                limit = max(1.0, min(limit, schedule.time_left()))
            result = execute(probe, limit)
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
