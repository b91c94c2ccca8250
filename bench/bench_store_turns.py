"""Two checkouts of preflight in turns on the stores bench_store.py --keep built (issue 31):
`preflight history` as a user runs it, each command in a new process, before and after a change
alternately, so that both meet the same machine load.

    python3 bench/bench_store_turns.py --keep DIR --before TREE [--after TREE] [--rounds 3] [--no-fleet]
                                       [--engines sqlite,postgresql] [--store history]

TREE: a checkout (a git worktree of the commit to compare). Per engine and command, the median
wall seconds of the rounds, and every round's. Each tree's Python reads its own bytecode cache,
filled by an untimed first run, as an installed package's is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
URLS = {"sqlite": "sqlite:///{keep}/{name}.sqlite",
        "postgresql": "postgresql://postgres@/{name}?host={keep}/pg/sock"}
COMMANDS = {"text": ["gpu-busy01", "--since", "365d"], "json": ["gpu-busy01", "--since", "365d", "--json"],
            "fleet 365d": ["--fleet", "--since", "365d"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", type=Path, required=True, help="bench_store.py --keep's directory (its server running)")
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, default=ROOT)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-fleet", action="store_true")
    p.add_argument("--engines", default=",".join(URLS), help="which of sqlite,postgresql (default both)")
    p.add_argument("--store", default="history", help="the fleet store's name under --keep (default history)")
    args = p.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    caches = {t: tempfile.mkdtemp(prefix=f"bench-turns-{t}-") for t in trees}

    def run(tree: str, argv: list[str]) -> float:
        env = {**base, "PYTHONPYCACHEPREFIX": caches[tree], "PYTHONPATH": str(trees[tree])}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "preflight", "history", *argv], cwd=trees[tree], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t0

    for tree in trees:
        run(tree, ["--help"])
    commands = {k: v for k, v in COMMANDS.items() if not (args.no_fleet and k.startswith("fleet"))}
    times: dict[tuple[str, str, str], list[float]] = {}
    for r in range(args.rounds):
        for engine, url in ((e, URLS[e]) for e in args.engines.split(",")):
            for tree in trees:
                for name, argv in commands.items():
                    store = args.store if name.startswith("fleet") else "node100000"
                    times.setdefault((engine, name, tree), []).append(
                        run(tree, [*argv, "--db", url.format(keep=args.keep, name=store)]))
        print(f"round {r + 1} of {args.rounds} done, load average {os.getloadavg()[0]:.1f}", flush=True)
    for (engine, name, tree), values in sorted(times.items()):
        print(f"{engine:10} {name:10} {tree:6} median {statistics.median(values):6.2f} s   "
              + " ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()
