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
(benchmarks with limits of their own) add their limits to it. Probes marked ``after_active`` (a
second reading of the IB error counters) run last, once the active probes are done.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from preflight.collect.node import CommandResult, Node, now_iso
from preflight.collect.probes import Probe
from preflight.collect.ssh import SshNode, SshOptions
from preflight.model import Host, ProbeResult
from preflight.node.schedule import run_schedule


@dataclass(frozen=True)
class ExecPlan:
    probes: tuple[Probe, ...]
    timeout_s: float = 30.0
    parallel: int = 64
    ssh: SshOptions = field(default_factory=SshOptions)
    per_node: int = 4  # probes at once on one node; sshd's MaxSessions defaults to 10
    node_timeout_s: float | None = None  # None: NODE_TIMEOUT_FACTOR x timeout_s
    workers: int | None = None  # controller processes for an SSH fleet (collect/shards.py); None: by size
    node_runner: bool = False  # SSH: one channel per node, the probes run by the node itself (collect/batch.py)

    def limit_for(self, probe: Probe) -> float:
        if probe.timeout_s is not None:
            return probe.timeout_s
        return self.timeout_s * (probe.timeout_factor or 1.0)

    def node_budget(self) -> float:
        """Seconds a node may take in all: the static probes' budget plus every active probe's
        own limit (a benchmark is expected to run long)."""
        static = self.node_timeout_s if self.node_timeout_s is not None else NODE_TIMEOUT_FACTOR * self.timeout_s
        return static + sum(self.limit_for(p) for p in self.probes if p.active or p.after_active)


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


def run_fleet(nodes: Sequence[Node], plan: ExecPlan, on_result: OnResult,
              run: Callable[[Node, ExecPlan, OnResult], None] | None = None) -> None:
    """Run every probe on every node; ``on_result`` gets each result as soon as it exists.

    ``on_result`` is called from worker threads; it must be thread-safe for distinct
    (host, probe) pairs (writing one file per result is).
    """
    if not nodes:
        return
    workers = max(1, min(plan.parallel, len(nodes)))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="preflight-node")
    # Each new thread waits for this before it starts on its node: a thread that started
    # connecting at once would hold the GIL while the next one is being started, and over 64
    # nodes the last connections began seconds after the first.
    go = threading.Event()

    def task(node: Node) -> None:
        go.wait()
        (run or run_node)(node, plan, on_result)

    try:
        futures = [pool.submit(task, n) for n in nodes]
        go.set()
        for f in futures:
            f.result()
    finally:
        go.set()
        # Every node is done once its future is: joining the idle threads here would only make
        # the run wait while each of them in turn gets the GIL from the busy judge thread
        # (0.35 s at 64 nodes); they end on their own.
        pool.shutdown(wait=False)


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
                on_result(failed_result(probe, node.name, f"internal error: {type(exc).__name__}: {exc}"))
    finally:
        node.close()


def _run_probes(node: Node, plan: ExecPlan, on_result: OnResult) -> None:
    connect = getattr(node, "connect", None)
    if connect is not None and (why := connect()):
        for probe in plan.probes:  # one refusal answers for every probe
            on_result(failed_result(probe, node.name, why))
        return
    # The schedule is the one the Slurm task runs on its node (preflight/node/schedule.py).
    run_schedule(
        plan.probes, plan.per_node, plan.node_budget(), plan.limit_for,
        execute=lambda probe, limit: probe_result(probe, node.name, node.run(probe.argv, timeout=limit)),
        deliver=lambda probe, result: on_result(result),
        skip=lambda probe, why: on_result(failed_result(probe, node.name, why)),
        connected=lambda: getattr(node, "connected", True) is not False,
        name=node.name,
    )


def failed_result(probe: Probe, host: str, reason: str) -> ProbeResult:
    return ProbeResult(probe.id, host, probe.argv, None, "", None, now_iso(), 0.0, False, reason)
