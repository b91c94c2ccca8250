"""One saved run of the multi-node collective (``nccl-multinode*``, ``nccl-bisect-*``,
``nccl-pair-*``), read back: who took part, how it ended, and what its output says about why.

The saved format is preflight/collect/multinode.py's: ``# preflight: tool=T gpus=G
repetitions=1``, the hostfile as ``# preflight: host NAME slots=G``, the launcher's output, and
``# preflight: repetition 1 exit=C seconds=S``. ``T`` is ``mpirun`` or ``srun`` for nccl-tests'
all_reduce_perf, ``mpi4py`` for the CPU engine (preflight/node/mpi_allreduce.py).

Beyond passed / hung / failed, three readings the field needs (issue 32):

- **never ran**: the launcher could not start the test on every node: ssh refused or timed
  out, Open MPI's daemon could not start or was lost. Open MPI says so in its own words
  ("ORTE was unable to reliably start one or more daemons", "ORTE has lost communication with
  a remote daemon ... on node N"; PRRTE's "PRTE ..." in Open MPI 5). That is no fabric fault
  and no unreadable output: the host named is unreachable from the launcher.
- **init failed**: NCCL stopped before any results table, with a WARN line whose source file
  or text names the transport: NET/IB (with the HCA from "on dev mlx5_0:1" or "dev mlx5_0"),
  NVLS (transport/nvls.cc: NVLink SHARP through the NVSwitches, which the fabric manager
  programs), P2P (transport/p2p.cc), or the socket transport.
- **where it hung**: NCCL prefixes its lines with the host that printed them, names the peer
  by address ("Got completion from peer 10.2.0.5<33092>", "Connect to 10.148.3.247<56821>
  failed"), and prints each rank's out-of-band address at INFO level ("Bootstrap : Using
  eth0:ADDR", "NET/IB : Using [0]mlx5_0:1/IB ... ; OOB eth0:ADDR"): the peer's address is
  mapped back to its host through those lines, or through the inventory's own addresses. The
  CPU engine's ranks print ``ready`` and ``done``: the ranks that never finished are named.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from preflight.model import ProbeResult
from preflight.parse import ParseError
from preflight.parse.mpi_allreduce import MpiAllreduce, parse_mpi_allreduce
from preflight.parse.nccl_probe import TIMEOUT_EXITS, NcclProbeOutput, parse_probe_output
from preflight.parse.nccl_signatures import MPI_TAG, NCCL_LOG

MPI_TOOL = "mpi4py"
_HOST_LINE = re.compile(r"^# preflight: host (\S+) slots=(\d+)\s*$")
_ADDRESS_LINE = re.compile(r"^# preflight: address (\S+) (\S+)\s*$")
_EXPECT_LINE = re.compile(r"^# preflight: expect busbw=(none|[0-9.eE+-]+) ratio=([0-9.eE+-]+)\s*$")
_TOOL = re.compile(r"^# preflight: tool=(\S+) gpus=\d+ repetitions=\d+\s*$")
_MARK = re.compile(r"^# preflight: repetition \d+ exit=(\d+) seconds=(\d+)\s*$")
_RANK_TAG = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:(.*)$")
_FAILURE = re.compile(r"NCCL WARN|Test (?:CUDA |NCCL )?failure")

# Open MPI's launcher (ORTE in 4.x, PRRTE in 5.x) and the ssh it starts daemons with.
_DAEMONS_NOT_STARTED = re.compile(r"\b(?:ORTE|PRTE) was unable to reliably start one or more daemons")
_DAEMON_LOST = re.compile(r"\b(?:ORTE|PRTE) has lost communication with a remote daemon")
_REMOTE_DAEMON = re.compile(r"Remote daemon:\s*\S+ on node (\S+)")
_SSH = re.compile(r"^ssh: (?:connect to host (\S+) port \d+: (.+)|Could not resolve hostname (\S+?):? (.+))$")
_SSH_DENIED = re.compile(r"^(?:\S+@)?(\S+): Permission denied \(")

_PEER = re.compile(r"(?:from peer|[Cc]onnect to|remote peer|peer) "
                   r"(\d{1,3}(?:\.\d{1,3}){3}|\[?[0-9a-fA-F:]+\]?)<\d+>")
_OOB = re.compile(r"(?:Bootstrap ?: Using|OOB) \S+?:(\d{1,3}(?:\.\d{1,3}){3}|[0-9a-fA-F:]+)<\d+>")
_HCA = re.compile(r"\bon dev (\S+?):(\d+)\b|\bdev (mlx\w+|ib\w+|irdma\w+|bnxt\w+)(?::(\d+))?\b")


@dataclass(frozen=True)
class InitFailure:
    transport: str  # "NET/IB" | "NVLS" | "P2P"
    hca: str | None  # "mlx5_0:1" for NET/IB when the line names it
    host: str | None  # as NCCL printed it
    line: str


@dataclass(frozen=True)
class MultinodeRun:
    """One collective run, as its saved output tells it."""

    probe: str
    hosts: tuple[str, ...]  # from the hostfile lines it printed, in rank order
    slots: int | None  # ranks (GPUs) per host
    state: str  # "passed" | "hung" | "failed" | "not-run" | "never-ran"
    why: str  # for everything but passed: what happened
    output: NcclProbeOutput | None  # nccl-tests' reading; None for the CPU engine or when it did not run
    wrong: int  # #wrong summed over its rows, plus out-of-bounds values
    named: tuple[str, ...]  # host names as NCCL printed them on WARN / failure lines
    notes: tuple[str, ...]
    tool: str = ""
    mpi: MpiAllreduce | None = None  # the CPU engine's reading
    unreachable: tuple[str, ...] = ()  # never-ran: hosts (or addresses) the launcher could not start
    init_failure: InitFailure | None = None
    peers: tuple[str, ...] = ()  # peer addresses NCCL's WARN lines name
    addresses: tuple[tuple[str, str], ...] = ()  # (address, host): NCCL INFO lines, the hostfile's notes
    seconds: float | None = None
    expect: tuple[float | None, float] | None = None  # (busbw floor or None, slow ratio) the stage judged by
    repetitions: tuple[str, ...] = ()  # each repetition's state, when it has several

    @property
    def flaky(self) -> bool:
        """Passed in some repetitions, not in others: the field report's signature."""
        return "passed" in self.repetitions and any(s != "passed" for s in self.repetitions)

    @property
    def ok(self) -> bool:
        return self.state == "passed" and not self.wrong

    @property
    def busbw_gbs(self) -> float | None:
        """The largest size's bus bandwidth (nccl-tests), or the CPU engine's figure."""
        if self.mpi is not None:
            return self.mpi.busbw_gbs
        rows = [row for rep in (self.output.repetitions if self.output else ()) for run in rep.runs for row in run.rows]
        if not rows:
            return None
        row = max(rows, key=lambda r: r.size_bytes)
        return max(row.in_place.busbw, row.out_of_place.busbw if row.out_of_place else 0.0)


def read_run(result: ProbeResult) -> MultinodeRun:
    """Parse one stage result; never raises."""
    if result.error or result.stdout is None or result.tool_missing:
        why = result.error or (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
        return MultinodeRun(result.probe, (), None, "not-run", why, None, 0, (), ())
    text = result.text
    hosts, slots, tool, exit_code, seconds = [], None, "", None, None
    noted: list[tuple[str, str]] = []
    expect = None
    for line in text.splitlines():
        s = line.strip()
        if m := _EXPECT_LINE.match(s):
            expect = (None if m.group(1) == "none" else float(m.group(1)), float(m.group(2)))
        elif m := _ADDRESS_LINE.match(s):
            noted.append((m.group(2), m.group(1)))
        elif m := _HOST_LINE.match(s):
            hosts.append(m.group(1))
            slots = int(m.group(2))
        elif (m := _TOOL.match(s)) and not tool:
            tool = m.group(1)
        elif m := _MARK.match(s):
            exit_code, seconds = int(m.group(1)), float(m.group(2))
    common = {"tool": tool, "peers": _peers(text), "addresses": tuple(noted) + _addresses(text), "seconds": seconds,
              "expect": expect}
    if launcher := launcher_failure(text):
        why, named = launcher
        # ssh names the address it resolved; the hostfile's notes say whose it is.
        unreachable = tuple(dict((a, h) for a, h in noted).get(n, n) for n in named)
        return MultinodeRun(result.probe, tuple(hosts), slots, "never-ran", why, None, 0, (), (),
                            unreachable=unreachable, **common)
    if tool == MPI_TOOL:
        return _read_mpi(result, text, tuple(hosts), slots, exit_code, common)
    try:
        out = parse_probe_output(text, cut_off=result.timed_out)
    except ParseError as exc:
        return MultinodeRun(result.probe, tuple(hosts), slots, "failed", f"unreadable output ({exc})",
                            None, 0, (), (), **common)
    state, why, states = _state(out)
    runs = [run for rep in out.repetitions for run in rep.runs]
    wrong = sum((h.wrong or 0) for run in runs for row in run.rows
                for h in (row.in_place, row.out_of_place) if h is not None)
    wrong += sum(run.out_of_bounds or 0 for run in runs)
    init = None
    if state != "passed" and not any(run.rows for run in runs):
        init = init_failure(text)
        if init is not None:
            where = f" ({init.hca})" if init.hca else ""
            why = f"NCCL failed in {init.transport}{where} on {init.host or 'a node'} before any results: {why}"
    return MultinodeRun(result.probe, tuple(hosts), slots, state, why, out, wrong, _named_hosts(text, out),
                        out.notes, init_failure=init, repetitions=states if len(states) > 1 else (), **common)


def _read_mpi(result: ProbeResult, text: str, hosts: tuple[str, ...], slots, exit_code, common) -> MultinodeRun:
    """The CPU engine's run, repetition by repetition (each closed by its marker); the run's
    state is its worst repetition's, and a run that passed in some and not in others is flaky."""
    segments, lines = [], []
    for line in text.splitlines():
        if m := _MARK.match(line.strip()):
            segments.append(("\n".join(lines), int(m.group(1))))
            lines = []
        else:
            lines.append(line)
    if any(line.strip() for line in lines) or not segments:
        segments.append(("\n".join(lines), None))  # cut off: no marker closed it
    reps = [_mpi_repetition(body, code, result.timed_out, common) for body, code in segments]
    worst = max(reps, key=lambda r: _SEVERITY[r[0]])
    state, why, mpi, named = worst
    states = tuple(r[0] for r in reps)
    if len(reps) > 1 and state != "passed":
        passed = [str(i) for i, r in enumerate(reps, 1) if r[0] == "passed"]
        why = (f"{state} in repetition {states.index(state) + 1} of {len(reps)}"
               + (f" (passed in {', '.join(passed)})" if passed else "") + f": {why}")
    if state == "never-ran":
        return MultinodeRun(result.probe, hosts, slots, state, why, None, 0, (), (), mpi=mpi, unreachable=named,
                            repetitions=states, **common)
    return MultinodeRun(result.probe, hosts, slots, state, why, None, mpi.wrong, named if state == "hung" else (),
                        (), mpi=mpi, repetitions=states, **common)


_SEVERITY = {"passed": 0, "failed": 1, "hung": 2, "never-ran": 3}


def _mpi_repetition(body: str, exit_code: int | None, cut: bool, common) -> tuple[str, str, MpiAllreduce, tuple]:
    mpi = parse_mpi_allreduce(body)
    timed_out = exit_code in TIMEOUT_EXITS or (exit_code is None and cut)
    if timed_out and not mpi.ready:
        # No rank reached the all_reduce: the launcher never got the ranks running (Open MPI 4.1
        # can wait forever when one of several ssh launches fails: seen on the namespace test bed).
        said = [f"ssh to {m.group(1) or m.group(3)}: {m.group(2) or m.group(4)}"
                for raw in body.splitlines() if (m := _SSH.match(MPI_TAG.sub("", raw).strip()))]
        named = tuple(dict(common["addresses"]).get(m, m) for m in _ssh_named(body))
        return "never-ran", "no rank started before the timeout" + (f" ({'; '.join(said)})" if said else ""), mpi, named
    stopped = tuple(dict.fromkeys(mpi.stopped.values()))
    if timed_out:
        return "hung", "stopped by its timeout" + (f"; ranks that never finished: {_ranks(mpi.stopped)}"
                                                   if mpi.stopped else "; no rank reached the all_reduce"), mpi, stopped
    if exit_code is None:
        return "hung", "still running when the controller's timeout stopped it", mpi, stopped
    if exit_code != 0 or not mpi.complete:
        return "failed", f"mpirun exit {exit_code}" + ("" if mpi.complete else ", no result line"), mpi, ()
    return "passed", "", mpi, ()


def _ranks(ranks: Mapping[int, str]) -> str:
    return ", ".join(f"{r} ({h})" for r, h in sorted(ranks.items()))


def _state(out: NcclProbeOutput) -> tuple[str, str, tuple[str, ...]]:
    """The worst repetition's state and why, and every repetition's state."""
    if not out.repetitions:
        return (("hung", "cut off before mpirun printed anything", ()) if out.cut_off else
                ("failed", "no all_reduce output", ()))
    reps = [rep.state("mpirun") or ("hung", "still running when the controller's timeout stopped it")
            for rep in out.repetitions]
    state, why = max(reps, key=lambda r: _SEVERITY[r[0]])
    states = tuple(r[0] for r in reps)
    if len(reps) > 1 and state != "passed":
        passed = [str(i) for i, r in enumerate(reps, 1) if r[0] == "passed"]
        why = (f"{state} in repetition {states.index(state) + 1} of {len(reps)}"
               + (f" (passed in {', '.join(passed)})" if passed else "") + f": {why}")
    return state, why, states


def _ssh_named(text: str) -> list[str]:
    return [m.group(1) or m.group(3) for raw in text.splitlines() if (m := _SSH.match(MPI_TAG.sub("", raw).strip()))]


def launcher_failure(text: str) -> tuple[str, tuple[str, ...]] | None:
    """(why, hosts or addresses it names) when Open MPI's launcher could not start or keep the
    test on every node; None otherwise."""
    lines = [MPI_TAG.sub("", raw).strip() for raw in text.splitlines()]
    started, lost = any(_DAEMONS_NOT_STARTED.search(s) for s in lines), any(_DAEMON_LOST.search(s) for s in lines)
    ssh = [m for s in lines if (m := _SSH.match(s))]
    denied = [m.group(1) for s in lines if (m := _SSH_DENIED.match(s))]
    if not (started or lost):
        return None
    named: list[str] = [m.group(1) or m.group(3) for m in ssh] + denied
    named += [m.group(1) for s in lines if (m := _REMOTE_DAEMON.search(s))]
    reasons = [f"ssh to {m.group(1) or m.group(3)}: {m.group(2) or m.group(4)}" for m in ssh]
    reasons += [f"ssh to {h}: permission denied" for h in denied]
    what = "the launcher lost its daemon on a node" if lost and not started else \
        "the launcher could not start its daemons on every node"
    return f"{what} ({'; '.join(reasons) or 'Open MPI names no host'})", tuple(dict.fromkeys(named))


def init_failure(text: str) -> InitFailure | None:
    """The transport an NCCL init failure names, from its first WARN line that names one."""
    for raw in text.splitlines():
        line = MPI_TAG.sub("", raw).strip()
        if "NCCL WARN" not in line:
            continue
        log = NCCL_LOG.match(line)
        host = log["host"] if log else None
        if "nvls.cc" in line or "NVLS" in line or "Multicast" in line:
            return InitFailure("NVLS", None, host, line)
        if "p2p.cc" in line or "P2P" in line:
            return InitFailure("P2P", None, host, line)
        if "NET/IB" in line or "ibvwrap" in line or "net_ib" in line or "ibv_" in line:
            m = _HCA.search(line)
            hca = (f"{m.group(1)}:{m.group(2)}" if m.group(1) else m.group(3) + (f":{m.group(4)}" if m.group(4) else "")
                   ) if m else None
            return InitFailure("NET/IB", hca, host, line)
    return None


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


def _peers(text: str) -> tuple[str, ...]:
    found = []
    for raw in text.splitlines():
        line = MPI_TAG.sub("", raw).strip()
        if "NCCL WARN" in line and (m := _PEER.search(line)):
            found.append(m.group(1).strip("[]"))
    return tuple(dict.fromkeys(found))


def _addresses(text: str) -> tuple[tuple[str, str], ...]:
    found = []
    for raw in text.splitlines():
        line = MPI_TAG.sub("", raw).strip()
        if (log := NCCL_LOG.match(line)) and (m := _OOB.search(line)):
            found.append((m.group(1), log["host"]))
    return tuple(dict.fromkeys(found))


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


def peer_hosts(run: MultinodeRun, hosts: Sequence[str], known: Mapping[str, str] = {}) -> tuple[str, ...]:
    """The inventory hosts behind the peer addresses a run's WARN lines name: through the
    run's own NCCL address lines, else ``known`` (address -> inventory name)."""
    printed = dict(run.addresses)
    names = [printed.get(addr) or known.get(addr) or "" for addr in run.peers]
    return inventory_names([n for n in names if n], hosts)
