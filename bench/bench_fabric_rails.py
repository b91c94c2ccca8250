"""The rail stage's cost: the planner at fleet sizes, and a real sweep on the namespace test bed.

    python3 bench/bench_fabric_rails.py [--sizes 64,1024,10000] [--rails 8] [--reps 3] [--seconds 5]
    sudo python3 bench/bench_fabric_rails.py --sweep 16      # also: a real 16-node iperf3 sweep

For each size: the planner's own time (best of 5), its rounds, the pair tests (one per pair and
round, every rail of the pair at once), the rail tests (pair tests x rails, each run --reps
times), and the node-minutes the stage holds: every node for every round, each round lasting
reps x (seconds + SETUP_S) plus one latency test, SETUP_S an assumed per-test start and teardown
(RDMA could not run here; --sweep prints what a whole stage takes on the test bed).

--sweep N builds N simulated hosts (tests/simcluster.py: real sshd in network namespaces) and runs
`preflight fabric --pair-tool iperf3 --seconds 1 --reps 3 --bitrate 200M` over them, printing its
wall time and verdict: the stage's real cost on this machine, transport and judgement included.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from preflight.fabric.pairing import plan_rail_rounds  # noqa: E402

SETUP_S = 1.5  # per test, assumed: the server's head start (0.2 s), connection, teardown, with a margin for RDMA set-up
LATENCY_S = 1.0  # one ib_write_lat per rail and round


def plan_row(n: int, rails: int, reps: int, seconds: float) -> dict:
    names = [f"gpu{i:05d}" for i in range(n)]
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        plan = plan_rail_rounds(names)
        best = min(best, time.perf_counter() - t0)
    round_s = reps * (seconds + SETUP_S) + LATENCY_S
    partners = min(len(set(plan.partners(x))) for x in names)
    return {"nodes": n, "planner_ms": round(best * 1000, 2), "rounds": len(plan.rounds), "pair_tests": plan.runs,
            "rail_tests": plan.runs * rails * reps, "min_partners": partners,
            "stage_minutes": round(len(plan.rounds) * round_s / 60, 2),
            "node_minutes": round(n * len(plan.rounds) * round_s / 60, 1)}


def sweep(n: int) -> dict:
    from simcluster import SimCluster, SimHost

    from preflight.app.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        with SimCluster([SimHost(f"s{i:02d}") for i in range(1, n + 1)], Path(tmp)) as c:
            t0 = time.monotonic()
            code = main(["fabric", "--hosts", str(c.hosts_file), "--ssh-config", str(c.ssh_config),
                         "--known-hosts", str(c.known_hosts), "--identity", str(c.identity), "--out", tmp,
                         "--run-id", "sweep", "-q", "--no-db", "--pair-tool", "iperf3", "--seconds", "1",
                         "--reps", "3", "--bitrate", "200M"])
            wall = time.monotonic() - t0
            report = json.loads((Path(tmp) / "sweep" / "report.json").read_text())
    fleet = next(f for f in report["findings"] if f["check"] == "fabric-rails" and f["host"] is None)
    return {"nodes": n, "wall_s": round(wall, 1), "exit": code, "status": fleet["status"],
            "pair_tests": fleet["data"]["pair_tests"], "rounds": fleet["data"]["rounds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,1024,10000")
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--sweep", type=int, metavar="N", help="also run a real N-node iperf3 sweep (root)")
    args = ap.parse_args()
    print(f"# {platform.node()} {platform.python_version()} {time.strftime('%Y-%m-%d %H:%M %Z')}; "
          f"{args.rails} rails, {args.reps} reps of {args.seconds:g} s, {SETUP_S:g} s set-up per test")
    print("| nodes | planner ms | rounds | pair tests | rail tests | min partners | stage minutes | node-minutes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in (int(x) for x in args.sizes.split(",")):
        r = plan_row(n, args.rails, args.reps, args.seconds)
        print(f"| {r['nodes']} | {r['planner_ms']} | {r['rounds']} | {r['pair_tests']} | {r['rail_tests']} | "
              f"{r['min_partners']} | {r['stage_minutes']} | {r['node_minutes']} |")
    if args.sweep:
        print(json.dumps(sweep(args.sweep)))


if __name__ == "__main__":
    main()
