"""Following a soak: each node's files mirrored as they grow, its state judged, a live table.

Every few seconds, one small ``python3 -c _PULL`` per node returns the heartbeat and the bytes
appended to the agent's files since the last poll (the CSVs, agent.log, and the vLLM server
and load generator logs); ``Mirror`` appends them to ``reports/<run-id>/soak/<host>/``, which
therefore mirrors the node's soak directory as the run goes: a node that dies mid-run has
still delivered all but its last poll's data, and a later ``--attach`` carries on from where
the copy ends. ``HostWatch`` decides when a node is done (its agent finished or failed and every
byte is here, it died, or it stayed out of reach or silent past the planned end plus a grace
period); ``watch`` polls them all in parallel and shows the live view (state, elapsed/planned,
the node's throughput, its hottest GPU, its lowest SM clock and the clocks-event reasons active
in the latest samples), or a line per change of state without a terminal.
"""

from __future__ import annotations

import base64
import csv
import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from preflight.collect.slurm import UnavailableNode
from preflight.contracts import EVENTS_CSV, IB_COUNTERS_TXT, SLURM_ERROR, SOAK_JSON, TELEMETRY_CSV, THROUGHPUT_CSV
from preflight.evidence.atomic import write_atomic
from preflight.parse.smi_records import reasons_from_bitmask
from preflight.soak.plan import SoakPlan
from preflight.soak.ship import Started, last_json_line, make_nodes

# The agent's files besides the contract's (preflight/node/records.py and vllm_log.py name them).
HEARTBEAT_JSON = "heartbeat.json"
AGENT_LOGS = ("agent.log", "vllm-server.log", "loadgen.log")
APPEND_FILES = (TELEMETRY_CSV, THROUGHPUT_CSV, EVENTS_CSV, IB_COUNTERS_TXT, *AGENT_LOGS)
WHOLE_FILES = (HEARTBEAT_JSON, SOAK_JSON)
PULL_CAP = 4 << 20  # bytes per file per poll; a long backlog (after --attach) takes several polls
# How long past a node's planned end the controller keeps trying a node it cannot reach, or
# whose heartbeat stopped changing, before it gives up and merges what it has.
GRACE_S = 120.0
STALE_S = 60.0
FINAL_STATES = ("finished", "failed")
# The node-wide throughput rows the live view shows: the burn's rates, and of the load
# generator's many figures per window (loadgen_windows.py) the rate, the median latencies and the errors.
LIVE_METRICS = ("tflops", "hbm_gbps", "output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "errors")

# `python3 -c _PULL NODE_DIR RUN_ID CAP NAME OFFSET...`: a JSON object with, per file that
# exists, the bytes from OFFSET (from 0 when the file is shorter) and its size, and whether
# the heartbeat's pid is alive (a zombie is not: some container inits never reap). Files are
# read in argument order, heartbeat first (pull_argv): the agent writes rows before the
# heartbeat that counts them, so a final heartbeat comes with every row. An agent found gone
# has everything read again: it may have written its last rows and heartbeat and exited
# between the first reads and the check.
_PULL = """\
import base64, json, os, sys
d = os.path.abspath(os.path.join(os.path.expanduser(sys.argv[1]), sys.argv[2]))
cap = int(sys.argv[3])
out = {"exists": os.path.isdir(d), "files": {}, "alive": None}
def read(name, offset):
    try:
        with open(os.path.join(d, name), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            offset = offset if offset <= size else 0
            f.seek(offset)
            data = f.read(cap)
    except FileNotFoundError:
        return
    out["files"][name] = {"offset": offset, "size": size, "data": base64.b64encode(data).decode()}
def read_all():
    for name, offset in zip(sys.argv[4::2], sys.argv[5::2]):
        read(name, int(offset))
read_all()
try:
    pid = int(json.loads(base64.b64decode(out["files"]["heartbeat.json"]["data"]))["pid"])
    os.kill(pid, 0)
    try:
        with open("/proc/%d/stat" % pid) as f:
            out["alive"] = f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        out["alive"] = True
except ProcessLookupError:
    out["alive"] = False
except PermissionError:
    out["alive"] = True
except (KeyError, ValueError, TypeError):
    pass
if out["alive"] is False:
    read_all()
sys.stdout.write(json.dumps(out))
"""


# --- Mirroring a node's soak directory ---------------------------------------------------------


class Mirror:
    """The local copy of one node's soak directory, extended by byte offsets.

    Append-only files grow by exactly the bytes the node's files grew by, so the copy is byte
    for byte the node's (a half-written last line included, until the next poll completes it);
    heartbeat.json and soak.json are replaced whole. ``apply`` also hands back the CSV rows
    that arrived complete, for the live view. A copy left by an earlier controller (``--attach``)
    is carried on from where it ends."""

    def __init__(self, directory: Path):
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.sizes = {name: (directory / name).stat().st_size if (directory / name).exists() else 0
                      for name in APPEND_FILES}
        self.caught_up = False
        self._partial: dict[str, bytes] = {}
        self._header: dict[str, list[str]] = {}
        for name in (TELEMETRY_CSV, THROUGHPUT_CSV):
            if self.sizes[name]:
                self._resume(name)

    def _resume(self, name: str) -> None:
        with (self.dir / name).open("rb") as f:
            first = f.readline()
            f.seek(max(0, self.sizes[name] - (1 << 16)))
            tail = f.read()
        if first.endswith(b"\n"):
            self._header[name] = next(csv.reader([first.decode("utf-8", "replace")]), [])
            self._partial[name] = tail.rpartition(b"\n")[2]
        else:
            self._partial[name] = first  # not even the header is complete yet

    def pairs(self) -> list[str]:
        """What a pull reads: (file name, offset) flattened; the whole files from 0."""
        return [x for name in WHOLE_FILES for x in (name, "0")] + [
            x for name in APPEND_FILES for x in (name, str(self.sizes[name]))]

    def pull_argv(self, plan: SoakPlan, host: str) -> list[str]:
        return pull_argv(plan, host, self.pairs())


    def apply(self, files: dict) -> dict[str, list[dict]]:
        """Write what a pull brought; returns the new complete rows of the CSVs, as dicts."""
        rows: dict[str, list[dict]] = {}
        caught_up = True
        for name, item in files.items():
            data = base64.b64decode(item["data"])
            if name in WHOLE_FILES:
                if data:
                    replace_file(self.dir / name, data)
                continue
            if item["offset"] != self.sizes[name]:
                # The pull starts over (offset 0) when the node's file is shorter than our copy:
                # it was replaced. So does the copy.
                (self.dir / name).write_bytes(b"")
                self.sizes[name] = 0
                self._partial.pop(name, None)
                self._header.pop(name, None)
            with (self.dir / name).open("ab") as f:
                f.write(data)
            self.sizes[name] += len(data)
            caught_up = caught_up and self.sizes[name] >= item["size"]
            if name in (TELEMETRY_CSV, THROUGHPUT_CSV):
                rows[name] = self._rows(name, data)
        self.caught_up = caught_up
        return rows

    def _rows(self, name: str, data: bytes) -> list[dict]:
        text = self._partial.pop(name, b"") + data
        complete, _, rest = text.rpartition(b"\n")
        if rest:
            self._partial[name] = rest
        if not complete:
            return []
        lines = complete.decode("utf-8", "replace").split("\n")
        if name not in self._header:
            self._header[name] = next(csv.reader([lines.pop(0)]), [])
        header = self._header[name]
        # Not strict: a row with fewer cells than the header (or more) maps the cells it has.
        return [dict(zip(header, values, strict=False)) for values in csv.reader(lines)]


def pull_argv(plan: SoakPlan, host: str, pairs: list[str]) -> list[str]:
    """The node-side command that reads ``pairs`` (file name, offset, ...) of ``host``'s run directory."""
    return [plan.node_python, "-c", _PULL, plan.node_dir, plan.node_subdir(host), str(PULL_CAP), *pairs]


def replace_file(path: Path, data: bytes) -> None:
    write_atomic(path, data)


# --- Watching ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStatus:
    """One line of the live view."""

    host: str
    state: str
    elapsed_s: float | None = None
    planned_s: float | None = None
    throughput: tuple[tuple[str, float], ...] = ()
    hottest: tuple[int, float] | None = None  # (gpu, degrees C)
    lowest_sm: tuple[int, float] | None = None  # (gpu, MHz)
    reasons: tuple[str, ...] = ()
    note: str | None = None


def _num(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def node_status(host: str, state: str, heartbeat: dict | None, telemetry: dict[int, dict],
                throughput: dict[str, float], note: str | None) -> NodeStatus:
    """The view's line from the newest telemetry row of each GPU and the newest node-level
    throughput row of each metric."""
    temps = [(g, t) for g, row in telemetry.items() if (t := _num(row.get("temperature_c"))) is not None]
    clocks = [(g, c) for g, row in telemetry.items() if (c := _num(row.get("sm_clock_mhz"))) is not None]
    mask = 0
    for row in telemetry.values():
        bits = _num(row.get("clocks_event_reasons"))
        mask |= int(bits) if bits is not None else 0
    hb = heartbeat or {}
    return NodeStatus(
        host, state, hb.get("elapsed_s"), hb.get("planned_s"), tuple(sorted(throughput.items())),
        max(temps, key=lambda gt: gt[1]) if temps else None,
        min(clocks, key=lambda gc: gc[1]) if clocks else None,
        tuple(sorted(reasons_from_bitmask(mask & ~0x1))),  # GPU idle is not a throttle reason
        note,
    )


class HostWatch:
    """One node's side of the watch: its mirror, its latest heartbeat and rows, its outcome."""

    def __init__(self, node, plan: SoakPlan, started: Started | None):
        self.node, self.plan = node, plan
        self.mirror = Mirror(plan.run_dir / "soak" / node.name)
        self.heartbeat: dict | None = read_json(self.mirror.dir / HEARTBEAT_JSON)
        self.alive: bool | None = None
        self.error: str | None = None
        # A node whose agent did not start is still polled once, for what the agent wrote.
        self.start_failed = started is not None and not started.ok
        self.outcome: str | None = None
        self.note: str | None = started.detail if self.start_failed else None
        self.telemetry: dict[int, dict] = {}
        self.throughput: dict[str, float] = {}
        self._beat_seen: tuple[float | None, float] = (None, time.monotonic())

    @property
    def name(self) -> str:
        return self.node.name

    def poll(self) -> None:
        reply = self.node.run(self.mirror.pull_argv(self.plan, self.name), timeout=120.0)
        doc = last_json_line(reply.stdout or b"") if not reply.fault and reply.exit_code == 0 else None
        error = None if doc is not None else (
            reply.fault or (reply.stderr.strip().splitlines() or [f"exit code {reply.exit_code}"])[-1])
        self.take(doc, error)

    def take(self, doc: dict | None, error: str | None) -> None:
        """One poll's answer: the pull's reply, or why there is none."""
        if doc is None:
            self.error = error or "no reply"
            return
        self.error = None
        if not doc.get("exists"):
            self.outcome, self.note = "no soak", f"no soak directory for run {self.plan.run_id} on this node"
            return
        rows = self.mirror.apply(doc["files"])
        self.heartbeat = read_json(self.mirror.dir / HEARTBEAT_JSON) or self.heartbeat
        self.alive = doc.get("alive")
        for row in rows.get(TELEMETRY_CSV, []):
            if (gpu := _num(row.get("gpu"))) is not None:
                self.telemetry[int(gpu)] = row
        for row in rows.get(THROUGHPUT_CSV, []):
            live = row.get("gpu", "") == "" and row.get("metric") in LIVE_METRICS
            if live and (value := _num(row.get("value"))) is not None:
                self.throughput[row["metric"]] = value
        beat = (self.heartbeat or {}).get("now_epoch")
        if beat != self._beat_seen[0]:
            self._beat_seen = (beat, time.monotonic())

    def settle(self, now: float) -> None:
        """Decide whether this node is done: its agent ended and every byte is here, or it died,
        or it stayed out of reach (or stalled) past the planned end plus the grace period."""
        if self.outcome:
            return
        if self.start_failed:
            self.outcome = "not started"
            return
        hb = self.heartbeat or {}
        state = hb.get("state")
        end = hb.get("started_epoch", self.plan.created) + self.plan.seconds + GRACE_S
        if self.error is None and self.mirror.caught_up:
            if state in FINAL_STATES:
                self.outcome = state
            elif self.alive is False:
                self.outcome, self.note = "died", "the agent is gone without finishing (killed?)"
            if self.outcome:
                self.note = self.note or hb.get("last_error")
                return
        if now > end and (self.error is not None or self._stale_s() is not None):
            self.outcome = "unreachable" if self.error is not None else "stalled"
            self.note = self.error or "the heartbeat stopped changing"

    def _stale_s(self) -> float | None:
        """Seconds since the heartbeat last changed, once that is long enough to worry."""
        quiet = time.monotonic() - self._beat_seen[1]
        return quiet if quiet > max(STALE_S, 20 * self.plan.interval_s) else None

    def status(self) -> NodeStatus:
        hb = self.heartbeat or {}
        state = self.outcome or ("unreachable" if self.error else hb.get("state", "starting"))
        stale = None if self.outcome or self.error else self._stale_s()
        note = self.note or self.error or (f"no heartbeat for {stale:.0f} s" if stale else None) or hb.get("last_error")
        return node_status(self.name, state, hb, self.telemetry, self.throughput, note)


def read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def render(statuses: Iterable[NodeStatus], run_id: str) -> Table:
    table = Table(title=f"soak {run_id}", title_justify="left")
    for col in ("host", "state", "elapsed (left)", "throughput", "hottest GPU", "lowest SM clock",
                "clock-event reasons", "note"):
        table.add_column(col)
    for s in statuses:
        elapsed = ("" if s.elapsed_s is None else
                   f"{_duration(s.elapsed_s)} ({_duration(max(0.0, (s.planned_s or 0) - s.elapsed_s))})")
        table.add_row(
            s.host, s.state, elapsed,
            ", ".join(f"{m} {v:,.1f}" for m, v in s.throughput),
            "" if s.hottest is None else f"GPU {s.hottest[0]} {s.hottest[1]:.0f} °C",
            "" if s.lowest_sm is None else f"GPU {s.lowest_sm[0]} {s.lowest_sm[1]:.0f} MHz",
            ", ".join(s.reasons), s.note or "",
        )
    return table


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


PollAll = Callable[[SoakPlan, list[HostWatch], ThreadPoolExecutor], None]


def poll_each(plan: SoakPlan, pending: list[HostWatch], pool: ThreadPoolExecutor) -> None:
    """A command per node, all at once (over SSH; soak/slurm_poll.py polls a Slurm allocation in one step)."""
    list(pool.map(lambda w: w.poll(), pending))


def watch(watches: list[HostWatch], plan: SoakPlan, console: Console, live: bool,
          poll_all: PollAll | None = None) -> None:
    """Poll every node until each one is done; Ctrl-C (KeyboardInterrupt) propagates, leaving
    the agents running and the local copies as complete as the last poll."""
    last_states: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(watches))), thread_name_prefix="soak-poll") as pool, \
            (Live(render([w.status() for w in watches], plan.run_id), console=console, refresh_per_second=4)
             if live else nullcontext()) as view:
        while True:
            pending = [w for w in watches if not w.outcome]
            (poll_all or poll_each)(plan, pending, pool)
            now = time.time()
            for w in pending:
                w.settle(now)
            statuses = [w.status() for w in watches]
            if view is not None:
                view.update(render(statuses, plan.run_id))
            else:
                for s in statuses:
                    if last_states.get(s.host) != s.state:
                        last_states[s.host] = s.state
                        console.print(f"soak {plan.run_id}: {s.host}: {s.state}" + (f" ({s.note})" if s.note else ""),
                                      highlight=False, markup=False)
            if all(w.outcome for w in watches):
                return
            time.sleep(plan.poll_s)


def _unstarted(node, started: Started | None):
    """Under Slurm, a node Slurm itself would not run the agent on (its words start "slurm:")
    is not asked again through srun, which would only wait out its launch timeout."""
    if started is not None and not started.ok and started.detail.startswith(SLURM_ERROR):
        return UnavailableNode(node.name, started.detail.removeprefix(SLURM_ERROR))
    return node


def follow_nodes(plan: SoakPlan, console: Console, started: list[Started] | None = None,
                 live: bool = False, poll_all: PollAll | None = None) -> dict[str, tuple[str, str | None]]:
    """Watch every node of the run until each is done: its outcome (finished, failed, died,
    stalled, unreachable, not started, no soak) and a note, per host."""
    by_host = {s.host: s for s in started or []}
    nodes = [_unstarted(n, by_host.get(n.name)) if plan.slurm is not None else n for n in make_nodes(plan)]
    watches = [HostWatch(n, plan, by_host.get(n.name)) for n in nodes]
    try:
        watch(watches, plan, console, live, poll_all)
    finally:
        for node in nodes:
            node.close()
    return {w.name: (w.outcome or "unknown", w.note) for w in watches}
