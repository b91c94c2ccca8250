"""``preflight history`` on a terminal: a node's timeline, or the fleet's four answers, as
plain lines (one record per line, so a pipe to grep keeps each whole). Every value read from
the store is shown through ``printable``: a node name holding ESC, CR or a newline is shown as
its escapes, so it can neither drive the terminal nor start a line of its own."""

from __future__ import annotations

from rich.console import Console

from preflight.printable import printable as _p
from preflight.report.fleet_html import duration

PLAIN = {"markup": False, "highlight": False, "soft_wrap": True, "emoji": False}
_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "error": "ERROR"}


def _figures(figures: dict) -> str:
    return ", ".join(f"{_p(k)} {v:g}" for k, v in sorted(figures.items()))


def show(result: dict, console: Console, fleet: bool) -> None:
    (show_fleet if fleet else show_node)(result, console)


def show_node(h: dict, console: Console) -> None:
    runs, events = h["runs"], h["events"]
    bad = h.get("failing_total", sum(1 for r in runs if r["status"] in ("fail", "error")))
    total, happened = h.get("runs_total", len(runs)), h.get("events_total", len(events))
    console.print(f"{_p(h['node'])}: {total} run(s) since {_p(h['since'])}, {bad} failing; {happened} event(s)",
                  **PLAIN)
    if total > len(runs) or happened > len(events):
        console.print(f"  ({total - len(runs)} earlier run(s) and {happened - len(events)} earlier event(s) not shown: "
                      "--last N shows more, 0 all; --json lists them all)", **PLAIN)
    lines = [(r["started"], "run", r) for r in runs] + [(e["at"], "event", e) for e in events]
    for when, what, item in sorted(lines, key=lambda x: (x[0] or "", x[1])):
        if what == "event":
            console.print(f"  {_p(when)}  {_p(item['kind'].upper()):<5} by {_p(item['actor'])}: {_p(item['reason'])}"
                          + (f" (run {_p(item['run_id'])})" if item["run_id"] else ""), **PLAIN)
            continue
        causes = _p(", ".join(c["cause"] for c in item["causes"]))
        checks = _p(", ".join(f["check"] for f in item["findings"] if f["status"] in ("fail", "error")))
        console.print(f"  {_p(when)}  {_p(_MARK.get(item['status'], item['status'])):<5} {_p(item['kind']):<11} "
                      f"{_p(item['run_id'])}"
                      + (f"  causes: {causes}" if causes else (f"  failed: {checks}" if checks else ""))
                      + (f"  [{_figures(item['figures'])}]" if item["figures"] else ""), **PLAIN)


def show_fleet(f: dict, console: Console) -> None:
    console.print(f"fleet since {_p(f['since'])}: {f['runs']} run(s), {f['host_runs']} host-run(s), "
                  f"{f['nodes']} node(s)", **PLAIN)
    console.print(f"repeat offenders ({len(f['repeat_offenders'])}):", **PLAIN)
    for r in f["repeat_offenders"]:
        console.print(f"  {_p(r['node'])}  {_p(r['cause'])}  {r['count']} incidents, "
                      f"{_p(r['first'])} .. {_p(r['last'])}", **PLAIN)
    console.print(f"flapping ({len(f['flapping'])}):", **PLAIN)
    for r in f["flapping"]:
        console.print(f"  {_p(r['node'])}  {_p(r['check'])}  {r['transitions']} changes in {r['runs']} runs "
                      f"({r['failures']} failing)", **PLAIN)
    console.print(f"degrading ({len(f['degrading'])}):", **PLAIN)
    for r in f["degrading"]:
        console.print(f"  {_p(r['node'])}  {_p(r['figure'])}  {r['recent']:g} against its own {r['baseline']:g} "
                      f"({r['change_pct']:+.1f} %, {r['sigmas']:.1f} x the fleet's run-to-run spread of "
                      f"{r['spread_pct']:.2f} %; fleet median {r['fleet_median']})", **PLAIN)
    failing = [r for r in f["rates"] if r["failures"]]
    console.print(f"failure rates ({len(failing)} with failures):", **PLAIN)
    for r in failing:
        key = r.get("check") or r.get("cause")
        kind = "check" if "check" in r else "cause"
        mtbf = f"MTBF {r['mtbf_h']:g} h" if r["mtbf_h"] is not None else "MTBF -"
        runs = f" of {r['runs']} host-runs" if r["runs"] else ""
        console.print(f"  {kind} {_p(key)}: {r['failures']} failing{runs}, {r['incidents']} incident(s), {mtbf}",
                      **PLAIN)
    _show_precision(f.get("precision"), console)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _counts(p: dict) -> str:
    by = p["confirmed_by"]
    return (f"{p['drains']} drain(s): {p['confirmed']} confirmed ({by['escalated']} escalated, "
            f"{by['retest_failed']} retest failed, {by['step']} after a step, {by['returned']} returned), "
            f"{p['unconfirmed']} unconfirmed, {p['pending']} pending, {p['open']} open, {p['cleared']} cleared; "
            f"precision {_share(p['precision'])}")


def _times(p: dict) -> str:
    d, r = p["to_drain"], p["to_resume"]
    return (f"first failing reading to drain p50 {duration(d['p50_s'])}, p90 {duration(d['p90_s'])} ({d['n']}); "
            f"drain to resume p50 {duration(r['p50_s'])}, p90 {duration(r['p90_s'])} ({r['n']})")


def _show_precision(p: dict | None, console: Console) -> None:
    """How often preflight's drains were right (docs/lifecycle.md, "How often preflight is wrong")."""
    if not p:
        return
    if not p["drains"]:
        console.print("precision of the drains: no drain by preflight began in the window", **PLAIN)
        return
    rate = p["unconfirmed_per_100_node_days"]
    console.print(f"precision of the drains (unconfirmed: resumed with no step and the cause away "
                  f"{duration(p['returns_within_s'])}):", **PLAIN)
    console.print(f"  {_counts(p)}", **PLAIN)
    console.print(f"  {'-' if rate is None else f'{rate:g}'} unconfirmed drain(s) per 100 node-days "
                  f"({p['node_days']:,.1f} node-days)", **PLAIN)
    console.print(f"  {_times(p)}", **PLAIN)
    for c in p["causes"]:
        console.print(f"  cause {_p(c['cause'])}: {_counts(c)}; {_times(c)}", **PLAIN)
