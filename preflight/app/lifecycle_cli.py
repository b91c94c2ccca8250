"""``preflight lifecycle``: the nodes on their way back to service.

    preflight lifecycle [--json]               each node's state and how long it has been there
    preflight lifecycle --once [--slurm]       one pass: decide every node's step and take it
    preflight lifecycle --watch [--interval S] a pass every S seconds (a systemd timer or a loop)
    preflight lifecycle ... --dry-run          the plan; nothing recorded, nothing done
    preflight lifecycle NODE --clear           a person cleared NODE (an escalated one, say): healthy
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path

from rich.console import Console

from preflight.app import options, store_cli, targets
from preflight.app.errors import UsageError
from preflight.app.retest import Retest, level_of
from preflight.collect.slurm_job import SlurmUsageError
from preflight.collect.ssh import SshNode
from preflight.contracts import EXIT_FAILED, EXIT_OK
from preflight.diagnose.engine import load_knowledge
from preflight.judge.loader import load_checks
from preflight.judge.precision import CLEARED
from preflight.knowledge.datafile import LONGEST_S, positive
from preflight.lifecycle import capture, controller, effects, policy, rma
from preflight.lifecycle.machine import STATES
from preflight.printable import printable as _p
from preflight.store import Store
from preflight.store import lifecycle as kept
from preflight.store.read import UnknownNode, node_history, up_to_latest
from preflight.store.rows import iso

PLAIN = {"markup": False, "highlight": False, "soft_wrap": True, "emoji": False}


def add_parser(sub) -> None:
    lc = sub.add_parser(
        "lifecycle", help="each node's way back to service: suspect, drained, remediating, retesting, resumed, "
                          "escalated; --once/--watch decide and take the next steps",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  preflight lifecycle\n  preflight lifecycle --once --slurm --dry-run\n"
               "  preflight lifecycle --watch --slurm --interval 300 --db postgresql://pf@db01/preflight\n"
               "  preflight lifecycle --once --slurm --hosts hosts.txt --known-hosts /etc/preflight/known_hosts\n"
               "  preflight lifecycle gpu017 --clear --reason 'GPU replaced, RMA 4711'")
    lc.add_argument("node", nargs="?", help="one node (with --clear)")
    lc.add_argument("--once", action="store_true", help="one pass over the fleet: decide and act")
    lc.add_argument("--watch", action="store_true", help="a pass every --interval seconds until stopped")
    # NaN or a negative number once made a loop without a pause (some 150 passes a second
    # against the store), and infinity a traceback: finite, above zero, at most a week.
    lc.add_argument("--interval", type=positive(float, LONGEST_S), default=300.0, metavar="S",
                    help="--watch: seconds between passes (at most a week; default 300)")
    lc.add_argument("--slurm", action="store_true", help="read node states from Slurm and act through scontrol "
                    "(default: no scheduler; the steps that need one are reported for a person)")
    lc.add_argument("--dry-run", action="store_true", help="print the plan; record and change nothing")
    lc.add_argument("--site", type=Path, metavar="FILE", help="the site's lifecycle file (silences, timings, "
                    "per-cause steps; playbooks/lifecycle.yaml's shape)")
    lc.add_argument("--clear", action="store_true", help="NODE: a person cleared it; back to healthy")
    lc.add_argument("--rma", action="store_true", help="NODE: what a vendor case needs: its incidents with their "
                    "evidence, GPU serials and board part numbers, VBIOS, NIC firmware and PSIDs, kernel-log lines, "
                    "DCGM error codes (Markdown; --json)")
    lc.add_argument("--since", default="30d", help="--rma: the incidents of this window (default 30d)")
    lc.add_argument("--reason", default="", help="--clear: why (kept with the event)")
    lc.add_argument("--json", action="store_true", help="print JSON")
    lc.add_argument("--db", metavar="URL", help="the store (default $PREFLIGHT_DB, else the embedded SQLite file)")
    lc.add_argument("--dcgm-level", type=int, choices=(1, 2, 3, 4), metavar="N",
                    help="a retest's dcgmi diag level (default: the policy's retest_dcgm_level, 2)")
    reach = lc.add_argument_group(
        "reaching the nodes", "the nodes the lifecycle may reset, restart a service on and retest, over SSH (without "
        "them those steps wait, and a node's next run is its retest)")
    options.add(reach, tuple(o for o in options.TARGETS if o.dest != "local"), exclusive=True)
    options.add(reach, tuple(o for o in options.OUTPUT if o.dest == "out"))
    reach.add_argument("--retest-arg", action="append", default=[], metavar="ARG",
                       help="one more option for the retest's run, passed as it is (e.g. --retest-arg=--nccl-reps=2; "
                            "repeatable)")
    options.add_ssh(lc)


def _store(args, create: bool) -> Store:
    return store_cli.open_required(args, create=create)


def _listing(store: Store, now: float) -> dict:
    states = kept.node_states(store)
    by = {s: [] for s in STATES}
    for node, row in sorted(states.items()):
        by.setdefault(row["state"], []).append({"node": node, "since": iso(row["since"]),
                                                "for_s": round(now - row["since"], 1), "cause": row["cause"],
                                                "run_id": row["run_id"], "step": row["step"]})
    return {"states": by}


def _show_listing(listing: dict, console: Console) -> None:
    if not any(listing["states"].values()):
        console.print("no node in any state: the lifecycle takes a node in at the first pass "
                      "(`preflight lifecycle --once`) after a recorded run has judged it", **PLAIN)
        return
    for state, nodes in listing["states"].items():
        if not nodes:
            continue
        console.print(f"{_p(state)} ({len(nodes)}):", **PLAIN)
        for n in nodes:
            hours = n["for_s"] / 3600
            console.print(f"  {_p(n['node'])}  for {hours:.1f} h" + (f"  {_p(n['cause'])}" if n["cause"] else "")
                          + (f"  ({_p(n['step'])})" if n["step"] else "")
                          + (f"  run {_p(n['run_id'])}" if n["run_id"] else ""), **PLAIN)


def _show_pass(p: controller.Pass, console: Console, dry_run: bool) -> None:
    if p.lock_holder:
        console.print(f"another lifecycle holds the store's lock ({_p(p.lock_holder)}): nothing done", **PLAIN)
        return
    if p.took_over:
        console.print(f"took over the store's lock from {_p(p.took_over)}, which no longer runs", **PLAIN)
    for o in p.outcomes:
        if o.waiting:
            console.print(f"{_p(o.node)}: waiting: {_p(o.waiting)}", **PLAIN)
        if not o.step.moved:
            continue
        verb = "would " if dry_run else ""
        actions = ", ".join(f"{a.kind}" + (f" ({a.reason})" if a.reason else "") for a in o.step.actions)
        console.print(f"{_p(o.node)}: {verb}{_p(o.step.why)}" + (f"; {verb}{_p(actions)}" if actions else ""),
                      **PLAIN)
        for c in o.captures:
            console.print(f"  evidence before the {_p(c['step'])}: {_p(c['outcome'])}, {c['bytes']} bytes in "
                          f"{c['seconds']:g} s" + (f" in {_p(c['directory'])}" if c.get("bytes") else "")
                          + (f" ({_p(c['why'])})" if c.get("why") else ""), **PLAIN)
        for r in o.step.outcomes:
            console.print(f"  {verb}record: the {_p(r.step)} for {_p(r.cause)} {_p(r.outcome)}", **PLAIN)
        for line in o.done:
            if line.startswith("for a person"):
                console.print(f"  {_p(line)}", **PLAIN)
        if o.refused:
            console.print(f"  not done: {_p(o.refused)}", **PLAIN)
    if p.stopped:
        console.print(f"stopped: {_p(p.stopped)}", **PLAIN)
    if not p.stopped and not any(o.waiting or o.step.moved for o in p.outcomes):
        console.print(f"nothing to do: {len(p.outcomes)} node(s) looked at, none due a step", **PLAIN)


def _pass_json(p: controller.Pass) -> dict:
    return {"lock_holder": p.lock_holder, "took_over": p.took_over, "stopped": p.stopped,
            "steps": [{"node": o.node, "to": o.step.state.state, "why": o.step.why,
                       "actions": [{"kind": a.kind, "reason": a.reason} for a in o.step.actions],
                       "outcomes": [{"cause": r.cause, "step": r.step, "outcome": r.outcome, "reading": r.reading}
                                    for r in o.step.outcomes],
                       "captures": [{k: c.get(k) for k in ("step", "outcome", "why", "directory", "bytes", "seconds",
                                                            "source")} for c in o.captures],
                       "done": list(o.done), "refused": o.refused} for o in p.outcomes if o.step.moved],
            "waiting": [{"node": o.node, "why": o.step.why, "lacks": o.waiting} for o in p.outcomes if o.waiting]}


def cmd_lifecycle(args, console: Console) -> int:
    if args.once and args.watch:
        raise UsageError("--once or --watch, not both")
    if args.clear and args.rma:
        raise UsageError("--clear or --rma, not both")
    if args.clear:
        return _clear(args, console)
    if args.rma:
        return _rma(args, console)
    if args.node:
        raise UsageError("lifecycle NODE: only with --clear or --rma (the node's history: preflight history NODE)")
    if not (args.once or args.watch):
        with _store(args, create=False) as store:
            listing = _listing(store, time.time())
        print(json.dumps(listing, indent=1)) if args.json else _show_listing(listing, console)
        return EXIT_OK
    try:
        pol, timings = policy.load(args.site, set(load_knowledge().causes), {c.id for c in load_checks()})
    except policy.PolicyError as exc:
        raise UsageError(str(exc)) from None
    hosts = {h.name: h for h in targets.hosts_of(args)}
    ssh = targets.ssh_of(args)
    if hosts and not args.slurm:
        raise UsageError("-H/--hosts: the lifecycle resets and retests only with --slurm, which says whether a job "
                         "runs on the node; without it every step is reported for a person")
    stop = _Stop() if args.watch else None
    code = EXIT_OK
    while True:
        with _store(args, create=True) as store:
            code = _one_pass(args, store, pol, timings, console, hosts, ssh)
        if stop is None or stop.wait(args.interval):
            return code


class _Stop:
    """--watch ends at SIGTERM (systemd's stop) or SIGINT between passes, never inside one: a
    pass whose step was recorded carries it out."""

    def __init__(self):
        self.event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.event.set())

    def wait(self, seconds: float) -> bool:
        return self.event.wait(seconds) or self.event.is_set()


def _one_pass(args, store: Store, pol, timings, console: Console, hosts: dict, ssh) -> int:
    now = time.time()
    nodes = sorted(set(kept.node_states(store)) | set(kept.readings(store, now - timings.get("escalate_window_s",
                                                                                           7 * 86400))))
    views = None
    act = effects.ForAPerson()
    if args.slurm:
        try:
            views = effects.scheduler_views(nodes)
        except SlurmUsageError as exc:
            raise UsageError(str(exc)) from None
        reach = {name: SshNode(h, ssh) for name, h in hosts.items()}
        retest = Retest(hosts, ssh, store.url, args.out, level_of(args, timings),
                        float(timings.get("step_timeout_s", 1800.0)), tuple(args.retest_arg)) if hosts else None
        limits = capture.Limits(float(timings.get("capture_timeout_s", capture.DEFAULT_TIMEOUT_S)),
                                int(timings.get("capture_max_bytes", capture.DEFAULT_MAX_BYTES)))
        act = effects.SlurmEffects(reach, retest, retest.timeout_s if retest else 0.0, Path(args.out), limits)
    try:
        p = controller.run_pass(store, pol, timings, now, act, f"lifecycle:{store_cli.actor()}", nodes, views,
                                dry_run=args.dry_run, clock=time.time)
    finally:
        for node in getattr(act, "reach", {}).values():
            node.close()
    print(json.dumps(_pass_json(p), indent=1)) if args.json else _show_pass(p, console, args.dry_run)
    return EXIT_FAILED if (p.stopped or any(o.refused for o in p.outcomes)) else EXIT_OK


def _rma(args, console: Console) -> int:
    if not args.node:
        raise UsageError("--rma: name the NODE")
    since = store_cli.since_of(args.since)
    with _store(args, create=False) as store:
        try:
            timeline = node_history(store, args.node, up_to_latest(store, since))
        except UnknownNode as exc:
            raise UsageError(str(exc)) from None
        state = kept.node_states(store).get(args.node)
        ids = [r["run_id"] for r in timeline["runs"]]
        dirs = dict(store.rows(f"SELECT run_id, report_dir FROM pf_runs WHERE run_id IN ({', '.join('?' * len(ids))})",
                               ids)) if ids else {}
    if state:
        state = {**state, "since_iso": iso(state["since"])}
    result = rma.summary(args.node, state, timeline, dirs)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        console.print(rma.markdown(result), end="", **PLAIN)
    return EXIT_OK


def _clear(args, console: Console) -> int:
    if not args.node:
        raise UsageError("--clear: name the NODE a person cleared")
    with _store(args, create=False) as store:
        states = kept.node_states(store)
        if args.node not in states:
            raise UsageError(f"{args.node}: the lifecycle has no state for it")
        before = states[args.node]["state"]
        now = time.time()
        kept.put_state(store, {"node": args.node, "state": "healthy", "since": now, "cause": None, "run_id": None,
                               "step": None, "requested": None, "retest_failures": 0},
                       {"kind": "transition", "actor": store_cli.actor(), "at": now,
                        "reason": f"{CLEARED}: {args.reason or 'no reason given'}",
                        "detail": {"from": before, "to": "healthy"}})
    console.print(f"{_p(args.node)}: {_p(before)} -> healthy (cleared by {_p(store_cli.actor())})", **PLAIN)
    return EXIT_OK
