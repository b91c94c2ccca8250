"""Wall time of `preflight run --quick` over a fleet where one node's nvidia-smi hangs.

    sudo python3 bench/bench_hung_tool.py [--hosts 7] [--timeout 10] [--repeat 3] [--src DIR]

Builds a simulated cluster (tests/simcluster.py: a network namespace and a real sshd per host,
recorded real outputs) of healthy HGX H200 nodes, one of which answers every `nvidia-smi` call
by sleeping for an hour (what a GPU that fell off the bus does to nvidia-smi), runs
`python3 -m preflight run --quick --timeout T` against it, and prints each run's wall seconds
and the median. `--src DIR` runs the preflight of another checkout (e.g. a git worktree of an
earlier commit) to compare before and after on the same machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from nodes import healthy_h200  # noqa: E402 - the simulated nodes live with the tests
from simcluster import Reply, SimCluster  # noqa: E402


def hung(node):
    return replace(node, commands={cmd: (Reply(sleep_s=3600) if cmd.startswith("nvidia-smi") else reply)
                                   for cmd, reply in node.commands.items()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--src", type=Path, default=ROOT, help="checkout whose preflight runs (default: this one)")
    args = ap.parse_args()
    nodes = [healthy_h200(f"gpu{i:02d}") for i in range(1, args.hosts)] + [hung(healthy_h200(f"gpu{args.hosts:02d}"))]
    env = {**os.environ, "PYTHONPATH": str(args.src.resolve())}
    walls = []
    with tempfile.TemporaryDirectory() as d, SimCluster(nodes, Path(d)) as cluster:
        for i in range(args.repeat):
            out = Path(d) / f"out{i}"
            t0 = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "preflight", "run", "--hosts", str(cluster.hosts_file),
                                   "--ssh-config", str(cluster.ssh_config), "--known-hosts", str(cluster.known_hosts),
                                   "--identity", str(cluster.identity), "--out", str(out), "--quick", "-q",
                                   "--timeout", f"{args.timeout:g}"], env=env, capture_output=True, text=True, cwd=d)
            walls.append(time.monotonic() - t0)
            if os.environ.get("BENCH_SHOW"):
                import json
                for m in sorted((next(out.glob("*")) / "bundle" / "hosts" / f"gpu{args.hosts:02d}").glob("*.json")):
                    j = json.loads(m.read_text())
                    print(" ", m.stem, j["duration_s"], j["timed_out"], j["exit_code"], (j.get("error") or "")[:50])
            print(f"run {i + 1}: {walls[-1]:.1f} s (exit {done.returncode})", flush=True)
    print(f"{platform.node()} {os.cpu_count()} cores, {args.hosts} hosts (1 hung), --timeout {args.timeout:g}, "
          f"src {args.src}: median {statistics.median(walls):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
