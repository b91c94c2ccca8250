"""What the node side costs (issue 34): `preflight healthcheck` (and `prolog`) wall time over many
runs (p50, p99, max), their peak memory, and the size of a node's install.

    python3 bench/bench_node.py [--runs 50] [--sizes]          # here: the shipped example's healthy node
    python3 bench/bench_node.py --local [--runs 50]            # on a real GPU node: its own tools

Without --local the node is examples/h200-fleet's gpu001 (tests/nodes.py ``healthy_h200``: 8 x
H200, 8 ConnectX-7), its tools answered by the simulated cluster's command shims put first on PATH
(tests/simcluster.py ``write_shims``): what preflight itself costs around the tools, whose own time
on a real node it does not include. With --local nothing is replaced: the node's real nvidia-smi,
ibstat, mlxfwmanager... answer, which is the figure that must stay under NHC's 30 s watchdog
and Slurm's 60 s HealthCheckTimeout. Either way each run is
`preflight healthcheck --no-drain --no-db` (never a drain, never a store), in a fresh
interpreter, under `/usr/bin/time -v` for its maximum resident set size; the first run is
untimed (bytecode compiled, page cache warm, as on a node that ran it before).

--sizes builds two fresh venvs from this checkout (`pip install .` and `pip install '.[analysis]'`)
and prints the size of each one's site-packages (`du -sk`), the node install against the
controller's; pip needs its index (or the machine's wheel mirror) for that.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIME = "/usr/bin/time"


def example_shims(work: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from nodes import healthy_h200  # the tests' simulated nodes: only without --local
    from simcluster import write_shims

    return write_shims(healthy_h200("gpu001"), work / "gpu001")


def one_run(command: str, env: dict, out: Path, node: str | None) -> tuple[float, int | None, int]:
    """(wall seconds, max RSS in KiB or None without /usr/bin/time, exit status) of one run."""
    argv = [sys.executable, "-m", "preflight", command, "--no-db", "--out", str(out)]
    argv += ["--no-drain"] if command == "healthcheck" else []
    argv += ["--node", node] if node else []
    timed = [TIME, "-v", *argv] if os.access(TIME, os.X_OK) else argv
    t0 = time.perf_counter()
    proc = subprocess.run(timed, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    return wall, int(rss.group(1)) if rss else None, proc.returncode


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the value q of the runs were at or under."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, -(-len(ordered) * q // 100) - 1))]


def bench_command(command: str, runs: int, env: dict, work: Path, node: str | None, keep: Path | None) -> None:
    out = work / command
    one_run(command, env, out, node)  # untimed
    walls, rss, codes = [], [], set()
    for _ in range(runs):
        wall, kib, code = one_run(command, env, out, node)
        walls.append(wall)
        codes.add(code)
        if code and keep:  # a healthy node that did not pass: keep the run to read why
            newest = max(out.iterdir(), key=lambda p: p.stat().st_mtime)
            shutil.copytree(newest, keep / newest.name, dirs_exist_ok=True)
            print(f"{command}: exit {code} after {wall:.1f} s; kept {keep / newest.name}", flush=True)
        if kib is not None:
            rss.append(kib)
    line = (f"{command}: {runs} runs, wall p50 {percentile(walls, 50):.3f} s, p99 {percentile(walls, 99):.3f} s, "
            f"max {max(walls):.3f} s, mean {statistics.fmean(walls):.3f} s")
    if rss:
        line += f"; max RSS p50 {statistics.median(rss) / 1024:.1f} MiB, max {max(rss) / 1024:.1f} MiB"
    print(line + f"; exit status {sorted(codes)}", flush=True)


def site_packages_kib(venv: Path) -> int:
    (site,) = venv.glob("lib/python3*/site-packages")
    return int(subprocess.run(["du", "-sk", str(site)], capture_output=True, text=True, check=True).stdout.split()[0])


def install_sizes(work: Path) -> None:
    for label, target in (("core (a node)", "."), ("with [analysis] (a controller)", ".[analysis]")):
        venv = work / ("venv-" + ("core" if target == "." else "analysis"))
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        build = work / "build"  # a copy: the checkout stays free of build/ and *.egg-info
        shutil.rmtree(build, ignore_errors=True)
        shutil.copytree(ROOT, build, ignore=shutil.ignore_patterns(".git", "reports", "__pycache__", "*.egg-info",
                                                                   "build"))
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", target],
                       cwd=build, check=True)
        kib = site_packages_kib(venv)
        pip_kib = sum(int(subprocess.run(["du", "-sk", str(p)], capture_output=True, text=True).stdout.split()[0])
                      for p in venv.glob("lib/python3*/site-packages/pip"))
        print(f"install {label}: site-packages {kib / 1024:.1f} MiB ({(kib - pip_kib) / 1024:.1f} MiB without pip "
              f"itself)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--local", action="store_true", help="this node's own tools (a real GPU node)")
    ap.add_argument("--commands", default="healthcheck,prolog")
    ap.add_argument("--sizes", action="store_true", help="also the install sizes, core against [analysis]")
    ap.add_argument("--keep", type=Path, help="copy here the runs that did not exit 0")
    args = ap.parse_args()
    print(f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{'--local' if args.local else 'the example gpu001 (shims)'}; {time.strftime('%Y-%m-%d %H:%M %Z')}")
    with tempfile.TemporaryDirectory(prefix="bench-node-") as tmp:
        work = Path(tmp)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        node = None
        if not args.local:
            env["PATH"] = f"{example_shims(work)}{os.pathsep}{env['PATH']}"
            node = "gpu001"
        for command in args.commands.split(","):
            bench_command(command, args.runs, env, work, node, args.keep)
        if args.sizes:
            install_sizes(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
