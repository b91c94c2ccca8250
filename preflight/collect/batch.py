"""Every probe of a node over one SSH channel: the node runs them itself (``--node-runner``).

The default SSH fan-out opens a channel per probe (each a shell and a ``timeout`` on the node,
and Python work per channel on the controller). Here the controller opens one: ``python3 -c
BOOT`` with the node-side runner and the plan on stdin (``node_runner``), the very runner a Slurm
task runs, with the same schedule (per-node width, hung-tool skip, node deadline) and
process-group timeouts, now on the node. Its framed records come back on the channel's stdout.

The channel's output is read when the channel ends, so results of a node arrive together (a
controller killed mid-run loses the nodes in flight, not the ones done). A node where python3
cannot start the runner (no python3, too old) is probed the default way, a channel per probe;
a runner that dies half-way leaves its probes recorded as not run, with what it printed.
"""

from __future__ import annotations

from preflight.collect.fanout import ExecPlan, OnResult, failed_result, run_node
from preflight.collect.node_runner import BOOT, node_payload, result_of
from preflight.collect.ssh import SshNode
from preflight.node.frames import FrameReader

# Beyond the node's budget: python3 starting and the records' transfer.
GRACE_S = 30.0


def run_node_batched(node: SshNode, plan: ExecPlan, on_result: OnResult, python: str = "python3") -> None:
    """Every probe of the plan on ``node`` through one channel; never raises."""
    why = node.connect()
    if why:
        for probe in plan.probes:
            on_result(failed_result(probe, node.name, why))
        node.close()
        return
    try:
        r = node.run([python, "-c", BOOT], stdin=node_payload(plan), timeout=plan.node_budget() + GRACE_S)
    except Exception as exc:  # noqa: BLE001 - a broken channel is a result like any other
        r = None
        failure = f"internal error: {type(exc).__name__}: {exc}"
    by_id = {p.id: p for p in plan.probes}
    delivered: set[str] = set()
    hello = False
    reader = FrameReader()
    for line in (r.stdout or b"").splitlines(keepends=True) if r is not None else ():
        # The runner names itself by its hostname; the inventory's name is what the bundle uses.
        for _, _, header, payload in reader.feed(line):
            kind = header.get("kind")
            hello = hello or kind == "hello"
            if kind == "result" and header.get("probe") in by_id and header["probe"] not in delivered:
                delivered.add(header["probe"])
                on_result(result_of(by_id[header["probe"]], node.name, header, payload))
    if r is not None and not hello and r.error is None and not r.timed_out:
        # python3 missing or unable to run the runner: the default way still works.
        run_node(node, plan, on_result)
        return
    if r is not None:
        failure = r.error or (f"the node's runner stopped at its limit ({plan.node_budget() + GRACE_S:g} s)"
                              if r.timed_out else f"the node's runner ended before its last result "
                                                  f"(exit {r.exit_code}): {r.stderr.strip()[-300:] or 'no stderr'}")
    for probe in plan.probes:
        if probe.id not in delivered:
            on_result(failed_result(probe, node.name, f"not run: {failure}"))
    node.close()
