"""The controller's own cost per host: `preflight run --quick` over hosts that refuse connections
(so no node does any work), then `preflight analyze` of the bundle that run wrote.

    python3 bench/bench_controller.py [--sizes 1000,4000,10000] [--repeat 3]

Each host is a distinct loopback address (127.88.X.Y) with nothing listening on port 22, so a
connection is refused at once and every probe becomes a recorded failure: what is left is the
controller's work per host (threads, results, bundle files, parsing, judging, diagnosis and
every report). Prints wall seconds, seconds per 1,000 hosts and the peak RSS of each command;
``analyze`` runs --repeat times on the one bundle, and its median is printed (one run moves by a
third on a shared 2-core machine). Every command reads its modules' bytecode from one cache, as
an installed package's is (a shell with PYTHONDONTWRITEBYTECODE set would otherwise make each
command compile preflight again, a fixed 0.3 s that flatters the small fleets).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run(argv: list[str], cwd: str) -> tuple[float, int, float]:
    """(wall seconds, exit code, peak RSS in MiB) of one command in a fresh process."""
    t0 = time.monotonic()
    code = subprocess.run([sys.executable, "-c", "import resource, subprocess, sys; "
                           "c = subprocess.run(sys.argv[1:]).returncode; "
                           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
                           "sys.exit(c)", sys.executable, "-m", "preflight", *argv],
                          cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    wall = time.monotonic() - t0
    rss_kib = int(code.stderr.strip().splitlines()[-1])
    return wall, code.returncode, rss_kib / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,4000,10000")
    ap.add_argument("--repeat", type=int, default=3, help="analyze runs per size (median printed)")
    args = ap.parse_args()
    cache = tempfile.TemporaryDirectory()
    ENV["PYTHONPYCACHEPREFIX"] = cache.name
    run(["--help"], cache.name)  # writes the cache: no size pays for compiling
    print(f"# {platform.node()} {os.cpu_count()} cores, python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}; hosts refuse connections")
    print(f"{'hosts':>6} {'run s':>8} {'s/1k':>6} {'MiB':>6} {'analyze s':>10} {'s/1k':>6} {'MiB':>6}")
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d:
            hosts = Path(d) / "hosts.txt"
            hosts.write_text("".join(f"127.88.{i // 250}.{i % 250 + 1}\n" for i in range(n)))
            ran, code, rss = run(["run", "--hosts", str(hosts), "--quick", "-q", "--no-html", "--run-id", "r",
                                  "--connect-timeout", "5", "--out", str(Path(d) / "out")], d)
            assert code == 1, code  # every host unreachable
            analyses = []
            for _ in range(max(1, args.repeat)):
                analyses.append(run(["analyze", str(Path(d) / "out" / "r"), "-q", "--no-html",
                                     "--out", str(Path(d) / "an")], d))
                assert analyses[-1][1] == 1, analyses[-1][1]
            an, _, rss2 = sorted(analyses)[len(analyses) // 2]
            print(f"{n:>6} {ran:>8.1f} {ran / n * 1000:>6.2f} {rss:>6.0f} "
                  f"{an:>10.1f} {an / n * 1000:>6.2f} {rss2:>6.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
