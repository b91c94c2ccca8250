"""``run --slurm``: the probes of every node run on that node, as one srun task per node.

The controller builds the same ``ExecPlan`` as for SSH. Each allocation (at most
``max_nodes_per_job`` nodes) gets one step with one task per node; the task is
``python3 -I -S -c BOOT`` and receives on stdin the node-side runner (``preflight/node``: schedule,
local execution, frames) and the plan, so nothing is installed on the nodes. All nodes probe at
once, each with the SSH path's rules (``preflight.node.schedule``), and stream framed records
back over srun's stdout; each result reaches ``on_result`` (the bundle writer) as it arrives.

Every node gets a result, in Slurm's words where Slurm said something:
  - a node Slurm will not run jobs on (drained, down, not responding) before the run: not
    probed, every probe recorded with that state and reason;
  - a task Slurm could not launch ("Task launch ... failed on node X: ..."): the same, with the
    launch error. srun aborts the step when one launch fails, so the other nodes of that step
    that had not finished run again in a new step without it;
  - a task that ended before its last record (killed, the step cancelled at its time limit, a
    python3 missing): its probes that never came back carry what srun said;
  - an allocation not granted (busy nodes past ``--immediate``): its nodes carry salloc's words.
Errors Slurm reports start with ``slurm:`` (``SLURM_ERROR``): a node where every probe carries
one is judged unreachable through Slurm (cause ``slurm-node-unavailable``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ClusterShell.NodeSet import NodeSet

from preflight.collect import dcgm
from preflight.collect.fanout import ExecPlan
from preflight.collect.node import now_iso
from preflight.collect.node_runner import node_payload, result_of, runner_argv
from preflight.collect.probe import Probe
from preflight.collect.slurm_job import Allocation, SlurmOptions, allocate, gpu_groups, node_states, release
from preflight.contracts import SLURM_ERROR
from preflight.model import ProbeResult
from preflight.node.frames import FrameReader
from preflight.node.localexec import end_group
from preflight.parse.slurm import NodeState, StepReport, parse_step_stderr

# Steps of one allocation: the first, then at most this many re-runs after launch failures.
MAX_RETRIES = 2
# Beyond the node budget: python3 starting, srun's own launch timeouts (MessageTimeout, 10 s).
STEP_GRACE_S = 60.0

OnResult = Callable[[ProbeResult], None]


@dataclass
class SlurmRun:
    """A run's allocations, granted before anything is written, and the nodes not probed."""

    allocations: list[Allocation]
    unusable: dict[str, str]  # node -> why Slurm will not run it, from scontrol show node
    options: SlurmOptions

    def release(self) -> None:
        for a in self.allocations:
            if a.job is not None:
                release(a.job)


def prepare(nodes: Sequence[str], plan: ExecPlan, opts: SlurmOptions, run_id: str) -> SlurmRun:
    """Node states, then the allocations, each asking for the nodes' GPUs. Raises
    ``SlurmUsageError`` (nothing granted is kept) when Slurm refuses the request itself."""
    states = node_states(nodes)
    unusable = {n: f"node {s.unusable} before the run ({s.describe()})" for n, s in states.items() if s.unusable}
    unusable.update(shared_refusals(states, plan, opts, unusable))
    usable = [n for n in nodes if n not in unusable]
    run = SlurmRun([], unusable, opts)
    try:
        groups = gpu_groups(usable, states, opts)
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(groups)))) as pool:
            futures = [pool.submit(allocate, g, opts, f"preflight-{run_id}", plan.node_budget(), gpus=gpus)
                       for gpus, g in groups]
            for f in futures:
                run.allocations.append(f.result())
    except BaseException:
        run.release()
        raise
    return run


def loads_node(probe: Probe) -> bool:
    """An active probe, except DCGM's diagnostic at level 1: "quick deployment checks, normally
    lasting seconds", where level 2 is "medium validation, approximately two minutes" of GPU
    tests (dcgmi-diag(1), docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/
    dcgmi/dcgmi-diag.html). The level is the first of the configured probe's arguments."""
    if probe.id == dcgm.PROBE_ID and probe.argv[len(dcgm.PROBE.argv):][:1] == ("1",):
        return False
    return probe.active


def shared_refusals(states: dict[str, NodeState], plan: ExecPlan, opts: SlurmOptions,
                    unusable: dict[str, str]) -> dict[str, str]:
    """The nodes where another job runs, when the plan loads the node (an active probe: the
    all_reduce, DCGM's diagnostic, a burn) and the run neither waits for the node (--exclusive)
    nor accepts to share it (--allow-shared): they are not probed, and say why. Slurm grants a
    job the CPUs and GPUs another job leaves free, so without this the load would land beside
    someone's work (and, without GPUs configured in Slurm, on that work's GPUs)."""
    load = [p.id for p in plan.probes if loads_node(p)]
    if not load or opts.exclusive or opts.allow_shared:
        return {}
    return {n: (f"node runs another job ({s.describe()}): the load probes ({', '.join(load)}) are not run beside "
                "it; --exclusive waits for the node, --allow-shared runs them anyway")
            for n, s in states.items() if s.busy and n not in unusable}


def run_slurm(run: SlurmRun, plan: ExecPlan, on_result: OnResult) -> None:
    """Probe every node of the run; every node gets its results or Slurm's reason; releases the
    allocations at the end (also on Ctrl-C)."""
    pool = ThreadPoolExecutor(max_workers=max(1, min(64, len(run.allocations))), thread_name_prefix="preflight-job")
    try:
        for node, why in run.unusable.items():
            _fail_rest(plan, node, set(), why, on_result)
        for f in [pool.submit(_run_allocation, a, plan, on_result, run.options.node_python) for a in run.allocations]:
            f.result()
    finally:
        # On Ctrl-C, not waiting for the steps: cancelling the jobs is what ends them.
        pool.shutdown(wait=False, cancel_futures=True)
        run.release()


def _run_allocation(alloc: Allocation, plan: ExecPlan, on_result: OnResult, python: str) -> None:
    if alloc.job is None:
        for node in alloc.nodes:
            _fail_rest(plan, node, set(), alloc.why_not or "allocation not granted", on_result)
        return
    payload = node_payload(plan)
    pending = list(alloc.nodes)
    for attempt in range(MAX_RETRIES + 1):
        step = run_step(alloc.job, pending, payload, plan, on_result, python)
        retry = []
        for node in pending:
            got = step.delivered.get(node, set())
            if node in step.finished:
                if len(got) < len(plan.probes):  # the task sent them, but they did not arrive whole
                    _fail_rest(plan, node, got, f"the result was damaged in transit ({step.damaged} damaged "
                                                "line(s) on srun's stdout)", on_result)
                continue
            if node in step.report.launch_failed:
                _fail_rest(plan, node, got, step.reason(node), on_result)
            elif step.report.launch_failed and attempt < MAX_RETRIES:
                retry.append(node)  # aborted with the step another node's launch failure broke
            else:
                _fail_rest(plan, node, got, step.reason(node), on_result)
        if not retry:
            return
        pending = retry


@dataclass
class Step:
    """What one srun step brought back."""

    report: StepReport
    exit_code: int | None
    stopped_by_us: bool = False
    seconds: float = 0.0
    delivered: dict[str, set[str]] = field(default_factory=dict)  # node -> probe ids recorded
    hello: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)  # nodes whose `end` record came
    noise: list[str] = field(default_factory=list)
    damaged: int = 0  # framed lines dropped for a bad checksum

    def reason(self, node: str) -> str:
        said = self.report.reason_for(node)
        if said is None and self.stopped_by_us:
            said = f"the step did not end within {self.seconds:.0f} s; preflight cancelled it"
        if said is None:
            said = (f"the task printed nothing (srun exit {self.exit_code})" if node not in self.hello
                    else f"the task ended before its last result (srun exit {self.exit_code})")
        if self.noise and node not in self.hello:
            said += f"; the step printed: {self.noise[0]}"
        return said


def step_argv(job: int, nodes: Sequence[str], python: str = "python3") -> list[str]:
    return ["srun", f"--jobid={job}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={NodeSet.fromlist(nodes)}", "--kill-on-bad-exit=0", "--input=all",
            *runner_argv(python)]


def run_step(job: int, nodes: Sequence[str], payload: bytes, plan: ExecPlan, on_result: OnResult,
             python: str = "python3") -> Step:
    """One srun step over ``nodes``; records go to ``on_result`` as they arrive."""
    by_id = {p.id: p for p in plan.probes}
    wanted = set(nodes)
    limit = plan.node_budget() + STEP_GRACE_S
    started = time.monotonic()
    proc = subprocess.Popen(step_argv(job, nodes, python), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    stderr: list[bytes] = []
    feeders = [threading.Thread(target=_feed, args=(proc.stdin, payload), daemon=True),
               threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)]
    for t in feeders:
        t.start()
    stopped = threading.Event()

    def watchdog() -> None:
        if proc.poll() is None:
            stopped.set()
            end_group(proc)  # SIGTERM makes srun cancel the step; SIGKILL after the grace

    timer = threading.Timer(limit, watchdog)
    timer.daemon = True
    timer.start()
    step = Step(StepReport(), None)
    reader = FrameReader()
    try:
        for line in proc.stdout:
            for node, _, header, payload_bytes in reader.feed(line):
                if node not in wanted:
                    continue
                kind = header.get("kind")
                if kind == "hello":
                    step.hello.add(node)
                elif kind == "end":
                    step.finished.add(node)
                elif kind == "result" and header.get("probe") in by_id:
                    probe = by_id[header["probe"]]
                    step.delivered.setdefault(node, set()).add(probe.id)
                    on_result(result_of(probe, node, header, payload_bytes))
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for t in feeders:
            t.join(10)
    step.report = parse_step_stderr(b"".join(stderr).decode("utf-8", "replace"))
    step.exit_code, step.stopped_by_us = proc.returncode, stopped.is_set()
    step.seconds, step.noise, step.damaged = time.monotonic() - started, reader.noise, reader.damaged
    return step


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError):
        pass  # srun gave up before reading it all: its stderr says why


def _fail_rest(plan: ExecPlan, node: str, delivered: set[str], why: str, on_result: OnResult) -> None:
    """Record every probe of ``node`` that has no result yet with Slurm's reason."""
    for probe in plan.probes:
        if probe.id not in delivered:
            on_result(ProbeResult(probe.id, node, probe.argv, None, "", None, now_iso(), 0.0, False,
                                  f"{SLURM_ERROR}{why}"))
