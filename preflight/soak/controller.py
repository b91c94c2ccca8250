"""``preflight soak``: start the soak agent on every node, watch it, collect and merge its files.

The command in four steps, one module each:
1. ``plan.py``: the options become a ``SoakPlan``, kept in ``reports/<run-id>/soak/run.json``;
2. ``ship.py``: each node (over SSH, or this machine with ``--local``) gets the agent of
   ``preflight/node`` as a tar through the command's stdin, unpacked into
   ``<node-dir>/<run-id>/`` (default node dir ``~/.cache/preflight/soak``) and started with
   ``--detach``, so it outlives the SSH session and the controller;
3. ``follow.py``: every few seconds each node's new bytes are appended to
   ``reports/<run-id>/soak/<host>/``, a mirror of its soak directory, while a live view shows
   each node's state, throughput, hottest GPU, lowest SM clock and active clocks-event reasons;
4. ``merge.py``: when every agent has finished (or failed, died, or its node stayed unreachable
   past the planned end plus a grace period), the per-host copies become one
   ``preflight-soak/1`` directory, ``reports/<run-id>/``, judged by the soak checks
   (``judge.py``) and reported as ``preflight analyze`` would.

``preflight soak --slurm`` starts the agents as srun tasks instead (``slurm_soak.py``) and polls
them through short srun steps inside the allocation; steps 3-4 are the same.

``preflight soak --attach RUN_ID`` (after Ctrl-C, a dropped connection or a killed controller)
reads run.json and resumes steps 3-4 where the local copies end. Every remote command is an argv
list quoted with ``shlex.join``; host names and paths never reach a shell unquoted. The command
line (options, ``cmd_soak``) is ``preflight.app.soak_cli``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from preflight.diagnose.engine import load_knowledge
from preflight.report import terminal
from preflight.report.files import write_reports
from preflight.soak import slurm_poll
from preflight.soak.follow import follow_nodes
from preflight.soak.merge import merge_soak
from preflight.soak.plan import SoakPlan
from preflight.soak.ship import Started, start
from preflight.soak.slurm_soak import release_soak, slurm_outcomes

__all__ = ["SoakOutcome", "analyze_and_show", "follow", "start"]


@dataclass(frozen=True)
class SoakOutcome:
    run_dir: Path
    outcomes: dict[str, tuple[str, str | None]]
    merged: dict

    @property
    def failed(self) -> bool:
        return any(state != "finished" for state, _ in self.outcomes.values())


def follow(plan: SoakPlan, console: Console, started: list[Started] | None = None, live: bool = False) -> SoakOutcome:
    """Watch the run until every node is done, then merge: used after ``start`` and by ``--attach``.
    Under Slurm, the outcomes get Slurm's words, and the allocations are released once every
    node is done (not on Ctrl-C: the agents run on inside them)."""
    outcomes = follow_nodes(plan, console, started, live, slurm_poll.poll_all if plan.slurm is not None else None)
    if plan.slurm is not None:
        outcomes = slurm_outcomes(plan, outcomes)
        release_soak(plan)
    return SoakOutcome(plan.run_dir, outcomes, merge_soak(plan.run_dir, outcomes))


def analyze_and_show(outcome: SoakOutcome, console: Console, slos: tuple = (), slo_budget: float = 0.05,
                     quiet: bool = False) -> bool:
    """Judge the merged directory and write the run's reports (report.json with its ``soak``
    section, report.md, report.html with the plots, junit.xml) beside the soak data, as
    ``preflight analyze`` would; True when something failed. ``quiet`` (``-q``): the summary's
    one line only."""
    # pandas, behind the soak's data and analysis, loads only once a soak is to be judged.
    from preflight.soak.data import SoakDataError

    # The thresholds live beside the figures, pandas too.
    from preflight.soak.figures import Thresholds
    from preflight.soak.judge import judge_soak

    try:
        analysis = judge_soak(outcome.run_dir, load_knowledge(), plots_dir=outcome.run_dir / "plots",
                              thresholds=Thresholds(slos=slos, slo_budget=slo_budget))
    except SoakDataError as exc:
        console.print(f"soak analysis: cannot read {outcome.run_dir}: {exc}", highlight=False, markup=False)
        return True
    analysis.meta.update({"run_id": outcome.run_dir.name, "kind": "soak", "soak_dir": str(outcome.run_dir)})
    if isinstance(outcome.merged.get("started"), str):
        analysis.meta.setdefault("created", outcome.merged["started"])
    write_reports(outcome.run_dir, analysis)
    (terminal.show_line if quiet else terminal.show)(analysis, console, str(outcome.run_dir))
    return analysis.failed
