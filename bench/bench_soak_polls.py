"""The load a `soak --slurm` puts on slurmctld while it follows the nodes (issue 25, item 8):
job steps per minute, one srun step per node per poll (before) against one per allocation (now).

    sudo python3 bench/bench_soak_polls.py [--sizes 8,64] [--seconds 60] [--simulated 1000]

Real, for each of --sizes: a simulated cluster of that many hosts with a real Slurm 22.05 on it
(tests/slurmcluster.py: slurmctld here, a slurmd per host), one allocation of all of them (as
`soak --slurm` makes, at most --max-nodes-per-job 256 each), a soak directory per node with a
live heartbeat, then `follow.watch`'s polling for --seconds at `soak --slurm`'s default cadence
(a poll every 10 s), each way. slurmctld's own count of step creations (`sdiag`: REQUEST_JOB_STEP_CREATE)
before and after gives the steps per minute it saw; the seconds one poll round took are printed
beside it.

Simulated, --simulated nodes: no Slurm can run that many slurmd here, so `srun` is replaced on
PATH by a recorder that answers each pull for the nodes it names (an empty soak directory's
reply) and logs its call; the count of its calls per minute is the steps the controller would
create, in ceil(N / 256) allocations. Numbers depend on the machine: record it with the date.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from simcluster import SimHost  # noqa: E402
from slurmcluster import slurm_fleet  # noqa: E402

from preflight.app.soak_cli import SLURM_POLL_S  # noqa: E402
from preflight.collect.slurm import SlurmNode  # noqa: E402
from preflight.collect.slurm_job import SlurmOptions, chunks  # noqa: E402
from preflight.soak import follow, slurm_poll  # noqa: E402
from preflight.soak.plan import SlurmJob, SlurmSoak, SoakPlan  # noqa: E402

PER_JOB = 256


def step_creations() -> int:
    for _ in range(10):  # a slurmctld busy with a burst of steps may not answer at once
        r = subprocess.run(["sdiag"], capture_output=True, text=True)
        if r.returncode == 0:
            break
        time.sleep(2)
    else:
        raise SystemExit(f"sdiag: {r.stderr.strip()}")
    out = r.stdout
    m = re.search(r"REQUEST_JOB_STEP_CREATE\s+\(\s*\d+\)\s+count:(\d+)", out)
    return int(m.group(1)) if m else 0


def plan_for(nodes: list[str], jobs: list[int], work: Path) -> SoakPlan:
    groups = [tuple(g) for g in chunks(nodes, PER_JOB)]
    return SoakPlan("bench", work / "reports", "none", 3600.0, 1.0, hosts=(),
                    node_dir=str(work / "node"), python=sys.executable, poll_s=SLURM_POLL_S,
                    slurm=SlurmSoak(SlurmOptions(), tuple(SlurmJob(j, g) for j, g in zip(jobs, groups, strict=True))))


def soak_dirs(plan: SoakPlan, nodes: list[str]) -> None:
    """A live agent's files on every node: a heartbeat naming this process (alive), a telemetry row."""
    for n in nodes:
        d = Path(plan.node_dir) / plan.node_subdir(n)
        d.mkdir(parents=True, exist_ok=True)
        (d / "heartbeat.json").write_text(json.dumps({"format": "preflight-soak-heartbeat/1", "pid": os.getpid(),
                                                      "host": n, "state": "sampling", "now_epoch": time.time()}))
        (d / "telemetry.csv").write_text(f"timestamp,host,gpu,temperature_c\n1.0,{n},0,40\n")


def poll_for(plan: SoakPlan, nodes: list[str], seconds: float, batched: bool) -> tuple[int, float]:
    """Poll as `follow.watch` does for ``seconds``; (poll rounds, mean seconds per round)."""
    watches = [follow.HostWatch(SlurmNode(n, plan.slurm.job_of(n)), plan, None) for n in nodes]
    rounds, busy = 0, 0.0
    end = time.monotonic() + seconds
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(watches)))) as pool:
        while time.monotonic() < end:
            t0 = time.monotonic()
            (slurm_poll.poll_all if batched else follow.poll_each)(plan, watches, pool)
            rounds += 1
            busy += time.monotonic() - t0
            bad = [w.name for w in watches if w.error]
            if bad:
                print(f"    round {rounds}: no reply from {len(bad)} node(s), e.g. {bad[0]}: "
                      f"{watches[[w.name for w in watches].index(bad[0])].error}", flush=True)
            time.sleep(max(0.0, plan.poll_s - (time.monotonic() - t0)))
    return rounds, busy / max(1, rounds)


def real(n: int, seconds: float, work: Path) -> dict:
    nodes = [f"gpu{i:03d}" for i in range(1, n + 1)]
    with slurm_fleet([SimHost(name) for name in nodes], work / f"n{n}") as slurm:
        jobs = []
        for group in chunks(nodes, PER_JOB):
            out = slurm.slurm("salloc", "--no-shell", "-N", str(len(group)), f"--nodelist={','.join(group)}",
                              "--time", "30", "-J", "bench-soak-polls").stderr
            jobs.append(int(re.search(r"Granted job allocation (\d+)", out).group(1)))
        plan = plan_for(nodes, jobs, work / f"n{n}")
        soak_dirs(plan, nodes)
        result = {}
        # The new way first: a step per node leaves slurmctld busy behind it for a while (munge
        # timeouts in its log at 64 nodes on two cores), which would slow what is measured next.
        for way, batched in (("per allocation", True), ("per node", False)):
            before = step_creations()
            rounds, per_round = poll_for(plan, nodes, seconds, batched)
            steps = step_creations() - before
            result[way] = (steps * 60.0 / seconds, rounds, per_round, steps / max(1, rounds))
            print(f"  {n} nodes, a step {way}: {steps} steps in {seconds:g} s = {steps * 60 / seconds:.0f}/min "
                  f"({rounds} poll rounds, {per_round:.2f} s each)", flush=True)
        return result


RECORDER = """#!/bin/sh
# bench/bench_soak_polls.py: srun replaced by a recorder (the simulated count).
echo call >> "{log}"
nodes=""; label=""
for a in "$@"; do case "$a" in --nodelist=*) nodes="${{a#--nodelist=}}";; --label) label=1;; esac; done
exec {python} -c 'import json, sys
from ClusterShell.NodeSet import NodeSet
for i, n in enumerate(NodeSet(sys.argv[1])):
    reply = json.dumps({{"node": n, "exists": True, "files": {{}}, "alive": True}})
    print("%d: %s" % (i, reply) if sys.argv[2] else reply)' "$nodes" "$label"
"""


def simulated(n: int, seconds: float, work: Path) -> dict:
    nodes = [f"gpu{i:04d}" for i in range(1, n + 1)]
    bindir, log = work / "sim-bin", work / "srun.log"
    bindir.mkdir(parents=True, exist_ok=True)
    srun = bindir / "srun"
    srun.write_text(RECORDER.format(log=log, python=sys.executable))
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    os.environ["PATH"] = f"{bindir}:{os.environ['PATH']}"
    plan = plan_for(nodes, list(range(1, math.ceil(n / PER_JOB) + 1)), work / "sim")
    result = {}
    for way, batched in (("per node", False), ("per allocation", True)):
        log.write_text("")
        rounds, per_round = poll_for(plan, nodes, seconds, batched)
        steps = len(log.read_text().splitlines())
        result[way] = (steps * 60.0 / seconds, rounds, per_round, steps / max(1, rounds))
        print(f"  {n} nodes (simulated srun), a step {way}: {steps} steps in {seconds:g} s = "
              f"{steps * 60 / seconds:.0f}/min ({rounds} poll rounds, {per_round:.2f} s each)", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--simulated", type=int, default=1000)
    args = ap.parse_args()
    print(f"# {platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-soak-polls-") as tmp:
        for n in [int(s) for s in args.sizes.split(",") if s]:
            rows.append((n, "real Slurm 22.05", real(n, args.seconds, Path(tmp))))
        if args.simulated:
            rows.append((args.simulated, "simulated srun", simulated(args.simulated, args.seconds, Path(tmp))))
    print("\n| nodes | slurmctld | steps per poll: per node / per allocation | steps/min measured: per node / "
          "per allocation | s per poll round: per node / per allocation |\n|---|---|---|---|---|")
    for n, how, r in rows:
        a, b = r["per node"], r["per allocation"]
        print(f"| {n} | {how} | {a[3]:.0f} / {b[3]:.0f} | {a[0]:.0f} / {b[0]:.0f} | {a[2]:.2f} / {b[2]:.2f} |")


if __name__ == "__main__":
    main()
