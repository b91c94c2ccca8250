"""Judging the collective's runs: each run's verdict for the bisection (pass, fail, unknown),
the "slow" expectation, and the offline replay of the bisection from a saved bundle.

Slow is judged against, in this order:
- an explicit floor (``--collective-expect-busbw GBS``: a run below ``slow_ratio`` of it fails);
- otherwise, relatively: against the median bus bandwidth of this round's runs and the earlier
  passing runs with at least as many nodes (minus one, for the odd half), since a smaller group
  of healthy nodes is not slower than a larger one. A run below ``slow_ratio`` of that median
  fails. The fleet run alone has nothing to be compared with, so the bisection then halves it
  once (``bisect(split_once=True)``): the slow half shows against its twin.
The nccl engine keeps the profile's per-NIC figure for the fleet runs in the check
(checks/nccl_multinode.py); its bisection judges completion, results and this expectation.

The replay walks ``preflight.fabric.bisection.bisect`` again with the recorded runs as its
answers (looked up by their members), judged by the same rules in the same order: the verdict of
``analyze`` on a bundle is the one the live run reached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median

from preflight.fabric.bisection import BISECT_PREFIX, PAIR_PREFIX, Bisection, GroupRun, Verdict, bisect
from preflight.parse.collective_run import MultinodeRun, inventory_names, peer_hosts

SLOW_RATIO = 0.5


@dataclass(frozen=True)
class Expectation:
    floor_gbs: float | None = None  # explicit: runs below slow_ratio x this fail
    slow_ratio: float = SLOW_RATIO
    relative: bool = True  # without a floor: compare runs with each other

    @classmethod
    def of(cls, expect_gbs: float | None, slow_ratio: float = SLOW_RATIO, relative: bool = True) -> Expectation:
        return cls(expect_gbs, slow_ratio, relative and expect_gbs is None)


@dataclass
class RoundJudge:
    """Verdicts round after round; remembers the runs that passed, for the relative reference."""

    expectation: Expectation
    passed: list[tuple[int, float]] = field(default_factory=list)  # (members, busbw) of judged passing runs
    why: dict[str, str] = field(default_factory=dict)  # probe -> why it failed or gave no verdict

    def __call__(self, runs: Sequence[MultinodeRun]) -> dict[str, Verdict]:
        verdicts: dict[str, Verdict] = {}
        for run in runs:
            if run.state == "not-run":  # the controller could not reach the launcher: nothing to learn
                verdicts[run.probe] = "unknown"
                self.why[run.probe] = run.why
            elif run.state == "never-ran":
                # A node the launcher cannot start the test on fails every group it is in, so the
                # bisection corners it like a bad node; the check then names it as unreachable.
                verdicts[run.probe] = "fail"
                self.why[run.probe] = f"never ran: {run.why}"
            elif not run.ok:
                verdicts[run.probe] = "fail"
                self.why[run.probe] = run.why or f"{run.wrong} wrong values"
            else:
                verdicts[run.probe] = "pass"
        measured = [(len(r.hosts), r.busbw_gbs) for r in runs
                    if verdicts[r.probe] == "pass" and r.busbw_gbs is not None]
        alone = len(runs) == 1 and not self.passed and self.expectation.relative
        for run in runs:
            if verdicts[run.probe] != "pass" or run.busbw_gbs is None:
                continue
            floor, against = self.floor(len(run.hosts), measured)
            if floor is not None and run.busbw_gbs < floor:
                verdicts[run.probe] = "fail"
                self.why[run.probe] = f"slow: busbw {run.busbw_gbs:.4g} GB/s, below {floor:.4g} ({against})"
        if not alone:
            # A lone first run has nothing to be compared with: it is no reference for later ones.
            self.passed += [(len(r.hosts), r.busbw_gbs) for r in runs
                            if verdicts[r.probe] == "pass" and r.busbw_gbs is not None]
        return verdicts

    def floor(self, members: int, current: Sequence[tuple[int, float]] = ()) -> tuple[float | None, str]:
        e = self.expectation
        if e.floor_gbs is not None:
            return e.slow_ratio * e.floor_gbs, f"{e.slow_ratio:.0%} of the expected {e.floor_gbs:g} GB/s"
        if not e.relative:
            return None, ""
        # The median, not the best: on shared CPUs a healthy run can be many times faster than
        # another (measured on the namespace test bed: 1.8 ms and 48 ms for the same 1 MiB pair).
        peers = sorted(bw for n, bw in [*self.passed, *current] if n >= members - 1)
        if len(peers) < 2:
            return None, ""
        middle = median(peers)
        return (e.slow_ratio * middle,
                f"{e.slow_ratio:.0%} of {middle:.4g} GB/s, the median of this round's and earlier passing runs")


def is_bisection_probe(probe: str) -> bool:
    return probe.startswith((BISECT_PREFIX, PAIR_PREFIX))


def replay(hosts: Sequence[str], fleet: Verdict, runs: Sequence[MultinodeRun], judge: RoundJudge,
           split_once: bool) -> Bisection:
    """The bisection again, answered by the saved runs (by their members). A group the bundle
    does not hold answers "unknown": its nodes stay unresolved rather than guessed."""
    by_members = {frozenset(r.hosts): r for r in runs}

    def run_round(groups: Sequence[GroupRun]) -> Mapping[str, Verdict]:
        found = {g.probe: by_members.get(frozenset(g.members)) for g in groups}
        verdicts = judge([r for r in found.values() if r is not None])
        return {probe: verdicts.get(r.probe, "unknown") if r is not None else "unknown" for probe, r in found.items()}

    return bisect(hosts, run_round, fleet=fleet, split_once=split_once)


def hang_named(run: MultinodeRun, hosts: Sequence[str], known: Mapping[str, str] = {}) -> tuple[str, ...]:
    """The hosts a failing or hung run's own output points at: NCCL's WARN lines (the host that
    printed them, and the peer whose address they name), the CPU engine's ranks that never
    finished when only some did."""
    named = list(inventory_names(run.named, hosts)) if run.mpi is None else []
    named += peer_hosts(run, hosts, known)
    if run.mpi is not None and run.mpi.stopped and len(run.mpi.stopped) < len(run.mpi.ready):
        named += inventory_names(run.mpi.stopped.values(), hosts)
    return tuple(h for h in hosts if h in set(named))
