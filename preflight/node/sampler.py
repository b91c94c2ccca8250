"""The soak agent's NVML side: every GPU read once per interval, and its events watched.

Part of the agent (agent.py beside it; standard library and nvidia-ml-py's ``pynvml``, never
preflight). ``Sampler`` turns one tick of NVML readings per GPU into a ``records.GpuSample``:
instant readings, one ``nvmlDeviceGetFieldValues`` call for the counters, and the GPU's
identity and thresholds read once at start. ``EventWatcher`` waits on an NVML event set (XIDs,
ECC errors) in a thread of its own and hands the events over as ``records.EventRow``s.
``NoTelemetry`` stands in for the sampler where the NVIDIA driver is absent (vLLM on the CPU).

NVML is passed in, not imported here: ``load_nvml`` gives ``pynvml`` or, for tests, what the
agent's ``--fake-nvml FILE:FACTORY`` hook builds (recorded NVML values replayed).
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time

try:
    from .records import EventRow, GpuSample
except ImportError:  # a shipped copy, run from the agent's directory
    from records import EventRow, GpuSample

# What one tick costs is set by how many NVML calls it makes (each is a driver round trip, and on
# a VM slice tens of us of CPU), so a tick makes as few as the readings allow: every figure NVML
# offers as a field value comes from one nvmlDeviceGetFieldValues call per GPU, and readings that
# change slowly (memory in use, the memory clock, ECC and row-remap counts, the clocks-event time
# counters) are read only every SLOW_EVERY_S, their cells empty in between.
SLOW_EVERY_S = 5.0
# Field values read every tick: (column, field constant, scale, the call that stands in where a
# driver lacks the field). Power fields are in mW. NVML_FI_DEV_POWER_AVERAGE is the 1 s average
# that nvmlDeviceGetPowerUsage returns on Ampere and newer (NVML API reference, nvmlDeviceGetPowerUsage
# and the NVML_FI_DEV_POWER_* field ids); older GPUs lack it and fall back to the call.
_FAST_FIELDS = (
    ("power_w", "NVML_FI_DEV_POWER_AVERAGE", 1e-3, "nvmlDeviceGetPowerUsage"),
    ("power_limit_w", "NVML_FI_DEV_POWER_CURRENT_LIMIT", 1e-3, "nvmlDeviceGetEnforcedPowerLimit"),
    ("memory_temperature_c", "NVML_FI_DEV_MEMORY_TEMP", 1, None),
)
# Field values read every SLOW_EVERY_S. The clocks-event reasons' cumulative time counters are ns
# (nvidia-smi -q shows the same in us); on an H200 (driver 580) the HW thermal and HW power brake
# ones cost about 1 ms of CPU each, which alone would be a whole tick's budget.
_SLOW_FIELDS = (
    ("ecc_sbe_volatile", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
    ("ecc_dbe_volatile", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
    ("remapped_rows_correctable", "NVML_FI_DEV_REMAPPED_COR"),
    ("remapped_rows_uncorrectable", "NVML_FI_DEV_REMAPPED_UNC"),
    ("remapped_rows_pending", "NVML_FI_DEV_REMAPPED_PENDING"),
    ("remapped_rows_failure", "NVML_FI_DEV_REMAPPED_FAILURE"),
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


def _scaled(value, scale: float):
    return value if scale == 1 else round(value * scale, 3)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Sampler:
    """Reads every GPU through an NVML binding (``pynvml`` or a stand-in with its interface).

    A call the GPU or driver does not support is asked once and then left alone (its column
    stays empty); any other NVML error empties the cell for that tick and is kept in
    ``errors`` for the heartbeat, so one flaky reading never stops the soak.
    """

    def __init__(self, nvml, host: str, clock=time.time):
        self.nvml = nvml
        self.host = host
        self.clock = clock
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._unsupported: set[tuple[int, str]] = set()
        self._reasons_call: dict[int, str] = {}
        self._fast = [(col, getattr(nvml, name), scale) for col, name, scale, _ in _FAST_FIELDS if hasattr(nvml, name)]
        self._calls = {col: (call, scale) for col, _, scale, call in _FAST_FIELDS if call}
        # Per GPU, the fast columns read through their call: the binding lacks the field's constant,
        # or the GPU did not answer the field.
        no_constant = {col for col, name, _, call in _FAST_FIELDS if call and not hasattr(nvml, name)}
        self._by_call = {gpu: set(no_constant) for gpu in range(len(self.handles))}
        self._slow = [(col, getattr(nvml, name)) for col, name in _SLOW_FIELDS if hasattr(nvml, name)]
        self._slow_due: dict[int, float] = {}
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

    def _field_values(self, gpu: int, slow: bool) -> dict[str, int | float | None]:
        by_call = self._by_call[gpu]
        wanted = [(col, fid, scale) for col, fid, scale in self._fast if col not in by_call]
        if slow:
            wanted += [(col, fid, 1) for col, fid in self._slow]
        ids = [fid for _, fid, _ in wanted]
        values = self._call(gpu, "fields", "nvmlDeviceGetFieldValues", ids) if ids else None
        no_fields = values is None and (gpu, "fields") in self._unsupported
        out: dict[str, int | float | None] = {}
        for (col, _, scale), v in zip(wanted, values or [None] * len(wanted)):  # noqa: B905 - strict= is 3.10+
            member = v is not None and v.nvmlReturn == 0 and _VALUE_MEMBER.get(v.valueType)
            if member:
                out[col] = _scaled(getattr(v.value, member), scale)
            elif col in self._calls and (v is not None or no_fields):
                by_call.add(col)  # a one-off failure of the whole call only empties this tick
        for col in by_call:
            call, scale = self._calls[col]
            value = self._call(gpu, col, call)
            out[col] = None if value is None else _scaled(value, scale)
        return out

    def sample(self, gpu: int) -> GpuSample | None:
        n = self.nvml
        errors_before = len(self.errors)
        now = self.clock()
        slow = now >= self._slow_due.get(gpu, 0.0)
        if slow:
            self._slow_due[gpu] = now + SLOW_EVERY_S
        util = self._call(gpu, "util", "nvmlDeviceGetUtilizationRates")
        mem = self._call(gpu, "mem", "nvmlDeviceGetMemoryInfo") if slow else None
        row = {
            "temperature_c": self._call(gpu, "temp", "nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU),
            "sm_clock_mhz": self._call(gpu, "sm", "nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM),
            "memory_clock_mhz": self._call(gpu, "memclk", "nvmlDeviceGetClockInfo", n.NVML_CLOCK_MEM) if slow else None,
            "utilization_pct": None if util is None else util.gpu,
            "memory_utilization_pct": None if util is None else util.memory,
            "memory_used_mib": None if mem is None else mem.used // (1 << 20),
            "clocks_event_reasons": self._reasons(gpu),
            "slowdown_temperature_c": self.gpus[gpu]["slowdown_c"],
            **self._field_values(gpu, slow),
        }
        if len(self.errors) > errors_before and all(row.get(k) is None for k in _CORE):
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


def load_nvml(fake: str | None):
    if not fake:
        import pynvml

        return pynvml
    path, _, factory = fake.rpartition(":")
    spec = importlib.util.spec_from_file_location("preflight_soak_fake_nvml", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, factory)()

