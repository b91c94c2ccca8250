"""The idle-node sweep (`preflight sweep --slurm`, docs/sweep.md): what it costs a user and slurmctld.

    sudo python3 bench/bench_sweep.py preempt [--nodes 4] [--grace 5,30]
    python3 bench/bench_sweep.py load [--nodes 64,1000] [--period-h 24,168] [--share 0.1,0.34] [--budget-min 20]
    sudo python3 bench/bench_sweep.py pass [--nodes 64]

- preempt: a real Slurm 22.05 cluster (tests/slurmcluster.py) with PreemptType=preempt/partition_prio,
  PreemptMode=CANCEL, a `sweep` partition (PriorityTier=1, GraceTime=G) and a `batch` partition
  (PriorityTier=10) over the same simulated nodes. One sweep pass starts a sweep on every node
  (max_share 1) whose DCGM diagnostic takes 120 s; 1 s after its run starts on the node, a user job (`sbatch -p batch
  --exclusive`) asks for the node. Measured: submission to RUNNING (squeue polled every 0.1 s) and
  Slurm's own StartTime - SubmitTime (whole seconds), per node, and whether the store says preempted.
  The same for a job that is a bare batch script (no srun step), which Slurm signals only when the
  grace ends (slurm.conf(5), GraceTime): why the sweep runs its work in a step.
- load: the sweep's submissions computed from the pass's own plan (preflight.lifecycle.sweep_plan,
  a pure function) over simulated passes every 10 minutes for two periods (two days at least), every node idle except
  for its sweeps (the most a sweep ever submits): jobs per minute (mean over the second period,
  and the most in one pass) and steps per minute (each job is a batch step and one srun step).
- pass: one real pass on a simulated cluster of N nodes (one slurmd each): its wall time and the
  RPCs slurmctld served for it (sdiag's per-type counts, before and after).
The store is a PostgreSQL server of the bench's own (tests/pgcluster.py), as the sweep requires.
Record the machine and date with the numbers (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from preflight.lifecycle import sweep_plan  # noqa: E402
from preflight.lifecycle.sweep_policy import SweepPolicy  # noqa: E402
from preflight.parse.slurm import NodeState  # noqa: E402

STEPS_PER_JOB = 2  # the batch step and the srun step running `preflight sweep --job`
QUERIES_PER_PASS = 3  # squeue (the sweep's jobs), sinfo (the partition's nodes), scontrol show node


def load(nodes: int, period_h: float, share: float, budget_min: float, interval_min: float = 10.0) -> dict:
    """Submissions of passes every ``interval_min`` over two periods (two days at least), counted
    over the second half; each sweep holds its node for ``budget_min`` (its whole budget: the
    most it may)."""
    names = [f"gpu{i:04d}" for i in range(nodes)]
    policy = SweepPolicy(partition="sweep", period_h=period_h, max_share=share, budget_min=budget_min)
    running: dict[str, float] = {}  # node -> when its sweep ends
    done: dict[str, float] = {}
    t, end = 0.0, 2 * max(period_h, 24.0) * 3600
    per_pass: list[tuple[float, int]] = []
    while t < end:
        for node, until in list(running.items()):
            if until <= t:
                done[node] = until
                del running[node]
        states = {n: NodeState(n, "ALLOCATED" if n in running else "IDLE") for n in names}
        plan = sweep_plan.plan(states, running, done, policy, t)
        for node in plan.submit:
            running[node] = t + budget_min * 60
        per_pass.append((t, len(plan.submit)))
        t += interval_min * 60
    second = [n for at, n in per_pass if at >= end / 2]
    minutes = len(second) * interval_min
    jobs = sum(second)
    return {"nodes": nodes, "period_h": period_h, "max_share": share, "budget_min": budget_min,
            "interval_min": interval_min, "jobs_per_min": jobs / minutes,
            "steps_per_min": STEPS_PER_JOB * jobs / minutes,
            "queries_per_min": QUERIES_PER_PASS / interval_min, "most_jobs_in_a_pass": max(n for _, n in per_pass),
            "sweeps_per_node_per_period": jobs / nodes / (end / 2 / 3600 / period_h)}


def cmd_load(args) -> None:
    for n in args.nodes:
        for p in args.period_h:
            for share in args.share:
                r = load(n, p, share, args.budget_min)
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}))


# ---- on the real cluster ---------------------------------------------------------------------


def _cluster(names, work: Path, grace: int):
    from nodes import DCGM_DIAG, healthy_h200
    from slurmcluster import slurm_fleet

    hosts = []
    for name in names:
        h = healthy_h200(name)
        reply = h.commands[DCGM_DIAG]
        hosts.append(replace(h, commands={**h.commands, DCGM_DIAG: [replace(reply, sleep_s=120), reply]}))
    nodelist = ",".join(names)
    conf = ["PreemptType=preempt/partition_prio", "PreemptMode=CANCEL",
            f"PartitionName=sweep Nodes={nodelist} PriorityTier=1 PreemptMode=CANCEL GraceTime={grace} State=UP",
            f"PartitionName=batch Nodes={nodelist} PriorityTier=10 PreemptMode=OFF State=UP"]
    return slurm_fleet(hosts, work, conf)


def _site(work: Path, share: float = 1.0) -> Path:
    site = work / "sweep.yaml"
    site.write_text(f"format: preflight-sweep/1\npartition: sweep\nmax_share: {share}\nbudget_minutes: 5\n"
                    "dcgm_level: 1\nchecks: [dcgm-diag]\nburn_minutes: 0\n"
                    f"python: {sys.executable}\nout: {work / 'reports'}\n")
    return site


def _pass(slurm, site: Path, db: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "preflight", "sweep", "--slurm", "--site", str(site), "--db",
                        db, "--json"], env={**slurm.env, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"sweep pass exited {r.returncode}: {r.stderr or r.stdout}")
    return json.loads(r.stdout)


def _running(slurm, job: str) -> bool:
    return slurm.slurm("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip() == "RUNNING"


def _wait(what, timeout: float = 120.0, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(step)
    raise SystemExit(f"not within {timeout:g} s")


def _user_job(slurm, node: str) -> tuple[float, int]:
    """(seconds from sbatch to RUNNING by polling, Slurm's StartTime - SubmitTime)."""
    t0 = time.monotonic()
    job = slurm.slurm("sbatch", "--parsable", "-p", "batch", "-w", node, "--exclusive", "-o", "/dev/null",
                      "--wrap", "sleep 1").stdout.strip()
    _wait(lambda: _running(slurm, job))
    polled = time.monotonic() - t0
    line = slurm.slurm("scontrol", "show", "job", "-o", job).stdout
    times = {k: time.mktime(time.strptime(v, "%Y-%m-%dT%H:%M:%S"))
             for k, v in re.findall(r"(SubmitTime|StartTime)=(\S+)", line)}
    return polled, int(times["StartTime"] - times["SubmitTime"])


def _store():
    """A PostgreSQL server of the bench's own (tests/pgcluster.py), as the sweep needs."""
    import pgcluster

    return pgcluster.start(max_connections=40), pgcluster.stop


def _events(db: str) -> list[str]:
    from preflight.app.store_cli import open_store
    from preflight.store.location import parse

    with open_store(parse(db), create=False) as store:
        return [k for (k,) in store.rows("SELECT kind FROM pf_events WHERE kind LIKE 'sweep-%' "
                                         "AND kind != 'sweep-submitted' ORDER BY at")]


def on_cluster(measure, name_width: int):
    """A command that runs ``measure(args, node names, PostgreSQL)`` with the bench's own store,
    preflight importable on the simulated nodes."""
    def command(args) -> None:
        names = [f"gpu{i:0{name_width}d}" for i in range(1, args.nodes + 1)]
        os.environ["PYTHONPATH"] = str(ROOT)
        pg, stop = _store()
        try:
            measure(args, names, pg)
        finally:
            stop(pg)
    return command


def _checking(run_id: str) -> bool:
    """The sweep's run started on its node (`sweep --job` starts it once it listens for SIGTERM)."""
    return subprocess.run(["pgrep", "-f", f"preflight run --local --run-id {run_id} "],
                          stdout=subprocess.DEVNULL).returncode == 0


def _preempt(args, names, pg) -> None:
    for grace in args.grace:
        with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
            work = Path(tmp)
            with _cluster(names, work, grace) as slurm:
                db = pg.create_database(f"bench_sweep_{grace}")
                p = _pass(slurm, _site(work), db)
                runs = {s["node"]: s["run_id"] for s in p["submitted"]}
                rows = []
                for node in names:
                    _wait(lambda r=runs[node]: _checking(r))
                    time.sleep(1)  # inside the sweep's 120 s diagnostic
                    rows.append(_user_job(slurm, node))
                slurm.wait_idle(60)
                kinds = _events(db)
                print(json.dumps({"grace_s": grace, "kind": "sweep (srun step)",
                                  "polled_s": [round(r[0], 2) for r in rows], "slurm_s": [r[1] for r in rows],
                                  "outcomes": kinds}))
                # The same with a bare batch script that traps SIGTERM (no step).
                bare = []
                for node in names:
                    job = subprocess.run(["sbatch", "--parsable", "-p", "sweep", "-w", node, "--exclusive", "-o",
                                          "/dev/null"], input="#!/bin/sh\ntrap 'exit 0' TERM\nsleep 120 & wait\n",
                                         env=slurm.env, capture_output=True, text=True).stdout.strip()
                    _wait(lambda j=job: _running(slurm, j))
                    time.sleep(3)
                    bare.append(_user_job(slurm, node))
                slurm.wait_idle(60)
                print(json.dumps({"grace_s": grace, "kind": "bare batch script",
                                  "polled_s": [round(r[0], 2) for r in bare], "slurm_s": [r[1] for r in bare]}))


def _sdiag(slurm) -> dict[str, int]:
    out = slurm.slurm("sdiag").stdout
    part = out.split("Remote Procedure Call statistics by message type")[1]
    part = part.split("Remote Procedure Call statistics by user")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*(\S+)\s+\(\s*\d+\)\s+count:(\d+)", part, re.M)}




def _one(args, names, pg) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        work = Path(tmp)
        with _cluster(names, work, 5) as slurm:
            site = _site(work, args.share)
            before = _sdiag(slurm)
            t0 = time.monotonic()
            p = _pass(slurm, site, pg.create_database("bench_sweep_pass"))
            wall = time.monotonic() - t0
            after = _sdiag(slurm)
            rpcs = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            for s in p["submitted"]:
                slurm.slurm("scancel", str(s["job"]), check=False)
            print(json.dumps({"nodes": args.nodes, "max_share": args.share, "submitted": len(p["submitted"]),
                              "pass_wall_s": round(wall, 2), "rpcs": rpcs}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    pr = sub.add_parser("preempt")
    pr.add_argument("--nodes", type=int, default=4)
    pr.add_argument("--grace", type=lambda s: [int(x) for x in s.split(",")], default=[5, 30])
    lo = sub.add_parser("load")
    lo.add_argument("--nodes", type=lambda s: [int(x) for x in s.split(",")], default=[64, 1000])
    lo.add_argument("--period-h", type=lambda s: [float(x) for x in s.split(",")], default=[1, 24, 168])
    lo.add_argument("--share", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 0.34])
    lo.add_argument("--budget-min", type=float, default=20)
    pa = sub.add_parser("pass")
    pa.add_argument("--nodes", type=int, default=64)
    pa.add_argument("--share", type=float, default=0.1)
    args = ap.parse_args()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# {platform.node()} {platform.platform()} {os.cpu_count()} CPUs, {when}")
    {"load": cmd_load, "preempt": on_cluster(_preempt, 2), "pass": on_cluster(_one, 3)}[args.what](args)


if __name__ == "__main__":
    main()
