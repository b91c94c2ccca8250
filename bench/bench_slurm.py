"""`preflight run --quick` through Slurm against the same run over SSH, on the same hosts.

    sudo python3 bench/bench_slurm.py [--sizes 8,32,64] [--repeat 2]

Builds a simulated cluster of healthy HGX H200 nodes (tests/nodes.py: every probe answered with
recorded real output) with a real Slurm 22.05 on it (tests/slurmcluster.py: slurmctld here, a
slurmd in each host), then times `preflight run --quick` two ways, each in a process of its
own so that its CPU time is the controller's alone (its children, salloc/srun/scancel,
included; the nodes' sshd, slurmd and probes are not its children):
- ssh: `--hosts` over the hosts' sshd (fabric/paramiko in the controller);
- slurm: `--slurm -w NODES` (one allocation, one srun task per node, probes on the nodes).
Prints wall seconds and controller CPU seconds (best of --repeat), the CPU of `preflight analyze`
on the same bundle (the judgement both share), and the collection's CPU per node (the rest). Needs root
and the slurm-wlm and munge packages. Record the machine and date with the numbers.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from nodes import healthy_h200  # noqa: E402
from slurmcluster import slurm_fleet  # noqa: E402 - a context manager; pytest only for its skip


def measure(argv: list[str], env: dict) -> tuple[float, float, int]:
    """(wall s, CPU s of the process and its children, exit code) of one preflight run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    code = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), code


def bench(n: int, repeat: int, work: Path) -> dict[str, tuple[float, float]]:
    names = [f"gpu{i:03d}" for i in range(1, n + 1)]
    out: dict[str, tuple[float, float]] = {}
    with slurm_fleet([healthy_h200(name) for name in names], work / f"n{n}") as slurm:
        sim = slurm.sim
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        base = [sys.executable, "-m", "preflight", "run", "--quick", "-q", "--no-html", "--out", str(work / "r")]
        ways = {
            "ssh": ["--hosts", str(sim.hosts_file), "--ssh-config", str(sim.ssh_config),
                    "--known-hosts", str(sim.known_hosts), "--identity", str(sim.identity)],
            "slurm": ["--slurm", "-w", ",".join(names)],
        }
        for way, args in ways.items():
            best = None
            for i in range(repeat):
                wall, cpu, code = measure(base + ["--run-id", f"{way}-{n}-{i}"] + args, env)
                if code != 0:
                    raise SystemExit(f"{way} run on {n} nodes exited {code}")
                best = (wall, cpu) if best is None or wall < best[0] else best
                slurm.wait_idle()
            out[way] = best
        # The judgement is the same for both (it reads only the bundle): measured alone, it
        # separates the collection's own CPU from the analysis both share.
        analyze = [sys.executable, "-m", "preflight", "analyze", str(work / "r" / f"slurm-{n}-0"), "-q", "--no-html",
                   "--out", str(work / "a")]
        out["analyze"] = min((measure(analyze, env)[:2] for _ in range(repeat)), key=lambda r: r[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,32,64")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print(f"# {platform.node()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, "
          f"python {platform.python_version()}")
    print("| nodes | wall s: ssh / slurm | controller CPU s: ssh / slurm | of which `analyze` alone | "
          "collection CPU per node: ssh / slurm |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            r = bench(n, args.repeat, Path(tmp))
            (sw, sc), (lw, lc), (_, ac) = r["ssh"], r["slurm"], r["analyze"]
            print(f"| {n} | {sw:.1f} / {lw:.1f} | {sc:.2f} / {lc:.2f} | {ac:.2f} | "
                  f"{(sc - ac) / n * 1000:.0f} ms / {(lc - ac) / n * 1000:.0f} ms |", flush=True)


if __name__ == "__main__":
    main()
