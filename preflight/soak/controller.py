"""``preflight soak``: start the soak agent on every node, watch it, collect and merge its files.

For each node (over SSH, or this machine with ``--local``) the controller
1. ships the agent through the command's stdin as a tar stream that a fixed ``python3 -c``
   unpacks into ``<node-dir>/<run-id>/`` (default node dir ``~/.cache/preflight/soak``):
   ``agent.py``, ``vllm_engine.py`` and ``loadgen.py`` (the ``vllm`` and ``endpoint`` engines),
   and ``models/<name>.json`` when ``--model`` names a built-in config; then starts the agent
   with ``--detach``, so it outlives the SSH session and the controller;
2. polls it every few seconds with one small ``python3 -c`` command that returns the heartbeat
   and the bytes appended to the agent's files since the last poll (the CSVs, agent.log, and the
   vLLM server and load generator logs); those bytes are appended to
   ``reports/<run-id>/soak/<host>/``, which therefore mirrors the node's soak directory as the
   run goes (a node that dies mid-run has still delivered all but its last poll's data);
3. shows a live view: state, elapsed/planned, the node's throughput, its hottest GPU, its
   lowest SM clock and the clocks-event reasons active in the latest samples;
4. when every agent has finished (or failed, died, or its node stayed unreachable past the
   planned end plus a grace period), merges the per-host copies into one ``preflight-soak/1``
   directory, ``reports/<run-id>/`` (soak.json, telemetry.csv, throughput.csv, events.csv),
   and judges it with ``preflight.soak.analysis``.

``reports/<run-id>/soak/run.json`` records the hosts and options, so ``preflight soak --attach
RUN_ID`` (after Ctrl-C, a dropped connection or a killed controller) resumes steps 2-4 where the
local copies end. Every remote command is an argv list quoted with ``shlex.join``; host names and
paths never reach a shell unquoted.
"""

from __future__ import annotations

import argparse
import base64
import csv
import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from preflight.knowledge.datafile import positive
from preflight.collect.local import LocalNode, local_host_name
from preflight.diagnose.engine import load_knowledge
from preflight.evidence.bundle import new_run_id
from preflight.report import terminal
from preflight.report.files import write_reports
from preflight.collect.node import Node
from preflight.collect.ssh import SshNode, SshOptions
from preflight.collect.inventory import InventoryInvalid, load_hosts_file, parse_host_list
from preflight.model import Host
from preflight.parse.smi_records import reasons_from_bitmask
from preflight.node.agent import EVENT_COLUMNS, TELEMETRY_COLUMNS, THROUGHPUT_COLUMNS

AGENT_PATH = Path(__file__).resolve().parent.parent / "node" / "agent.py"
# Shipped beside agent.py, which imports them for the vllm and endpoint engines.
SIBLING_PATHS = tuple(AGENT_PATH.with_name(name) for name in ("vllm_engine.py", "loadgen.py"))
MODELS_DIR = AGENT_PATH.with_name("models")
RUN_FORMAT = "preflight-soak-run/1"
SOAK_FORMAT = "preflight-soak/1"
NODE_DIR = "~/.cache/preflight/soak"
ENGINES = ("burn", "vllm", "endpoint", "none")
APPEND_FILES = ("telemetry.csv", "throughput.csv", "events.csv", "agent.log", "vllm-server.log", "loadgen.log")
WHOLE_FILES = ("heartbeat.json", "soak.json")
# The merged files, with the header each gets when no host delivered a line.
MERGED_CSVS = {"telemetry.csv": TELEMETRY_COLUMNS, "throughput.csv": THROUGHPUT_COLUMNS, "events.csv": EVENT_COLUMNS}
PULL_CAP = 4 << 20  # bytes per file per poll; a long backlog (after --attach) takes several polls
POLL_S = 2.0
# How long past a node's planned end the controller keeps trying a node it cannot reach, or
# whose heartbeat stopped changing, before it gives up and merges what it has.
GRACE_S = 120.0
STALE_S = 60.0
FINAL_STATES = ("finished", "failed")
# The node-wide throughput rows the live view shows: the burn's rates, and of the load
# generator's many figures per window (loadgen.py) the rate, the median latencies and the errors.
LIVE_METRICS = ("tflops", "hbm_gbps", "output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "errors")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# Run on the node as `python3 -c _START NODE_DIR RUN_ID AGENT_ARGS...` with the agent's tar
# (agent_bundle) on stdin: regular files only, each written under the run's directory.
_START = """\
import io, os, sys, tarfile
d = os.path.abspath(os.path.join(os.path.expanduser(sys.argv[1]), sys.argv[2]))
os.makedirs(d, exist_ok=True)
with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read())) as tar:
    for m in tar.getmembers():
        parts = m.name.split("/")
        if not m.isfile() or m.name.startswith("/") or ".." in parts:
            sys.exit("preflight soak: refusing %r from the agent's bundle" % m.name)
        path = os.path.join(d, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(tar.extractfile(m).read())
os.execv(sys.executable, [sys.executable, os.path.join(d, "agent.py"), "--out", d, "--detach"] + sys.argv[3:])
"""

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


class SoakUsageError(ValueError):
    """Bad options or a run that cannot be attached; the CLI exits 2 with the message."""


# --- The plan, and run.json --------------------------------------------------------------------


@dataclass(frozen=True)
class SoakPlan:
    """Everything needed to start, and later re-attach to, one soak run.

    ``hosts`` empty means this machine (``local_name`` names it in the files). ``python`` is the
    interpreter on the nodes (default ``python3``; locally, this one). ``agent_args`` are passed
    to every agent as they are (e.g. ``--bench 30``, ``--model tiny-llama-ci``); ``builtin_model``
    names the config in ``models/`` that goes with the agent, if the model is one of those."""

    run_id: str
    out: Path
    engine: str
    seconds: float
    interval_s: float
    hosts: tuple[Host, ...] = ()
    local_name: str = "localhost"
    ssh: SshOptions = field(default_factory=SshOptions)
    python: str | None = None
    node_dir: str = NODE_DIR
    agent_args: tuple[str, ...] = ()
    builtin_model: str | None = None
    poll_s: float = POLL_S
    created: float = field(default_factory=time.time)

    @property
    def run_dir(self) -> Path:
        return self.out / self.run_id

    def to_json(self) -> dict:
        ssh = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.ssh).items()}
        return {"format": RUN_FORMAT, "run_id": self.run_id, "engine": self.engine, "seconds": self.seconds,
                "interval_s": self.interval_s, "hosts": [asdict(h) for h in self.hosts],
                "local_name": self.local_name, "ssh": ssh, "python": self.python, "node_dir": self.node_dir,
                "agent_args": list(self.agent_args), "builtin_model": self.builtin_model, "poll_s": self.poll_s,
                "created": self.created}

    @classmethod
    def from_json(cls, doc: dict, out: Path) -> SoakPlan:
        ssh = {k: (Path(v) if k in ("identity", "ssh_config", "known_hosts") and v else v)
               for k, v in doc["ssh"].items()}
        return cls(run_id=doc["run_id"], out=out, engine=doc["engine"], seconds=doc["seconds"],
                   interval_s=doc["interval_s"], hosts=tuple(Host(**h) for h in doc["hosts"]),
                   local_name=doc["local_name"], ssh=SshOptions(**ssh), python=doc["python"],
                   node_dir=doc["node_dir"], agent_args=tuple(doc["agent_args"]),
                   builtin_model=doc.get("builtin_model"), poll_s=doc["poll_s"], created=doc["created"])


def run_json_path(out: Path, run_id: str) -> Path:
    return out / run_id / "soak" / "run.json"


def load_plan(out: Path, run_id: str) -> SoakPlan:
    path = run_json_path(out, run_id)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SoakUsageError(f"--attach: no soak run {run_id!r} here ({path} does not exist)") from None
    except ValueError as exc:
        raise SoakUsageError(f"--attach: {path}: not JSON ({exc})") from None
    if doc.get("format") != RUN_FORMAT:
        raise SoakUsageError(f"--attach: {path}: format is {doc.get('format')!r}, expected {RUN_FORMAT!r}")
    return SoakPlan.from_json(doc, out)


# --- Reaching a node ---------------------------------------------------------------------------


def make_nodes(plan: SoakPlan) -> list[Node]:
    if not plan.hosts:
        return [LocalNode(plan.local_name)]
    return [SshNode(h, plan.ssh) for h in plan.hosts]


def _python(plan: SoakPlan) -> str:
    return plan.python or (sys.executable if not plan.hosts else "python3")


# --- Starting ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    host: str
    ok: bool
    detail: str  # the agent's pid and directory, or why it did not start


def agent_argv(plan: SoakPlan, host: str) -> list[str]:
    return [_python(plan), "-c", _START, plan.node_dir, plan.run_id, "--host", host, "--engine", plan.engine,
            "--seconds", repr(float(plan.seconds)), "--interval", repr(float(plan.interval_s)), *plan.agent_args]


def builtin_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def agent_bundle(builtin_model: str | None) -> bytes:
    """The tar that _START unpacks on the node: agent.py, its sibling modules, and the model config."""
    files = [(AGENT_PATH, AGENT_PATH.name)] + [(p, p.name) for p in SIBLING_PATHS]
    if builtin_model:
        files.append((MODELS_DIR / f"{builtin_model}.json", f"models/{builtin_model}.json"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, name in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def start_agent(node, plan: SoakPlan) -> Started:
    """Ship the agent and start it detached; its reply comes once it samples (or failed)."""
    reply = node.run(agent_argv(plan, node.name), stdin=agent_bundle(plan.builtin_model), timeout=90.0)
    if reply.fault:
        return Started(node.name, False, reply.fault)
    report = _last_json_line(reply.stdout or b"")
    if reply.exit_code == 0 and report:
        return Started(node.name, True, f"agent pid {report.get('pid')} in {report.get('dir')}")
    why = (report or {}).get("last_error") or reply.stderr.strip().splitlines()[-1:] or [f"exit code {reply.exit_code}"]
    return Started(node.name, False, why if isinstance(why, str) else why[0])


def _last_json_line(stdout: bytes) -> dict | None:
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


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
        for name in ("telemetry.csv", "throughput.csv"):
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

    def pull_argv(self, plan: SoakPlan) -> list[str]:
        pairs = [x for name in WHOLE_FILES for x in (name, "0")]
        pairs += [x for name in APPEND_FILES for x in (name, str(self.sizes[name]))]
        return [_python(plan), "-c", _PULL, plan.node_dir, plan.run_id, str(PULL_CAP), *pairs]

    def apply(self, files: dict) -> dict[str, list[dict]]:
        """Write what a pull brought; returns the new complete rows of the CSVs, as dicts."""
        rows: dict[str, list[dict]] = {}
        caught_up = True
        for name, item in files.items():
            data = base64.b64decode(item["data"])
            if name in WHOLE_FILES:
                if data:
                    _replace(self.dir / name, data)
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
            if name in ("telemetry.csv", "throughput.csv"):
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
        return [dict(zip(header, values)) for values in csv.reader(lines)]


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


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
        self.heartbeat: dict | None = _read_json(self.mirror.dir / "heartbeat.json")
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
        reply = self.node.run(self.mirror.pull_argv(self.plan), timeout=120.0)
        doc = _last_json_line(reply.stdout or b"") if not reply.fault and reply.exit_code == 0 else None
        if doc is None:
            self.error = reply.fault or (reply.stderr.strip().splitlines() or [f"exit code {reply.exit_code}"])[-1]
            return
        self.error = None
        if not doc.get("exists"):
            self.outcome, self.note = "no soak", f"no soak directory for run {self.plan.run_id} on this node"
            return
        rows = self.mirror.apply(doc["files"])
        self.heartbeat = _read_json(self.mirror.dir / "heartbeat.json") or self.heartbeat
        self.alive = doc.get("alive")
        for row in rows.get("telemetry.csv", []):
            if (gpu := _num(row.get("gpu"))) is not None:
                self.telemetry[int(gpu)] = row
        for row in rows.get("throughput.csv", []):
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


def _read_json(path: Path) -> dict | None:
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


def watch(watches: list[HostWatch], plan: SoakPlan, console: Console, live: bool) -> None:
    """Poll every node until each one is done; Ctrl-C (KeyboardInterrupt) propagates, leaving
    the agents running and the local copies as complete as the last poll."""
    last_states: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(watches))), thread_name_prefix="soak-poll") as pool, \
            (Live(render([w.status() for w in watches], plan.run_id), console=console, refresh_per_second=4)
             if live else nullcontext()) as view:
        while True:
            pending = [w for w in watches if not w.outcome]
            list(pool.map(lambda w: w.poll(), pending))
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


# --- Merging -----------------------------------------------------------------------------------


def merge_soak(run_dir: Path, outcomes: dict[str, tuple[str, str | None]]) -> dict:
    """Merge ``run_dir/soak/<host>/`` into one ``preflight-soak/1`` directory at ``run_dir``.

    ``outcomes`` maps each host to (state, note). Only complete lines are merged (a copy cut
    mid-line loses that line). Hosts whose files share the first host's header are copied line
    for line; a host with other columns is mapped onto the union of the headers by name."""
    per_host = {h: run_dir / "soak" / h for h in outcomes}
    metas = {h: _read_json(d / "soak.json") for h, d in per_host.items()}
    beats = {h: _read_json(d / "heartbeat.json") for h, d in per_host.items()}
    hosts = [h for h, m in metas.items() if m and m.get("format") == SOAK_FORMAT]
    for name, columns in MERGED_CSVS.items():
        _merge_csv(run_dir / name, [per_host[h] / name for h in hosts], columns)
    engines = sorted({metas[h].get("engine") for h in hosts} - {None})
    doc = {
        "format": SOAK_FORMAT,
        "engine": engines[0] if len(engines) == 1 else ",".join(engines) or "unknown",
        "started": min((metas[h]["started"] for h in hosts), default=datetime.now(timezone.utc).isoformat()),
        "hosts": hosts,
        "run_id": run_dir.name,
        "planned_s": max((metas[h].get("planned_s", 0) for h in hosts), default=None),
        "interval_s": max((metas[h].get("interval_s", 0) for h in hosts), default=None),
        "gpus": {h: metas[h].get("gpus", {}).get(h, []) for h in hosts},
        "agents": {h: {"outcome": outcomes[h][0], "note": outcomes[h][1],
                       "elapsed_s": (beats[h] or {}).get("elapsed_s"),
                       "sampler_cpu_ms_per_tick": (beats[h] or {}).get("sampler_cpu_ms_per_tick"),
                       "summary": (beats[h] or {}).get("summary")} for h in outcomes},
        "missing": {h: outcomes[h][1] or outcomes[h][0] for h in outcomes if h not in hosts},
    }
    # Hosts whose agent ran without GPU telemetry (vllm on a machine without the NVIDIA driver).
    no_telemetry = {h: metas[h]["no_telemetry"][h] for h in hosts if h in (metas[h].get("no_telemetry") or {})}
    if no_telemetry:
        doc["no_telemetry"] = no_telemetry
    _replace(run_dir / "soak.json", (json.dumps(doc, indent=1) + "\n").encode())
    return doc


def _complete_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    return lines[:-1]  # the piece after the last newline is empty, or a half-written row


def _merge_csv(target: Path, sources: list[Path], default_header: Sequence[str]) -> None:
    contents = [lines for lines in map(_complete_lines, sources) if lines] or [[_csv_line(default_header)[:-1]]]
    tmp = target.with_name(f".{target.name}.tmp")
    with tmp.open("w", encoding="utf-8", newline="") as out:
        headers = [next(csv.reader([lines[0]])) for lines in contents]
        union = list(dict.fromkeys(col for cols in headers for col in cols))
        out.write(_csv_line(union))
        for cols, lines in zip(headers, contents):
            if cols == union:
                out.writelines(line + "\n" for line in lines[1:])
            else:
                for row in csv.DictReader(lines):
                    out.write(_csv_line([row.get(col) or "" for col in union]))
    os.replace(tmp, target)


def _csv_line(values: Sequence[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()


# --- Whole runs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoakOutcome:
    run_dir: Path
    outcomes: dict[str, tuple[str, str | None]]
    merged: dict

    @property
    def failed(self) -> bool:
        return any(state != "finished" for state, _ in self.outcomes.values())


def start(plan: SoakPlan, console: Console) -> list[Started]:
    """Write run.json, then start the agent on every node (in parallel)."""
    path = run_json_path(plan.out, plan.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    nodes = make_nodes(plan)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(64, len(nodes)))) as pool:
            started = list(pool.map(lambda n: start_agent(n, plan), nodes))
    finally:
        for node in nodes:
            node.close()
    for s in started:
        console.print(f"soak {plan.run_id}: {s.host}: {'started, ' if s.ok else 'NOT started: '}{s.detail}",
                      highlight=False, markup=False)
    return started


def follow(plan: SoakPlan, console: Console, started: list[Started] | None = None, live: bool = False) -> SoakOutcome:
    """Watch the run until every node is done, then merge: used after ``start`` and by ``--attach``."""
    nodes = make_nodes(plan)
    by_host = {s.host: s for s in started or []}
    watches = [HostWatch(n, plan, by_host.get(n.name)) for n in nodes]
    try:
        watch(watches, plan, console, live)
    finally:
        for node in nodes:
            node.close()
    outcomes = {w.name: (w.outcome or "unknown", w.note) for w in watches}
    return SoakOutcome(plan.run_dir, outcomes, merge_soak(plan.run_dir, outcomes))


def analyze_and_show(outcome: SoakOutcome, console: Console) -> bool:
    """Judge the merged directory and write the run's reports (report.json with its ``soak``
    section, report.md, report.html with the plots, junit.xml) beside the soak data, as
    ``preflight analyze`` would; True when something failed."""
    # pandas, behind the soak's data and analysis, loads only once a soak is to be judged.
    from preflight.soak.data import SoakDataError
    from preflight.soak.judge import judge_soak

    try:
        analysis = judge_soak(outcome.run_dir, load_knowledge(), plots_dir=outcome.run_dir / "plots")
    except SoakDataError as exc:
        console.print(f"soak analysis: cannot read {outcome.run_dir}: {exc}", highlight=False, markup=False)
        return True
    analysis.meta.update({"run_id": outcome.run_dir.name, "soak_dir": str(outcome.run_dir)})
    write_reports(outcome.run_dir, analysis)
    terminal.show(analysis, console, str(outcome.run_dir))
    return analysis.failed


# --- Command line ------------------------------------------------------------------------------


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("soak", help="full-load burn-in with NVML telemetry on every node (detached agents)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="FILE", type=Path, help="hosts file: [user@]host[:port] per line")
    where.add_argument("-H", dest="host_list", metavar="HOSTS", help="hosts inline: a,b,gpu[01-04]")
    where.add_argument("--local", action="store_true", help="soak this machine (the default with no hosts)")
    where.add_argument("--attach", metavar="RUN_ID", help="re-attach to a run: watch it, collect and analyse")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--hours", type=_positive, help="run length in hours (default 1)")
    length.add_argument("--minutes", type=_positive, help="run length in minutes")
    p.add_argument("--engine", choices=ENGINES, help="load: burn (PyTorch GEMM + HBM copy; the default), vllm "
                   "(serve --model with dummy weights and load it), endpoint (load --endpoint URL), or none "
                   "(telemetry only, you load the GPUs)")
    p.add_argument("--interval", type=_positive, default=1.0, help="seconds between NVML samples (default 1, min 0.1)")
    p.add_argument("--bench", type=_positive, metavar="S", help="burn: then run a plain torch.matmul loop for S s per GPU")
    p.add_argument("--python", help="Python on the nodes, with pynvml (and torch for burn) (default: python3)")
    serve = p.add_argument_group("vllm and endpoint engines (a vllm soak's length counts from the moment the "
                                 "server answers; its start-up comes on top)")
    serve.add_argument("--model", help=f"vllm: a built-in model config ({', '.join(builtin_models())}, shipped "
                       "with the agent), or an HF config directory, model path or hub id as the nodes see it")
    serve.add_argument("--vllm-python", metavar="PYTHON", help="vllm: the Python on the nodes that has vLLM "
                       "(default python3)")
    serve.add_argument("--vllm-arg", action="append", default=[], metavar="ARGS",
                       help="vllm: more server flags, split like a shell line; repeatable, e.g. "
                            "--vllm-arg=--enforce-eager --vllm-arg='--kv-cache-dtype fp8'")
    serve.add_argument("--skip-tokenizer-init", dest="skip_tokenizer_init", action="store_true", default=None,
                       help="vllm: start the server without a tokenizer (the agent's default)")
    serve.add_argument("--no-skip-tokenizer-init", dest="skip_tokenizer_init", action="store_false",
                       help="vllm: let the server load the model's tokenizer")
    serve.add_argument("--ready-timeout", type=_positive, metavar="S",
                       help="vllm: longest server start-up (the agent's default: 1200 s)")
    serve.add_argument("--endpoint", metavar="URL", help="load this running OpenAI-compatible server "
                       "(implies --engine endpoint)")
    serve.add_argument("--concurrency", type=positive(int), help="vllm/endpoint: requests in flight (default 256)")
    serve.add_argument("--max-tokens", type=positive(int), help="vllm/endpoint: output tokens per request "
                       "(default 256)")
    p.add_argument("--node-dir", default=NODE_DIR, help=f"where agents keep their files on the nodes (default {NODE_DIR})")
    p.add_argument("--poll", type=_positive, default=POLL_S, help=f"seconds between polls of the nodes (default {POLL_S:g})")
    p.add_argument("--run-id", help="name of the run directory (default: timestamp)")
    p.add_argument("--out", metavar="DIR", type=Path, default=Path("reports"), help="where run directories go")
    p.add_argument("--user", help="SSH user")
    p.add_argument("--port", type=int, help="SSH port")
    p.add_argument("--identity", "-i", type=Path, metavar="KEY", help="SSH private key")
    p.add_argument("--ssh-config", type=Path, metavar="FILE", help="OpenSSH client config")
    p.add_argument("--known-hosts", type=Path, metavar="FILE", help="extra known_hosts file")
    p.add_argument("--accept-new-host-keys", action="store_true", help="accept host keys not in known_hosts")
    p.add_argument("--connect-timeout", type=_positive, default=10.0, help="seconds to connect (default 10)")
    p.add_argument("-q", "--quiet", action="store_true", help="no live view")
    return p


_positive = positive(float)


# The command line's options for the serving engines (argparse dest -> the engines they apply to).
SERVE_OPTIONS = {"model": ("vllm",), "vllm_python": ("vllm",), "vllm_arg": ("vllm",), "skip_tokenizer_init": ("vllm",),
                 "ready_timeout": ("vllm",), "endpoint": ("endpoint",), "concurrency": ("vllm", "endpoint"),
                 "max_tokens": ("vllm", "endpoint")}


def serving_args(args, engine: str) -> tuple[str, ...]:
    """The agent's flags for the vllm and endpoint engines, from the command line's; each value
    is one argv item (``--vllm-arg=VALUE``, so a value starting with ``-`` stays a value)."""
    given = [k for k in SERVE_OPTIONS if getattr(args, k) not in (None, [])]
    stray = [k for k in given if engine not in SERVE_OPTIONS[k]]
    if stray:
        raise SoakUsageError(f"--{stray[0].replace('_', '-')} does not apply to --engine {engine}")
    if engine == "vllm" and not args.model:
        raise SoakUsageError(f"--engine vllm needs --model (built-in: {', '.join(builtin_models())})")
    out: list[str] = []
    for key in given:
        value = getattr(args, key)
        if key == "vllm_arg":
            out += [f"--vllm-arg={v}" for v in value]
        elif key == "skip_tokenizer_init":
            out.append("--skip-tokenizer-init" if value else "--no-skip-tokenizer-init")
        else:
            out.append(f"--{key.replace('_', '-')}={value}")
    return tuple(out)


def plan_from_args(args, local_name: str, run_id: str) -> SoakPlan:
    engine = args.engine or ("endpoint" if args.endpoint else "burn")
    if engine == "endpoint" and not args.endpoint:
        raise SoakUsageError("--engine endpoint needs --endpoint URL")
    serve_args = serving_args(args, engine)
    if args.interval < 0.1:
        raise SoakUsageError("--interval: at most 10 samples a second (>= 0.1 s)")
    if "/" in run_id or run_id in (".", ".."):
        raise SoakUsageError(f"--run-id: {run_id!r} must be a plain directory name")
    if (args.out / run_id).exists():
        raise SoakUsageError(f"--run-id: {args.out / run_id} already exists; choose another id")
    for path, opt in ((args.identity, "--identity"), (args.ssh_config, "--ssh-config"), (args.known_hosts, "--known-hosts")):
        if path and not path.is_file():
            raise SoakUsageError(f"{opt}: {path}: no such file")
    if args.hosts:
        hosts = load_hosts_file(args.hosts)
    elif args.host_list:
        hosts = parse_host_list(args.host_list)
    else:
        hosts = []
    seconds = args.minutes * 60 if args.minutes else (args.hours or 1.0) * 3600
    agent_args = (("--bench", repr(args.bench)) if args.bench else ()) + serve_args
    builtin = args.model if engine == "vllm" and args.model in builtin_models() else None
    return SoakPlan(run_id=run_id, out=args.out, engine=engine, seconds=seconds, interval_s=args.interval,
                    hosts=tuple(hosts), local_name=local_name, ssh=_ssh_options(args), python=args.python,
                    node_dir=args.node_dir, agent_args=agent_args, builtin_model=builtin, poll_s=args.poll)


def _ssh_options(args) -> SshOptions:
    return SshOptions(args.user, args.port, args.identity, args.ssh_config, args.known_hosts,
                      args.accept_new_host_keys, args.connect_timeout)


def cmd_soak(args, console: Console) -> int:
    err = Console(stderr=True)
    try:
        if args.attach:
            plan = load_plan(args.out, args.attach)
            if any(getattr(args, k) for k in ("user", "port", "identity", "ssh_config", "known_hosts")):
                plan = replace(plan, ssh=_ssh_options(args))
            started = None
        else:
            plan = plan_from_args(args, local_host_name(), args.run_id or new_run_id())
    except (SoakUsageError, InventoryInvalid) as exc:
        err.print(f"preflight: error: {exc}", highlight=False, markup=False)
        return EXIT_USAGE
    try:
        if not args.attach:
            started = start(plan, console)
        outcome = follow(plan, console, started, live=console.is_terminal and not args.quiet)
    except KeyboardInterrupt:
        err.print(f"preflight soak: detached; the agents keep running. Re-attach with: "
                  f"preflight soak --attach {plan.run_id}" + (f" --out {args.out}" if args.out != Path("reports") else ""),
                  highlight=False, markup=False)
        return EXIT_INTERRUPTED
    failed = analyze_and_show(outcome, console) if outcome.merged["hosts"] else True
    console.print(f"soak data: {outcome.run_dir}", highlight=False, markup=False)
    return EXIT_FAILED if failed or outcome.failed else EXIT_OK
