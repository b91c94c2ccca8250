"""A node against its own past (``run``/``analyze --history``): the results store's memory of
earlier runs, read as the ``history`` fact. Three checks, each an ordinary host check over plain
data, so a saved bundle judged with the same store says the same:

- ``history-repeat``: the same cause in separate incidents within the last 7 days (NVSentinel
  escalates a node after 5 remediations in 7 days; 3 incidents already name a node to watch).
  An incident is a streak of consecutive runs carrying the cause: a node that stayed broken
  through a day of five-minute healthchecks is one incident, not 288.
- ``history-flapping``: a check whose verdict on the node changed between failing and passing 3
  or more times over the same window, this run included (a node that keeps coming back is not
  cured; gpud PR #1247 describes flapping nodes stuck in drain).
- ``history-trend``: a figure (busbw, the soak's TFLOP/s, tokens/s, temperature, P99s) whose
  recent level moved the worse way by more than 3 times the fleet's run-to-run spread against
  the node's own median of its earlier runs; this run's reading counts as the most recent.

Each warns: history alone does not make a node fail today, it tells the operator where to look
and what to escalate. The rules are ``preflight.judge.trends``'s, shared with ``history --fleet``.
"""

from __future__ import annotations

from datetime import datetime, timezone

from preflight.check import host_check, ok, skip, warn
from preflight.judge import trends
from preflight.judge.figures import FIGURES

WINDOW_S = 7 * 86400
POLICY = trends.Policy()


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M")


def _recent(host):
    h = host.history
    runs = [r for r in h.runs if r.started >= h.now - WINDOW_S]
    return h, runs


@host_check("history-repeat", facts=["history"],
            summary="the same cause in 3 or more separate incidents in 7 days (a repeat offender; --history)")
def history_repeat(host):
    h, runs = _recent(host)
    if not runs:
        return skip("no earlier run of this node in the last 7 days in the results store")
    order = {host.name: [r.run_id for r in runs]}
    hits = [(host.name, cause, r.run_id, r.started) for r in runs for cause in r.causes]
    found = trends.repeat_offenders(trends.incidents(order, hits), POLICY)
    if not found:
        n = len(trends.incidents(order, hits))
        return ok(f"no cause came back: {len(runs)} earlier run(s) in 7 days, {n} incident(s)")
    out = []
    for r in found:
        out.append(warn(
            f"{r['cause']} diagnosed in {r['count']} separate incidents in the 7 days before this run "
            f"({_day(r['first'])} .. {_day(r['last'])} UTC, {len(runs)} runs)",
            symptoms=["history-repeat-offender"],
            action=f"stop returning the node to service on a passing run: drain it with reason 'preflight: repeat "
                   f"{r['cause']}', open a vendor case with its incidents (preflight history {host.name})",
            data={"cause": r["cause"], "incidents": r["count"], "first": _day(r["first"]), "last": _day(r["last"])}))
    return out


@host_check("history-flapping", facts=["history"],
            summary="no check changed its verdict between fail and pass 3 or more times in 7 days (--history)")
def history_flapping(host):
    h, runs = _recent(host)
    if not runs:
        return skip("no earlier run of this node in the last 7 days in the results store")
    checks = {c for r in runs for c in r.failed} | {c for c, failed in host.verdicts.items() if failed}
    sequences = {}
    for check in checks:
        seq = [check in r.failed for r in runs if r.reachable and (check in r.judged or check in r.failed)]
        if check in host.verdicts:
            seq.append(host.verdicts[check])
        sequences[(host.name, check)] = seq
    found = trends.flapping(sequences, POLICY)
    if not found:
        return ok(f"no check flapped over {len(runs)} earlier run(s) and this one")
    return [warn(f"{r['check']} changed between fail and pass {r['transitions']} times in 7 days "
                 f"({r['failures']} failing of {r['runs']} runs, this one included)",
                 symptoms=["history-flapping"],
                 action=f"do not resume {host.name} on its next pass: an intermittent fault passes now and then; "
                        f"keep it drained and look for what {r['check']} sees come and go (preflight history "
                        f"{host.name})",
                 data={"check": r["check"], "transitions": r["transitions"], "runs": r["runs"]})
            for r in found]


@host_check("history-trend", facts=["history"],
            summary="no figure (busbw, soak throughput, temperature, P99) moved the worse way beyond 3 x the "
                    "fleet's run-to-run spread against the node's own earlier runs (--history)")
def history_trend(host):
    h = host.history
    names = sorted(set(h.figures) | set(host.readings))
    if not names:
        return skip("no figure of this node in the results store (all_reduce or soak runs record them)")
    out, judged = [], []
    for name in names:
        values = list(h.figures.get(name, ())) + ([host.readings[name]] if name in host.readings else [])
        spread = h.spreads.get(name)
        if name not in FIGURES or spread is None:
            continue
        if len(values) < POLICY.recent_runs + POLICY.min_baseline_runs:
            continue
        judged.append(f"{name} over {len(values)} runs")
        t = trends.trend_of(host.name, name, values, spread, FIGURES[name].worse, POLICY, h.fleet_medians.get(name))
        if t is None:
            continue
        fig = FIGURES[name]
        way = "below" if t.change_pct < 0 else "above"
        base_n = t.runs - POLICY.recent_runs
        out.append(warn(
            f"{fig.label} {abs(t.change_pct):.1f} % {way} this node's median of its {base_n} runs before "
            f"({t.recent:g} against {t.baseline:g} {fig.unit}; {t.sigmas:.1f} x the fleet's run-to-run spread of "
            f"{t.spread_pct:.2f} %; fleet median {t.fleet_median:g})",
            symptoms=["history-degrading"],
            action=f"compare {host.name}'s {fig.label} with its history (preflight history {host.name}) and look for "
                   "what changed: NVLink and PCIe link states, NIC firmware, cooling and inlet temperature; "
                   "re-run the test to confirm before draining",
            data=t.to_dict()))
    if out:
        return out
    if not judged:
        return skip(f"fewer than {POLICY.recent_runs + POLICY.min_baseline_runs} readings of any figure "
                    "for this node in the results store")
    return ok(f"no figure got worse beyond the fleet's run-to-run spread ({', '.join(judged)})")
