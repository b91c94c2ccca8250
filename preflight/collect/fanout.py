"""Probes out to many nodes at once, every result handed back as soon as it exists.

Failures are results, never exceptions: an unreachable node, refused authentication, an unknown
host key, a command that hangs past its timeout all come back as ``ProbeResult`` records, and
one slow or dead node never holds up the others (a thread per node, bounded by ``parallel``).
Nodes are reached through ``preflight.collect.node``'s ``Node``, whatever the transport.

On one node, up to ``per_node`` probes run at once (channels of the one SSH connection). A tool
that hangs costs one timeout per node, not one per probe: once a probe of a tool times out,
the node's probes of that tool that have not started are recorded as not run, naming the hung
tool (a GPU that fell off the bus makes every ``nvidia-smi`` call hang, which is exactly when
this tool is run). ``node_timeout_s`` bounds a node's static probes as a whole; active probes
(benchmarks with limits of their own) add their limits to it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from preflight.collect.node import CommandResult, Node, now_iso
from preflight.collect.probes import Probe
from preflight.collect.ssh import SshNode, SshOptions
from preflight.model import Host, ProbeResult


@dataclass(frozen=True)
class ExecPlan:
    probes: tuple[Probe, ...]
    timeout_s: float = 30.0
    parallel: int = 64
    ssh: SshOptions = field(default_factory=SshOptions)
    per_node: int = 4  # probes at once on one node; sshd's MaxSessions defaults to 10
    node_timeout_s: float | None = None  # None: NODE_TIMEOUT_FACTOR x timeout_s

    def limit_for(self, probe: Probe) -> float:
        if probe.timeout_s is not None:
            return probe.timeout_s
        return self.timeout_s * (probe.timeout_factor or 1.0)

    def node_budget(self) -> float:
        """Seconds a node may take in all: the static probes' budget plus every active probe's
        own limit (a benchmark is expected to run long)."""
        static = self.node_timeout_s if self.node_timeout_s is not None else NODE_TIMEOUT_FACTOR * self.timeout_s
        return static + sum(self.limit_for(p) for p in self.probes if p.active)


# A node whose static probes all ran one after the other at their full timeout would need
# len(probes) x timeout; with probes concurrent and hung tools skipped, a few timeouts suffice.
NODE_TIMEOUT_FACTOR = 4


OnResult = Callable[[ProbeResult], None]


def ssh_nodes(hosts: Iterable[Host], ssh: SshOptions) -> list[SshNode]:
    return [SshNode(h, ssh) for h in hosts]


def probe_result(probe: Probe, host: str, r: CommandResult) -> ProbeResult:
    """A command's result as the bundle records it: under the probe's id and its argv."""
    return ProbeResult(probe.id, host, probe.argv, r.stdout, r.stderr, r.exit_code, r.started,
                       r.duration_s, r.timed_out, r.error)


def run_fleet(nodes: Sequence[Node], plan: ExecPlan, on_result: OnResult) -> None:
    """Run every probe on every node; ``on_result`` gets each result as soon as it exists.

    ``on_result`` is called from worker threads; it must be thread-safe for distinct
    (host, probe) pairs (writing one file per result is).
    """
    if not nodes:
        return
    workers = max(1, min(plan.parallel, len(nodes)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="preflight-node") as pool:
        for f in [pool.submit(run_node, n, plan, on_result) for n in nodes]:
            f.result()


def run_node(node: Node, plan: ExecPlan, on_result: OnResult) -> None:
    """Every probe of the plan on one node; never raises."""
    delivered: Counter[str] = Counter()
    lock = threading.Lock()

    def deliver(result: ProbeResult) -> None:
        with lock:
            delivered[result.probe] += 1
        on_result(result)

    try:
        _run_probes(node, plan, deliver)
    except Exception as exc:  # noqa: BLE001 - a node's failure must never stop the fleet
        owed = Counter(p.id for p in plan.probes) - delivered
        for probe in plan.probes:
            if owed[probe.id] > 0:
                owed[probe.id] -= 1
                on_result(_failed(probe, node.name, f"internal error: {type(exc).__name__}: {exc}"))
    finally:
        node.close()


class NodeSchedule:
    """Which probe runs next on one node, and which are not run: after a hang of their tool, past
    the node's deadline, or after the transport died. Pure bookkeeping, no I/O; thread-safe."""

    def __init__(self, probes: Sequence[Probe], deadline: float, clock: Callable[[], float] = time.monotonic):
        self._waiting = list(probes)
        self._deadline = deadline
        self._clock = clock
        self._lock = threading.Lock()
        self.hung: dict[str, str] = {}  # tool -> the probe record that hung
        self.lost: str | None = None  # why the transport is gone

    def next(self) -> tuple[Probe | None, list[tuple[Probe, str]]]:
        """The next probe to start (None: nothing left), and the probes passed over with why."""
        skipped: list[tuple[Probe, str]] = []
        with self._lock:
            while self._waiting:
                probe = self._waiting.pop(0)
                if self.lost:
                    skipped.append((probe, f"connection lost: {self.lost}"))
                elif probe.tool in self.hung:
                    skipped.append((probe, f"not run: {probe.tool} hung on this node ({self.hung[probe.tool]})"))
                elif self._clock() >= self._deadline:
                    skipped.append((probe, "not run: the node's deadline passed (--node-timeout)"))
                else:
                    return probe, skipped
            return None, skipped

    def extend(self, probes: Sequence[Probe]) -> None:
        with self._lock:
            self._waiting.extend(probes)

    def time_left(self) -> float:
        return self._deadline - self._clock()

    def finished(self, probe: Probe, result: ProbeResult, connected: bool) -> None:
        with self._lock:
            if result.timed_out and probe.tool not in self.hung:
                self.hung[probe.tool] = f"{' '.join(probe.argv[:3])} stopped after {result.duration_s:g} s"
            if result.error and not connected:
                self.lost = result.error


def _run_probes(node: Node, plan: ExecPlan, on_result: OnResult) -> None:
    connect = getattr(node, "connect", None)
    if connect is not None and (why := connect()):
        for probe in plan.probes:  # one refusal answers for every probe
            on_result(_failed(probe, node.name, why))
        return
    # Active probes load the node: they run alone, after the static ones, in catalogue order.
    static = [p for p in plan.probes if not p.active]
    active = [p for p in plan.probes if p.active]
    schedule = NodeSchedule(static, time.monotonic() + plan.node_budget())

    def worker() -> None:
        while True:
            probe, skipped = schedule.next()
            for passed_over, why in skipped:
                on_result(_failed(passed_over, node.name, why))
            if probe is None:
                return
            # A probe never outlives the node's deadline, except a benchmark's own limit.
            limit = plan.limit_for(probe)
            if not probe.active:
                limit = max(1.0, min(limit, schedule.time_left()))
            result = probe_result(probe, node.name, node.run(probe.argv, timeout=limit))
            schedule.finished(probe, result, getattr(node, "connected", True) is not False)
            on_result(result)

    width = max(1, min(plan.per_node, len(static)))
    threads = [threading.Thread(target=worker, name=f"preflight-{node.name}-{i}", daemon=True)
               for i in range(width)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    schedule.extend(active)
    worker()
def _failed(probe: Probe, host: str, reason: str) -> ProbeResult:
    return ProbeResult(probe.id, host, probe.argv, None, "", None, now_iso(), 0.0, False, reason)
