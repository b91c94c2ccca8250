"""The command lines of ``preflight drain RUN`` and ``preflight resume RUN`` (rules in drain.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from preflight.app import drain, options, store_cli
from preflight.app.errors import UsageError
from preflight.contracts import EXIT_FAILED, EXIT_OK
from preflight.knowledge.datafile import fraction

PLAIN = {"markup": False, "highlight": False, "soft_wrap": True}  # node output, verbatim, one line each



def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of nodes")
    return int(text)


def add_parsers(sub) -> None:
    dr = sub.add_parser("drain", help="drain in Slurm the nodes a run's diagnoses blame, behind a circuit breaker",
                        epilog=options.examples("preflight drain reports/<run-id> --dry-run",
                                                "preflight drain reports/<run-id> --min-confidence medium "
                                                "--max-nodes 4"))
    dr.add_argument("run", type=Path, help="a run directory (reports/<run-id>) or its report.json")
    dr.add_argument("--min-confidence", choices=drain.CONFIDENCE, default="high",
                    help="the weakest diagnosis that drains (default high)")
    dr.add_argument("--max-fraction", type=fraction("the run's nodes"), default=0.1, metavar="F",
                    help="refuse to drain more than this share of the run's nodes (default 0.1)")
    dr.add_argument("--max-nodes", type=_count, metavar="N", help="and more than N nodes")
    dr.add_argument("--dry-run", action="store_true", help="say what would be drained; change nothing")
    store_cli.add_options(dr)
    rs = sub.add_parser("resume", help="resume the nodes preflight drained that pass in this run",
                        epilog=options.examples("preflight resume reports/<run-id> --dry-run",
                                                "preflight resume reports/<run-id>"))
    rs.add_argument("run", type=Path, help="a run directory (reports/<run-id>) or its report.json")
    rs.add_argument("--dry-run", action="store_true", help="say what would be resumed; change nothing")
    store_cli.add_options(rs)


def _show(plan: drain.Plan, console: Console, dry_run: bool) -> None:
    for a in plan.actions:
        verb = {"drain": "drain", "resume": "resume", "none": "leave"}[a.kind]
        console.print(f"{'would ' if dry_run and a.kind != 'none' else ''}{verb} {a.node}: "
                      + (f"{a.reason} " if a.reason else "") + f"({a.why})", **PLAIN)


def _finish(plan: drain.Plan, args, console: Console, run_id: str | None = None) -> int:
    _show(plan, console, args.dry_run or bool(plan.refused))
    if plan.refused:
        console.print(f"refused: {plan.refused}; nothing was changed", **PLAIN)
        return EXIT_FAILED
    if args.dry_run:
        return EXIT_OK
    complaints = drain.carry_out(plan)
    for c in complaints:
        console.print(f"Slurm refused: {c}", **PLAIN)
    refused = {c.split(":", 1)[0] for c in complaints}
    store_cli.record_events(store_cli.store_of(args), [
        {"node": a.node, "kind": a.kind, "reason": a.reason or a.why, "run_id": run_id, "detail": {"why": a.why}}
        for a in plan.doing("drain") + plan.doing("resume") if a.node not in refused], console)
    return EXIT_FAILED if complaints else EXIT_OK


def _report(args) -> tuple[dict, str]:
    try:
        report = drain.read_report(args.run)
    except drain.DrainInputError as exc:
        raise UsageError(str(exc)) from None
    run_dir = args.run if args.run.is_dir() else args.run.parent
    return report, str(report.get("run_id") or run_dir.name)


def cmd_drain(args, console: Console) -> int:
    store_cli.store_of(args)  # a bad --db is refused before Slurm is asked anything
    report, run_id = _report(args)
    states = drain.states_of(drain.blamed(report, args.min_confidence))
    plan = drain.plan_drain(report, states, run_id, args.min_confidence, args.max_fraction, args.max_nodes)
    if not plan.actions:
        console.print(f"nothing to drain: no {args.min_confidence}-confidence diagnosis blames a node",
                      markup=False, highlight=False, soft_wrap=True)
    return _finish(plan, args, console, run_id)


def cmd_resume(args, console: Console) -> int:
    store_cli.store_of(args)
    report, run_id = _report(args)
    plan = drain.plan_resume(report, drain.states_of(report["hosts"]))
    if not plan.actions:
        console.print("nothing to resume: no node of this run is drained", **PLAIN)
    return _finish(plan, args, console, run_id)
