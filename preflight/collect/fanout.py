"""Probes out to many nodes at once, every result handed back as soon as it exists.

Failures are results, never exceptions: an unreachable node, refused authentication, an unknown
host key, a command that hangs past its timeout all come back as ``ProbeResult`` records, and
one slow or dead node never holds up the others (a thread per node, bounded by ``parallel``).
Nodes are reached through ``preflight.collect.node``'s ``Node``, whatever the transport.
"""

from __future__ import annotations

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

    def limit_for(self, probe: Probe) -> float:
        return probe.timeout_s if probe.timeout_s is not None else self.timeout_s


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
    """Every probe of the plan on one node, one after the other; never raises."""
    delivered: set[str] = set()

    def deliver(result: ProbeResult) -> None:
        delivered.add(result.probe)
        on_result(result)

    try:
        _run_probes(node, plan, deliver)
    except Exception as exc:  # noqa: BLE001 - a node's failure must never stop the fleet
        for probe in plan.probes:
            if probe.id not in delivered:
                on_result(_failed(probe, node.name, f"internal error: {type(exc).__name__}: {exc}"))
    finally:
        node.close()


def _run_probes(node: Node, plan: ExecPlan, on_result: OnResult) -> None:
    connect = getattr(node, "connect", None)
    if connect is not None and (why := connect()):
        for probe in plan.probes:  # one refusal answers for every probe
            on_result(_failed(probe, node.name, why))
        return
    for i, probe in enumerate(plan.probes):
        result = probe_result(probe, node.name, node.run(probe.argv, timeout=plan.limit_for(probe)))
        on_result(result)
        if result.error and getattr(node, "connected", True) is False:
            # The transport died mid-run: the rest would only reconnect into the same fault.
            for rest in plan.probes[i + 1:]:
                on_result(_failed(rest, node.name, f"connection lost: {result.error}"))
            return


def _failed(probe: Probe, host: str, reason: str) -> ProbeResult:
    return ProbeResult(probe.id, host, probe.argv, None, "", None, now_iso(), 0.0, False, reason)
