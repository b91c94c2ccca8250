"""The fleet's questions about time, answered from rows the store returns. Pure: sequences in,
records out, so each rule is tested on tables without a database.

- An **incident** is a streak: a node's consecutive runs that carry the same cause (or fail
  the same check) are one incident, however often a healthcheck saw it. A node diagnosed every
  five minutes for a day is one broken node, not 288 offences; a node whose cause comes back
  after it passed in between is a repeat offender.
- **Flapping** is a check that keeps changing its mind on one node: its verdict turned between
  failing and passing at least ``transitions`` times in the window.
- **Degrading** compares a node's recent readings of a figure with its own earlier ones, in
  units of the fleet's run-to-run spread of that figure (measured from every node's successive
  readings), so a figure that is noisy everywhere needs a larger change to count than one that
  is steady, and no fixed percentage decides.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

FAILING = ("fail", "error")


@dataclass(frozen=True)
class Policy:
    repeat_count: int = 3  # incidents of one cause in the window that make a repeat offender
    flap_transitions: int = 3  # fail<->pass changes of one check that make it flapping ...
    flap_runs: int = 20  # ... within its last this many verdicts on the node
    recent_runs: int = 3  # the readings that make a node's "recent" level
    baseline_runs: int = 10  # the earlier readings its own baseline is the median of
    min_baseline_runs: int = 5  # fewer earlier readings than this: no trend is claimed
    sigmas: float = 3.0  # a change beyond this many fleet spreads is degradation
    # A floor under the spread (0.1 %): replayed or quantised figures can repeat exactly, and a
    # spread of zero would make any change infinitely significant.
    min_spread: float = 0.001
    # A drain resumed with no step taken is unconfirmed once its cause stayed away this long
    # (judge.precision; history --fleet --returns-within).
    returns_within_s: float = 7 * 86400.0


@dataclass(frozen=True)
class Incident:
    node: str
    key: str  # a cause or a check
    first: float
    last: float
    runs: int


def incidents(run_order: Mapping[str, Sequence[str]], hits: Iterable[tuple[str, str, str, float]]) -> list[Incident]:
    """``run_order``: each node's run ids in time order; ``hits``: (node, key, run_id, started)
    for each run that carried the key. Consecutive runs of the node that carry it fold into one
    incident."""
    position = {node: {r: i for i, r in enumerate(runs)} for node, runs in run_order.items()}
    by_key: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for node, key, run_id, started in hits:
        pos = position.get(node, {}).get(run_id)
        if pos is not None:
            by_key[(node, key)].append((pos, started))
    out = []
    for (node, key), seen in by_key.items():
        seen = sorted(set(seen))
        start = prev = seen[0]
        count = 1
        for item in seen[1:]:
            if item[0] == prev[0] + 1:
                prev, count = item, count + 1
                continue
            out.append(Incident(node, key, start[1], prev[1], count))
            start = prev = item
            count = 1
        out.append(Incident(node, key, start[1], prev[1], count))
    return out


def repeat_offenders(found: Iterable[Incident], policy: Policy) -> list[dict]:
    grouped: dict[tuple[str, str], list[Incident]] = defaultdict(list)
    for i in found:
        grouped[(i.node, i.key)].append(i)
    out = [{"node": node, "cause": cause, "count": len(items), "first": min(i.first for i in items),
            "last": max(i.last for i in items)}
           for (node, cause), items in grouped.items() if len(items) >= policy.repeat_count]
    return sorted(out, key=lambda r: (-r["count"], r["node"], r["cause"]))


def transitions(verdicts: Sequence[bool]) -> int:
    """How many times a sequence of failing (True) / passing (False) verdicts changed."""
    return sum(1 for a, b in zip(verdicts, verdicts[1:], strict=False) if a != b)


def flapping(sequences: Mapping[tuple[str, str], Sequence[bool]], policy: Policy) -> list[dict]:
    """``sequences``: (node, check) -> the check's verdicts on the node in time order (True:
    failing). Only the last ``flap_runs`` count: flapping is a check changing its mind *now*; two
    chance failures months apart in a year of daily runs are four changes too, and no flap."""
    recent = {key: list(seq)[-policy.flap_runs:] for key, seq in sequences.items()}
    out = [{"node": node, "check": check, "transitions": n, "runs": len(seq), "failures": sum(seq)}
           for (node, check), seq in recent.items() if (n := transitions(seq)) >= policy.flap_transitions]
    return sorted(out, key=lambda r: (-r["transitions"], r["node"], r["check"]))


def run_to_run_spread(series: Iterable[Sequence[float]]) -> float | None:
    """The fleet's run-to-run spread of a figure, as a fraction of its level: the robust
    standard deviation (1.4826 x MAD) of every node's successive relative changes, divided by
    sqrt(2) because a change between two readings carries the noise of both. None without two
    readings anywhere."""
    steps = []
    for values in series:
        values = [v for v in values if v]
        steps += [(b - a) / abs(a) for a, b in zip(values, values[1:], strict=False)]
    if not steps:
        return None
    centre = statistics.median(steps)
    mad = statistics.median(abs(s - centre) for s in steps)
    return 1.4826 * mad / math.sqrt(2)


@dataclass(frozen=True)
class Trend:
    node: str
    figure: str
    baseline: float
    recent: float
    change_pct: float
    runs: int
    spread_pct: float
    sigmas: float
    fleet_median: float | None

    def to_dict(self) -> dict:
        return {"node": self.node, "figure": self.figure, "baseline": round(self.baseline, 4),
                "recent": round(self.recent, 4), "change_pct": round(self.change_pct, 2), "runs": self.runs,
                "spread_pct": round(self.spread_pct, 3), "sigmas": round(self.sigmas, 2),
                "fleet_median": None if self.fleet_median is None else round(self.fleet_median, 4)}


def trend_of(node: str, figure: str, values: Sequence[float], spread: float, worse: str,
             policy: Policy, fleet_median: float | None = None) -> Trend | None:
    """The node's recent level against its own baseline, when it moved the worse way by more
    than ``policy.sigmas`` fleet spreads; None otherwise or with too few readings."""
    recent_n, base_n = policy.recent_runs, policy.baseline_runs
    if len(values) < recent_n + policy.min_baseline_runs:
        return None
    recent = statistics.median(values[-recent_n:])
    earlier = values[-recent_n - base_n:-recent_n]
    baseline = statistics.median(earlier)
    if not baseline:
        return None
    change = (recent - baseline) / abs(baseline)
    spread = max(spread, policy.min_spread)
    bad = change < 0 if worse == "lower" else change > 0
    sigmas = abs(change) / spread
    if not bad or sigmas < policy.sigmas:
        return None
    return Trend(node, figure, baseline, recent, 100 * change, len(earlier) + recent_n, 100 * spread, sigmas,
                 fleet_median)


def degrading(series: Mapping[tuple[str, str], Sequence[float]], worse: Mapping[str, str],
              policy: Policy) -> list[Trend]:
    """``series``: (node, figure) -> readings in time order. Every figure's spread is measured
    on the whole fleet's series of it first, then each node is judged against it."""
    by_figure: dict[str, list[Sequence[float]]] = defaultdict(list)
    for (_, figure), values in series.items():
        by_figure[figure].append(values)
    spreads = {f: run_to_run_spread(vs) for f, vs in by_figure.items()}
    fleet = {f: statistics.median([v[-1] for v in vs if v]) for f, vs in by_figure.items()}
    out = []
    for (node, figure), values in series.items():
        spread = spreads.get(figure)
        if spread is None or figure not in worse:
            continue
        t = trend_of(node, figure, values, spread, worse[figure], policy, fleet.get(figure))
        if t:
            out.append(t)
    return sorted(out, key=lambda t: (-t.sigmas, t.node, t.figure))


def rates(keys_runs: Mapping[str, int], found: Iterable[Incident], failures: Mapping[str, int],
          node_hours: float, field: str) -> list[dict]:
    """Per check or cause: failing host-runs, judged host-runs, and the mean time between
    failures: the fleet's node-hours in the window over the incidents (streaks) of it."""
    count: dict[str, int] = defaultdict(int)
    for i in found:
        count[i.key] += 1
    out = []
    for key in sorted(set(keys_runs) | set(failures)):
        n = count.get(key, 0)
        out.append({field: key, "failures": int(failures.get(key, 0)), "incidents": n,
                    "runs": int(keys_runs.get(key, 0)),
                    "mtbf_h": round(node_hours / n, 1) if n else None})
    return sorted(out, key=lambda r: (-r["failures"], r[field]))
