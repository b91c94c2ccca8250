"""``soak --slurm``: the soak agents as srun tasks inside one allocation (or one per
``--max-nodes-per-job`` nodes), watched and collected as over SSH.

Why not the SSH path's ``--detach`` through one srun step per node: Slurm ends every process
of a step when the step ends (proctrack/cgroup puts them all in the step's cgroup, whatever
they fork), so a detached agent would die with the short step that started it. Here the agent
*is* the step: one srun per allocation, one task per node, ``python3 -c _START`` with the
agent's tar on srun's stdin (broadcast to every task, as ``run --slurm`` ships its runner), the
agent in the foreground for the whole soak, its output in ``agent.log`` beside its files. srun
runs in a session of its own, so Ctrl-C or a killed controller leaves it, and the agents, running;
the allocation (``salloc --no-shell``) outlives the controller too, and ``--attach`` finds it in
run.json. Everything else is the SSH soak's: each poll is a short ``srun --overlap`` step on the
node (``SlurmNode``) that reads the new bytes, the mirror, the merge, the verdicts.

Every node gets an outcome: a node drained or down before the run is not started (Slurm's state
and reason); a task Slurm could not launch carries srun's words, and the nodes its failure
aborted are started again in a new step without it; a step cancelled at its time limit marks
its nodes ``killed`` with Slurm's line. The job's ``--time`` covers the soak: the soak's length,
the vllm server's start-up, the burn's bench, plus a margin for start and collection
(``needed_s``); a shorter ``--time`` is refused before anything runs. The allocation is released
once every node is done.
"""

from __future__ import annotations

import base64
import json
import math
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

from ClusterShell.NodeSet import NodeSet
from rich.console import Console

from preflight.collect.slurm import SlurmNode
from preflight.collect.slurm_job import allocate, gpu_groups, node_states, release
from preflight.contracts import SLURM_ERROR
from preflight.parse.slurm import parse_step_stderr
from preflight.soak.follow import HEARTBEAT_JSON, last_json_line, pull_argv
from preflight.soak.plan import SlurmJob, SoakPlan, write_plan
from preflight.soak.ship import UNPACK, Started, agent_bundle

# How long the agents get to report that they sample (the SSH start waits as long for its reply).
START_WAIT_S = 90.0
# After the soak's end: the engine's stop (the burn gives its workers a window), the last
# polls, the follow's grace for a silent node (follow.GRACE_S), the merge.
COLLECT_MARGIN_S = 240.0
# The agent's own default vllm start-up allowance (preflight/node/agent.py ServeParams.ready_timeout_s;
# a test holds the two equal): a vllm soak's length counts from the moment the server answers.
VLLM_READY_DEFAULT_S = 1200.0
ABORT_WAIT_S = 60.0  # for srun to end a step one launch failure aborted
MAX_RETRIES = 2  # steps re-run for the nodes another node's failed launch aborted
STEPS_JSON = "slurm-steps.json"  # node -> the stderr file of the step that ran its agent

# `python3 -c _START NODE_DIR RUN_ID FRESH AGENT_ARGS...` on every task, the agent's tar on stdin.
# The task's Slurm name ($SLURMD_NODENAME) names its directory and its rows. FRESH=1 (a step run
# again after an aborted one) clears what the aborted agent left. The agent's output goes to
# agent.log, as a detached agent's does; the agent then runs in the foreground: it is the step.
_START = """\
import io, os, sys, tarfile
node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
d = os.path.abspath(os.path.join(os.path.expanduser(sys.argv[1]), sys.argv[2], node))
if sys.argv[3] == "1" and os.path.isdir(d):
    for name in os.listdir(d):
        if os.path.isfile(os.path.join(d, name)):
            os.remove(os.path.join(d, name))
os.makedirs(d, exist_ok=True)
""" + UNPACK + """\
log = os.open(os.path.join(d, "agent.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.dup2(log, 1)
os.dup2(log, 2)
os.execv(sys.executable, [sys.executable, os.path.join(d, "agent.py"), "--out", d, "--host", node] + sys.argv[4:])
"""


def needed_s(seconds: float, engine: str, ready_timeout_s: float | None = None, bench_s: float | None = None) -> float:
    """The time limit a soak of ``seconds`` needs: start-up, the soak, the bench, collection."""
    startup = (ready_timeout_s or VLLM_READY_DEFAULT_S) if engine == "vllm" else 0.0
    return START_WAIT_S + startup + seconds + (bench_s or 0.0) + COLLECT_MARGIN_S


def time_limit(needed: float) -> str:
    """Slurm's --time in whole minutes (its resolution), rounded up."""
    return str(math.ceil(needed / 60))


# --------------------------------------------------------------------------- allocation


def allocate_soak(plan: SoakPlan, needed: float) -> SoakPlan:
    """The plan with its allocations: node states first (drained and down nodes are reported,
    never allocated), then one job per ``max_nodes_per_job`` nodes. A request Slurm refuses
    raises ``SlurmUsageError`` with nothing granted left behind and nothing written."""
    assert plan.slurm is not None
    names = [h.name for h in plan.hosts]
    states = node_states(names)
    unusable = {n: f"node {s.unusable} before the run ({s.describe()})" for n, s in states.items() if s.unusable}
    usable = [n for n in names if n not in unusable]
    opts = plan.slurm.options
    opts = replace(opts, time=opts.time or time_limit(needed))
    jobs: list[SlurmJob] = []
    try:
        # Every GPU slurm.conf gives each node, as run --slurm asks: under ConstrainDevices=yes
        # the agents' step (and the polls beside it) would see no GPU otherwise.
        for gpus, group in gpu_groups(usable, states, opts):
            # allocate() derives --time from a budget only when none is set; it is set above.
            a = allocate(group, opts, f"preflight-soak-{plan.run_id}", needed, gpus=gpus)
            jobs.append(SlurmJob(a.job, a.nodes, a.why_not))
    except BaseException:
        for j in jobs:
            if j.job is not None:
                release(j.job)
        raise
    return replace(plan, slurm=replace(plan.slurm, options=opts, jobs=tuple(jobs), unusable=unusable))


def release_soak(plan: SoakPlan) -> None:
    for j in plan.slurm.jobs if plan.slurm else ():
        if j.job is not None:
            release(j.job)


# --------------------------------------------------------------------------- starting


def step_argv(plan: SoakPlan, job: int, nodes: list[str], fresh: bool) -> list[str]:
    return ["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={NodeSet.fromlist(nodes)}", "--kill-on-bad-exit=0", "--input=all",
            plan.node_python, "-c", _START, plan.node_dir, plan.run_id, "1" if fresh else "0",
            "--engine", plan.engine, "--seconds", repr(float(plan.seconds)),
            "--interval", repr(float(plan.interval_s)), *plan.agent_args]


def start(plan: SoakPlan, console: Console) -> list[Started]:
    """Write run.json, then start every allocation's agent step; returns once each node's agent
    samples (or failed, or Slurm said why not)."""
    try:
        write_plan(plan)
        soak_dir = plan.run_dir / "soak"
        (soak_dir / "agent.tar").write_bytes(agent_bundle(plan.builtin_model))
    except Exception:
        release_soak(plan)  # no agent runs yet: nothing to keep the allocation for
        raise
    started: dict[str, Started] = {}
    steps: dict[str, str] = {}
    for h in plan.hosts:
        if why := plan.slurm.why_not(h.name):
            started[h.name] = Started(h.name, False, f"{SLURM_ERROR}{why}")
    jobs = [j for j in plan.slurm.jobs if j.job is not None]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(jobs)))) as pool:
        for got, ran in pool.map(lambda j: _start_job(plan, j), jobs):
            started.update(got)
            steps.update(ran)
    (soak_dir / STEPS_JSON).write_text(json.dumps(steps, indent=1) + "\n")
    out = [started[h.name] for h in plan.hosts]
    for s in out:
        console.print(f"soak {plan.run_id}: {s.host}: {'started, ' if s.ok else 'NOT started: '}{s.detail}",
                      highlight=False, markup=False)
    return out


def _start_job(plan: SoakPlan, job: SlurmJob) -> tuple[dict[str, Started], dict[str, str]]:
    pending = list(job.nodes)
    started: dict[str, Started] = {}
    steps: dict[str, str] = {}
    for attempt in range(MAX_RETRIES + 1):
        err_name = f"slurm-{job.job}.{attempt}.stderr"
        proc = _launch(plan, job.job, pending, attempt, err_name)
        up = _wait_up(plan, job.job, pending, proc, plan.run_dir / "soak" / err_name)
        ended = proc.poll() is not None
        report = parse_step_stderr((plan.run_dir / "soak" / err_name).read_text(errors="replace")) if ended else None
        steps.update(dict.fromkeys(pending, err_name))
        if report is not None and report.launch_failed:
            # srun aborts the whole step when one launch fails: the agents that had started
            # died with it, and start again in a new step without the node Slurm could not reach.
            for node in pending:
                if node in report.launch_failed:
                    started[node] = Started(node, False, f"{SLURM_ERROR}{report.reason_for(node)}")
            rest = [n for n in pending if n not in report.launch_failed]
            if rest and attempt < MAX_RETRIES:
                pending = rest
                continue
            for node in rest:
                started[node] = Started(node, False, f"{SLURM_ERROR}{report.reason_for(node) or 'step aborted'}")
            break
        for node in pending:
            if node in up:
                started[node] = up[node]
            elif report is None:  # still running, but this agent never reported
                started[node] = Started(node, False, f"the agent did not report within {START_WAIT_S:g} s")
            else:
                said = (report.reason_for(node)
                        or f"the task ended before its agent reported (srun exit {proc.returncode})")
                started[node] = Started(node, False, f"{SLURM_ERROR}{said}")
        break
    return started, steps


def _launch(plan: SoakPlan, job: int, nodes: list[str], attempt: int, err_name: str) -> subprocess.Popen:
    soak_dir = plan.run_dir / "soak"
    # A session of its own: Ctrl-C at the controller must not reach srun, which would cancel the step.
    with (soak_dir / "agent.tar").open("rb") as tar, (soak_dir / err_name).open("wb") as err:
        return subprocess.Popen(step_argv(plan, job, nodes, attempt > 0), stdin=tar, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)


def _wait_up(plan: SoakPlan, job: int, nodes: list[str], proc: subprocess.Popen, stderr: Path) -> dict[str, Started]:
    """Poll the nodes' heartbeats until each agent left its "starting" state, the step ended,
    or START_WAIT_S passed. A poll of a node srun cannot reach waits out srun's own launch
    timeout, so polls run in the background and srun's stderr is read every second: once it
    reports a failed launch the step is being aborted, and its heartbeats no longer matter."""
    up: dict[str, Started] = {}
    deadline = time.monotonic() + START_WAIT_S
    pool = ThreadPoolExecutor(max_workers=max(1, min(64, len(nodes))), thread_name_prefix="soak-start")
    inflight: dict[str, Future] = {}
    try:
        while True:
            ended = proc.poll() is not None  # read first: a short soak may finish in between
            if parse_step_stderr(stderr.read_text(errors="replace")).launch_failed:
                try:
                    proc.wait(ABORT_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
                break
            for node in nodes:
                if node not in up and node not in inflight:
                    inflight[node] = pool.submit(_heartbeat, plan, job, node)
            if ended:  # one last look at every node, for agents that already finished
                wait(list(inflight.values()), timeout=60)
            for node, future in list(inflight.items()):
                if future.done():
                    del inflight[node]
                    beat = future.result()
                    if beat and beat.get("state") not in (None, "starting"):
                        ok = beat["state"] != "failed"
                        up[node] = Started(node, ok, f"agent pid {beat.get('pid')} in job {job}" if ok else
                                           str(beat.get("last_error") or "the agent failed"))
            if ended or len(up) == len(nodes) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a poll still waiting on srun ends on its own limit
    return up


def _heartbeat(plan: SoakPlan, job: int, node: str) -> dict | None:
    reply = SlurmNode(node, job).run(pull_argv(plan, node, [HEARTBEAT_JSON, "0"]), timeout=30.0)
    doc = last_json_line(reply.stdout or b"") if reply.exit_code == 0 else None
    try:
        beat = json.loads(base64.b64decode(doc["files"][HEARTBEAT_JSON]["data"]))
    except (TypeError, KeyError, ValueError):
        return None
    return beat if isinstance(beat, dict) else None


# --------------------------------------------------------------------------- after the watch


def slurm_outcomes(plan: SoakPlan, outcomes: dict[str, tuple[str, str | None]]) -> dict[str, tuple[str, str | None]]:
    """The watch's outcomes with Slurm's words: a node whose step was cancelled (its time limit,
    an operator's scancel) is ``killed`` even where its agent, told by SIGTERM, wrote a tidy end;
    a node whose task ended badly gets srun's line in its note."""
    try:
        steps = json.loads((plan.run_dir / "soak" / STEPS_JSON).read_text())
    except (OSError, ValueError):
        return outcomes
    reports = {}
    for name in set(steps.values()) if isinstance(steps, dict) else ():
        path = plan.run_dir / "soak" / Path(str(name)).name
        if path.is_file():
            reports[name] = parse_step_stderr(path.read_text(errors="replace"))
    out = dict(outcomes)
    for node, (state, note) in outcomes.items():
        report = reports.get(steps.get(node))
        said = report.reason_for(node) if report else None
        if report is None or said is None or state == "not started":
            continue
        if report.cancelled:
            out[node] = ("killed", f"{SLURM_ERROR}{said}")
        elif state != "finished":
            out[node] = (state, f"{note}; {SLURM_ERROR}{said}" if note else f"{SLURM_ERROR}{said}")
    return out
