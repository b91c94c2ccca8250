"""``preflight sweep``: the deep checks on idle nodes, as preemptable Slurm jobs (docs/sweep.md).
Not ``soak --sweep``, which is a concurrency sweep of a served model.

    preflight sweep --slurm --site FILE [--dry-run] [--json]   one pass (a systemd timer's, or cron's)
    preflight sweep --job RUN_ID ...                            on the node: what a sweep's job runs

A pass reads the nodes' Slurm states, the sweep's jobs in the queue and each node's last finished
sweep in the store, settles the sweeps that ended without saying so, and submits one job on each
idle node that is due, within the site's share (preflight.lifecycle.sweep_plan). The job's step
runs ``preflight run --local`` of the site's checks (DCGM diagnostics at its level, the single-node
all_reduce) and the short burn (``preflight soak --local --engine burn``) on the node, each a run
recorded into the store like any other, so a failing sweep feeds the lifecycle like any run; and
says how the sweep ended (preflight.store.sweeps): done, preempted by a real job (not a failure,
no verdict), or incomplete."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from preflight.app import store_cli
from preflight.app.errors import UsageError
from preflight.collect import slurm_sweep
from preflight.collect.local import local_host_name
from preflight.collect.slurm_job import node_states, partition_nodes
from preflight.contracts import EXIT_FAILED, EXIT_OK
from preflight.judge.loader import load_checks
from preflight.lifecycle import sweep_plan, sweep_policy
from preflight.printable import printable as _p
from preflight.store import lifecycle as kept
from preflight.store import sweeps
from preflight.store.location import ENV as DB_ENV

PLAIN = {"markup": False, "highlight": False, "soft_wrap": True, "emoji": False}
# Kept of the budget for the step's own start and the outcome's record, after the children end.
MARGIN_S = 30.0
SETTLE_WINDOW_S = 14 * 86400.0  # submitted sweeps older than this are not looked for again
# A child asked to stop (SIGTERM) has this long before SIGKILL: its run is thrown away (no
# verdict), and the outcome must be written before Slurm's own SIGKILL (KillWait after its
# SIGTERM; 30 s by default, the test cluster's 2 s). What the run left behind on the node, Slurm
# ends with the step.
STOP_WAIT_S = 1.0
LOCK, LOCK_TTL_S = "sweep", 600.0  # a pass lasts seconds; a pass that died holding it blocks 10 minutes at most
_EMPTY = {"submitted": [], "refused": [], "settled": [], "capacity": 0, "in_flight": [], "left": {}}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep", help="deep checks (DCGM diag, single-node all_reduce, a short burn) on idle nodes that are due, as "
                      "Slurm jobs any real job preempts; one pass per call (not `soak --sweep`, a concurrency sweep)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The deep checks on idle nodes that are due, as Slurm jobs any real job preempts (docs/sweep.md). "
                    "`preflight soak --sweep C1,C2,...` is another thing: a concurrency sweep of a served model.",
        epilog="examples:\n  preflight sweep --slurm --site /etc/preflight/sweep.yaml --dry-run\n"
               "  preflight sweep --slurm --site /etc/preflight/sweep.yaml --db postgresql://pf@db01/preflight")
    p.add_argument("--slurm", action="store_true", help="one pass: submit the sweep's jobs through sbatch (the only "
                   "scheduler a sweep runs under)")
    p.add_argument("--site", type=Path, metavar="FILE", help="the site's sweep policy (format: preflight-sweep/1): "
                   "partition or QOS, period, max_share, budget, DCGM level, checks, burn (docs/sweep.md)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; submit and record nothing")
    p.add_argument("--json", action="store_true", help="print the pass as JSON")
    p.add_argument("--db", metavar="URL", help="the store, PostgreSQL (default $PREFLIGHT_DB): the jobs record into "
                   "it from the nodes, so they must reach it")
    node = p.add_argument_group("on the node", "what a sweep's Slurm job runs (the pass writes these)")
    node.add_argument("--job", metavar="RUN_ID", help="run the sweep RUN_ID here and record how it ended")
    node.add_argument("--dcgm-level", type=int, choices=(1, 2, 3, 4), default=2, metavar="N")
    node.add_argument("--checks", default=",".join(sweep_policy.DEEP_CHECKS), metavar="IDS")
    node.add_argument("--burn-minutes", type=float, default=0.0, metavar="M")
    node.add_argument("--budget-minutes", type=float, default=20.0, metavar="M")
    node.add_argument("--out", default=sweep_policy.SweepPolicy.out, metavar="DIR")
    node.add_argument("--run-arg", action="append", default=[], metavar="ARG")


def cmd_sweep(args, console: Console) -> int:
    if args.job:
        if args.slurm or args.site:
            raise UsageError("--job runs on the node, alone; --slurm --site is the pass")
        return _job(args, console)
    if not args.slurm:
        raise UsageError("sweep: --slurm (a sweep's checks run as Slurm jobs any real job preempts; "
                         "docs/sweep.md)")
    if not args.site:
        raise UsageError("sweep --slurm: --site FILE names the preemptable partition or QOS, the period and the "
                         "share (docs/sweep.md)")
    try:
        policy = sweep_policy.load(args.site, {c.id for c in load_checks()})
    except sweep_policy.SweepPolicyError as exc:
        raise UsageError(str(exc)) from None
    url = store_cli.required_url(args)
    if url.dialect != "postgresql":
        # The jobs record into the store from the nodes while the pass and others write to it: an
        # SQLite file is one host's (a node's own would never be read here, and every pass would
        # sweep the nodes again), and written from the nodes at once it lost events (docs/sweep.md).
        raise UsageError(f"sweep --slurm: the store must be PostgreSQL, which the nodes reach too (--db or "
                         f"${DB_ENV} postgresql://...), not {url.shown}")
    holder = f"{socket.gethostname()}:{os.getpid()}"
    with store_cli.open_required(args, create=True) as store:
        # One pass at a time (the timer's and an operator's): two at once would each see no job
        # on a node and both submit one. The lifecycle's lock table, under a name of its own.
        if not args.dry_run and not kept.take_lock(store, LOCK, holder, LOCK_TTL_S):
            found = kept.lock_holder(store, LOCK)
            result = {**_EMPTY, "lock_holder": found[0] if found else "another pass"}
        else:
            try:
                result = {**one_pass(store, url, policy, time.time(), args.dry_run), "lock_holder": None}
            finally:
                if not args.dry_run:
                    kept.drop_lock(store, LOCK, holder)
    print(json.dumps(result, indent=1)) if args.json else _show(result, console, args.dry_run)
    return EXIT_FAILED if result["refused"] else EXIT_OK


def node_argv(policy: sweep_policy.SweepPolicy, run_id: str) -> list[str]:
    argv = [policy.python, "-m", "preflight", "sweep", "--job", run_id, "--dcgm-level", str(policy.dcgm_level),
            "--checks", ",".join(policy.checks), "--burn-minutes", f"{policy.burn_min:g}",
            "--budget-minutes", f"{policy.budget_min:g}", "--out", policy.out]
    return argv + [f"--run-arg={a}" for a in policy.run_args]


def one_pass(store, url, policy: sweep_policy.SweepPolicy, now: float, dry_run: bool) -> dict:
    jobs = slurm_sweep.queued()
    in_flight = {}
    for j in jobs:
        node = sweep_plan.node_of(j.comment)
        if node and j.active:
            in_flight[node] = j
    settled = [] if dry_run else _settle(store, {j.job: j for j in jobs}, in_flight, now)
    names = partition_nodes(policy.partition) if policy.partition else partition_nodes(None)
    states = node_states(names)
    decided = sweep_plan.plan(states, in_flight, sweeps.last_done(store), policy, now)
    submitted, refused = [], []
    if not dry_run and decided.submit:
        # The jobs inherit this environment (sbatch --export=ALL): the store's URL reaches the
        # node there, not on a command line where `ps` would show a password.
        os.environ[DB_ENV] = url.target if url.dialect == "postgresql" else f"sqlite:///{url.target}"
    for node in decided.submit:
        run_id = sweep_plan.run_id(node, time.time())
        if dry_run:
            submitted.append({"node": node, "run_id": run_id, "job": None})
            continue
        argv = slurm_sweep.sbatch_argv(node, run_id, int(policy.budget_min) + 1, 2 * int(policy.budget_min) + 2,
                                       policy.partition, policy.qos, policy.account)
        job, why = slurm_sweep.submit(argv, slurm_sweep.script(node_argv(policy, run_id), run_id, node))
        if job is None:
            refused.append({"node": node, "why": why})
            continue
        sweeps.record(store, node, sweeps.SUBMITTED, _actor(), f"job {job}", run_id,
                      {"job": job, "partition": policy.partition, "qos": policy.qos})
        submitted.append({"node": node, "run_id": run_id, "job": job})
    return {"submitted": submitted, "refused": refused, "settled": settled, "capacity": decided.capacity,
            "in_flight": sorted(in_flight), "left": decided.left}


def _settle(store, listed: dict, in_flight: dict, now: float) -> list[dict]:
    """Sweeps submitted without an outcome whose job no longer runs: the job's own record never
    came (killed before it could write, never started before its deadline). Preempted where
    Slurm still knows the job and says it chose it for preemption (its PreemptTime; a sweep
    that stopped within the grace ends COMPLETED, so the state alone does not tell), else
    incomplete."""
    out = []
    for o in sweeps.open_sweeps(store, now - SETTLE_WINDOW_S):
        if o.node in in_flight and in_flight[o.node].comment == o.run_id:
            continue
        job = listed.get(o.job)
        state = job.state if job is not None else None
        if state is not None and (state == "PREEMPTED" or slurm_sweep.preempted(o.job)):
            kind, reason = sweeps.PREEMPTED, f"job {o.job} preempted by Slurm for a real job"
        else:
            kind, reason = sweeps.INCOMPLETE, (f"job {o.job} ended {state} without an outcome" if state else
                                               f"job {o.job} ended without an outcome (Slurm no longer lists it)")
        sweeps.record(store, o.node, kind, _actor(), reason, o.run_id, {"job": o.job, "slurm_state": state})
        out.append({"node": o.node, "run_id": o.run_id, "outcome": kind, "why": reason})
    return out


def _actor() -> str:
    return f"sweep:{store_cli.actor()}"


def _show(result: dict, console: Console, dry_run: bool) -> None:
    if result.get("lock_holder"):
        console.print(f"another sweep pass holds the store's lock ({_p(result['lock_holder'])}): nothing done",
                      **PLAIN)
        return
    for s in result["settled"]:
        console.print(f"{_p(s['node'])}: {_p(s['run_id'])}: {_p(s['outcome'])}: {_p(s['why'])}", **PLAIN)
    verb = "would submit" if dry_run else "submitted"
    for s in result["submitted"]:
        console.print(f"{_p(s['node'])}: {verb} {_p(s['run_id'])}" + (f" (job {s['job']})" if s["job"] else ""),
                      **PLAIN)
    for r in result["refused"]:
        console.print(f"{_p(r['node'])}: not submitted: {_p(r['why'])}", **PLAIN)
    console.print(f"{len(result['submitted'])} {verb}, {len(result['in_flight'])} in flight, at most "
                  f"{result['capacity']} at once; {len(result['left'])} left this pass", **PLAIN)


# ---- on the node ---------------------------------------------------------------------------


class _Stopped:
    """SIGTERM (Slurm's at a preemption, a time limit or a scancel) or SIGINT: the running child
    is stopped, and the outcome says why."""

    def __init__(self):
        self.signal: int | None = None
        self.child: subprocess.Popen | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on)

    def _on(self, signum, _frame) -> None:
        self.signal = signum
        if self.child is not None and self.child.poll() is None:
            _end(self.child, signal.SIGTERM)


def _end(child: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


def _run_child(argv: list[str], stop: _Stopped, deadline: float) -> int | None:
    """The child's exit status; None when stopped or past the deadline."""
    if stop.signal is not None:
        return None
    stop.child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        return stop.child.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _end(stop.child, signal.SIGTERM)
        try:
            stop.child.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            _end(stop.child, signal.SIGKILL)
            stop.child.wait()
        return None
    finally:
        if stop.signal is not None and stop.child.poll() is None:
            try:
                stop.child.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                _end(stop.child, signal.SIGKILL)
                stop.child.wait()


def job_steps(args) -> list[tuple[str, list[str]]]:
    """What the sweep runs on the node, in order: the checks, then the burn."""
    py = [sys.executable, "-m", "preflight"]
    steps = [("checks", [*py, "run", "--local", "--run-id", args.job, "--checks", args.checks,
                         "--dcgm-level", str(args.dcgm_level), "--out", args.out, "--no-html", "-q", *args.run_arg])]
    if args.burn_minutes > 0:
        steps.append(("burn", [*py, "soak", "--local", "--engine", "burn", "--minutes", f"{args.burn_minutes:g}",
                               "--run-id", f"{args.job}.burn", "--out", args.out, "-q"]))
    return steps


def _job(args, console: Console) -> int:
    # The node as Slurm names it (the pass put it in the run id): what the next pass looks up. The
    # run names the node by its host name; where the two differ, the event says so.
    node = sweep_plan.node_of(args.job)
    if node is None:
        raise UsageError(f"--job {args.job}: not a sweep's run id (sweep-NODE-STAMP)")
    url = store_cli.required_url(args)  # before anything runs: a store it cannot name is bad usage
    stop = _Stopped()
    deadline = time.monotonic() + args.budget_minutes * 60 - MARGIN_S
    results: dict[str, int | None] = {}
    for name, argv in job_steps(args):
        results[name] = _run_child(argv, stop, deadline)
        if results[name] not in (0, 1):
            break
    job = os.environ.get("SLURM_JOB_ID")
    detail: dict = {"job": int(job) if job and job.isdigit() else None, "steps": results}
    if local_host_name() != node:
        detail["host"] = local_host_name()  # the name the run's verdicts are recorded under
    if stop.signal is not None:
        chosen = slurm_sweep.preempted(int(job)) if detail["job"] else None
        detail["preempted"] = chosen
        if chosen:
            kind, reason = sweeps.PREEMPTED, f"job {job} preempted by Slurm for a real job"
        else:
            kind, reason = sweeps.INCOMPLETE, (f"stopped by signal {stop.signal} (its time limit or a scancel; "
                                               f"Slurm did not preempt it)")
    elif any(code is None for code in results.values()):
        kind, reason = sweeps.INCOMPLETE, f"did not finish within its budget ({args.budget_minutes:g} min)"
    elif any(code not in (0, 1) for code in results.values()):
        bad = next(n for n, c in results.items() if c not in (0, 1))
        kind, reason = sweeps.INCOMPLETE, f"its {bad} exited {results[bad]} (no verdict; the step's stderr says why)"
    else:
        kind, reason = sweeps.DONE, "failed" if 1 in results.values() else "passed"
    with store_cli.open_store(url, create=True, timeout_s=10.0) as store:
        sweeps.record(store, node, kind, f"sweep-job:{node}", reason, args.job, detail)
    console.print(f"{_p(node)}: {_p(args.job)}: {kind}: {_p(reason)}", **PLAIN)
    if kind == sweeps.DONE:
        return EXIT_FAILED if reason == "failed" else EXIT_OK
    return EXIT_OK if kind == sweeps.PREEMPTED else EXIT_FAILED
