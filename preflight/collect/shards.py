"""The SSH fan-out split over worker processes, for fleets one Python process cannot keep up with.

The controller's share of probing a node over SSH is Python work: paramiko's packet handling,
ciphers and channel bookkeeping, about 0.1 s of CPU per node for the static probes
(bench/RESULTS.md). Threads share one core under the GIL, so one process tops out at a few
nodes per second however many cores the controller has. Splitting the hosts over worker
processes, each running the usual ``run_fleet`` on its share, spreads that work over the
cores; the parent only receives results and hands them on (it writes the bundle, so the bundle
has one writer). ClusterShell's tree mode spreads the same load over gateway nodes instead,
but it needs ClusterShell installed on the gateways, and a node needs nothing installed here.

Hosts are dealt round robin, so a rack of slow or dead nodes (consecutive names) does not land
on one worker. A worker that dies (killed, out of memory) costs only the results it had not
sent: every probe it owed is recorded as not run, naming the worker's exit code.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
from collections.abc import Sequence
from dataclasses import replace

from preflight.collect.batch import run_node_batched
from preflight.collect.fanout import ExecPlan, OnResult, failed_result, run_fleet, ssh_nodes
from preflight.model import Host, ProbeResult

# Below this many hosts per worker a process costs more (its start, its imports) than it saves.
HOSTS_PER_WORKER = 64
_POLL_S = 0.5


def auto_workers(hosts: int, cpus: int | None = None) -> int:
    """Worker processes for a fleet of ``hosts``: one per HOSTS_PER_WORKER hosts, at most one
    per core; 1 means the fan-out stays in this process."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(cpus, -(-hosts // HOSTS_PER_WORKER)))


def run_sharded(hosts: Sequence[Host], plan: ExecPlan, on_result: OnResult, workers: int) -> None:
    """``run_fleet`` over SSH for ``hosts``, split across ``workers`` processes; ``on_result``
    is called in this process, from this thread, for every result."""
    if workers <= 1 or len(hosts) <= 1:
        run_fleet(ssh_nodes(hosts, plan.ssh), plan, on_result, run=_per_node(plan))
        return
    workers = min(workers, len(hosts))
    shares = [list(hosts[i::workers]) for i in range(workers)]
    # The fleet-wide limit on nodes at once is kept: each worker gets its part of it.
    share_plan = replace(plan, parallel=max(1, -(-plan.parallel // workers)))
    # spawn, not fork: the parent runs threads (the live view), and a forked child would
    # inherit their locks in whatever state they were.
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(i, share, share_plan, results), daemon=True,
                         name=f"preflight-shard-{i}") for i, share in enumerate(shares)]
    for proc in procs:
        proc.start()
    owed = {i: {(h.name, p.id) for h in share for p in plan.probes} for i, share in enumerate(shares)}
    open_shards = set(range(workers))
    try:
        while open_shards:
            try:
                kind, shard, payload = results.get(timeout=_POLL_S)
            except queue.Empty:
                for i in [i for i in open_shards if not procs[i].is_alive()]:
                    _drain(results, owed, on_result, open_shards)  # what it sent before it died
                    if i in open_shards:
                        open_shards.discard(i)
                        _owe(owed[i], plan, on_result,
                             f"not run: the controller's worker process died (exit code {procs[i].exitcode})")
                continue
            _handle(kind, shard, payload, owed, on_result, open_shards)
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


def _per_node(plan: ExecPlan):
    return run_node_batched if plan.node_runner else None


def _handle(kind: str, shard: int, payload, owed: dict, on_result: OnResult, open_shards: set[int]) -> None:
    if kind == "result":
        owed[shard].discard((payload.host, payload.probe))
        on_result(payload)
    else:  # "done": the worker ran its whole share
        open_shards.discard(shard)


def _drain(results, owed: dict, on_result: OnResult, open_shards: set[int]) -> None:
    while True:
        try:
            kind, shard, payload = results.get(timeout=0.1)
        except queue.Empty:
            return
        _handle(kind, shard, payload, owed, on_result, open_shards)


def _owe(missing: set[tuple[str, str]], plan: ExecPlan, on_result: OnResult, why: str) -> None:
    by_id = {p.id: p for p in plan.probes}
    for host, probe_id in sorted(missing):
        on_result(failed_result(by_id[probe_id], host, why))
    missing.clear()


def _worker(shard: int, hosts: list[Host], plan: ExecPlan, results) -> None:
    def send(result: ProbeResult) -> None:
        results.put(("result", shard, result))

    run_fleet(ssh_nodes(hosts, plan.ssh), plan, send, run=_per_node(plan))
    results.put(("done", shard, None))
    # Queue.put hands the item to a feeder thread; the process exits only once it is written.
    results.close()
    results.join_thread()
