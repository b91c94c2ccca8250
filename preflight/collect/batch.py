"""Every probe of a node over one SSH channel: the node runs them itself (the default).

With ``--no-node-runner`` the fan-out opens a channel per probe instead (each a shell and a
``timeout`` on the node, and Python work per channel on the controller). Here the controller
opens one: ``python3 -I -S -c BOOT`` with the node-side runner and the plan on stdin
(``node_runner``), the very runner a Slurm task runs, with the same schedule (per-node width,
hung-tool skip, node deadline) and process-group timeouts, now on the node. Its framed records
come back on the channel's stdout.

Each record is handed on the moment its last line arrives, so a probe's result reaches the
bundle as soon as the node has it (a controller killed mid-run keeps what every node had
finished, as the channel-per-probe path does). A node where python3 cannot start the runner (no
python3, too old) is probed a channel per probe; a runner that dies half-way
leaves its probes recorded as not run, with what it printed.
"""

from __future__ import annotations

from preflight.collect.fanout import ExecPlan, OnResult, failed_result, run_node
from preflight.collect.node_runner import node_payload, result_of, runner_argv
from preflight.collect.ssh import SshNode
from preflight.node.frames import FrameReader

# Beyond the node's budget: python3 starting and the records' transfer.
GRACE_S = 30.0


class _Records:
    """Cuts the channel's stdout into lines as it arrives and hands on every probe's result once
    (the runner names itself by its hostname; the inventory's name is what the bundle uses)."""

    def __init__(self, node: str, plan: ExecPlan, on_result: OnResult):
        self.node, self.on_result = node, on_result
        self.by_id = {p.id: p for p in plan.probes}
        self.delivered: set[str] = set()
        self.hello = False
        self._reader = FrameReader()
        self._partial = b""

    def feed(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)

    def flush(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = b""

    def _line(self, line: bytes) -> None:
        for _, _, header, payload in self._reader.feed(line):
            kind = header.get("kind")
            self.hello = self.hello or kind == "hello"
            probe = header.get("probe")
            if kind == "result" and probe in self.by_id and probe not in self.delivered:
                self.delivered.add(probe)
                self.on_result(result_of(self.by_id[probe], self.node, header, payload))


def run_node_batched(node: SshNode, plan: ExecPlan, on_result: OnResult, python: str = "python3") -> None:
    """Every probe of the plan on ``node`` through one channel; never raises."""
    why = node.connect()
    if why:
        for probe in plan.probes:
            on_result(failed_result(probe, node.name, why))
        node.close()
        return
    records = _Records(node.name, plan, on_result)
    try:
        r = node.run(runner_argv(python), stdin=node_payload(plan), timeout=plan.node_budget() + GRACE_S,
                     on_stdout=records.feed)
    except Exception as exc:  # noqa: BLE001 - a broken channel is a result like any other
        r = None
        failure = f"internal error: {type(exc).__name__}: {exc}"
    records.flush()
    if r is not None and not records.hello and r.error is None and not r.timed_out:
        # python3 missing or unable to run the runner: the default way still works.
        run_node(node, plan, on_result)
        return
    if r is not None:
        failure = r.error or (f"the node's runner stopped at its limit ({plan.node_budget() + GRACE_S:g} s)"
                              if r.timed_out else f"the node's runner ended before its last result "
                                                  f"(exit {r.exit_code}): {r.stderr.strip()[-300:] or 'no stderr'}")
    for probe in plan.probes:
        if probe.id not in records.delivered:
            on_result(failed_result(probe, node.name, f"not run: {failure}"))
    node.close()
