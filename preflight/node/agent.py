#!/usr/bin/env python3
"""preflight soak agent: load the GPUs of this node, sample them through NVML, write it all down.

A handful of files (stdlib + nvidia-ml-py's ``pynvml``; ``torch`` for the ``burn`` engine) that
never import preflight: the controller ships this one and its siblings to a node over SSH,
unpacked side by side into one directory, and runs it there with ``python3``; it runs the same
way on this machine from ``preflight/node``:

    python3 agent.py --seconds 60 --engine burn --interval 0.1 --out DIR [--bench 20] [--detach]
    python3 agent.py --seconds 3600 --engine vllm --model llama-3-70b-dense --vllm-python VENV/bin/python3 \\
        [--vllm-arg=--enforce-eager] [--vllm-arg='--kv-cache-dtype fp8'] [--concurrency 256] --out DIR
    python3 agent.py --seconds 3600 --engine endpoint --endpoint http://127.0.0.1:8000 --out DIR

The agent's jobs, one module each: this one holds the main loop (one tick per interval: read
every GPU, poll the engine, append the rows, replace the heartbeat) and ``--detach``;
``agent_options.py`` its options and the configuration they make; ``sampler.py`` reads NVML and
watches its events; ``ib_snapshots.py`` reads the RDMA port counters before the load, every
``--ib-interval`` seconds and after it; ``records.py`` is what gets written (soak.json,
telemetry.csv, throughput.csv, events.csv, heartbeat.json: see there) and how, so that a
``kill -9`` loses at most the interval in flight; ``burn.py`` is the ``burn`` engine. Each
imports its siblings as ``preflight.node.<name>`` when it is imported from the package and by
plain name when it runs from a directory that holds the files.

Engines: ``burn`` loads every GPU with a GEMM and an HBM copy (burn.py); ``none`` only samples
(the GPUs run the user's own load). ``vllm`` serves a model (``--model``: a built-in config name
from ``models/``, an HF config directory or a model path) with dummy weights and loads it
through the streaming load generator; ``endpoint`` loads a server that is already running. Both
come from ``vllm_engine.py`` and the load generator's files (``SERVING_FILES``), which must sit
beside this file (the controller ships them there); a burn node needs none of them. For
``vllm``, ``--seconds`` counts from the moment the server answers: its start-up (up to
``--ready-timeout``) comes on top, so an hour's soak is an hour of load.

NVML is required, except for ``vllm`` on a machine without the NVIDIA driver (vLLM on the CPU,
as in CI): the agent then says so, runs without GPU telemetry (telemetry.csv holds only its
header) and records why in soak.json's ``no_telemetry``, which the analysis reports instead of
failing the host.

Test hook: ``--fake-nvml FILE:FACTORY`` loads ``FACTORY()`` from the Python file FILE and uses
what it returns in place of the ``pynvml`` module (tests replay recorded NVML values with it).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

try:
    from . import records
    from .agent_options import ENGINES, SERVING_ENGINES, AgentConfig, ServeParams, config_of, parse_args
    from .burn import BurnEngine
    from .ib_snapshots import IbCounterLog
    from .sampler import EventWatcher, NoTelemetry, Sampler, load_nvml, nvidia_driver_loaded
except ImportError:  # a shipped copy, run from a directory holding its siblings
    import records
    from agent_options import ENGINES, SERVING_ENGINES, AgentConfig, ServeParams, config_of, parse_args
    from burn import BurnEngine
    from ib_snapshots import IbCounterLog
    from sampler import EventWatcher, NoTelemetry, Sampler, load_nvml, nvidia_driver_loaded

# The options and their configuration live in agent_options.py; these names stay reachable here.
__all__ = ["ENGINES", "SERVING_ENGINES", "Agent", "AgentConfig", "NoEngine", "ServeParams", "main", "parse_args"]

# What those two engines need beside this file (vllm_engine.py imports the rest).
SERVING_FILES = ("vllm_engine.py", "vllm_log.py", "loadgen.py", "loadgen_config.py", "loadgen_bench.py",
                 "loadgen_http.py", "loadgen_windows.py")
# Where the controller puts the agent's siblings and models/; resolved now, since a
# --detach-ed agent changes its directory to /.
HERE = Path(__file__).resolve().parent
# fsync at most this often: each interval's write already reaches the page cache, which
# survives the agent's death; fsync only guards against the machine's.
FSYNC_EVERY_S = 2.0
# Replace heartbeat.json at most this often. Writing it (a JSON dump, a new file, a rename) cost
# more CPU than reading a GPU: 0.89 ms per 10 Hz tick on the lent H200, of which the sampler was
# 0.27. The controller polls every 2 s (soak/plan.py POLL_S), so once a second loses nothing;
# a change of state or phase is written at once.
HEARTBEAT_EVERY_S = 1.0
# How long a --detach parent waits for the agent to report that it is sampling.
DETACH_WAIT_S = 30.0


class NoEngine:
    """Samples only: the GPUs carry whatever the user runs on them."""

    def start(self, grid_t0: float) -> None:
        pass

    def poll(self, host: str, final: bool = False) -> tuple[list[records.ThroughputRow], list[str]]:
        return [], []

    def running(self) -> bool:
        return True

    def finish(self, stopped: bool) -> list[str]:
        return []

    def summary(self) -> dict:
        return {}


# --- The agent ---------------------------------------------------------------------------------


class Agent:
    """Samples every interval until ``cfg.seconds`` have passed or a stop is requested (SIGTERM,
    SIGINT, ``request_stop``), then lets the engine finish while still sampling.
    ``driver_loaded`` tells a machine without the NVIDIA driver (see the module docstring)."""

    def __init__(self, cfg: AgentConfig, load_nvml, engine_factory=None, driver_loaded=nvidia_driver_loaded):
        self.cfg = cfg
        self.load_nvml = load_nvml
        self.engine_factory = engine_factory or _make_engine
        self.driver_loaded = driver_loaded
        self.progress = records.Progress(os.getpid(), cfg.host, cfg.engine, time.time(), cfg.seconds, cfg.interval_s)
        self.stop_requested = False
        # Sleeping in select() on this pipe lets a signal handler (or another thread) end a sleep
        # at once without taking a lock the interrupted main thread might hold.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._done = threading.Event()  # tells the event thread to end
        self._power: dict[int, list[tuple[float, float]]] = {}
        self._engine_failed = False
        self._last_beat, self._beat_phase = 0.0, ("", "")

    def request_stop(self, *_signal) -> None:
        self.stop_requested = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # a wake-up is already pending, or the run is over and the pipe closed

    def _beat(self, sync: bool = False) -> None:
        # A new state goes out at once: a --detach parent and the controller act on it.
        self._last_beat, self._beat_phase = time.monotonic(), (self.progress.state, self.progress.phase)
        records.write_json_atomic(self.cfg.out / records.HEARTBEAT_JSON,
                                  records.heartbeat_doc(self.progress, time.time(), time.process_time()), sync)

    def _fail(self, message: str) -> int:
        self.progress.error(message)
        self.progress.state = self.progress.phase = "failed"
        self._beat(sync=True)
        print(f"preflight soak agent: failed: {message}", file=sys.stderr, flush=True)
        return 1

    def _write_soak_json(self, gpus: list[dict], driver: dict, no_telemetry: str | None = None) -> None:
        cfg = self.cfg
        doc = {
            "format": records.FORMAT,
            "engine": cfg.engine,
            "started": records.iso(self.progress.started),
            "hosts": [cfg.host],
            "planned_s": cfg.seconds,
            "interval_s": cfg.interval_s,
            "ib_interval_s": cfg.ib_interval_s,
            "agent": {"pid": os.getpid(), "python": sys.version.split()[0], **driver},
            "gpus": {cfg.host: gpus},
        }
        if no_telemetry:
            doc["no_telemetry"] = {cfg.host: no_telemetry}
        records.write_json_atomic(cfg.out / records.SOAK_JSON, doc, sync=True)

    def run(self) -> int:
        try:
            self._beat()
            try:
                sampler = Sampler(self.load_nvml(), self.cfg.host)
            except Exception as exc:  # noqa: BLE001 - NVML absent or broken: say so in the files
                reason = f"NVML: {type(exc).__name__}: {exc}"
                if self.cfg.engine != "vllm" or self.driver_loaded():
                    self._write_soak_json([], {})
                    return self._fail(reason)
                sampler = NoTelemetry(f"no NVIDIA driver on this machine ({reason})")
                print(f"preflight soak agent: no GPU telemetry: {sampler.reason}; the vllm engine runs without it",
                      flush=True)
            try:
                return self._run(sampler)
            finally:
                sampler.close()
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _run(self, sampler: Sampler | NoTelemetry) -> int:
        cfg, p = self.cfg, self.progress
        described = sampler.gpus
        no_telemetry = sampler.reason if isinstance(sampler, NoTelemetry) else None
        self._write_soak_json(described, sampler.driver(), no_telemetry)
        selected = [g for g in range(len(sampler.handles)) if cfg.gpus is None or g in cfg.gpus]
        engine = self.engine_factory(cfg, [(g, described[g]["uuid"]) for g in selected])
        # The fabric's counters before any load, so the soak's growth is the load's.
        ib = IbCounterLog(cfg.out, cfg.host, cfg.ib_interval_s, cfg.ib_root)
        ib.take("before", time.time())
        try:
            engine.start(self.progress.started)
        except Exception as exc:  # noqa: BLE001 - e.g. torch missing: a failed soak, said plainly
            return self._fail(f"engine {cfg.engine}: {type(exc).__name__}: {exc}")
        logs = {
            "telemetry": records.AppendLog(cfg.out / records.TELEMETRY_CSV, records.TELEMETRY_COLUMNS),
            "throughput": records.AppendLog(cfg.out / records.THROUGHPUT_CSV, records.THROUGHPUT_COLUMNS),
            "events": records.AppendLog(cfg.out / records.EVENTS_CSV, records.EVENT_COLUMNS),
        }
        events = EventWatcher(sampler.nvml, sampler.handles, cfg.host, self._done)
        events.start()
        p.state, p.phase = "running", cfg.engine
        print(f"preflight soak agent: pid {p.pid}, {len(sampler.handles)} GPUs, engine {cfg.engine}, "
              f"{cfg.seconds:g} s every {cfg.interval_s:g} s", flush=True)
        deadline = p.started + cfg.seconds + cfg.startup_allowance_s
        last_sync = [time.monotonic()]
        tick_at = time.time()
        while True:
            self._tick(sampler, engine, events, logs, last_sync)
            if ib.due(time.time()):
                ib.take("during", time.time())
            if self.stop_requested or time.time() >= deadline or not engine.running():
                break
            tick_at = self._sleep_until_next(tick_at)
        # The workers finish their window (and the bench) while sampling goes on; the tick
        # after they are gone records the last windows they queued.
        stopped = self.stop_requested
        p.phase = "bench" if cfg.engine == "burn" and cfg.burn.bench_s and not stopped else "stopping"
        finish_errors: list[str] = []
        finisher = threading.Thread(target=lambda: finish_errors.extend(engine.finish(stopped)), daemon=True)
        finisher.start()
        while finisher.is_alive():
            tick_at = self._sleep_until_next(tick_at)
            self._tick(sampler, engine, events, logs, last_sync)
        self._done.set()
        events.join(2)
        for message in finish_errors:
            p.error(message)
            self._engine_failed = True
        self._tick(sampler, engine, events, logs, last_sync, final=True)
        ib.take("after", time.time())
        engine_summary = engine.summary()
        logs["events"].append(records.row_text(records.finding_events(engine_summary, cfg.host, time.time())))
        for log in logs.values():
            log.sync()
            log.close()
        limits = {d["gpu"]: d.get("power_limit_w") for d in described}
        p.summary = {"engine": engine_summary, "power": records.power_summary(self._power, limits, engine_summary),
                     "stopped_by_signal": stopped, "events": events.note}
        if no_telemetry:
            p.summary["no_telemetry"] = no_telemetry
        p.state = p.phase = "failed" if self._engine_failed else "finished"
        self._beat(sync=True)
        records.print_summary(p, sys.stdout)
        return 1 if self._engine_failed else 0

    def _tick(self, sampler: Sampler | NoTelemetry, engine, events: EventWatcher, logs: dict, last_sync: list[float],
              final: bool = False) -> None:
        """One interval: read every GPU, append the rows, replace the heartbeat. Its CPU time (this
        thread's, the heartbeat's write included) is what the heartbeat reports per tick."""
        p = self.progress
        cpu0 = time.thread_time()
        samples = [s for gpu in range(len(sampler.handles)) if (s := sampler.sample(gpu)) is not None]
        rows, engine_errors = engine.poll(self.cfg.host, final)
        logs["telemetry"].append(records.row_text(samples))
        logs["throughput"].append(records.row_text(rows))
        logs["events"].append(records.row_text(events.take()))
        p.ticks += 1
        p.rows += len(samples)
        for s in samples:
            if s.power_w is not None:
                self._power.setdefault(s.gpu, []).append((s.time, s.power_w))
        for message in sampler.take_errors():
            p.error(message)
        for message in engine_errors:
            p.error(message)
            self._engine_failed = True
        if time.monotonic() - last_sync[0] >= FSYNC_EVERY_S:
            for log in logs.values():
                log.sync()
            last_sync[0] = time.monotonic()
        if final or (p.state, p.phase) != self._beat_phase or time.monotonic() - self._last_beat >= HEARTBEAT_EVERY_S:
            self._beat()
        p.sampler_cpu_s += time.thread_time() - cpu0

    def _sleep_until_next(self, tick_at: float) -> float:
        """Sleep to the next tick on a steady grid; a late tick skips ahead rather than bursting.
        A stop request ends the sleep at once."""
        tick_at += self.cfg.interval_s
        now = time.time()
        if tick_at < now:
            tick_at = now
        ready, _, _ = select.select([self._wake_r], [], [], tick_at - now)
        if ready:
            os.read(self._wake_r, 64)
        return tick_at


class EngineUnavailable(RuntimeError):
    """An engine's files are not beside the agent."""


def serving_module():
    """vllm_engine.py from beside this file, imported the way the agent itself was: from the
    package, or as the top-level module it is on a node (it imports its siblings the same way)."""
    missing = [name for name in SERVING_FILES if not (HERE / name).is_file()]
    if missing:
        names = ", ".join(missing[:-1]) + " and " + missing[-1] if len(missing) > 1 else missing[0]
        raise EngineUnavailable(f"{names} not found beside the agent in {HERE}: the vllm and endpoint engines "
                                "need them (preflight soak ships them with agent.py)")
    try:
        from . import vllm_engine
    except ImportError:  # not in the package: by plain name from HERE, which a script run has on sys.path
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        import vllm_engine
    return vllm_engine


def _make_engine(cfg: AgentConfig, gpus: list[tuple[int, str]]):
    if cfg.engine == "none":
        return NoEngine()
    if cfg.engine == "burn":
        return BurnEngine(gpus, cfg.burn)
    ve = serving_module()
    sp = cfg.serve
    if cfg.engine == "endpoint":
        load = ve.loadgen.LoadConfig(url=sp.endpoint, **sp.load_fields())
        return ve.EndpointEngine(load, cfg.out, cfg.seconds)
    # The engine points the load at its own server once it has a port.
    load = ve.loadgen.LoadConfig(**sp.load_fields())
    params = ve.VllmParams(model=sp.model, python=sp.python, skip_tokenizer_init=sp.skip_tokenizer_init,
                           extra_args=sp.extra_args, ready_timeout_s=sp.ready_timeout_s, load=load)
    return ve.VllmEngine(params, cfg.out, cfg.seconds, [uuid for _, uuid in gpus if uuid])


# --- Detaching ---------------------------------------------------------------------------------


def detach(out: Path) -> int | None:
    """Double fork into a new session with stdio on ``out/agent.log``, so the agent outlives the
    SSH session and the controller. Returns None in the detached agent; in the original process,
    once the agent samples (or failed), prints its pid and state as one JSON line and returns
    the exit code that process should end with."""
    read_fd, write_fd = os.pipe()
    first = os.fork()
    if first:
        os.close(write_fd)
        os.waitpid(first, 0)
        with os.fdopen(read_fd) as pipe:
            pid_text = pipe.read().strip()
        return _report_detached(out, int(pid_text) if pid_text else None)
    os.close(read_fd)
    os.setsid()
    if os.fork():
        os._exit(0)
    os.write(write_fd, f"{os.getpid()}\n".encode())
    os.close(write_fd)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(out / records.AGENT_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    sys.stdout.reconfigure(line_buffering=True)
    os.chdir("/")
    return None


def _report_detached(out: Path, pid: int | None) -> int:
    deadline = time.monotonic() + DETACH_WAIT_S
    state, error = "unknown", None
    while time.monotonic() < deadline:
        try:
            beat = json.loads((out / records.HEARTBEAT_JSON).read_text())
        except (OSError, ValueError):
            beat = None
        if beat and beat.get("state") != "starting":
            state, error = beat["state"], beat.get("last_error")
            break
        time.sleep(0.05)
    print(json.dumps({"pid": pid, "dir": str(out), "state": state, "last_error": error}), flush=True)
    return 1 if state in ("failed", "unknown") else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = (args.out or Path(datetime.now().strftime("soak-%Y%m%d-%H%M%S"))).absolute()
    if (out / records.SOAK_JSON).exists():
        print(f"preflight soak agent: {out} already holds a soak (soak.json); choose another --out", file=sys.stderr)
        return 2
    if args.engine in SERVING_ENGINES:
        try:
            serving_module()
        except EngineUnavailable as exc:
            print(f"preflight soak agent: --engine {args.engine}: {exc}", file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    print(f"preflight soak agent: writing to {out}", flush=True)
    if args.detach and (code := detach(out)) is not None:
        return code
    cfg = config_of(args, out, args.host or socket.gethostname())
    agent = Agent(cfg, lambda: load_nvml(args.fake_nvml))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, agent.request_stop)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
