"""What the soak agent writes down: its rows and their CSV form, the heartbeat, the summary.

Part of the agent (agent.py beside it; standard library only, never imports preflight). The
files it describes go into the agent's soak directory as it runs (contract ``preflight-soak/1``;
columns after the contract's may follow, readers must ignore those they do not know):
- ``soak.json``: ``{"format": "preflight-soak/1", "engine", "started", "hosts": [this host]}``
  plus ``gpus`` (per host: name, UUID, PCI bus id, slowdown/shutdown/max-operating thresholds in
  absolute degrees C as NVML reports them, power limits, maximum clocks), written once at start.
- ``telemetry.csv``: one ``GpuSample`` per GPU per interval: the contract's columns (time, host,
  gpu, temperature_c, memory_temperature_c, sm_clock_mhz, memory_clock_mhz, power_w,
  power_limit_w, utilization_pct, memory_used_mib, clocks_event_reasons), then the GPU's slowdown
  threshold (``slowdown_temperature_c``, which preflight.soak.data understands), memory
  utilisation, volatile ECC totals, remapped-row counts and the clocks-event reasons' cumulative
  time counters (ns). Those counts, memory used and the memory clock are read every
  ``sampler.SLOW_EVERY_S`` and empty in between. Any other empty
  cell is "not available on this GPU/driver"; a GPU that stops answering (fallen off the bus)
  gets no more rows rather than rows of empty cells.
- ``throughput.csv``: ``ThroughputRow``s (time, host, metric, value, gpu): per engine window, the
  node's total with an empty ``gpu`` cell (``tflops`` and ``hbm_gbps`` for ``burn``;
  ``output_tokens_per_s``, TTFT/TPOT percentiles and the server's gauges for ``vllm`` and
  ``endpoint``, see loadgen.py) and each GPU's own (``gpu_tflops``, ``gpu_hbm_gbps``).
- ``events.csv``: ``EventRow``s (time, host, gpu, event, data): NVML events (XIDs with their
  number as data, ECC errors), where the driver supports an event set; and at the end, each
  known failure the ``vllm`` engine found in its server log, the symptom as event and its line
  as data (``vllm-cuda-graph-capture-error``, ``vllm-engine-dead``...; vllm_log.py).
- ``vllm-server.log``, ``loadgen.log``: the ``vllm`` engine's server output and the load
  generator's stderr (``endpoint``: loadgen.log only).
- ``heartbeat.json``: progress and state (starting, running, finished, failed), last error, and
  the sampler's own CPU time per tick, replaced atomically every interval; at the end it also
  holds a summary (per GPU median throughput, power against the limit, the ``--bench`` result).
- ``agent.log``: stdout/stderr of a ``--detach``-ed agent.

Crash safety: each interval's rows go to the CSV files in one ``write`` on an ``O_APPEND``
descriptor (``AppendLog``), so a ``kill -9`` leaves only whole rows behind and loses at most the
interval in flight; the agent ``fsync``-s them every few seconds against a machine crash.

The format names, file names and column lists here are preflight.contracts' (this file cannot
import it); tests/test_contracts.py checks that they agree.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

FORMAT = "preflight-soak/1"
HEARTBEAT_FORMAT = "preflight-soak-heartbeat/1"
SOAK_JSON = "soak.json"
TELEMETRY_CSV = "telemetry.csv"
THROUGHPUT_CSV = "throughput.csv"
EVENTS_CSV = "events.csv"
HEARTBEAT_JSON = "heartbeat.json"
AGENT_LOG = "agent.log"


# --- Rows and their CSV form (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class GpuSample:
    """One row of telemetry.csv; field order is column order (the contract's twelve first)."""

    time: float
    host: str
    gpu: int
    temperature_c: int | None = None
    memory_temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: int | None = None
    memory_used_mib: int | None = None
    clocks_event_reasons: int | None = None
    slowdown_temperature_c: int | None = None
    memory_utilization_pct: int | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: int | None = None
    remapped_rows_failure: int | None = None
    sw_power_cap_ns: int | None = None
    sync_boost_ns: int | None = None
    sw_thermal_ns: int | None = None
    hw_thermal_ns: int | None = None
    hw_power_brake_ns: int | None = None


@dataclass(frozen=True)
class ThroughputRow:
    time: float
    host: str
    metric: str
    value: float
    gpu: int | None = None


@dataclass(frozen=True)
class EventRow:
    time: float
    host: str
    gpu: int | None
    event: str
    data: int | None = None


TELEMETRY_COLUMNS = tuple(f.name for f in fields(GpuSample))
THROUGHPUT_COLUMNS = tuple(f.name for f in fields(ThroughputRow))
EVENT_COLUMNS = tuple(f.name for f in fields(EventRow))


def csv_text(rows: Iterable[Sequence]) -> str:
    """CSV lines ending in "\\n"; None becomes an empty cell ("not available")."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in rows:
        writer.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


def row_text(records: Iterable) -> str:
    return csv_text(astuple(r) for r in records)


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Progress:
    """What the heartbeat reports; mutated by the agent's main loop only."""

    pid: int
    host: str
    engine: str
    started: float
    planned_s: float
    interval_s: float
    state: str = "starting"
    phase: str = "starting"
    last_error: str | None = None
    errors: int = 0
    ticks: int = 0
    rows: int = 0
    sampler_cpu_s: float = 0.0
    summary: dict | None = None

    def error(self, message: str) -> None:
        self.errors += 1
        self.last_error = message


def heartbeat_doc(p: Progress, now: float, process_cpu_s: float) -> dict:
    """heartbeat.json's content. CPU time per tick covers reading NVML for every GPU and
    writing the rows (the agent's main thread); per GPU divides that by the GPUs sampled."""
    per_tick = p.sampler_cpu_s / p.ticks if p.ticks else None
    gpus_per_tick = p.rows / p.ticks if p.ticks else 0
    return {
        "format": HEARTBEAT_FORMAT,
        "pid": p.pid,
        "host": p.host,
        "engine": p.engine,
        "started": iso(p.started),
        "now": iso(now),
        "started_epoch": round(p.started, 3),
        "now_epoch": round(now, 3),
        "elapsed_s": round(now - p.started, 3),
        "planned_s": p.planned_s,
        "interval_s": p.interval_s,
        "state": p.state,
        "phase": p.phase,
        "last_error": p.last_error,
        "errors": p.errors,
        "ticks": p.ticks,
        "rows": p.rows,
        "sampler_cpu_ms_per_tick": None if per_tick is None else round(per_tick * 1e3, 4),
        "sampler_cpu_ms_per_gpu_sample": (round(per_tick * 1e3 / gpus_per_tick, 4)
                                          if per_tick is not None and gpus_per_tick else None),
        "process_cpu_s": round(process_cpu_s, 3),
        "summary": p.summary,
    }


def write_json_atomic(path: Path, doc: dict, sync: bool = False) -> None:
    """Readers see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = (json.dumps(doc, indent=1) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class AppendLog:
    """An append-only CSV file. The header goes in when the file is new; each ``append`` is one
    ``write`` of whole lines on an O_APPEND descriptor, so a killed writer leaves whole lines."""

    def __init__(self, path: Path, columns: Sequence[str]):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size == 0:
            _write_all(self._fd, csv_text([columns]).encode())

    def append(self, text: str) -> None:
        if text:
            _write_all(self._fd, text.encode())

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


# --- The summary at the end -------------------------------------------------------------------


def power_summary(power: dict[int, list[tuple[float, float]]], limits: dict[int, float | None],
                  windows: dict[str, dict]) -> dict[str, dict]:
    """Median power per GPU while its engine ran (between its first and last window; the whole
    run when there were none), against its enforced limit."""
    out = {}
    for gpu, samples in power.items():
        w = windows.get(str(gpu), {})
        lo, hi = w.get("first_window", float("-inf")), w.get("last_window", float("inf"))
        during = [p for t, p in samples if lo <= t <= hi] or [p for _, p in samples]
        if not during:
            continue
        median = statistics.median(during)
        limit = limits.get(gpu)
        out[str(gpu)] = {"power_median_w": round(median, 1), "power_limit_w": limit,
                         "power_of_limit": round(median / limit, 4) if limit else None}
    return out


def print_summary(p: Progress, out) -> None:
    """The lines a person running the agent by hand reads at the end."""
    summary = p.summary or {}
    power = summary.get("power") or {}
    engine = summary.get("engine") or {}
    # The burn's summary is keyed by GPU; the vllm and endpoint engines' by topic (serving_lines).
    per_gpu = {k: v for k, v in engine.items() if k.isdigit()}
    for gpu in sorted(set(per_gpu) | set(power), key=int):
        s, pw = per_gpu.get(gpu, {}), power.get(gpu, {})
        parts = [f"GPU {gpu}:"]
        if "tflops_median" in s:
            parts.append(f"burn GEMM {s['tflops_median']:.1f} TFLOP/s (n={s.get('gemm_size')}),"
                         f" HBM copy {s['hbm_gbps_median']:.0f} GB/s;")
        if "bench_matmul_tflops" in s:
            parts.append(f"plain matmul {s['bench_matmul_tflops']:.1f} TFLOP/s;")
        if "burn_efficiency" in s:
            parts.append(f"efficiency {s['burn_efficiency']:.1%};")
        if pw.get("power_of_limit") is not None:
            parts.append(f"power {pw['power_median_w']:.0f} of {pw['power_limit_w']:.0f} W "
                         f"({pw['power_of_limit']:.1%})")
        print(" ".join(parts), file=out)
    for line in serving_lines(engine):
        print(line, file=out)
    if summary.get("no_telemetry"):
        print(f"no GPU telemetry: {summary['no_telemetry']}", file=out)
    doc = heartbeat_doc(p, time.time(), time.process_time())
    print(f"state {p.state}; {p.ticks} ticks, {p.rows} GPU samples; sampler CPU "
          f"{doc['sampler_cpu_ms_per_tick']} ms per tick ({doc['sampler_cpu_ms_per_gpu_sample']} ms per GPU sample)"
          + (f"; last error: {p.last_error}" if p.last_error else ""), file=out, flush=True)


def serving_lines(engine: dict) -> list[str]:
    """The summary of a ``vllm`` or ``endpoint`` engine (vllm_engine's ``summary()``) as lines:
    the server, the load, each server-log finding with what to try, the notes."""
    lines = []
    server = engine.get("server")
    if server:
        ready = server.get("ready_after_s")
        lines.append(f"vLLM server: {'never ready' if ready is None else f'ready after {ready} s'}, RSS peak "
                     f"{server.get('rss_peak_mib')} MiB, exit code {server.get('exit_code')}"
                     + (f" after {server['stopped_with']}" if server.get("stopped_with") else "")
                     + f"; log {server.get('log')}")
    if engine.get("url"):
        lines.append(f"endpoint {engine['url']}")
    load = engine.get("load")
    if load:
        ttft, tpot = load.get("ttft_ms") or {}, load.get("tpot_ms") or {}
        lines.append(f"load: {load.get('requests_completed')} requests, {load.get('output_tokens')} output tokens "
                     f"in {load.get('duration_s')} s over {load.get('windows')} windows; "
                     f"TTFT p50 {ttft.get('p50')} ms, TPOT p50 {tpot.get('p50')} ms; "
                     f"errors {load.get('errors') or 'none'}")
    for f in engine.get("findings") or ():
        lines.append(f"server log line {f['line']}: {f['symptom']}: {f['summary']}; try: {f['suggestion']}")
    lines += [f"note: {n}" for n in engine.get("notes") or ()]
    return lines


def finding_events(engine_summary: dict, host: str, now: float) -> list[EventRow]:
    """The server-log findings of a ``vllm`` engine's summary as events.csv rows (symptom, line)."""
    return [EventRow(round(now, 3), host, None, f["symptom"], f["line"]) for f in engine_summary.get("findings") or ()]

