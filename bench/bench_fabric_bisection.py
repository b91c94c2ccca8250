"""The collective's bisection planner at fleet sizes: rounds, runs and node-minutes to find one
bad node and two, against the log2(N) + 2 bound, and the planner's own time.

    python3 bench/bench_fabric_bisection.py [--minutes-per-run 2] [--sizes 64,1024,10000]

The fleet is simulated by a fault oracle (a group fails when it holds a bad node), not run: this
measures the plan, not a fabric. Each case places the bad node(s) at several positions and prints
the worst; node-minutes are node-runs x ``--minutes-per-run`` (an all_reduce of a few GiB with its
start-up, about two minutes at fleet scale: an assumption, printed with the figures). The planner's
time is the walk's own, the oracle's answers included (they are set lookups).
"""

from __future__ import annotations

import argparse
import math
import time

from preflight.fabric.bisection import bisect


def oracle(bad: set[str]):
    def run_round(runs):
        return {r.probe: "fail" if bad & set(r.members) else "pass" for r in runs}
    return run_round


def case(n: int, bad_at: list[tuple[int, ...]], minutes: float) -> dict:
    hosts = [f"node{i:05d}" for i in range(n)]
    worst = {"rounds": 0, "runs": 0, "node_runs": 0, "seconds": 0.0}
    for positions in bad_at:
        bad = {hosts[p] for p in positions}
        start = time.perf_counter()
        found = bisect(hosts, oracle(bad))
        took = time.perf_counter() - start
        assert set(found.culprits) == bad and not found.unresolved, (n, positions, found.culprits)
        for key, value in (("rounds", found.rounds), ("runs", found.runs), ("node_runs", found.node_runs),
                           ("seconds", took)):
            worst[key] = max(worst[key], value)
    worst["node_minutes"] = worst["node_runs"] * minutes
    return worst


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes-per-run", type=float, default=2.0)
    parser.add_argument("--sizes", default="64,1024,10000")
    args = parser.parse_args()
    print(f"minutes per run (assumed): {args.minutes_per_run:g}")
    print("| nodes | bad | log2(N)+2 | rounds (worst) | runs | node-runs | node-minutes | planner time |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in (int(s) for s in args.sizes.split(",")):
        one = [(0,), (n // 3,), (n // 2,), (n - 1,)]
        two = [(0, 1), (0, n - 1), (n // 4, 3 * n // 4), (n // 2, n // 2 + 1)]
        for label, positions in (("1", one), ("2", two)):
            w = case(n, positions, args.minutes_per_run)
            print(f"| {n:,} | {label} | {math.log2(n) + 2:.1f} | {w['rounds']} | {w['runs']} | {w['node_runs']:,} | "
                  f"{w['node_minutes']:,.0f} | {w['seconds'] * 1000:.1f} ms |")


if __name__ == "__main__":
    main()
