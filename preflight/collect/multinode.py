"""Multi-node nccl all_reduce through mpirun (``preflight run --nccl-multinode``), its split
variants, and the re-pairing pass that names the node to blame.

After the per-host probes, with at least two reachable hosts whose GPU count is known, the
stage picks a launcher (the first such host in inventory order) and runs there, one after the
other, each under ``timeout``::

    mpirun --hostfile F -np N --tag-output -x NCCL_DEBUG [-x NCCL_TESTS_SPLIT] \
        all_reduce_perf -b 8 -e MAX -f 2 -g 1 -c 1

- ``nccl-multinode``: every host, one rank per GPU;
- ``nccl-multinode-intra``: ``NCCL_TESTS_SPLIT="DIV <gpus>"``: one communicator per node, so
  only NVLink/intra-node paths carry traffic;
- ``nccl-multinode-inter``: ``NCCL_TESTS_SPLIT="MOD <gpus>"``: one communicator per local GPU
  index, one rank per node, so only the NICs and the fabric carry traffic.

When one of them does not pass, the re-pairing pass runs 2-node all_reduces
(``nccl-pair-<suspect>-<partner>``) that put each suspect with a partner believed good, so that
only a bad node's pairs fail; a second round pairs the hosts not yet cleared with the ones a
passing pair cleared when the first round isolated nobody. Pairs judge completion and
results, not bandwidth. This is the method of Google's cluster-health-scanner (its NCCL
check runs node pairs, then a "second pass" that re-pairs the nodes of failed pairs with nodes
that passed), adapted to an SSH launcher: suspects come first from the evidence (hosts whose
single-node all_reduce failed, hosts NCCL WARN lines or failing ranks name); only when nothing
names anyone are all hosts paired blind, and a second round then re-pairs the hosts of failed
pairs with hosts of passed ones. ``plan_pairs`` and ``attribute`` are the pure halves of that.

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

import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from preflight.collect import scripts
from preflight.collect.nccl import KILL_AFTER_S, NcclOptions
from preflight.collect.nccl import PROBE_ID as NCCL_PROBE_ID
from preflight.collect.node import Node, now_iso
from preflight.collect.ssh import SshNode, SshOptions
from preflight.model import Host, ProbeResult
from preflight.parse import ParseError
from preflight.parse.nccl_probe import NcclProbeOutput, parse_probe_output
from preflight.parse.nvidia_smi import parse_smi_xml

PROBE_FULL = "nccl-multinode"
PROBE_INTRA = "nccl-multinode-intra"
PROBE_INTER = "nccl-multinode-inter"
VARIANTS = (PROBE_FULL, PROBE_INTRA, PROBE_INTER)
PAIR_PREFIX = "nccl-pair-"
NODE_DIR = "~/.cache/preflight/multinode"
_GRACE_S = 30.0  # beyond the remote timeout: setup, the SIGKILL grace, the transfer

SCRIPT = scripts.read("multinode_all_reduce.sh").replace("@KILL_AFTER@", str(KILL_AFTER_S))

_HOST_LINE = re.compile(r"^# preflight: host (\S+) slots=(\d+)\s*$")
_RANK_TAG = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:(.*)$")
_FAILURE = re.compile(r"NCCL WARN|Test (?:CUDA |NCCL )?failure")


def pair_probe(suspect: str, partner: str) -> str:
    return f"{PAIR_PREFIX}{suspect}-{partner}"


# --------------------------------------------------------------------------- reading a run


@dataclass(frozen=True)
class MultinodeRun:
    """One mpirun all_reduce of the stage, as its saved output tells it."""

    probe: str
    hosts: tuple[str, ...]  # from the hostfile lines it printed, in rank order
    slots: int | None  # ranks (GPUs) per host
    state: str  # "passed" | "hung" | "failed" | "not-run"
    why: str  # for hung/failed/not-run: what happened
    output: NcclProbeOutput | None  # None when it did not run
    wrong: int  # #wrong summed over its rows, plus out-of-bounds values
    named: tuple[str, ...]  # host names as NCCL printed them on WARN / failure lines
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.state == "passed" and not self.wrong


def read_run(result: ProbeResult) -> MultinodeRun:
    """Parse one stage result; never raises."""
    if result.error or result.stdout is None or result.tool_missing:
        why = result.error or (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
        return MultinodeRun(result.probe, (), None, "not-run", why, None, 0, (), ())
    text = result.text
    hosts, slots = [], None
    for line in text.splitlines():
        if m := _HOST_LINE.match(line.strip()):
            hosts.append(m.group(1))
            slots = int(m.group(2))
    try:
        out = parse_probe_output(text, cut_off=result.timed_out)
    except ParseError as exc:
        return MultinodeRun(result.probe, tuple(hosts), slots, "failed", f"unreadable output ({exc})",
                            None, 0, (), ())
    state, why = _state(out)
    runs = [run for rep in out.repetitions for run in rep.runs]
    wrong = sum((h.wrong or 0) for run in runs for row in run.rows
                for h in (row.in_place, row.out_of_place) if h is not None)
    wrong += sum(run.out_of_bounds or 0 for run in runs)
    return MultinodeRun(result.probe, tuple(hosts), slots, state, why, out, wrong,
                        _named_hosts(text, out), out.notes)


def _state(out: NcclProbeOutput) -> tuple[str, str]:
    if not out.repetitions:
        return ("hung", "cut off before mpirun printed anything") if out.cut_off else (
            "failed", "no all_reduce output")
    return out.repetitions[0].state("mpirun") or ("hung", "still running when the controller's timeout stopped it")


def _named_hosts(text: str, out: NcclProbeOutput) -> tuple[str, ...]:
    """Hosts that WARN lines name (NCCL prefixes its log lines with the host name), and hosts
    of the ranks whose tagged output holds a WARN or failure line (mpirun --tag-output gives
    the rank, the run's device lines give its host)."""
    names = [s.host for s in out.signatures if s.level == "WARN" and s.host]
    rank_host = {d.rank: d.host for rep in out.repetitions for run in rep.runs for d in run.devices}
    for line in text.splitlines():
        m = _RANK_TAG.match(line.strip())
        if m and _FAILURE.search(m.group(2)) and int(m.group(1)) in rank_host:
            names.append(rank_host[int(m.group(1))])
    return tuple(dict.fromkeys(names))


def inventory_names(printed: Iterable[str], hosts: Sequence[str]) -> tuple[str, ...]:
    """Printed host names (``gpu03``) as inventory names (``gpu03.dc1``): exact, else the same
    first label. Names that match no host are left out."""
    found = []
    for name in printed:
        if name in hosts:
            found.append(name)
            continue
        label = name.split(".")[0]
        found += [h for h in hosts if h.split(".")[0] == label]
    return tuple(h for h in hosts if h in found)


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


# --------------------------------------------------------------------------- the planner


@dataclass(frozen=True)
class PairPlan:
    pairs: tuple[tuple[str, str], ...]  # (suspect, partner)
    blind: bool  # nobody was known good: hosts were paired among themselves
    untested: tuple[str, ...]  # suspects left without a partner
    notes: tuple[str, ...]


def suspects(hosts: Sequence[str], single_failed: Collection[str], named: Collection[str]) -> tuple[str, ...]:
    """Who to re-pair after a failed multi-node run: hosts whose single-node run failed and
    hosts the failing runs name; all hosts when the evidence names nobody."""
    picked = tuple(h for h in hosts if h in single_failed or h in named)
    return picked or tuple(hosts)


def plan_pairs(hosts: Sequence[str], suspected: Collection[str], good: Collection[str] = (),
               done: Collection[tuple[str, str]] = ()) -> PairPlan:
    """2-node runs that make only a bad node fail.

    Each suspect gets a partner from ``good`` (proven or presumed good), spread round-robin
    so no partner carries many suspects, skipping pairs already ``done``. Without any good
    host the suspects are paired among themselves (blind): a second call with the hosts of the
    passing pairs as ``good`` then re-pairs the rest."""
    ordered = [h for h in hosts if h in suspected]
    partners = [h for h in hosts if h in good and h not in suspected]
    tried = {frozenset(p) for p in done}
    if not partners:
        pairs = [(ordered[i], ordered[i + 1]) for i in range(0, len(ordered) - 1, 2)]
        if len(ordered) % 2 and len(ordered) > 1:
            pairs.append((ordered[-1], ordered[0]))  # the odd one out joins the first again
        pairs = [p for p in pairs if frozenset(p) not in tried]
        lone = (ordered[0],) if len(ordered) == 1 else ()
        return PairPlan(tuple(pairs), True, lone,
                        ("nobody known good: suspects paired among themselves",) if pairs else ())
    pairs, untested = [], []
    for i, suspect in enumerate(ordered):
        for k in range(len(partners)):
            partner = partners[(i + k) % len(partners)]
            if frozenset((suspect, partner)) not in tried:
                pairs.append((suspect, partner))
                break
        else:
            untested.append(suspect)
    return PairPlan(tuple(pairs), False, tuple(untested), ())


@dataclass(frozen=True)
class Attribution:
    culprits: tuple[str, ...]  # failed every pair, at least one with a trusted partner
    cleared: tuple[str, ...]  # passed at least one pair
    unresolved: tuple[str, ...]  # failed, but only with partners as suspect as themselves
    failed_with: dict[str, tuple[str, ...]]  # host -> partners of its failed pairs


def attribute(outcomes: Mapping[tuple[str, str], bool], suspected: Collection[str]) -> Attribution:
    """Who the pair runs blame. A host that passed any pair works; one whose pairs all failed
    is the culprit when a partner is trusted: it passed another pair, or nothing suspected it."""
    cleared = {h for pair, ok in outcomes.items() if ok for h in pair}
    failed_with: dict[str, list[str]] = {}
    for (a, b), ok in outcomes.items():
        if not ok:
            failed_with.setdefault(a, []).append(b)
            failed_with.setdefault(b, []).append(a)

    def trusted(partner: str) -> bool:
        return partner in cleared or partner not in suspected

    culprits = {h for h, partners in failed_with.items()
                if h not in cleared and any(trusted(p) for p in partners)}
    # A partner that only ever failed beside a culprit is not suspect on that account.
    unresolved = {h for h, partners in failed_with.items()
                  if h not in cleared and h not in culprits and set(partners) - culprits}
    order = list(dict.fromkeys(h for pair in outcomes for h in pair))
    return Attribution(tuple(h for h in order if h in culprits),
                       tuple(h for h in order if h in cleared),
                       tuple(h for h in order if h in unresolved),
                       {h: tuple(p) for h, p in failed_with.items()})


# --------------------------------------------------------------------------- the stage


@dataclass(frozen=True)
class MultinodeOptions:
    max_bytes: int = 8 << 30
    timeout_s: float = 300.0  # per mpirun run
    tests_dir: str | None = None  # where all_reduce_perf lives on every node; None: PATH
    node_dir: str = NODE_DIR  # on the launcher: <node-dir>/<run-id>/<probe>.hosts

    @classmethod
    def from_nccl(cls, nccl: NcclOptions, node_dir: str = NODE_DIR) -> MultinodeOptions:
        return cls(nccl.max_bytes, nccl.timeout_s, nccl.tests_dir, node_dir)




def run_argv(options: MultinodeOptions, run_id: str, probe: str, split: str, np: int, gpus: int) -> list[str]:
    binary = f"{options.tests_dir.rstrip('/')}/all_reduce_perf" if options.tests_dir else "all_reduce_perf"
    return ["sh", "-c", SCRIPT, "sh", f"{options.node_dir.rstrip('/')}/{run_id}", f"{probe}.hosts",
            f"{options.timeout_s:g}", split, str(np), str(gpus), str(options.max_bytes), binary]


def hostfile(hosts: Sequence[str], slots: int) -> bytes:
    return "".join(f"{h} slots={slots}\n" for h in hosts).encode()


def run_stage(hosts: Sequence[str], gpus: int, single_failed: Collection[str], launcher: Node,
              options: MultinodeOptions, run_id: str, on_result: Callable[[ProbeResult], None],
              fleet_host: str) -> None:
    """The stage through mpirun on ``launcher``: every result goes to ``on_result`` as the
    pseudo-host ``fleet_host`` (``run_pass`` decides what runs)."""

    def one(probe: str, members: Sequence[str], split: str = "") -> MultinodeRun:
        argv = run_argv(options, run_id, probe, split, len(members) * gpus, gpus)
        r = launcher.run(argv, stdin=hostfile(members, gpus), timeout=options.timeout_s + KILL_AFTER_S + _GRACE_S)
        result = ProbeResult(probe, fleet_host, tuple(argv), r.stdout, r.stderr, r.exit_code, r.started,
                             r.duration_s, r.timed_out, r.error)
        on_result(result)
        return read_run(result)

    run_pass(hosts, gpus, single_failed, one)


RunOne = Callable[..., MultinodeRun]  # (probe, members, split="") -> the run, once its result is recorded


def run_pass(hosts: Sequence[str], gpus: int, single_failed: Collection[str], one: RunOne) -> None:
    """The three variants, then, if one did not pass, the re-pairing rounds; ``one`` runs and
    records one all_reduce (through mpirun, or as an srun step) and reads it back."""
    runs = [one(PROBE_FULL, hosts), one(PROBE_INTRA, hosts, f"DIV {gpus}"), one(PROBE_INTER, hosts, f"MOD {gpus}")]
    if all(r.ok for r in runs) or any(r.state == "not-run" for r in runs):
        return
    named = inventory_names((n for r in runs for n in r.named), hosts)
    suspected = suspects(hosts, single_failed, named)
    plan = plan_pairs(hosts, suspected, [h for h in hosts if h not in suspected])
    outcomes = _run_pairs(plan.pairs, lambda a, b: one(pair_probe(a, b), (a, b)).ok)
    found = attribute(outcomes, suspected)
    if found.culprits:
        return
    # Nobody isolated: the first round was blind, or it cleared the hosts the evidence named
    # (a WARN line names the node that saw the error, which may be the bad node's peer). The
    # hosts not yet cleared are paired with the ones that were.
    rest = [h for h in hosts if h not in found.cleared]
    second = plan_pairs(hosts, rest, found.cleared, done=outcomes)
    if found.cleared:
        _run_pairs(second.pairs, lambda a, b: one(pair_probe(a, b), (a, b)).ok)


def _run_pairs(pairs: Sequence[tuple[str, str]], run: Callable[[str, str], bool]) -> dict[tuple[str, str], bool]:
    """Run pairs in batches of disjoint pairs, the pairs of a batch at once (they share no node,
    so their GPUs and NICs do not interfere)."""
    outcomes: dict[tuple[str, str], bool] = {}
    lock = threading.Lock()
    for batch in _disjoint_batches(pairs):
        with ThreadPoolExecutor(max_workers=len(batch)) as pool:
            for pair, ok in zip(batch, pool.map(lambda p: run(*p), batch), strict=True):
                with lock:
                    outcomes[pair] = ok
    return outcomes


def _disjoint_batches(pairs: Sequence[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    batches: list[list[tuple[str, str]]] = []
    for pair in pairs:
        for batch in batches:
            if not any(set(pair) & set(other) for other in batch):
                batch.append(pair)
                break
        else:
            batches.append([pair])
    return batches


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
                  on_result: Callable[[ProbeResult], None],
                  fleet_host: str) -> tuple[list[Host], int, set[str]] | str:
    """The hosts the stage runs on (reached, GPU count known), the GPUs per host it uses and the
    hosts whose own all_reduce failed; or why it cannot run, recorded as the full run's result."""
    counts = {h.name: gpus_of(evidence[h.name]) for h in hosts if h.name in evidence}
    members = [h for h in hosts if counts.get(h.name)]
    if len(members) < 2:
        why = f"{len(members)} reachable host(s) with a known GPU count: a multi-node run needs two"
        # Recorded, so the nccl-multinode finding says why the run asked for did not happen.
        record_not_run([PROBE_FULL], on_result, fleet_host, why)
        return why
    # NCCL_TESTS_SPLIT's DIV/MOD need the same ranks on every node: the smallest count is used.
    gpus = min(counts[h.name] for h in members)
    failed = {h.name for h in members if single_node_failed(evidence[h.name].get(NCCL_PROBE_ID))}
    return members, gpus, failed


def run_multinode(hosts: Sequence[Host], evidence: Mapping[str, Mapping[str, ProbeResult]],
                  on_result: Callable[[ProbeResult], None], ssh: SshOptions, options: MultinodeOptions,
                  run_id: str, fleet_host: str) -> str | None:
    """The stage over SSH, after the per-host probes; ``evidence`` holds the probe results of
    the hosts that were reached. Every result goes to ``on_result`` as ``fleet_host``. Returns
    why it did not run (fewer than two hosts to run on), else None."""
    picked = stage_members(hosts, evidence, on_result, fleet_host)
    if isinstance(picked, str):
        return picked
    members, gpus, failed = picked
    names = [h.name for h in members]
    launcher = SshNode(members[0], ssh)
    why = launcher.connect()
    if why:
        record_not_run(VARIANTS, on_result, fleet_host, f"launcher {members[0].name}: {why}")
        return None
    try:
        run_stage(names, gpus, failed, launcher, options, run_id, on_result, fleet_host)
    finally:
        launcher.close()
    return None
