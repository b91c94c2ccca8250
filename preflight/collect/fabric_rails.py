"""The rail stage, run: every rail of every node against the same rail of a partner, through
``Node`` (SSH, Slurm steps, this machine alike).

For each round of the plan (``preflight.fabric.pairing``) every pair runs at once, and within a
pair every rail at once (rail i of the client against rail i of the server, on TCP port
``base_port + i``: the pairs of a round share no node, so no two servers of a node share a
port). One test is a server started on the partner and, a moment later, a client on the node:

- ``ib_write_bw``: ``ib_write_bw -d HCA -i PORT -p TCP --report_gbits -F -D S [-x GID]
  [--use_cuda=I]`` on both sides, the client with the server's name; then one
  ``ib_write_lat`` the same way (latency, reported);
- ``iperf3``: ``iperf3 -s -1 -J -p TCP`` on the partner, ``iperf3 -c ADDRESS -p TCP -t S -J
  [-b RATE]`` on the node, ADDRESS the partner's address on that rail (its interface).

Both sides run under ``timeout`` on the node (the transport's own bound), so a partner that
never answers costs one timeout, not a hang; a client that found no listener yet (the server's
start raced it) is tried again for a few seconds. Repetitions run in step across the round
(``before_rep`` is called before each, e.g. to change a link's shaping in a test).

Every pair's runs are saved as one record per round under the client node
(``preflight.fabric.record``); nothing measured before a failure is lost, and a partner that
did not answer is in the record as such (a finding, not a crash).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from preflight.collect.node import CommandResult, Node, now_iso
from preflight.collect.slurm import SlurmNode
from preflight.collect.slurm_job import allocate, release
from preflight.collect.ssh import SshNode
from preflight.collect.stage import Stage, StageContext
from preflight.fabric.pairing import Rail, RailPlan, RailRound, paired_rails, plan_rail_rounds
from preflight.fabric.rails import IP_ADDR_PROBE, rails_from_ip_addr, rdma_rails
from preflight.fabric.record import PairRecord, RunRecord, Side, dump, probe_id
from preflight.model import ProbeResult
from preflight.parse import ParseError

_RETRY_FOR_S = 5.0  # how long a client whose server is not listening yet tries again
_SERVER_HEAD_START_S = 0.2  # then retried while the server is not listening yet
_STDERR_CAP = 4000


@dataclass(frozen=True)
class RailOptions:
    tool: str = "ib_write_bw"  # or "iperf3"
    reps: int = 3
    seconds: float = 5.0  # per test (perftest -D, iperf3 -t)
    use_cuda: bool = False  # perftest --use_cuda=<rail index>: GPU i with NIC i (HGX layout)
    gid_index: int | None = None  # perftest -x, RoCE
    base_port: int = 18515  # perftest's default; rail i uses base + i (pairs of a round share no node)
    bitrate: str | None = None  # iperf3 -b: cap each stream (a shared CPU test bed)
    size: str | None = None  # iperf3 -n: send this many bytes instead of for ``seconds``
    latency: bool = True  # ib_write_lat once per rail and round
    slack_s: float = 20.0  # beyond the test's own seconds: connection, set-up, teardown

    @property
    def limit_s(self) -> float:
        """Each side's bound: the test, its set-up and teardown, the retries."""
        return self.seconds + self.slack_s + _RETRY_FOR_S


def server_argv(o: RailOptions, rail: Rail, port: int, rail_index: int, test: str = "bw") -> list[str]:
    if o.tool == "iperf3":
        return ["iperf3", "-s", "-1", "-J", "-p", str(port)]
    return _perftest(o, rail, port, test, rail_index)


def client_argv(o: RailOptions, rail: Rail, port: int, server: str, rail_index: int, test: str = "bw") -> list[str]:
    if o.tool == "iperf3":
        return ["iperf3", "-c", server, "-p", str(port), *(["-n", o.size] if o.size else ["-t", f"{o.seconds:g}"]),
                "-J", *(["-b", o.bitrate] if o.bitrate else [])]
    return _perftest(o, rail, port, test, rail_index) + [server]


def _perftest(o: RailOptions, rail: Rail, port: int, test: str, rail_index: int | None = None) -> list[str]:
    argv = ["ib_write_bw" if test == "bw" else "ib_write_lat", "-d", rail.device, "-i", str(rail.port or 1),
            "-p", str(port), "-F"]
    argv += ["--report_gbits", "-D", f"{max(1, round(o.seconds))}"] if test == "bw" else ["-n", "1000"]
    if o.gid_index is not None:
        argv += ["-x", str(o.gid_index)]
    if o.use_cuda and test == "bw":
        # Server and client alike use GPU <rail index> (the rail's own index on each node).
        argv.append(f"--use_cuda={rail_index if rail_index is not None else 0}")
    return argv


def _side(r: CommandResult) -> Side:
    return Side(r.argv, r.exit_code, r.duration_s, r.timed_out, r.error,
                (r.stdout or b"").decode("utf-8", "replace"), r.stderr[-_STDERR_CAP:])


def _not_listening(r: CommandResult, tool: str) -> bool:
    text = (r.stdout or b"").decode("utf-8", "replace") + r.stderr
    if tool == "iperf3":
        return "Connection refused" in text
    return "Couldn't connect" in text or "Connection refused" in text


def run_one(client: Node, server: Node, options: RailOptions, pair: tuple[Rail, Rail], port: int,
            address: str, index: int, test: str = "bw") -> tuple[Side, Side]:
    """One test: the server on ``server``, the client on ``client`` a moment later; never raises."""
    mine, theirs = pair
    limit = options.limit_s
    box: dict[str, CommandResult] = {}
    serving = threading.Thread(target=lambda: box.__setitem__(
        "s", server.run(server_argv(options, theirs, port, index, test), timeout=limit)), daemon=True)
    serving.start()
    time.sleep(_SERVER_HEAD_START_S)
    argv = client_argv(options, mine, port, address, index, test)
    deadline = time.monotonic() + _RETRY_FOR_S
    while True:
        r = client.run(argv, timeout=limit)
        if not (_not_listening(r, options.tool) and serving.is_alive() and time.monotonic() < deadline):
            break
        time.sleep(0.3)
    serving.join(limit + 60.0)
    s = box.get("s") or CommandResult(tuple(server_argv(options, theirs, port, index, test)), None, "", None,
                                      now_iso(), 0.0, True, "the server side did not return")
    return _side(r), _side(s)


def run_rounds(nodes: Mapping[str, Node], rails: Mapping[str, Sequence[Rail]], plan: RailPlan,
               options: RailOptions, on_result: Callable[[ProbeResult], None],
               before_rep: Callable[[int, int], None] | None = None, parallel: int = 256) -> None:
    """Every round of ``plan``: its pairs (and their rails) at once, ``options.reps`` times in
    step; each pair's record saved through ``on_result`` when its round ends."""
    for rnd in plan.rounds:
        _run_round(nodes, rails, rnd, options, on_result, before_rep, parallel)


def _run_round(nodes: Mapping[str, Node], rails: Mapping[str, Sequence[Rail]], rnd: RailRound,
               options: RailOptions, on_result: Callable[[ProbeResult], None],
               before_rep: Callable[[int, int], None] | None, parallel: int) -> None:
    runs: dict[tuple[str, str], list[RunRecord]] = {pair: [] for pair in rnd.pairs}
    tasks = []
    for a, b in rnd.pairs:
        for index, mine, theirs in paired_rails(rails[a], rails[b]):
            address = theirs.address if options.tool == "iperf3" else b
            tasks.append(((a, b), index, (mine, theirs), options.base_port + index, address or b))
    started, t0 = now_iso(), time.monotonic()
    lock = threading.Lock()
    silent = _silent([n for pair in rnd.pairs for n in pair], nodes, options, parallel)

    def one(task, rep: int, test: str = "bw") -> None:
        (a, b), index, pair, port, address = task
        if a in silent or b in silent:
            # A node that did not answer a plain `true` would only make its partner's side wait
            # for the whole limit: both sides are recorded as not run, saying which node it was.
            client = silent.get(a) or _not_run(f"not run: {b} did not answer ({silent.get(b)})")
            server = silent.get(b) or _not_run(f"not run: {a} did not answer ({silent.get(a)})")
            client, server = _side(client), _side(server)
        else:
            client, server = run_one(nodes[a], nodes[b], options, pair, port, address, index, test)
        with lock:
            runs[(a, b)].append(RunRecord(index, rep, test, client, server))

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(tasks)))) as pool:
        for rep in range(1, options.reps + 1):
            if before_rep:
                before_rep(rnd.number, rep)
            list(pool.map(lambda t, rep=rep: one(t, rep), tasks))
        if options.latency and options.tool != "iperf3":
            list(pool.map(lambda t: one(t, 0, "lat"), tasks))
    seconds = round(time.monotonic() - t0, 3)
    for (a, b), done in runs.items():
        done.sort(key=lambda r: (r.test != "bw", r.rail, r.rep))
        record = PairRecord(rnd.number, options.tool, a, b, options.reps, tuple(rails[a]), tuple(rails[b]),
                            tuple(done))
        on_result(ProbeResult(probe_id(rnd.number), a, ("preflight-fabric-rails", options.tool, a, b), dump(record),
                              "", 0, started, seconds, False, None))


def _not_run(why: str) -> CommandResult:
    return CommandResult((), None, "", None, now_iso(), 0.0, False, why)


def _silent(names: Sequence[str], nodes: Mapping[str, Node], options: RailOptions,
            parallel: int) -> dict[str, CommandResult]:
    """The round's nodes that do not answer a plain command now, with that result."""
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(names)))) as pool:
        results = dict(zip(names, pool.map(lambda n: nodes[n].run(["true"], timeout=options.slack_s), names),
                           strict=True))
    return {n: r for n, r in results.items() if r.error or r.timed_out}


def node_rails(evidence: Mapping[str, Mapping[str, ProbeResult]], tool: str) -> dict[str, list[Rail]]:
    """Each reached node's rails from its own listing (see ``preflight.fabric.rails``); a node
    whose listing is missing or unreadable has none."""
    out: dict[str, list[Rail]] = {}
    for name, results in evidence.items():
        if tool != "iperf3":
            out[name] = rdma_rails(results)
            continue
        r = results.get(IP_ADDR_PROBE)
        try:
            out[name] = rails_from_ip_addr(r.text) if r is not None and r.ok else []
        except ParseError:
            out[name] = []
    return out


def rail_stage(options: RailOptions, before_rep: Callable[[int, int], None] | None = None) -> Stage:
    """The rail stage as a run's stage: plan rounds over the reached nodes that list a rail,
    run them over SSH (or as srun steps of one allocation under ``--slurm``), save each pair's
    record. Nodes without a rail are left to the check, which names them."""

    def stage(ctx: StageContext) -> None:
        rails = node_rails(ctx.evidence, options.tool)
        members = [h for h in ctx.hosts if rails.get(h.name)]
        plan = plan_rail_rounds([h.name for h in members])
        if not plan.rounds:
            return
        if ctx.slurm is None:
            nodes: dict[str, Node] = {h.name: SshNode(h, ctx.ssh) for h in members}
            try:
                run_rounds(nodes, rails, plan, options, ctx.on_result, before_rep)
            finally:
                for node in nodes.values():
                    node.close()
            return
        names = [h.name for h in members]
        steps = options.reps + (1 if options.latency and options.tool != "iperf3" else 0)
        budget = len(plan.rounds) * steps * (options.limit_s + 60.0)
        alloc = allocate(names, ctx.slurm, f"preflight-{ctx.run_id}-fabric", budget)
        if alloc.job is None:
            raise FabricStageError(f"slurm: {alloc.why_not}")
        try:
            run_rounds({n: SlurmNode(n, alloc.job) for n in names}, rails, plan, options, ctx.on_result, before_rep)
        finally:
            release(alloc.job)

    return stage


class FabricStageError(RuntimeError):
    """The stage could not start at all (its allocation refused)."""
