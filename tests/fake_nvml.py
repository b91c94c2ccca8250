"""A stand-in for the ``pynvml`` module that replays a real H200 burn, for the soak agent's tests.

``FakeNvml`` has pynvml's own constants and error classes, with the device functions replaying
the real H200 burn in tests/fixtures/corpus/h200-vm/burn_samples.json (60 s of a bf16 GEMM
sampled at 10 Hz) and the fixed values the same capture recorded (probe.log: thresholds
89/95/87/95 C, power limit 700000 mW, max clocks 1980/3201 MHz, remapped rows (0, 0, 0, 0),
volatile ECC total 0; nvidia-smi.txt / smi-q.txt: name, UUID, bus id, driver). What the capture
did not record (memory temperature, memory used, the clocks-event counters) answers "not
supported", as such calls do on drivers without them.

Agent processes load this file through the agent's test hook ``--fake-nvml FILE:FACTORY``
(``FAKE_HOOK``), so it imports nothing but pynvml and the standard library: no preflight, no
pytest.
"""

from __future__ import annotations

import bisect
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pynvml

THIS = Path(__file__).resolve()
CORPUS = THIS.parent / "fixtures" / "corpus" / "h200-vm"
SAMPLES = json.loads((CORPUS / "burn_samples.json").read_text())


class FakeNvml:
    """A stand-in for the ``pynvml`` module (see the module docstring for where values come from).

    ``clock`` drives the replay: GPU k reads the sample at ``(clock() - init + k * 7) mod 60.67 s``
    so that several GPUs differ. ``event_reasons=False`` makes the new clocks-event call missing
    (as on drivers before R535), ``lost_at`` makes every call about GPU 1 fail with "GPU is lost"
    from that replay time on, ``events`` are (gpu, event type, data) delivered once through
    an event set.
    """

    def __init__(self, gpus: int = 1, clock=time.monotonic, event_reasons: bool = True,
                 lost_at: float | None = None, events: tuple = ()):
        self.gpus, self.clock, self.lost_at = gpus, clock, lost_at
        self.t0 = None
        self._times = [s["t"] for s in SAMPLES]
        self._events = list(events)
        if not event_reasons:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._missing

    def __getattr__(self, name):
        value = getattr(pynvml, name)  # constants and the NVMLError classes
        if name.startswith("nvml") and callable(value):
            return self._missing  # a function this driver "lacks"
        return value

    @staticmethod
    def _missing(*_args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _elapsed(self) -> float:
        return self.clock() - self.t0

    def _sample(self, gpu: int) -> dict:
        t = self._elapsed()
        if self.lost_at is not None and gpu == 1 and t >= self.lost_at:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        t = (t + 7 * gpu) % self._times[-1]
        return SAMPLES[max(0, bisect.bisect_right(self._times, t) - 1)]

    # Lifecycle and identity
    def nvmlInit(self):
        self.t0 = self.clock()

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetIndex(self, handle):
        return handle

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, h):
        return "GPU-88c58391-6001-919c-8431-20f011c20563"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:00:06.0")

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetNVMLVersion(self):
        return "13.580.159.04"

    # Fixed values from probe.log
    def nvmlDeviceGetTemperatureThreshold(self, h, kind):
        return {pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 95,
                pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95}[kind]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._sample(h)
        return 700000

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return 700000

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}[kind]

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        known = {pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: 0, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: 0,
                 pynvml.NVML_FI_DEV_REMAPPED_COR: 0, pynvml.NVML_FI_DEV_REMAPPED_UNC: 0,
                 pynvml.NVML_FI_DEV_REMAPPED_PENDING: 0, pynvml.NVML_FI_DEV_REMAPPED_FAILURE: 0}
        out = []
        for fid in field_ids:
            value = pynvml.c_nvmlFieldValue_t()
            value.fieldId = fid
            if fid in known:
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = known[fid]
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append(value)
        return out

    # Replayed from burn_samples.json
    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._sample(h)["temp"]

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._sample(h)["sm" if kind == pynvml.NVML_CLOCK_SM else "mem"]

    def nvmlDeviceGetPowerUsage(self, h):
        return round(self._sample(h)["power_w"] * 1000)

    def nvmlDeviceGetUtilizationRates(self, h):
        # The capture kept GPU utilisation only; memory utilisation reads as not available.
        return SimpleNamespace(gpu=self._sample(h)["util"], memory=None)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._sample(h)["reasons"]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._sample(h)["reasons"]

    # Event set
    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceGetSupportedEventTypes(self, h):
        return pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError

    def nvmlDeviceRegisterEvents(self, h, types, event_set):
        pass

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if self._events:
            gpu, kind, data = self._events.pop(0)
            return SimpleNamespace(device=gpu, eventType=kind, eventData=data)
        time.sleep(min(timeout_ms, 20) / 1000)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set):
        pass


def fake_two_gpus() -> FakeNvml:
    """Factory for the agent's ``--fake-nvml`` hook."""
    return FakeNvml(gpus=2)


FAKE_HOOK = f"{THIS}:fake_two_gpus"


class ManualClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

