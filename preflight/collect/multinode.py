"""Multi-node all_reduce through mpirun (``preflight run --nccl-multinode``), its split
variants, and the bisection's runs that name the node (or path) to blame: execution only.

After the per-host probes, with at least two reachable hosts whose GPU count is known, the
stage picks a launcher (the first such host in inventory order) and runs there, one after the
other, each under ``timeout``::

    mpirun --hostfile F -np N --tag-output [MPIRUN_ARGS] -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS \
        [-x NCCL_TESTS_SPLIT] all_reduce_perf -b 8 -e MAX -f 2 -g 1 -c 1

(``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET``: WARN lines, plus each rank's out-of-band
address, which maps the peer address of a WARN line back to its host)

- ``nccl-multinode``: every host, one rank per GPU;
- ``nccl-multinode-intra``: ``NCCL_TESTS_SPLIT="DIV <gpus>"``: one communicator per node, so
  only NVLink/intra-node paths carry traffic;
- ``nccl-multinode-inter``: ``NCCL_TESTS_SPLIT="MOD <gpus>"``: one communicator per local GPU
  index, one rank per node, so only the NICs and the fabric carry traffic.

When one of them does not pass (or, for the CPU engine, when the fleet run fails, hangs or is
slow), the bisection of preflight/fabric/bisection.py decides the next runs: halves of the
failing group at once (``nccl-bisect-<round>-<i>``), cross-boundary pairings when both halves
pass, and finally 2-node runs of the remaining suspects with nodes that passed
(``nccl-pair-<suspect>-<partner>``). Which runs to launch is the planner's; whether a run
passed is the judge's (preflight/judge/collective.py, handed in as ``judge``): this module
only launches, through ``Node``, and records.

Engines (``MultinodeOptions.tool``): ``nccl`` runs nccl-tests' all_reduce_perf (GPUs, MPI=1
build); ``mpi`` runs preflight/node/mpi_allreduce.py under ``python3 -c`` (python3-mpi4py and
openmpi-bin on every node, one rank per node), whose traffic crosses whatever links join the
nodes, so a CPU test bed runs the same stage. ``mpirun_args`` go to mpirun before the program
(a site's ``--mca`` settings; the test bed's ``--allow-run-as-root`` and ssh agent).

Requirements (why it is off by default): Open MPI's ``mpirun`` on the launcher, passwordless
SSH from the launcher to every node (mpirun starts its daemons over SSH), and all_reduce_perf
built with MPI=1 at the same path on every node. Hosts are written to the hostfile by name as
the inventory has them, through the SSH channel's stdin; no host name reaches a shell.

Every run's output lands in the bundle under the pseudo-host ``bundle.FLEET_HOST``, in the
nccl probe's format (``# preflight: tool=mpirun gpus=G repetitions=1``, the hostfile's lines as
``# preflight: host NAME slots=G``, the output, ``# preflight: repetition 1 exit=C
seconds=S``), so ``preflight.parse.nccl_probe.parse_probe_output`` reads it and the hosts of a run are in its
own output. GNU ``timeout`` signals its whole process group on expiry, so mpirun and its
children stop together; exit 124/137 then marks a hang.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.resources import files

from preflight.collect import scripts
from preflight.collect.nccl import KILL_AFTER_S, NcclOptions
from preflight.collect.nccl import PROBE_ID as NCCL_PROBE_ID
from preflight.collect.node import Node, now_iso
from preflight.fabric.bisection import PAIR_PREFIX, Bisection, GroupRun, Verdict, bisect, pair_probe
from preflight.model import Host, ProbeResult
from preflight.parse import ParseError
from preflight.parse.collective_run import MPI_TOOL, MultinodeRun, read_run
from preflight.parse.nccl_probe import parse_probe_output
from preflight.parse.nvidia_smi import parse_smi_xml

__all__ = ["PAIR_PREFIX", "MultinodeRun", "pair_probe", "read_run"]  # where the check and tests found them

PROBE_FULL = "nccl-multinode"
PROBE_INTRA = "nccl-multinode-intra"
PROBE_INTER = "nccl-multinode-inter"
VARIANTS = (PROBE_FULL, PROBE_INTRA, PROBE_INTER)
TOOLS = ("nccl", "mpi")
NODE_DIR = "~/.cache/preflight/multinode"
_GRACE_S = 30.0  # beyond the remote timeout: setup, the SIGKILL grace, the transfer

SCRIPT = scripts.read("multinode_all_reduce.sh").replace("@KILL_AFTER@", str(KILL_AFTER_S))
MPI_SOURCE = files("preflight.node").joinpath("mpi_allreduce.py").read_text()

# A round's verdicts from its runs, read back (preflight.judge.collective.RoundJudge).
Judge = Callable[[Sequence[MultinodeRun]], Mapping[str, Verdict]]


def single_node_failed(result: ProbeResult | None) -> bool:
    """Whether a host's own nccl-all-reduce probe shows a repetition that did not pass."""
    if result is None or result.stdout is None:
        return False
    try:
        out = parse_probe_output(result.text, cut_off=result.timed_out)
    except ParseError:
        return False
    return out.cut_off or any(
        rep.exit_code not in (0, None) or not rep.runs or not all(r.complete and not r.errors for r in rep.runs)
        for rep in out.repetitions)


# --------------------------------------------------------------------------- the stage


@dataclass(frozen=True)
class MultinodeOptions:
    max_bytes: int = 8 << 30
    timeout_s: float = 300.0  # per mpirun run
    tests_dir: str | None = None  # where all_reduce_perf lives on every node; None: PATH
    node_dir: str = NODE_DIR  # on the launcher: <node-dir>/<run-id>/<probe>.hosts
    tool: str = "nccl"  # "nccl": all_reduce_perf; "mpi": preflight/node/mpi_allreduce.py
    mpirun_args: tuple[str, ...] = ()  # extra mpirun options, before the program
    python: str = "python3"  # the mpi engine's interpreter on the nodes (with mpi4py)
    mpi_bytes: int = 1 << 20  # the mpi engine's message size
    expect_busbw_gbs: float | None = None  # below slow_ratio of it a run is slow
    slow_ratio: float = 0.5
    reps: int = 1  # repetitions of each fleet run (the bisection's runs run once)

    @classmethod
    def from_nccl(cls, nccl: NcclOptions, node_dir: str = NODE_DIR, **kw) -> MultinodeOptions:
        return cls(nccl.max_bytes, nccl.timeout_s, nccl.tests_dir, node_dir, **kw)

    @property
    def ranks_per_gpu(self) -> bool:
        return self.tool == "nccl"


def expect_note(options: MultinodeOptions) -> str:
    """What "slow" meant for these runs, as the runs' notes carry it."""
    floor = "none" if options.expect_busbw_gbs is None else f"{options.expect_busbw_gbs:g}"
    return f"busbw={floor} ratio={options.slow_ratio:g}"


def program(options: MultinodeOptions) -> list[str]:
    if options.tool == "mpi":
        return [options.python, "-c", MPI_SOURCE, "--bytes", str(options.mpi_bytes)]
    binary = f"{options.tests_dir.rstrip('/')}/all_reduce_perf" if options.tests_dir else "all_reduce_perf"
    return [binary, "-b", "8", "-e", str(options.max_bytes), "-f", "2", "-g", "1", "-c", "1"]


def run_argv(options: MultinodeOptions, run_id: str, probe: str, split: str, np: int, gpus: int) -> list[str]:
    tool = MPI_TOOL if options.tool == "mpi" else "mpirun"
    env = ["-x", "NCCL_DEBUG", "-x", "NCCL_DEBUG_SUBSYS"] + (["-x", "NCCL_TESTS_SPLIT"] if split else [])
    reps = options.reps if probe in VARIANTS else 1
    return ["sh", "-c", SCRIPT, "sh", f"{options.node_dir.rstrip('/')}/{run_id}", f"{probe}.hosts",
            f"{options.timeout_s:g}", split, str(gpus), tool, str(reps),
            "-np", str(np), "--tag-output", *options.mpirun_args, *(env if options.tool == "nccl" else []),
            *program(options)]


def hostfile(hosts: Sequence[str], slots: int, addresses: Mapping[str, str] = {}, expect: str = "") -> bytes:
    """The hostfile, with notes as comment lines (Open MPI skips lines that start with #): the
    address each host resolves to where it differs from the name (ssh's errors name the
    address), and the expectation the runs were judged by (so a bundle is judged again alike)."""
    notes = f"# preflight: expect {expect}\n" if expect else ""
    notes += "".join(f"# preflight: address {h} {addresses[h]}\n" for h in hosts if addresses.get(h, h) != h)
    return (notes + "".join(f"{h} slots={slots}\n" for h in hosts)).encode()


RunOne = Callable[..., MultinodeRun]  # (probe, members, split="") -> the run, once its result is recorded


def run_stage(hosts: Sequence[str], gpus: int, launcher: Node, options: MultinodeOptions, run_id: str,
              on_result: Callable[[ProbeResult], None], fleet_host: str, judge: Judge,
              split_once: bool = False, addresses: Mapping[str, str] = {}) -> Bisection | None:
    """The stage through mpirun on ``launcher``: every result goes to ``on_result`` as the
    pseudo-host ``fleet_host``; ``judge`` gives each round's verdicts. Returns the bisection
    walked, or None when it did not need one (or could not run)."""

    def one(probe: str, members: Sequence[str], split: str = "") -> MultinodeRun:
        argv = run_argv(options, run_id, probe, split, len(members) * gpus, gpus)
        reps = options.reps if probe in VARIANTS else 1
        r = launcher.run(argv, stdin=hostfile(members, gpus, addresses, expect_note(options)),
                         timeout=(options.timeout_s + KILL_AFTER_S) * reps + _GRACE_S)
        result = ProbeResult(probe, fleet_host, tuple(argv), r.stdout, r.stderr, r.exit_code, r.started,
                             r.duration_s, r.timed_out, r.error)
        on_result(result)
        return read_run(result)

    return run_pass(hosts, gpus, one, judge, options.tool, split_once)


def run_pass(hosts: Sequence[str], gpus: int, one: RunOne, judge: Judge, tool: str = "nccl",
             split_once: bool = False) -> Bisection | None:
    """The fleet runs (nccl: the full run and its intra/inter-node splits; mpi: the full run),
    then, if one does not pass, the bisection; ``one`` runs and records one all_reduce (through
    mpirun, or as an srun step) and reads it back."""
    if tool == "nccl":
        runs = [one(PROBE_FULL, hosts), one(PROBE_INTRA, hosts, f"DIV {gpus}"), one(PROBE_INTER, hosts, f"MOD {gpus}")]
    else:
        runs = [one(PROBE_FULL, hosts)]
    verdicts = judge(runs)
    if any(v == "unknown" for v in verdicts.values()):
        return None  # the launcher could not run the test: the check says why, nothing to bisect
    failed = [r.probe for r in runs if verdicts[r.probe] == "fail"]
    if not failed and not split_once:
        return None
    # Bisect the traffic that failed: the inter-node split when it did (the fabric), else the full run.
    split = f"MOD {gpus}" if PROBE_INTER in failed else ""
    return bisect(hosts, lambda groups: _run_round(groups, one, split, judge), fleet="fail" if failed else "pass",
                  split_once=split_once)


def _run_round(groups: Sequence[GroupRun], one: RunOne, split: str, judge: Judge) -> Mapping[str, Verdict]:
    """A round's groups at once: they share no node, so their GPUs and NICs do not interfere."""
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        runs = list(pool.map(lambda g: one(g.probe, g.members, split), groups))
    return judge(runs)


def gpus_of(results: Mapping[str, ProbeResult]) -> int | None:
    """GPUs of a host as its evidence says: the nccl probe's count (``nvidia-smi -L``), else
    the GPUs of ``nvidia-smi -q -x``."""
    nccl, smi = results.get(NCCL_PROBE_ID), results.get("nvidia-smi-q-x")
    if nccl is not None and nccl.stdout:
        try:
            gpus = parse_probe_output(nccl.text, cut_off=nccl.timed_out).gpus
        except ParseError:
            gpus = None
        if gpus:
            return gpus
    if smi is not None and smi.ok:
        try:
            report = parse_smi_xml(smi.text)
        except ParseError:
            return None
        # An output cut short shows the GPUs before the cut, not the host's: no count.
        return (len(report.gpus) or None) if report.cut is None else None
    return None


def record_not_run(probes: Iterable[str], on_result: Callable[[ProbeResult], None], fleet_host: str,
                   why: str) -> None:
    """Each of ``probes`` recorded as not run, saying why, so the finding can say it too."""
    for probe in probes:
        on_result(ProbeResult(probe, fleet_host, (), None, "", None, now_iso(), 0.0, False, why))


def stage_members(hosts: Sequence[Host], evidence: Mapping[str, Mapping[str, ProbeResult]],
                  on_result: Callable[[ProbeResult], None], fleet_host: str,
                  tool: str = "nccl") -> tuple[list[Host], int, set[str]] | str:
    """The hosts the stage runs on (reached; for nccl, GPU count known), the ranks per host it
    uses and the hosts whose own all_reduce failed; or why it cannot run, recorded as the full
    run's result."""
    if tool == "mpi":
        members = [h for h in hosts if h.name in evidence]
        counts = {h.name: 1 for h in members}
    else:
        counts = {h.name: gpus_of(evidence[h.name]) for h in hosts if h.name in evidence}
        members = [h for h in hosts if counts.get(h.name)]
    if len(members) < 2:
        what = "reachable host(s)" if tool == "mpi" else "reachable host(s) with a known GPU count"
        why = f"{len(members)} {what}: a multi-node run needs two"
        # Recorded, so the nccl-multinode finding says why the run asked for did not happen.
        record_not_run([PROBE_FULL], on_result, fleet_host, why)
        return why
    # NCCL_TESTS_SPLIT's DIV/MOD need the same ranks on every node: the smallest count is used.
    gpus = min(counts[h.name] for h in members)
    failed = {h.name for h in members if single_node_failed(evidence[h.name].get(NCCL_PROBE_ID))}
    return members, gpus, failed
