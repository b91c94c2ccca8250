"""Bisection of a failing collective: which runs to launch, round after round, to find the node
(or the path between two nodes) that makes the fleet's all_reduce fail, hang or run slow.

Pure: the caller runs each round's groups (all at once: they share no node) and answers a
verdict per group; ``bisect`` decides the next round from the answers. The same code replays a
saved bundle (``preflight.judge.collective``), its answers looked up among the recorded runs, so
the offline verdict is the tree the live run walked.

The stages, after the fleet-wide run failed:

- **halves**: every failing group of more than ``LEAF`` nodes is split in two and both halves
  run at once; a failing half is split again. One bad node is cornered in a group of two or
  three nodes after ceil(log2(N)) - 1 rounds. (NVIDIA's cluster readiness engine bisects a
  failing collective the same way, in at most log2(N) extra runs.)
- **cross**: when both halves of a failing group pass, the fault needs nodes of both: a path
  between them (cable, switch port, a route), or a NIC that fails only with some peers. Each
  side is halved and the quarters are paired across the boundary (A1+B1 with A2+B2, then A1+B2
  with A2+B1); a failing pairing is crossed again until one node is left on each side: the
  path between those two. When every pairing passes the fault shows only at the whole group's
  size; its nodes stay unresolved.
- **confirm**: the nodes of each failing leaf group are re-paired, in 2-node runs, with nodes
  that passed (Google's cluster-health-scanner pairs nodes and re-pairs the failed ones with
  nodes that passed): a node that fails with a trusted partner is the culprit; a leaf whose
  nodes all pass with others failed on the path between them.

The planner assumes a fault is monotone (a group holding a bad node or both ends of a bad path
fails; a group without one passes). A flaky fault breaks that; a stage answered "unknown" (the
run never started) stops its branch and leaves its nodes unresolved rather than guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Verdict = Literal["pass", "fail", "unknown"]
LEAF = 3  # groups this small are not split: their nodes are re-paired with good ones
BISECT_PREFIX = "nccl-bisect-"
PAIR_PREFIX = "nccl-pair-"


def pair_probe(suspect: str, partner: str) -> str:
    return f"{PAIR_PREFIX}{suspect}-{partner}"


@dataclass(frozen=True)
class GroupRun:
    """One collective over ``members`` (in inventory order), in ``round`` (1 = the fleet run)."""

    probe: str
    members: tuple[str, ...]
    stage: str  # "fleet" | "halves" | "cross" | "confirm"
    round: int


RunRound = Callable[[Sequence[GroupRun]], Mapping[str, Verdict]]  # probe -> verdict


@dataclass(frozen=True)
class Bisection:
    """What the walk found and what it cost."""

    culprits: tuple[str, ...]  # nodes that fail with trusted partners
    paths: tuple[tuple[str, str], ...]  # node pairs that fail together, each passing with others
    unresolved: tuple[str, ...]  # in a failing group, neither blamed nor cleared
    cleared: tuple[str, ...]  # took part in a passing run
    steps: tuple[tuple[GroupRun, Verdict], ...]  # every run launched, in order, with its verdict
    notes: tuple[str, ...]

    @property
    def rounds(self) -> int:
        return max((run.round for run, _ in self.steps), default=0)

    @property
    def runs(self) -> int:
        return len(self.steps)

    @property
    def node_runs(self) -> int:
        """Node-runs: each run counts its nodes; times a run's minutes, the node-minutes spent."""
        return sum(len(run.members) for run, _ in self.steps)

    @property
    def healthy(self) -> bool:
        return not (self.culprits or self.paths or self.unresolved)


def split(group: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Two halves, the first the larger by at most one node."""
    middle = (len(group) + 1) // 2
    return tuple(group[:middle]), tuple(group[middle:])


@dataclass
class _Walk:
    order: dict[str, int]
    run_round: RunRound
    steps: list[tuple[GroupRun, Verdict]] = field(default_factory=list)
    cleared: set[str] = field(default_factory=set)
    unresolved: set[str] = field(default_factory=set)
    at_scale: set[str] = field(default_factory=set)  # fail together, pass in every smaller group
    notes: list[str] = field(default_factory=list)
    round: int = 0

    def group(self, members: Collection[str]) -> tuple[str, ...]:
        return tuple(sorted(members, key=self.order.__getitem__))

    def run(self, planned: Sequence[tuple[str, tuple[str, ...]]]) -> list[Verdict]:
        """One round: ``(stage, members)`` groups, disjoint, run at once."""
        self.round += 1
        runs = [GroupRun(pair_probe(*members) if stage == "confirm" else f"{BISECT_PREFIX}{self.round}-{i}",
                         members, stage, self.round) for i, (stage, members) in enumerate(planned, 1)]
        answers = self.run_round(runs)
        verdicts: list[Verdict] = [answers.get(run.probe, "unknown") for run in runs]
        for run, verdict in zip(runs, verdicts, strict=True):
            self.steps.append((run, verdict))
            if verdict == "pass":
                self.cleared.update(run.members)
            elif verdict == "unknown":
                self.unresolved.update(run.members)
                self.notes.append(f"{run.probe} ({len(run.members)} nodes) gave no verdict: its nodes stay unresolved")
        return verdicts


def bisect(hosts: Sequence[str], run_round: RunRound, fleet: Verdict | None = None, split_once: bool = False,
           leaf: int = LEAF) -> Bisection:
    """Walk the tree for ``hosts`` (inventory order, no duplicates).

    ``fleet``: the fleet-wide run's verdict when it has already run (it then costs no round
    here but still counts as round 1); None runs it. ``split_once``: a passing fleet run is
    still halved once, for an expectation that can only be relative (halves compared with each
    other: a slow half shows against its twin, not alone)."""
    if len(set(hosts)) != len(hosts):
        raise ValueError("hosts named twice: " + ", ".join(sorted({h for h in hosts if list(hosts).count(h) > 1})))
    walk = _Walk({h: i for i, h in enumerate(hosts)}, run_round)
    everyone = tuple(hosts)
    if fleet is None:
        fleet = walk.run([("fleet", everyone)])[0]
    else:
        walk.round = 1
        walk.steps.append((GroupRun("nccl-multinode", everyone, "fleet", 1), fleet))
        if fleet == "pass":
            walk.cleared.update(everyone)
    if len(everyone) < 2 or fleet == "unknown" or (fleet == "pass" and not split_once):
        if fleet == "unknown":
            walk.unresolved.update(everyone)
        return _result(walk, (), ())
    if fleet == "pass":
        # A relative expectation: the halves are judged against each other, the fleet run alone cannot be.
        walk.cleared.clear()
    leaves, crosses = _halves(walk, [(everyone, fleet == "fail")] if len(everyone) > leaf else [], leaf)
    if len(everyone) <= leaf and fleet == "fail":
        leaves.append(everyone)
    paths = _cross(walk, crosses)
    culprits, leaf_paths = _confirm(walk, leaves)
    return _result(walk, culprits, paths + leaf_paths)


def _halves(walk: _Walk, failing: list[tuple[tuple[str, ...], bool]], leaf: int):
    """Split groups until they are leaves; returns (failing leaves, (A, B) cross pairs). A group
    comes with whether it failed itself: a fleet run that passed is halved once only to judge
    the halves against each other, and two passing halves of it are no cross-boundary fault."""
    leaves: list[tuple[str, ...]] = []
    crosses: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    while failing:
        planned = [("halves", half) for group, _ in failing for half in split(group)]
        verdicts = walk.run(planned)
        parents = [whole_failed for _, whole_failed in failing]
        failing = []
        for i in range(0, len(planned), 2):
            (_, a), (_, b) = planned[i], planned[i + 1]
            va, vb = verdicts[i], verdicts[i + 1]
            if va == vb == "pass" and parents[i // 2]:
                crosses.append((a, b))
            for half, v in ((a, va), (b, vb)):
                if v == "fail":
                    if len(half) > leaf:
                        failing.append((half, True))
                    else:
                        leaves.append(half)
    return leaves, crosses


def _cross(walk: _Walk, pending: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> list[tuple[str, str]]:
    """Pairings across boundaries whose sides pass alone; returns the paths found."""
    paths: list[tuple[str, str]] = []
    # A task: (A, B, step); step 0 pairs A1+B1 and A2+B2, step 1 A1+B2 and A2+B1.
    tasks = [(a, b, 0) for a, b in pending]
    while tasks:
        planned: list[tuple[str, tuple[str, ...]]] = []
        owners: list[tuple[int, tuple[str, ...], tuple[str, ...]]] = []
        for t, (a, b, step) in enumerate(tasks):
            for sa, sb in _pairings(a, b, step):
                planned.append(("cross", walk.group(sa + sb)))
                owners.append((t, sa, sb))
        verdicts = walk.run(planned)
        nxt: list[tuple[tuple[str, ...], tuple[str, ...], int]] = []
        for t, (a, b, step) in enumerate(tasks):
            mine = [(sa, sb, v) for (o, sa, sb), v in zip(owners, verdicts, strict=True) if o == t]
            failed = [(sa, sb) for sa, sb, v in mine if v == "fail"]
            for sa, sb in failed:
                if len(sa) == 1 and len(sb) == 1:
                    paths.append(tuple(walk.group(sa + sb)))  # type: ignore[arg-type]
                else:
                    nxt.append((sa, sb, 0))
            if failed or any(v == "unknown" for *_, v in mine):
                continue
            if step == 0 and _pairings(a, b, 1):
                nxt.append((a, b, 1))
            else:
                walk.at_scale.update(a + b)
                walk.notes.append(f"{len(a + b)} nodes fail together while every smaller pairing of them passes: "
                                  "a fault that shows only at that size")
        tasks = nxt
    return paths


def _pairings(a: tuple[str, ...], b: tuple[str, ...], step: int) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    a1, a2 = split(a)
    b1, b2 = split(b)
    if len(a) > 1 and len(b) > 1:
        return [(a1, b1), (a2, b2)] if step == 0 else [(a1, b2), (a2, b1)]
    if len(a) == 1 and len(b) == 1:
        return [(a, b)] if step == 0 else []
    # One side is a single node: it meets the other side's halves one after the other.
    one, (h1, h2) = (a, (b1, b2)) if len(a) == 1 else (b, (a1, a2))
    return [(one, (h1, h2)[step])] if len(a) == 1 else [((h1, h2)[step], one)]


def _confirm(walk: _Walk, leaves: list[tuple[str, ...]]) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
    """Re-pair the nodes of failing leaves with nodes that passed; returns (culprits, paths)."""
    if not leaves:
        return (), []
    suspected = [h for leaf in leaves for h in leaf]
    order = sorted(walk.order, key=walk.order.__getitem__)
    outcomes: dict[tuple[str, str], bool] = {}
    for attempt in range(2):
        good = [h for h in order if h in walk.cleared and h not in suspected] if attempt == 0 else \
            [h for h in order if h in walk.cleared]
        rest = [h for h in suspected if attempt == 0 or h not in walk.cleared]
        pairs = plan_pairs(order, rest, good, outcomes).pairs
        if attempt and not good:
            # Still nobody known good: every untried pair among the suspects (a leaf holds at
            # most three nodes, so this is only ever a handful of runs).
            tried = {frozenset(p) for p in outcomes}
            pairs = tuple((a, b) for i, a in enumerate(rest) for b in rest[i + 1:] if frozenset((a, b)) not in tried)
        if attempt and not pairs:
            break
        for batch in disjoint_batches(pairs):
            for pair, verdict in zip(batch, walk.run([("confirm", pair) for pair in batch]), strict=True):
                if verdict != "unknown":
                    outcomes[pair] = verdict == "pass"
        found = attribute(outcomes, suspected)
        if found.culprits or not found.unresolved:
            break
    found = attribute(outcomes, suspected)
    paths: list[tuple[str, str]] = []
    for leaf in leaves:
        if any(h in found.culprits for h in leaf) or not all(h in found.cleared for h in leaf):
            continue
        # Every node of the failing leaf passes with others: the fault is between them.
        if len(leaf) == 2:
            paths.append((leaf[0], leaf[1]))
            continue
        inner = [(leaf[i], leaf[j]) for i in range(len(leaf)) for j in range(i + 1, len(leaf))]
        for pair in inner:
            if walk.run([("confirm", pair)])[0] == "fail":
                paths.append(pair)
        if not any(set(p) <= set(leaf) for p in paths):
            walk.unresolved.update(leaf)
    walk.unresolved.update(found.unresolved)
    return found.culprits, paths


def _result(walk: _Walk, culprits: Sequence[str], paths: Sequence[tuple[str, str]]) -> Bisection:
    order = walk.order.__getitem__
    blamed = set(culprits) | {h for p in paths for h in p}
    # Nodes of a fault that shows only at size passed smaller runs, yet are not cleared.
    unresolved = sorted((walk.unresolved - walk.cleared - blamed) | walk.at_scale, key=order)
    cleared = sorted(walk.cleared - set(culprits) - walk.at_scale, key=order)
    return Bisection(tuple(sorted(culprits, key=order)), tuple(dict.fromkeys(paths)), tuple(unresolved),
                     tuple(cleared), tuple(walk.steps), tuple(dict.fromkeys(walk.notes)))


# --------------------------------------------------------------------------- the confirm stage's pairs


@dataclass(frozen=True)
class PairPlan:
    pairs: tuple[tuple[str, str], ...]  # (suspect, partner)
    blind: bool  # nobody was known good: hosts were paired among themselves
    untested: tuple[str, ...]  # suspects left without a partner
    notes: tuple[str, ...]


def plan_pairs(hosts: Sequence[str], suspected: Collection[str], good: Collection[str] = (),
               done: Collection[tuple[str, str]] = ()) -> PairPlan:
    """2-node runs that make only a bad node fail.

    Each suspect gets a partner from ``good`` (proven or presumed good), spread round-robin
    so no partner carries many suspects, skipping pairs already ``done``. Without any good
    host the suspects are paired among themselves (blind)."""
    suspected, good = set(suspected), set(good)  # membership tests over the whole fleet
    ordered = [h for h in hosts if h in suspected]
    partners = [h for h in hosts if h in good and h not in suspected]
    tried = {frozenset(p) for p in done}
    if not partners:
        pairs = [(ordered[i], ordered[i + 1]) for i in range(0, len(ordered) - 1, 2)]
        if len(ordered) % 2 and len(ordered) > 1:
            pairs.append((ordered[-1], ordered[0]))  # the odd one out joins the first again
        pairs = [p for p in pairs if frozenset(p) not in tried]
        lone = (ordered[0],) if len(ordered) == 1 else ()
        return PairPlan(tuple(pairs), True, lone,
                        ("nobody known good: suspects paired among themselves",) if pairs else ())
    pairs, untested = [], []
    for i, suspect in enumerate(ordered):
        for k in range(len(partners)):
            partner = partners[(i + k) % len(partners)]
            if frozenset((suspect, partner)) not in tried:
                pairs.append((suspect, partner))
                break
        else:
            untested.append(suspect)
    return PairPlan(tuple(pairs), False, tuple(untested), ())


@dataclass(frozen=True)
class Attribution:
    culprits: tuple[str, ...]  # failed every pair, at least one with a trusted partner
    cleared: tuple[str, ...]  # passed at least one pair
    unresolved: tuple[str, ...]  # failed, but only with partners as suspect as themselves
    failed_with: dict[str, tuple[str, ...]]  # host -> partners of its failed pairs


def attribute(outcomes: Mapping[tuple[str, str], bool], suspected: Collection[str]) -> Attribution:
    """Who the pair runs blame. A host that passed any pair works; one whose pairs all failed
    is the culprit when a partner is trusted: it passed another pair, or nothing suspected it."""
    cleared = {h for pair, ok in outcomes.items() if ok for h in pair}
    failed_with: dict[str, list[str]] = {}
    for (a, b), ok in outcomes.items():
        if not ok:
            failed_with.setdefault(a, []).append(b)
            failed_with.setdefault(b, []).append(a)

    def trusted(partner: str) -> bool:
        return partner in cleared or partner not in suspected

    culprits = {h for h, partners in failed_with.items()
                if h not in cleared and any(trusted(p) for p in partners)}
    # A partner that only ever failed beside a culprit is not suspect on that account.
    unresolved = {h for h, partners in failed_with.items()
                  if h not in cleared and h not in culprits and set(partners) - culprits}
    order = list(dict.fromkeys(h for pair in outcomes for h in pair))
    return Attribution(tuple(h for h in order if h in culprits),
                       tuple(h for h in order if h in cleared),
                       tuple(h for h in order if h in unresolved),
                       {h: tuple(p) for h, p in failed_with.items()})


def disjoint_batches(pairs: Sequence[tuple[str, ...]]) -> list[list[tuple[str, ...]]]:
    """Groups into rounds that share no node (first fit, order kept)."""
    batches: list[list[tuple[str, ...]]] = []
    for pair in pairs:
        for batch in batches:
            if not any(set(pair) & set(other) for other in batch):
                batch.append(pair)
                break
        else:
            batches.append([pair])
    return batches
