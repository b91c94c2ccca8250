#!/usr/bin/env python3
"""preflight soak agent: load the GPUs of this node, sample them through NVML, write it all down.

One self-contained file (stdlib + nvidia-ml-py's ``pynvml``; ``torch`` for the ``burn`` engine)
that never imports preflight: the controller ships this source to a node over SSH and runs it
there with ``python3``; it runs the same way on this machine:

    python3 agent.py --seconds 60 --engine burn --interval 0.1 --out DIR [--bench 20] [--detach]
    python3 agent.py --seconds 3600 --engine vllm --model llama-3-70b-dense --vllm-python VENV/bin/python3 \
        [--vllm-arg=--enforce-eager] [--vllm-arg='--kv-cache-dtype fp8'] [--concurrency 256] --out DIR
    python3 agent.py --seconds 3600 --engine endpoint --endpoint http://127.0.0.1:8000 --out DIR

What it writes into DIR, as it goes (contract ``preflight-soak/1``; columns after the contract's
may follow, readers must ignore those they do not know):
- ``soak.json``: ``{"format": "preflight-soak/1", "engine", "started", "hosts": [this host]}``
  plus ``gpus`` (per host: name, UUID, PCI bus id, slowdown/shutdown/max-operating thresholds in
  absolute degrees C as NVML reports them, power limits, maximum clocks), written once at start.
- ``telemetry.csv``: one row per GPU per interval: the contract's columns (time, host, gpu,
  temperature_c, memory_temperature_c, sm_clock_mhz, memory_clock_mhz, power_w, power_limit_w,
  utilization_pct, memory_used_mib, clocks_event_reasons), then the GPU's slowdown threshold
  (``slowdown_temperature_c``, which preflight.soak.data understands), memory utilisation,
  volatile ECC totals, remapped-row counts and the clocks-event reasons' cumulative time
  counters (ns; read every ``COUNTERS_EVERY_S``, empty in between). Any other empty cell is
  "not available on this GPU/driver"; a GPU that stops answering (fallen off the bus) gets no
  more rows rather than rows of empty cells.
- ``throughput.csv``: time, host, metric, value, gpu: per engine window, the node's total with
  an empty ``gpu`` cell (``tflops`` and ``hbm_gbps`` for ``burn``; ``output_tokens_per_s``,
  TTFT/TPOT percentiles and the server's gauges for ``vllm`` and ``endpoint``, see loadgen.py)
  and each GPU's own (``gpu_tflops``, ``gpu_hbm_gbps``).
- ``events.csv``: time, host, gpu, event, data: NVML events (XIDs with their number as data,
  ECC errors), where the driver supports an event set; and at the end, each known failure the
  ``vllm`` engine found in its server log, the symptom as event and its line as data
  (``vllm-cuda-graph-capture-error``, ``vllm-engine-dead``...; vllm_engine.scan_server_log).
- ``vllm-server.log``, ``loadgen.log``: the ``vllm`` engine's server output and the load
  generator's stderr (``endpoint``: loadgen.log only).
- ``heartbeat.json``: progress and state (starting, running, finished, failed), last error, and
  the sampler's own CPU time per tick, replaced atomically every interval; at the end it also
  holds a summary (per GPU median throughput, power against the limit, the ``--bench`` result).
- ``agent.log``: stdout/stderr of a ``--detach``-ed agent.

Crash safety: each interval's rows go to the CSV files in one ``write`` on an ``O_APPEND``
descriptor, so a ``kill -9`` leaves only whole rows behind and loses at most the interval in
flight; the files are ``fsync``-ed every few seconds against a machine crash.

Engines: ``burn`` runs one process per GPU: a bf16 GEMM (8192-square on GPUs of 16 GiB or more)
for most of each window, then an HBM device-to-device copy for ``--copy-fraction`` of it, and
reports each phase's rate; ``none`` only samples (the GPUs run the user's own load).
``--bench S`` then runs a plain ``torch.matmul`` loop on the same sizes for S seconds on each
GPU, on a GPU as hot as the burn left it, so the burn's efficiency can be read off the summary.

``vllm`` serves a model (``--model``: a built-in config name from ``models/``, an HF config
directory or a model path) with dummy weights and loads it through the streaming load
generator; ``endpoint`` loads a server that is already running. Both come from
``vllm_engine.py`` and ``loadgen.py``, which must sit beside this file (the controller ships
them there). For ``vllm``, ``--seconds`` counts from the moment the server answers: its start-up
(up to ``--ready-timeout``) comes on top, so an hour's soak is an hour of load.

NVML is required, except for ``vllm`` on a machine without the NVIDIA driver (vLLM on the CPU,
as in CI): the agent then says so, runs without GPU telemetry (telemetry.csv holds only its
header) and records why in soak.json's ``no_telemetry``, which the analysis reports instead of
failing the host.

Test hook: ``--fake-nvml FILE:FACTORY`` loads ``FACTORY()`` from the Python file FILE and uses
what it returns in place of the ``pynvml`` module (tests replay recorded NVML values with it).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import os
import queue
import select
import shlex
import signal
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

FORMAT = "preflight-soak/1"
HEARTBEAT_FORMAT = "preflight-soak-heartbeat/1"
ENGINES = ("burn", "none", "vllm", "endpoint")
SERVING_ENGINES = ("vllm", "endpoint")  # from vllm_engine.py beside this file
# Where the controller puts vllm_engine.py, loadgen.py and models/; resolved now, since a
# --detach-ed agent changes its directory to /.
HERE = Path(__file__).resolve().parent
MAX_RATE_HZ = 10.0
# fsync at most this often: each interval's write already reaches the page cache, which
# survives the agent's death; fsync only guards against the machine's.
FSYNC_EVERY_S = 2.0
# How long a --detach parent waits for the agent to report that it is sampling.
DETACH_WAIT_S = 30.0
ENGINE_STOP_S = 60.0


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


# --- NVML sampler ------------------------------------------------------------------------------

# Field-value columns, read in one nvmlDeviceGetFieldValues call per GPU per tick. A constant
# missing from an older nvidia-ml-py simply leaves its column empty.
_FIELDS = (
    ("memory_temperature_c", "NVML_FI_DEV_MEMORY_TEMP"),
    ("ecc_sbe_volatile", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
    ("ecc_dbe_volatile", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
    ("remapped_rows_correctable", "NVML_FI_DEV_REMAPPED_COR"),
    ("remapped_rows_uncorrectable", "NVML_FI_DEV_REMAPPED_UNC"),
    ("remapped_rows_pending", "NVML_FI_DEV_REMAPPED_PENDING"),
    ("remapped_rows_failure", "NVML_FI_DEV_REMAPPED_FAILURE"),
)
# The clocks-event reasons' cumulative time counters (ns; nvidia-smi -q shows the same in us).
# On an H200 (driver 580) reading the HW thermal and HW power brake ones costs about 1 ms of CPU
# each against tens of us for every other reading, so the counters are read only every
# COUNTERS_EVERY_S (empty cells in between); every row still carries the instant bitmask.
COUNTERS_EVERY_S = 5.0
_COUNTERS = (
    ("sw_power_cap_ns", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP"),
    ("sync_boost_ns", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST"),
    ("sw_thermal_ns", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN"),
    ("hw_thermal_ns", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"),
    ("hw_power_brake_ns", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN"),
)
# nvmlFieldValue_t.valueType -> member of its value union.
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# Readings whose failure on every call of a tick means the GPU stopped answering.
_CORE = ("temperature_c", "sm_clock_mhz", "power_w")
_THRESHOLDS = (
    ("slowdown_c", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
    ("shutdown_c", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
    ("max_operating_c", "NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
    ("memory_max_c", "NVML_TEMPERATURE_THRESHOLD_MEM_MAX"),
)
_EVENTS = (
    ("xid", "nvmlEventTypeXidCriticalError"),
    ("ecc_dbe", "nvmlEventTypeDoubleBitEccError"),
    ("ecc_sbe", "nvmlEventTypeSingleBitEccError"),
    ("gpu_unavailable", "nvmlEventTypeGpuUnavailableError"),
    ("dram_retirement", "nvmlEventTypeDramRetirementEvent"),
    ("dram_retirement_failure", "nvmlEventTypeDramRetirementFailure"),
    ("gpu_recovery_action", "nvmlEventTypeGpuRecoveryAction"),
)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Sampler:
    """Reads every GPU through an NVML binding (``pynvml`` or a stand-in with its interface).

    A call the GPU or driver does not support is asked once and then left alone (its column
    stays empty); any other NVML error empties the cell for that tick and is kept in
    ``errors`` for the heartbeat, so one flaky reading never stops the soak.
    """

    def __init__(self, nvml, host: str):
        self.nvml = nvml
        self.host = host
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._unsupported: set[tuple[int, str]] = set()
        self._reasons_call: dict[int, str] = {}
        self._fields = [(col, getattr(nvml, name)) for col, name in _FIELDS if hasattr(nvml, name)]
        self._counters = [(col, getattr(nvml, name)) for col, name in _COUNTERS if hasattr(nvml, name)]
        self._counters_due: dict[int, float] = {}
        self._unsupported_codes = tuple(getattr(nvml, c) for c in (
            "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_DEPRECATED") if hasattr(nvml, c))
        self.errors: list[str] = []
        self.gpus = [self._describe(gpu) for gpu in range(len(self.handles))]

    def _call(self, gpu: int, what: str, fn_name: str, *args):
        """``nvml.<fn_name>(handle, *args)``, or None when unsupported or failing."""
        if (gpu, what) in self._unsupported:
            return None
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            self._unsupported.add((gpu, what))
            return None
        try:
            return fn(self.handles[gpu], *args)
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) in self._unsupported_codes:
                self._unsupported.add((gpu, what))
            else:
                self.errors.append(f"GPU {gpu}: {fn_name}: {exc}")
            return None

    def _reasons(self, gpu: int) -> int | None:
        # The Throttle call is deprecated (removed in CUDA 14) but older drivers have only it.
        names = ([self._reasons_call[gpu]] if gpu in self._reasons_call else
                 ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"])
        for name in names:
            value = self._call(gpu, name, name)
            if value is not None:
                self._reasons_call[gpu] = name
                return int(value)
        return None

    def _field_values(self, gpu: int, now: float) -> dict[str, int | float | None]:
        wanted = self._fields
        if now >= self._counters_due.get(gpu, 0.0):
            self._counters_due[gpu] = now + COUNTERS_EVERY_S
            wanted = wanted + self._counters
        if not wanted:
            return {}
        values = self._call(gpu, "fields", "nvmlDeviceGetFieldValues", [fid for _, fid in wanted])
        if values is None:
            return {}
        out = {}
        for (col, _), v in zip(wanted, values):
            member = _VALUE_MEMBER.get(v.valueType)
            if v.nvmlReturn == 0 and member:
                out[col] = getattr(v.value, member)
        return out

    def sample(self, gpu: int) -> GpuSample | None:
        n = self.nvml
        errors_before = len(self.errors)
        now = time.time()
        power = self._call(gpu, "power", "nvmlDeviceGetPowerUsage")
        limit = self._call(gpu, "limit", "nvmlDeviceGetEnforcedPowerLimit")
        util = self._call(gpu, "util", "nvmlDeviceGetUtilizationRates")
        mem = self._call(gpu, "mem", "nvmlDeviceGetMemoryInfo")
        row = {
            "temperature_c": self._call(gpu, "temp", "nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU),
            "sm_clock_mhz": self._call(gpu, "sm", "nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM),
            "memory_clock_mhz": self._call(gpu, "memclk", "nvmlDeviceGetClockInfo", n.NVML_CLOCK_MEM),
            "power_w": None if power is None else round(power / 1000, 3),
            "power_limit_w": None if limit is None else round(limit / 1000, 3),
            "utilization_pct": None if util is None else util.gpu,
            "memory_utilization_pct": None if util is None else util.memory,
            "memory_used_mib": None if mem is None else mem.used // (1 << 20),
            "clocks_event_reasons": self._reasons(gpu),
            "slowdown_temperature_c": self.gpus[gpu]["slowdown_c"],
            **self._field_values(gpu, now),
        }
        if len(self.errors) > errors_before and all(row[k] is None for k in _CORE):
            return None  # the GPU stopped answering; its rows stop here
        return GpuSample(time=round(now, 3), host=self.host, gpu=gpu, **row)

    def _describe(self, gpu: int) -> dict:
        """Identity, thresholds (absolute degrees C, as NVML reports them; nvidia-smi shows
        margins on Hopper), power limits and maximum clocks: read once, at start."""
        n = self.nvml
        info: dict = {"gpu": gpu}
        for key, fn in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
            value = self._call(gpu, key, fn)
            info[key] = None if value is None else _text(value)
        pci = self._call(gpu, "pci", "nvmlDeviceGetPciInfo")
        info["pci_bus_id"] = None if pci is None else _text(pci.busId)
        for key, const in _THRESHOLDS:
            info[key] = (self._call(gpu, key, "nvmlDeviceGetTemperatureThreshold", getattr(n, const))
                         if hasattr(n, const) else None)
        for key, fn in (("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit"),
                        ("default_power_limit_w", "nvmlDeviceGetPowerManagementDefaultLimit")):
            mw = self._call(gpu, key, fn)
            info[key] = None if mw is None else mw / 1000
        info["max_sm_clock_mhz"] = self._call(gpu, "maxsm", "nvmlDeviceGetMaxClockInfo", n.NVML_CLOCK_SM)
        info["max_memory_clock_mhz"] = self._call(gpu, "maxmem", "nvmlDeviceGetMaxClockInfo", n.NVML_CLOCK_MEM)
        return info

    def driver(self) -> dict:
        out = {}
        for key, fn in (("driver_version", "nvmlSystemGetDriverVersion"), ("nvml_version", "nvmlSystemGetNVMLVersion")):
            try:
                out[key] = _text(getattr(self.nvml, fn)())
            except (AttributeError, self.nvml.NVMLError):
                out[key] = None
        return out

    def take_errors(self) -> list[str]:
        errors, self.errors = self.errors, []
        return errors

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


class NoTelemetry:
    """The sampler's stand-in on a machine without the NVIDIA driver: no GPUs, no rows."""

    def __init__(self, reason: str):
        self.reason = reason
        self.nvml = None
        self.handles: list = []
        self.gpus: list[dict] = []

    def driver(self) -> dict:
        return {}

    def take_errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def nvidia_driver_loaded() -> bool:
    """Whether the NVIDIA kernel driver knows any GPU (it lists each in /proc/driver/nvidia/gpus)."""
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


class EventWatcher(threading.Thread):
    """Waits on an NVML event set (XIDs, ECC errors) and queues the events for the main loop,
    which alone writes files. Drivers or VMs without event support leave ``note`` set."""

    def __init__(self, nvml, handles: list, host: str, stop: threading.Event):
        super().__init__(name="nvml-events", daemon=True)
        self.nvml, self.handles, self.host, self.stop = nvml, handles, host, stop
        self._lock = threading.Lock()
        self._rows: list[EventRow] = []
        self.note: str | None = None
        self._names = [(name, getattr(nvml, const)) for name, const in _EVENTS if hasattr(nvml, const)]

    def take(self) -> list[EventRow]:
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def _register(self):
        n = self.nvml
        event_set = n.nvmlEventSetCreate()
        wanted = 0
        for _, bit in self._names:
            wanted |= bit
        registered = 0
        for handle in self.handles:
            try:
                types = n.nvmlDeviceGetSupportedEventTypes(handle) & wanted
                if types:
                    n.nvmlDeviceRegisterEvents(handle, types, event_set)
                    registered += 1
            except n.NVMLError:
                continue
        return event_set, registered

    def run(self) -> None:
        n = self.nvml
        if not self.handles:
            self.note = "no GPUs to watch for NVML events"
            return
        try:
            event_set, registered = self._register()
        except Exception as exc:  # noqa: BLE001 - no events is a note, never the agent's end
            self.note = f"NVML events not available: {type(exc).__name__}: {exc}"
            return
        if not registered:
            self.note = "NVML events not supported on any GPU"
            n.nvmlEventSetFree(event_set)
            return
        wait = getattr(n, "nvmlEventSetWait_v2", None) or n.nvmlEventSetWait
        try:
            while not self.stop.is_set():
                try:
                    data = wait(event_set, 500)
                except n.NVMLError as exc:
                    if getattr(exc, "value", None) == getattr(n, "NVML_ERROR_TIMEOUT", None):
                        continue
                    self.note = f"NVML event wait failed: {exc}"
                    return
                self._add(data)
        finally:
            n.nvmlEventSetFree(event_set)

    def _add(self, data) -> None:
        try:
            gpu = self.nvml.nvmlDeviceGetIndex(data.device)
        except self.nvml.NVMLError:
            gpu = None
        names = [name for name, bit in self._names if data.eventType & bit] or [f"type_{data.eventType:#x}"]
        with self._lock:
            self._rows += [EventRow(round(time.time(), 3), self.host, gpu, name, data.eventData) for name in names]


# --- Engines -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BurnParams:
    window_s: float = 5.0
    copy_fraction: float = 0.1
    gemm_size: int | None = None
    bench_s: float = 0.0


class NoEngine:
    """Samples only: the GPUs carry whatever the user runs on them."""

    def start(self, grid_t0: float) -> None:
        pass

    def poll(self, host: str, final: bool = False) -> tuple[list[ThroughputRow], list[str]]:
        return [], []

    def running(self) -> bool:
        return True

    def finish(self, stopped: bool) -> list[str]:
        return []

    def summary(self) -> dict:
        return {}


class WindowBook:
    """Per-GPU windows gathered by index into the node's totals.

    Every worker ends window k at the same wall-clock instant (``grid_t0 + k * window_s``), so
    the node's throughput for window k is the sum over its GPUs. Window k is released once every
    expected GPU has reported it, or once some GPU is two windows further (a GPU that stopped
    reporting must not hold the node's rows back), or at the end.
    """

    def __init__(self) -> None:
        self._pending: dict[int, dict[int, tuple[float, float]]] = {}
        self._newest = -1

    def add(self, k: int, gpu: int, tflops: float, gbps: float) -> None:
        self._pending.setdefault(k, {})[gpu] = (tflops, gbps)
        self._newest = max(self._newest, k)

    def release(self, expected: set[int], final: bool = False) -> list[tuple[int, dict[int, tuple[float, float]]]]:
        out = []
        for k in sorted(self._pending):
            got = self._pending[k]
            if final or expected <= set(got) or self._newest >= k + 2:
                out.append((k, self._pending.pop(k)))
            else:
                break
        return out


class BurnEngine:
    """One spawned process per GPU (``_burn_worker``), reporting over a queue; see the module
    docstring for what each does. The processes die with the agent (PR_SET_PDEATHSIG, and a
    parent check every window), so a ``kill -9`` of the agent leaves no orphan burning a GPU.

    Rows: ``tflops`` and ``hbm_gbps`` per window for the node (sum over its GPUs, empty ``gpu``
    cell), and ``gpu_tflops`` / ``gpu_hbm_gbps`` per GPU (``gpu`` set)."""

    def __init__(self, gpus: list[tuple[int, str]], params: BurnParams):
        import multiprocessing

        self._mp = multiprocessing.get_context("spawn")
        self.gpus, self.params = gpus, params
        self._queue = self._mp.Queue()
        self._finish = self._mp.Event()
        self._stop = self._mp.Event()
        self._procs: dict = {}
        self._ready: set[int] = set()
        self._reported_exit: set[int] = set()
        self._book = WindowBook()
        self._grid_t0 = 0.0
        self.windows: dict[int, list[tuple[float, float, float]]] = {}
        self.bench: dict[int, float] = {}
        self.info: dict[int, dict] = {}

    def start(self, grid_t0: float) -> None:
        self._grid_t0 = grid_t0
        for gpu, uuid in self.gpus:
            proc = self._mp.Process(target=_burn_worker, name=f"burn-gpu{gpu}",
                                    args=(gpu, uuid, self.params, grid_t0, self._queue, self._finish, self._stop,
                                          os.getpid()))
            proc.start()
            self._procs[gpu] = proc

    def poll(self, host: str, final: bool = False) -> tuple[list[ThroughputRow], list[str]]:
        rows, errors = [], []
        while True:
            try:
                msg = self._queue.get_nowait()
            except queue.Empty:
                break
            kind, gpu = msg[0], msg[1]
            if kind == "window":
                _, _, k, t, tflops, gbps = msg
                self.windows.setdefault(gpu, []).append((t, tflops, gbps))
                self._book.add(k, gpu, tflops, gbps)
                rows += [ThroughputRow(round(t, 3), host, "gpu_tflops", round(tflops, 3), gpu),
                         ThroughputRow(round(t, 3), host, "gpu_hbm_gbps", round(gbps, 2), gpu)]
            elif kind == "ready":
                self._ready.add(gpu)
                self.info[gpu] = msg[2]
            elif kind == "bench":
                self.bench[gpu] = msg[2]
            elif kind == "error":
                errors.append(f"burn on GPU {gpu}: {msg[2]}")
        for gpu, proc in self._procs.items():
            if proc.exitcode not in (None, 0) and gpu not in self._reported_exit:
                self._reported_exit.add(gpu)
                errors.append(f"burn on GPU {gpu}: process exited with code {proc.exitcode}")
        expected = {g for g in self._ready if self._procs[g].exitcode is None}
        for k, got in self._book.release(expected, final):
            t = round(self._grid_t0 + k * self.params.window_s, 3)
            rows += [ThroughputRow(t, host, "tflops", round(sum(v[0] for v in got.values()), 3)),
                     ThroughputRow(t, host, "hbm_gbps", round(sum(v[1] for v in got.values()), 2))]
        return rows, errors

    def running(self) -> bool:
        return any(proc.exitcode is None for proc in self._procs.values())

    def finish(self, stopped: bool) -> list[str]:
        """Ask the workers to end (bench first unless ``stopped``); wait for them, then force."""
        if stopped:
            self._stop.set()
        self._finish.set()
        deadline = time.monotonic() + ENGINE_STOP_S + (0 if stopped else self.params.bench_s)
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
        errors = []
        for gpu, proc in self._procs.items():
            if proc.is_alive():
                errors.append(f"burn on GPU {gpu}: did not stop in time; killed")
                proc.kill()
                proc.join(5)
        return errors

    def summary(self) -> dict:
        out = {}
        for gpu, _ in self.gpus:
            windows = self.windows.get(gpu, [])
            s: dict = dict(self.info.get(gpu, {}))
            if windows:
                s["tflops_median"] = round(statistics.median(w[1] for w in windows), 2)
                s["hbm_gbps_median"] = round(statistics.median(w[2] for w in windows), 1)
                s["windows"] = len(windows)
                s["first_window"], s["last_window"] = windows[0][0], windows[-1][0]
            if gpu in self.bench:
                s["bench_matmul_tflops"] = round(self.bench[gpu], 2)
                if windows:
                    s["burn_efficiency"] = round(s["tflops_median"] / self.bench[gpu], 4)
            out[str(gpu)] = s
        return out


def gemm_size(total_memory_bytes: int) -> int:
    """Square bf16 GEMM size: 8192 keeps Hopper/Blackwell tensor cores at their peak with room
    to spare (3 x 128 MiB); smaller GPUs get 4096."""
    return 8192 if total_memory_bytes >= 16 << 30 else 4096


def copy_bytes(total_memory_bytes: int) -> int:
    """Each of the copy's two buffers: 1/32 of the GPU's memory, at most 2 GiB: far past any L2."""
    return min(2 << 30, total_memory_bytes // 32)


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _timed_loop(fn, seconds: float, ended, chunk: list[int], sync) -> tuple[float, int]:
    """Run ``fn`` for about ``seconds`` (at least one chunk); synchronise only every chunk, grown
    until one takes >= 50 ms and kept in ``chunk`` between calls, so the GPU never waits on us."""
    t0 = time.perf_counter()
    count = 0
    while True:
        t_chunk = time.perf_counter()
        for _ in range(chunk[0]):
            fn()
        sync()
        count += chunk[0]
        now = time.perf_counter()
        if now - t_chunk < 0.05:
            chunk[0] *= 2
        if now - t0 >= seconds or any(e.is_set() for e in ended):
            return now - t0, count


def _burn_worker(gpu: int, uuid: str, params: BurnParams, grid_t0: float, queue, finish, stop, parent: int) -> None:
    """One GPU's burn, in its own process. Sees only its GPU (CUDA_VISIBLE_DEVICES=UUID), so
    its CUDA device 0 is NVML's GPU ``gpu`` whatever CUDA's device order."""
    _die_with_parent(parent)
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    try:
        import torch

        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        total = torch.cuda.get_device_properties(dev).total_memory
        n = params.gemm_size or gemm_size(total)
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        nbytes = copy_bytes(total)
        src = torch.randint(0, 255, (nbytes,), device=dev, dtype=torch.uint8)
        dst = torch.empty_like(src)
        flop = 2.0 * n ** 3
        sync = torch.cuda.synchronize
        # Plain str: torch.__version__ is torch's own str subclass, and unpickling it would
        # import torch (seconds of CPU, GBs of memory) into the agent.
        queue.put(("ready", gpu, {"gemm_size": n, "copy_bytes": nbytes,
                                  "device": str(torch.cuda.get_device_name(dev)), "torch": str(torch.__version__)}))
        gemm_chunk, copy_chunk = [1], [1]
        ended = (finish, stop)
        width, copy_s = params.window_s, params.window_s * params.copy_fraction
        while not any(e.is_set() for e in ended) and os.getppid() == parent:
            k = int((time.time() - grid_t0) // width) + 1
            gemm_s = grid_t0 + k * width - copy_s - time.time()
            if gemm_s <= 0.1 * width:
                k += 1  # too little of this window left (the first one, after start-up): join the next
                gemm_s += width
            t_gemm, done_gemm = _timed_loop(lambda: torch.matmul(a, b, out=c), gemm_s, ended, gemm_chunk, sync)
            t_copy, done_copy = _timed_loop(lambda: dst.copy_(src), grid_t0 + k * width - time.time(),
                                            ended, copy_chunk, sync)
            # A copy reads and writes every byte: 2 x nbytes of HBM traffic.
            queue.put(("window", gpu, k, time.time(), flop * done_gemm / t_gemm / 1e12,
                       2 * nbytes * done_copy / t_copy / 1e9))
        if os.getppid() != parent:
            return
        if params.bench_s > 0 and not stop.is_set():
            t, done = _timed_loop(lambda: torch.matmul(a, b), params.bench_s, (stop,), [1], sync)
            queue.put(("bench", gpu, flop * done / t / 1e12))
    except BaseException as exc:  # noqa: BLE001 - reported to the agent, then the process fails
        queue.put(("error", gpu, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None


# --- The agent ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeParams:
    """The ``vllm`` and ``endpoint`` engines' options (vllm_engine.VllmParams and loadgen.LoadConfig
    are built from them only when such an engine runs, so burn nodes need neither file)."""

    model: str | None = None
    python: str = "python3"
    extra_args: tuple[str, ...] = ()
    skip_tokenizer_init: bool = True
    ready_timeout_s: float = 1200.0
    endpoint: str | None = None
    concurrency: int = 256
    max_tokens: int = 256


@dataclass(frozen=True)
class AgentConfig:
    out: Path
    host: str
    engine: str
    seconds: float
    interval_s: float
    gpus: tuple[int, ...] | None = None
    burn: BurnParams = field(default_factory=BurnParams)
    serve: ServeParams = field(default_factory=ServeParams)

    @property
    def startup_allowance_s(self) -> float:
        """Time past ``seconds`` the soak may take: a vLLM server's start-up (see the docstring)."""
        return self.serve.ready_timeout_s if self.engine == "vllm" else 0.0


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


class Agent:
    """Samples every interval until ``cfg.seconds`` have passed or a stop is requested (SIGTERM,
    SIGINT, ``request_stop``), then lets the engine finish while still sampling.
    ``driver_loaded`` tells a machine without the NVIDIA driver (see the module docstring)."""

    def __init__(self, cfg: AgentConfig, load_nvml, engine_factory=None, driver_loaded=nvidia_driver_loaded):
        self.cfg = cfg
        self.load_nvml = load_nvml
        self.engine_factory = engine_factory or _make_engine
        self.driver_loaded = driver_loaded
        self.progress = Progress(os.getpid(), cfg.host, cfg.engine, time.time(), cfg.seconds, cfg.interval_s)
        self.stop_requested = False
        # Sleeping in select() on this pipe lets a signal handler (or another thread) end a sleep
        # at once without taking a lock the interrupted main thread might hold.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._done = threading.Event()  # tells the event thread to end
        self._power: dict[int, list[tuple[float, float]]] = {}
        self._engine_failed = False

    def request_stop(self, *_signal) -> None:
        self.stop_requested = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # a wake-up is already pending, or the run is over and the pipe closed

    def _beat(self, sync: bool = False) -> None:
        write_json_atomic(self.cfg.out / "heartbeat.json",
                          heartbeat_doc(self.progress, time.time(), time.process_time()), sync)

    def _fail(self, message: str) -> int:
        self.progress.error(message)
        self.progress.state = self.progress.phase = "failed"
        self._beat(sync=True)
        print(f"preflight soak agent: failed: {message}", file=sys.stderr, flush=True)
        return 1

    def _write_soak_json(self, gpus: list[dict], driver: dict, no_telemetry: str | None = None) -> None:
        cfg = self.cfg
        doc = {
            "format": FORMAT,
            "engine": cfg.engine,
            "started": iso(self.progress.started),
            "hosts": [cfg.host],
            "planned_s": cfg.seconds,
            "interval_s": cfg.interval_s,
            "agent": {"pid": os.getpid(), "python": sys.version.split()[0], **driver},
            "gpus": {cfg.host: gpus},
        }
        if no_telemetry:
            doc["no_telemetry"] = {cfg.host: no_telemetry}
        write_json_atomic(cfg.out / "soak.json", doc, sync=True)

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
        try:
            engine.start(self.progress.started)
        except Exception as exc:  # noqa: BLE001 - e.g. torch missing: a failed soak, said plainly
            return self._fail(f"engine {cfg.engine}: {type(exc).__name__}: {exc}")
        logs = {
            "telemetry": AppendLog(cfg.out / "telemetry.csv", TELEMETRY_COLUMNS),
            "throughput": AppendLog(cfg.out / "throughput.csv", THROUGHPUT_COLUMNS),
            "events": AppendLog(cfg.out / "events.csv", EVENT_COLUMNS),
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
        engine_summary = engine.summary()
        logs["events"].append(row_text(finding_events(engine_summary, cfg.host, time.time())))
        for log in logs.values():
            log.sync()
            log.close()
        limits = {d["gpu"]: d.get("power_limit_w") for d in described}
        p.summary = {"engine": engine_summary, "power": power_summary(self._power, limits, engine_summary),
                     "stopped_by_signal": stopped, "events": events.note}
        if no_telemetry:
            p.summary["no_telemetry"] = no_telemetry
        p.state = p.phase = "failed" if self._engine_failed else "finished"
        self._beat(sync=True)
        print_summary(p, sys.stdout)
        return 1 if self._engine_failed else 0

    def _tick(self, sampler: Sampler | NoTelemetry, engine, events: EventWatcher, logs: dict, last_sync: list[float],
              final: bool = False) -> None:
        """One interval: read every GPU, append the rows, replace the heartbeat. Its CPU time (this
        thread's, the heartbeat's write included) is what the heartbeat reports per tick."""
        p = self.progress
        cpu0 = time.thread_time()
        samples = [s for gpu in range(len(sampler.handles)) if (s := sampler.sample(gpu)) is not None]
        rows, engine_errors = engine.poll(self.cfg.host, final)
        logs["telemetry"].append(row_text(samples))
        logs["throughput"].append(row_text(rows))
        logs["events"].append(row_text(events.take()))
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
            parts.append(f"power {pw['power_median_w']:.0f} of {pw['power_limit_w']:.0f} W ({pw['power_of_limit']:.1%})")
        print(" ".join(parts), file=out)
    for line in serving_lines(engine):
        print(line, file=out)
    if summary.get("no_telemetry"):
        print(f"no GPU telemetry: {summary['no_telemetry']}", file=out)
    doc = heartbeat_doc(p, time.time(), time.process_time())
    print(f"state {p.state}; {p.ticks} ticks, {p.rows} GPU samples; sampler CPU "
          f"{doc['sampler_cpu_ms_per_tick']} ms per tick ({doc['sampler_cpu_ms_per_gpu_sample']} ms per GPU sample)"
          + (f"; last error: {p.last_error}" if p.last_error else ""), file=out, flush=True)


class EngineUnavailable(RuntimeError):
    """An engine's files are not beside the agent."""


def serving_module():
    """vllm_engine.py from beside this file, imported as the top-level module it is on a node
    (it imports its sibling loadgen.py the same way)."""
    missing = [name for name in ("vllm_engine.py", "loadgen.py") if not (HERE / name).is_file()]
    if missing:
        raise EngineUnavailable(f"{' and '.join(missing)} not found beside the agent in {HERE}: the vllm and "
                                "endpoint engines need them (preflight soak ships them with agent.py)")
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import vllm_engine

    return vllm_engine


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
                     f"in {load.get('duration_s')} s over {load.get('windows')} windows; TTFT p50 {ttft.get('p50')} ms, "
                     f"TPOT p50 {tpot.get('p50')} ms; errors {load.get('errors') or 'none'}")
    for f in engine.get("findings") or ():
        lines.append(f"server log line {f['line']}: {f['symptom']}: {f['summary']}; try: {f['suggestion']}")
    lines += [f"note: {n}" for n in engine.get("notes") or ()]
    return lines


def _make_engine(cfg: AgentConfig, gpus: list[tuple[int, str]]):
    if cfg.engine == "none":
        return NoEngine()
    if cfg.engine == "burn":
        return BurnEngine(gpus, cfg.burn)
    ve = serving_module()
    sp = cfg.serve
    if cfg.engine == "endpoint":
        load = ve.loadgen.LoadConfig(url=sp.endpoint, concurrency=sp.concurrency, max_tokens=sp.max_tokens)
        return ve.EndpointEngine(load, cfg.out, cfg.seconds)
    # The engine points the load at its own server once it has a port.
    load = ve.loadgen.LoadConfig(concurrency=sp.concurrency, max_tokens=sp.max_tokens)
    params = ve.VllmParams(model=sp.model, python=sp.python, skip_tokenizer_init=sp.skip_tokenizer_init,
                           extra_args=sp.extra_args, ready_timeout_s=sp.ready_timeout_s, load=load)
    return ve.VllmEngine(params, cfg.out, cfg.seconds, [uuid for _, uuid in gpus if uuid])


def finding_events(engine_summary: dict, host: str, now: float) -> list[EventRow]:
    """The server-log findings of a ``vllm`` engine's summary as events.csv rows (symptom, line)."""
    return [EventRow(round(now, 3), host, None, f["symptom"], f["line"]) for f in engine_summary.get("findings") or ()]


def load_nvml(fake: str | None):
    if not fake:
        import pynvml

        return pynvml
    path, _, factory = fake.rpartition(":")
    spec = importlib.util.spec_from_file_location("preflight_soak_fake_nvml", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, factory)()


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
    log = os.open(out / "agent.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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
            beat = json.loads((out / "heartbeat.json").read_text())
        except (OSError, ValueError):
            beat = None
        if beat and beat.get("state") != "starting":
            state, error = beat["state"], beat.get("last_error")
            break
        time.sleep(0.05)
    print(json.dumps({"pid": pid, "dir": str(out), "state": state, "last_error": error}), flush=True)
    return 1 if state in ("failed", "unknown") else 0


# --- Command line ------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="agent.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="soak directory to create (default: ./soak-TIMESTAMP)")
    ap.add_argument("--seconds", type=_seconds, default=3600.0, help="how long to run (default 3600)")
    ap.add_argument("--engine", choices=ENGINES, default="burn")
    ap.add_argument("--interval", type=_seconds, default=1.0, help="seconds between samples (default 1; min 0.1)")
    ap.add_argument("--host", default=None, help="name for the host column (default: this host's name)")
    ap.add_argument("--gpus", default=None, help="comma-separated NVML indices to load (default: all; all are sampled)")
    ap.add_argument("--window", type=_seconds, default=5.0, help="burn: seconds per throughput window (default 5)")
    ap.add_argument("--copy-fraction", type=float, default=0.1, help="burn: share of each window spent copying (default 0.1)")
    ap.add_argument("--gemm-size", type=int, default=None, help="burn: GEMM size n (default: by GPU memory)")
    ap.add_argument("--bench", type=_seconds, default=0.0, metavar="S",
                    help="burn: afterwards, run a plain torch.matmul loop on the same sizes for S seconds per GPU")
    serve = ap.add_argument_group("vllm and endpoint engines")
    serve.add_argument("--model", help="vllm: a built-in model config (tiny-llama-ci, llama-3-70b-dense, "
                       "qwen3-235b-a22b-moe), an HF config directory or .json, or a model path")
    serve.add_argument("--vllm-python", default="python3", help="vllm: the Python that has vLLM (default python3)")
    serve.add_argument("--vllm-arg", action="append", default=[], metavar="ARGS",
                       help="vllm: more server flags, split like a shell line; repeatable; write "
                            "--vllm-arg=--enforce-eager or --vllm-arg='--kv-cache-dtype fp8'")
    serve.add_argument("--skip-tokenizer-init", dest="skip_tokenizer_init", action="store_true", default=True,
                       help="vllm: start the server without a tokenizer (the default: the load sends token ids)")
    serve.add_argument("--no-skip-tokenizer-init", dest="skip_tokenizer_init", action="store_false",
                       help="vllm: let the server load the model's tokenizer")
    serve.add_argument("--ready-timeout", type=_seconds, default=ServeParams.ready_timeout_s, metavar="S",
                       help="vllm: longest server start-up, on top of --seconds (default %(default)g)")
    serve.add_argument("--endpoint", metavar="URL", help="endpoint: base URL of the OpenAI-compatible server to load")
    serve.add_argument("--concurrency", type=_count, default=ServeParams.concurrency,
                       help="requests kept in flight (default %(default)d)")
    serve.add_argument("--max-tokens", type=_count, default=ServeParams.max_tokens,
                       help="output tokens per request (default %(default)d)")
    ap.add_argument("--detach", action="store_true", help="run in the background, detached from the terminal/SSH session")
    ap.add_argument("--fake-nvml", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine == "vllm" and not args.model:
        ap.error("--engine vllm needs --model")
    if (args.engine == "endpoint") != bool(args.endpoint):
        ap.error("--endpoint URL goes with --engine endpoint, and --engine endpoint needs it")
    try:
        args.vllm_arg = tuple(a for text in args.vllm_arg for a in shlex.split(text))
    except ValueError as exc:
        ap.error(f"--vllm-arg: {exc}")
    if args.interval < 1 / MAX_RATE_HZ:
        ap.error(f"--interval: at most {MAX_RATE_HZ:g} samples a second (>= {1 / MAX_RATE_HZ:g} s)")
    if not 0 <= args.copy_fraction < 1:
        ap.error("--copy-fraction: must be in [0, 1)")
    if args.gpus is not None:
        try:
            args.gpus = tuple(int(g) for g in args.gpus.split(",") if g.strip())
        except ValueError:
            ap.error(f"--gpus: not a list of GPU indices: {args.gpus!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = (args.out or Path(datetime.now().strftime("soak-%Y%m%d-%H%M%S"))).absolute()
    if (out / "soak.json").exists():
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
    cfg = AgentConfig(out=out, host=args.host or socket.gethostname(), engine=args.engine, seconds=args.seconds,
                      interval_s=args.interval, gpus=args.gpus,
                      burn=BurnParams(args.window, args.copy_fraction, args.gemm_size, args.bench),
                      serve=ServeParams(args.model, args.vllm_python, args.vllm_arg, args.skip_tokenizer_init,
                                        args.ready_timeout, args.endpoint, args.concurrency, args.max_tokens))
    agent = Agent(cfg, lambda: load_nvml(args.fake_nvml))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, agent.request_stop)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
