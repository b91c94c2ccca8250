"""The lifecycle's actions carried out: a thin layer over Slurm's ``scontrol`` (drain, resume,
reboot through the site's RebootProgram) and, where the controller can reach a node over SSH, a
command on the node (a GPU reset, a service restart). Each returns the complaint that stopped it,
or None. What needs neither, or has no way onto the node, is a person's: reported, not done."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from preflight.collect.node import Node
from preflight.collect.slurm_job import node_states, set_state, slurm
from preflight.lifecycle import capture
from preflight.lifecycle.machine import Action, Scheduler
from preflight.parse.slurm import NodeState

COMMAND_TIMEOUT_S = 120.0
REASON_PREFIX = "preflight:"


def _boot_epoch(text: str | None) -> float | None:
    # slurmctld prints BootTime in its own local time, without a zone; the controller runs beside it.
    if not text:
        return None
    try:
        return time.mktime(datetime.fromisoformat(text).timetuple())
    except ValueError:
        return None


def scheduler_view(state: NodeState) -> Scheduler:
    drained = "DRAIN" in state.flags or state.base == "DOWN"
    reason = state.reason
    return Scheduler(busy=state.busy, drained=drained, reason=reason,
                     ours=bool(reason and reason.startswith(REASON_PREFIX)), boot_time=_boot_epoch(state.boot_time))


def scheduler_views(nodes: Sequence[str]) -> dict[str, Scheduler]:
    return {name: scheduler_view(s) for name, s in node_states(nodes).items()} if nodes else {}


ON_NODE = ("reset", "restart", "retest")
STEPS = ("reset", "restart", "reboot")  # what destroys a node's evidence: captured before


class SlurmEffects:
    """Actions through scontrol; a reset or restart over ``reach`` (node name -> Node), and a
    retest through ``retest`` (an action -> a complaint or None), when given. Before a step,
    ``capture`` keeps the node's state under ``evidence`` (docs/lifecycle.md)."""

    acts = True

    def __init__(self, reach: Mapping[str, Node] | None = None,
                 retest: Callable[[Action], str | None] | None = None, longest_s: float = 0.0,
                 evidence: Path | None = None, limits: capture.Limits | None = None):
        self.reach = dict(reach or {})
        self.retest = retest
        self.longest_s = longest_s  # the longest an action may take (a retest): the lock is held that long
        self.evidence, self.limits = evidence, limits or capture.Limits()
        # A capture may take its whole limit and the transport's grace: the lock is held that much longer.
        self.capture_s = self.limits.timeout_s + capture.OVERRUN_S if self.limits.timeout_s > 0 else 0.0

    def capture(self, action: Action, stamp: float) -> capture.Capture | None:
        """The node's state before a step (None: the action is no step); never raises, and never
        takes longer than its limit: the step follows whatever it came to."""
        if action.kind not in STEPS:
            return None
        if action.node not in self.reach:
            return capture.skipped(action.node, action.kind, f"no way onto {action.node} over SSH (give the "
                                   "lifecycle -H/--hosts with the node): its state was not kept")
        if self.evidence is None:
            return capture.skipped(action.node, action.kind, "no --out directory to keep it in")
        return capture.collect(self.reach[action.node], action.kind,
                               self.evidence / capture.directory_name(action.node, stamp), self.limits)

    def can(self, action: Action) -> bool:
        if action.kind not in ON_NODE:
            return True
        return action.node in self.reach and (action.kind != "retest" or self.retest is not None)

    def lacks(self, action: Action) -> str:
        return (f"the {action.kind} runs on {action.node} over SSH: give the lifecycle -H/--hosts with the node "
                "and the SSH options")

    def view(self, node: str) -> Scheduler | None:
        return scheduler_views([node]).get(node)

    def __call__(self, action: Action) -> str | None:
        if action.kind == "drain":
            return set_state(action.node, "DRAIN", action.reason)
        if action.kind == "resume":
            return set_state(action.node, "RESUME")
        if action.kind == "reboot":
            # ASAP: no new job starts there, the reboot comes once the running ones end; DOWN
            # afterwards, so nothing is scheduled on it before the retest resumes it.
            r = slurm(["scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={action.reason}", action.node])
            return None if r.exit_code == 0 else ((r.stderr or "").strip() or f"exit code {r.exit_code}")
        if action.kind in ("reset", "restart"):
            return self._on_node(action)
        if action.kind == "retest" and self.retest is not None:
            return self.retest(action)
        return None  # confirm, person: the node's next readings (healthcheck, run) answer them

    def _on_node(self, action: Action) -> str | None:
        node = self.reach[action.node]  # the controller asks can() first: a node out of reach waits
        argv = ["nvidia-smi", "-r"] if action.kind == "reset" else ["systemctl", "restart",
                                                                   str(action.detail.get("service"))]
        r = node.run(argv, timeout=COMMAND_TIMEOUT_S)
        if r.exit_code == 0 and not r.timed_out:
            return None
        return f"`{' '.join(argv)}` on {action.node}: " + ((r.stderr or "").strip()[-200:] or r.error or
                                                           f"exit code {r.exit_code}")


class ForAPerson:
    """Without a scheduler the states are kept the same, and every step is handed to a person:
    nothing is carried out, and the events say "for a person"."""

    acts = False

    def can(self, action: Action) -> bool:
        return action.kind != "retest"  # a person's retest is any later run of the node

    def lacks(self, action: Action) -> str:
        return "a person's: any later run of the node is its retest"

    def __call__(self, action: Action) -> str | None:
        return None
