"""Who the rail stage blames: the node, the path between two nodes, or nobody. Pure.

Input: every repetition of every rail of every pair (``preflight.fabric.record.RailRun``).
Per rail index (rail i of every node: mlx5_0 everywhere, say):

1. A repetition is **bad** when it did not measure, or measured below its reference: the
   higher of ``REL_SLOW`` x the fleet's median for that rail (over the nodes, of each node's
   best pair: ``fleet_figure``), and ``LINE_FLOOR`` x the rail's line rate when the node's evidence gives one (the
   port's active rate from ibv_devinfo). A TCP interface (the veth of a test bed) has no line
   rate: only the fleet median applies, and the cell says so.
2. A pair's rail is ``ok`` (no bad repetition), ``slow`` (every one bad), ``flaky`` (some bad,
   some not) or ``unreachable`` (no repetition measured: a side never answered, or the tool
   failed: missing, refused; its reason is kept).
3. A node whose rail is not ``ok`` with every partner it met (two at least), while one of those
   partners is ``ok`` with somebody else, is the **culprit**: ``fabric-rail-slow``, or
   ``fabric-rail-flaky`` when any of its bad pairs was only sometimes bad, or
   ``fabric-rail-unreachable`` when none of them ran (also when it stopped answering part-way:
   two or more partners that work elsewhere could not reach it). A pair not ``ok`` whose nodes are both
   cleared elsewhere points at the **path** between them (cable, switch port):
   ``fabric-path-slow``. A bad pair beside a culprit says nothing more about the other node.
   With one partner only (two nodes) a bad pair cannot be told from a bad node: both WARN.

Why these figures: ib_write_bw reaches 96-98 % of the line rate on healthy links (392.34 Gb/s on
NDR 400, 196.07 on a 200 Gb/s RoCE port: tests/fixtures/perftest; 96.6 on EDR 100 in NVIDIA's
forum), so 85 % of the line rate (``LINE_FLOOR``, the 15 % margin the nccl checks hold) is a
link that lost a lane or a speed grade, not noise. Against the fleet, 75 % (``REL_SLOW``):
repetitions of perftest on one healthy link agree within a few percent, so a quarter below the
fleet's own median is a fault even where no rate is known.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

from preflight.fabric.record import RailRun
from preflight.knowledge.link_rates import generation

REL_SLOW = 0.75
LINE_FLOOR = 0.85
MIN_MEDIAN_NODES = 3  # fewer nodes measured on a rail: no fleet median to judge against

SLOW, FLAKY, PATH, UNREACHABLE, MISSING = ("fabric-rail-slow", "fabric-rail-flaky", "fabric-path-slow",
                                            "fabric-rail-unreachable", "fabric-rail-missing")


@dataclass(frozen=True)
class PairRail:
    """One pair's rail over its repetitions."""

    node: str
    partner: str
    rail: int
    node_rail: str  # "mlx5_0:1" / "eth0"
    partner_rail: str
    state: str  # ok | slow | flaky | unreachable
    gbps: float | None  # median of the measured repetitions
    reps: tuple[float | None, ...]
    reference: float | None
    why: str | None = None  # the first failed repetition's reason
    latency_us: float | None = None  # ib_write_lat's t_avg for this rail and pair (reported, not judged)

    def involves(self, node: str) -> bool:
        return node in (self.node, self.partner)

    def other(self, node: str) -> str:
        return self.partner if node == self.node else self.node

    def rail_of(self, node: str) -> str:
        return self.node_rail if node == self.node else self.partner_rail


@dataclass(frozen=True)
class Blame:
    """One verdict on one node's rail: ``cause`` is a cause id; ``partners`` those it was bad with."""

    node: str
    rail: int
    rail_name: str
    cause: str
    partners: tuple[str, ...]
    severity: str  # "fail" | "warn"
    detail: str


@dataclass(frozen=True)
class RailJudgement:
    pairs: tuple[PairRail, ...]
    blames: tuple[Blame, ...]
    medians: dict[int, float | None]
    references: dict[int, str] = field(default_factory=dict)  # rail index -> what it was judged against
    notes: tuple[str, ...] = ()

    def cell(self, node: str, rail: int) -> tuple[str, float | None]:
        """The node x rail matrix's cell: its state (its own blame's, else ok / path / untested)
        and its median over the pairs it was in."""
        mine = [b for b in self.blames if b.node == node and b.rail == rail]
        values = [p.gbps for p in self.pairs if p.involves(node) and p.rail == rail and p.gbps is not None]
        figure = median(values) if values else None
        if mine:
            return {SLOW: "slow", FLAKY: "flaky", UNREACHABLE: "unreachable", PATH: "path"}.get(
                mine[0].cause, "suspect"), figure
        tested = [p for p in self.pairs if p.involves(node) and p.rail == rail]
        return ("ok" if tested else "untested"), figure


def judge_rails(runs: Iterable[RailRun], line_floor: float = LINE_FLOOR, rel_slow: float = REL_SLOW
                ) -> RailJudgement:
    runs = list(runs)
    notes: list[str] = []
    grouped: dict[tuple[str, str, int], list[RailRun]] = {}
    for r in runs:
        grouped.setdefault((r.node, r.partner, r.rail), []).append(r)
    medians: dict[int, float | None] = {}
    references: dict[int, str] = {}
    for rail in sorted({r.rail for r in runs}):
        medians[rail] = fleet_figure({k: g for k, g in grouped.items() if k[2] == rail})
        rates = {x for r in runs if r.rail == rail for x in (r.node_rail.rate_gbps, r.partner_rail.rate_gbps) if x}
        line = "line rate " + (", ".join(_rate(x) for x in sorted(rates)) or "unknown")
        fleet = f"fleet median {medians[rail]:.3g} Gb/s" if medians[rail] else "no fleet median (too few nodes)"
        references[rail] = f"{fleet}; {line}"
        if medians[rail] is None:
            notes.append(f"rail {rail}: fewer than {MIN_MEDIAN_NODES} nodes measured, no fleet median")
    pairs = tuple(_pair(group, medians[key[2]], line_floor, rel_slow) for key, group in grouped.items())
    blames = []
    for rail in sorted(medians):
        blames += _attribute([p for p in pairs if p.rail == rail])
    return RailJudgement(pairs, tuple(blames), medians, references, tuple(notes))


def _rate(gbps: float) -> str:
    name = generation(gbps)
    return f"{gbps:g} Gb/s" + (f" ({name})" if name else "")


def fleet_figure(groups: dict[tuple[str, str, int], list[RailRun]]) -> float | None:
    """The fleet's median for one rail: over nodes, of each node's best pair (the median of that
    pair's measured repetitions). A slow node's partners are at speed with their other partners,
    so their best pair is not the slow one: the reference stays the healthy rate while fewer
    than half the nodes are bad, where a median over every pair would sink with each bad
    node's two or three pairs."""
    best: dict[str, float] = {}
    for (a, b, _), group in groups.items():
        measured = [r.gbps for r in group if r.gbps is not None]
        if not measured:
            continue
        figure = median(measured)
        for n in (a, b):
            best[n] = max(best.get(n, figure), figure)
    return median(best.values()) if len(best) >= MIN_MEDIAN_NODES else None


def reference_of(run: RailRun, fleet_median: float | None, line_floor: float, rel_slow: float) -> float | None:
    """The figure a repetition must reach: the higher of the fleet's and the line rate's floors."""
    floors = []
    if fleet_median:
        floors.append(rel_slow * fleet_median)
    rates = [x for x in (run.node_rail.rate_gbps, run.partner_rail.rate_gbps) if x]
    if rates:
        floors.append(line_floor * min(rates))
    return max(floors) if floors else None


def _pair(group: Sequence[RailRun], fleet_median: float | None, line_floor: float, rel_slow: float) -> PairRail:
    group = sorted(group, key=lambda r: r.rep)
    first = group[0]
    reference = reference_of(first, fleet_median, line_floor, rel_slow)
    bad = [r.gbps is None or (reference is not None and r.gbps < reference) for r in group]
    measured = [r.gbps for r in group if r.gbps is not None]
    if not any(bad):
        state = "ok"
    elif all(r.gbps is None for r in group):
        # Nothing measured: the other side did not answer, or the tool failed (missing, refused):
        # the rail's test never ran, which is not a figure to call slow.
        state = "unreachable"
    elif all(bad):
        state = "slow"
    else:
        state = "flaky"
    why = next((r.why for r in group if r.why), None)
    latency = next((r.latency_us for r in group if r.latency_us is not None), None)
    return PairRail(first.node, first.partner, first.rail, first.node_rail.name, first.partner_rail.name, state,
                    median(measured) if measured else None, tuple(r.gbps for r in group), reference, why, latency)


def _attribute(pairs: Sequence[PairRail]) -> list[Blame]:
    nodes = list(dict.fromkeys(n for p in pairs for n in (p.node, p.partner)))
    ok_with: dict[str, set[str]] = {n: set() for n in nodes}
    for p in pairs:
        if p.state == "ok":
            ok_with[p.node].add(p.partner)
            ok_with[p.partner].add(p.node)
    everyone_bad = not any(ok_with.values())
    blames: list[Blame] = []
    culprits: set[str] = set()
    for n in nodes:
        mine = [p for p in pairs if p.involves(n)]
        bad = [p for p in mine if p.state != "ok"]
        gone = [p for p in bad if p.state == "unreachable" and ok_with[p.other(n)]]
        if len(gone) >= 2 and len(bad) < len(mine):
            # It answered earlier and then stopped (two partners that work elsewhere could not
            # reach it): unreachable, even though its first pairs measured.
            culprits.add(n)
            blames.append(Blame(n, gone[0].rail, gone[0].rail_of(n), UNREACHABLE, tuple(p.other(n) for p in gone),
                                "fail", "with two or more partners after answering earlier"))
            continue
        if not bad or len(bad) < len(mine):
            continue
        trusted = any(ok_with[p.other(n)] for p in bad)
        if len(mine) >= 2 and (trusted or everyone_bad):
            culprits.add(n)
            cause = (UNREACHABLE if all(p.state == "unreachable" for p in bad)
                     else FLAKY if any(p.state == "flaky" for p in bad) else SLOW)
            detail = "with every partner" + (" (so is every other pair on this rail: a fabric-wide cause)"
                                             if everyone_bad else "")
            blames.append(Blame(n, bad[0].rail, bad[0].rail_of(n), cause, tuple(p.other(n) for p in bad), "fail",
                                detail))
    for p in pairs:
        if p.state == "ok" or p.node in culprits or p.partner in culprits:
            continue
        lone = [n for n in (p.node, p.partner) if len([q for q in pairs if q.involves(n)]) < 2]
        if lone:
            detail = "its only partner: a slow node cannot be told from a slow path with one partner"
            for n in (p.node, p.partner):
                blames.append(Blame(n, p.rail, p.rail_of(n), SLOW if p.state != "flaky" else FLAKY, (p.other(n),),
                                    "warn", detail))
            continue
        detail = (f"only with this partner{' in some repetitions' if p.state == 'flaky' else ''}, both at speed "
                  "with their other partners: the path between them (cable, switch port)")
        for n in (p.node, p.partner):
            blames.append(Blame(n, p.rail, p.rail_of(n), PATH, (p.other(n),), "warn", detail))
    return blames
