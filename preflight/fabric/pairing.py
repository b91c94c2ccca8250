"""The rail stage's rounds: every rail of every node against the same rail of a partner.

Rounds come from the circle method of a round-robin tournament: one node stays put, the others
turn one place per round, and in each round position i meets position m-1-i. Every round is a
set of disjoint pairs (they all run at once), and over r rounds a node meets r different
partners. Three rounds are enough for the judgement: a node slow with two or three different
partners is the culprit, a pair slow only together is the path between them. With an odd count
a placeholder joins, so each round one node sits out, never the same one twice in three rounds:
every node still gets at least two partners (from three nodes up). Two nodes have one partner
each, and the plan says so.

All rails of a pair run in the same round (rail i against the partner's rail i), so the round
count does not grow with the rails or with N: at most ``MAX_ROUNDS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_ROUNDS = 3


@dataclass(frozen=True)
class Rail:
    """One rail of a node: an RDMA port (``device`` mlx5_0, ``port`` 1) or, for a TCP test
    bed, an IP interface (``device`` eth1, ``port`` None). ``address`` is where a partner
    reaches it (an IPv4 address; for perftest the node's own name serves). ``rate_gbps`` is
    the port's line rate when the node's evidence gives one."""

    device: str
    port: int | None = None
    address: str | None = None
    rate_gbps: float | None = None
    link_layer: str | None = None  # "InfiniBand" | "Ethernet" | None (an IP interface)

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}" if self.port is not None else self.device


@dataclass(frozen=True)
class RailRound:
    number: int  # 1-based
    pairs: tuple[tuple[str, str], ...]  # (client, server): the first runs the client side
    idle: tuple[str, ...]  # nodes without a partner this round (odd count)


@dataclass(frozen=True)
class RailPlan:
    rounds: tuple[RailRound, ...]
    notes: tuple[str, ...]

    def partners(self, node: str) -> tuple[str, ...]:
        out = []
        for rnd in self.rounds:
            for a, b in rnd.pairs:
                if node in (a, b):
                    out.append(b if a == node else a)
        return tuple(out)

    @property
    def runs(self) -> int:
        """Pair tests over all rounds (each tests every rail of both nodes)."""
        return sum(len(r.pairs) for r in self.rounds)


def plan_rail_rounds(nodes: Sequence[str], rounds: int = MAX_ROUNDS) -> RailPlan:
    """Disjoint pairs for ``rounds`` rounds (at most the distinct partners there are), in the
    nodes' order; the same nodes always give the same plan. Names must be unique."""
    if len(set(nodes)) != len(nodes):
        dup = sorted({n for n in nodes if list(nodes).count(n) > 1})
        raise ValueError(f"a node is named twice: {', '.join(dup)}")
    if len(nodes) < 2:
        return RailPlan((), (f"{len(nodes)} node(s): a pairwise test needs two",))
    slots: list[str | None] = list(nodes) + ([None] if len(nodes) % 2 else [])
    m = len(slots)
    count = max(1, min(rounds, m - 1))
    fixed, rest = slots[0], slots[1:]
    out = []
    for r in range(count):
        turned = rest[-r:] + rest[:-r] if r else list(rest)
        order = [fixed, *turned]
        pairs, idle = [], []
        for i in range(m // 2):
            a, b = order[i], order[m - 1 - i]
            if a is None or b is None:
                idle.append(b if a is None else a)
            else:
                pairs.append((a, b))
        out.append(RailRound(r + 1, tuple(pairs), tuple(n for n in idle if n is not None)))
    notes = ()
    if len(nodes) == 2:
        notes = ("two nodes: each has one partner, so a slow pair cannot be told from a slow node or path",)
    return RailPlan(tuple(out), notes)


def paired_rails(mine: Sequence[Rail], theirs: Sequence[Rail]) -> list[tuple[int, Rail, Rail]]:
    """Rail i against the partner's rail i (both lists in the nodes' own order, mlx5_0 first);
    rails beyond the shorter list have no counterpart and are left out (``rail_counts`` names
    the nodes whose count differs)."""
    return [(i, a, b) for i, (a, b) in enumerate(zip(mine, theirs, strict=False))]


def rail_counts(rails: Mapping[str, Sequence[Rail]]) -> tuple[int | None, dict[str, int]]:
    """The fleet's usual rail count (the most common; the larger on a tie) and the nodes whose
    count differs from it, with theirs."""
    counts: dict[int, int] = {}
    for rs in rails.values():
        counts[len(rs)] = counts.get(len(rs), 0) + 1
    if not counts:
        return None, {}
    usual = max(counts, key=lambda c: (counts[c], c))
    return usual, {n: len(rs) for n, rs in rails.items() if len(rs) != usual}
