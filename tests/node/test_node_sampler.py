"""The soak agent's NVML side (preflight/node/sampler.py) against ``FakeNvml``, which replays the
real H200 burn of tests/fixtures/corpus/h200-vm (see tests/fake_nvml.py)."""

from __future__ import annotations

import threading
import time

import pynvml
from fake_nvml import FakeNvml, ManualClock

from preflight.node.sampler import EventWatcher, Sampler


def test_sampler_replays_the_h200_burn():
    clock = ManualClock()
    sampler = Sampler(FakeNvml(clock=clock), "h200", clock=clock)
    info = sampler.gpus[0]
    assert (info["slowdown_c"], info["shutdown_c"], info["max_operating_c"], info["memory_max_c"]) == (89, 95, 87, 95)
    assert info["power_limit_w"] == 700.0 and info["max_sm_clock_mhz"] == 1980
    assert info["name"] == "NVIDIA H200" and info["pci_bus_id"] == "00000000:00:06.0"
    idle = sampler.sample(0)
    assert (idle.temperature_c, idle.sm_clock_mhz, idle.power_w, idle.clocks_event_reasons) == (43, 345, 78.63, 0)
    clock.t = 30.25  # the sample at t=30.22 s: power-capped burn
    busy = sampler.sample(0)
    assert busy.power_w == 691.736 and busy.power_limit_w == 700.0 and busy.utilization_pct == 100
    assert busy.clocks_event_reasons == 0x4 and busy.sm_clock_mhz == 1455 and busy.memory_clock_mhz == 3201
    assert busy.slowdown_temperature_c == 89
    assert busy.remapped_rows_pending == 0 and busy.ecc_dbe_volatile == 0
    # Not recorded by the capture, so "not supported": empty cells, never errors.
    assert busy.memory_temperature_c is None and busy.memory_used_mib is None and busy.sw_power_cap_ns is None
    assert sampler.take_errors() == []


class Counting:
    """Counts the device calls made through a binding, the figure a tick's CPU cost follows."""

    def __init__(self, nvml):
        self.nvml, self.calls = nvml, []

    def __getattr__(self, name):
        value = getattr(self.nvml, name)
        if name.startswith("nvmlDevice") and callable(value):
            def counted(*args):
                self.calls.append(name)
                return value(*args)
            return counted
        return value


class WithPowerFields(FakeNvml):
    """The replay, with the power figures also answered as field values, as drivers of Ampere
    and newer do (same recorded numbers, mW)."""

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        values = super().nvmlDeviceGetFieldValues(h, field_ids)
        for v in values:
            mw = {pynvml.NVML_FI_DEV_POWER_AVERAGE: self.nvmlDeviceGetPowerUsage(h),
                  pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: 700000}.get(v.fieldId)
            if mw is not None:
                v.nvmlReturn, v.valueType, v.value.uiVal = 0, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, mw
        return values


def test_a_tick_between_slow_readings_makes_five_calls_and_leaves_slow_cells_empty():
    clock = ManualClock(100.0)
    nvml = Counting(WithPowerFields(clock=clock))
    sampler = Sampler(nvml, "h200", clock=clock)
    nvml.calls.clear()
    first = sampler.sample(0)
    slow_calls = len(nvml.calls)
    assert first.memory_clock_mhz is not None and first.remapped_rows_pending == 0
    nvml.calls.clear()
    clock.t += 1.0
    fast = sampler.sample(0)
    # Temperature, SM clock, utilisation, clocks-event reasons and one field-value call for power,
    # the power limit and memory temperature.
    assert sorted(nvml.calls) == sorted(["nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo",
                                         "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetCurrentClocksEventReasons",
                                         "nvmlDeviceGetFieldValues"]) and slow_calls == 7
    assert fast.power_w is not None and fast.power_limit_w == 700.0 and fast.temperature_c is not None
    assert fast.memory_clock_mhz is None and fast.memory_used_mib is None and fast.remapped_rows_pending is None
    clock.t += 4.0
    assert sampler.sample(0).memory_clock_mhz is not None  # SLOW_EVERY_S later, read again


def test_power_read_through_its_call_where_the_gpu_lacks_the_field():
    clock = ManualClock()
    nvml = Counting(FakeNvml(clock=clock))  # answers the power fields "not supported", like pre-Ampere GPUs
    sampler = Sampler(nvml, "h200", clock=clock)
    clock.t = 30.25  # the replay's power-capped burn
    assert sampler.sample(0).power_w == 691.736
    nvml.calls.clear()
    clock.t += 1.0
    row = sampler.sample(0)
    assert row.power_w is not None and row.power_limit_w == 700.0
    assert nvml.calls.count("nvmlDeviceGetPowerUsage") == 1 and nvml.calls.count("nvmlDeviceGetEnforcedPowerLimit") == 1
    assert sampler.take_errors() == []


def test_the_field_path_gives_the_same_figures_as_the_calls():
    clock = ManualClock()
    samplers = Sampler(FakeNvml(clock=clock), "h200", clock=clock), Sampler(WithPowerFields(clock=clock), "h200", clock=clock)
    clock.t = 30.25
    by_call, by_field = (s.sample(0) for s in samplers)
    assert (by_field.power_w, by_field.power_limit_w) == (by_call.power_w, by_call.power_limit_w) == (691.736, 700.0)


def test_sampler_falls_back_to_the_throttle_reasons_call():
    clock = ManualClock()
    sampler = Sampler(FakeNvml(clock=clock, event_reasons=False), "h200")
    clock.t = 30.25
    assert sampler.sample(0).clocks_event_reasons == 0x4
    assert sampler._reasons_call[0] == "nvmlDeviceGetCurrentClocksThrottleReasons"


def test_a_gpu_that_falls_off_the_bus_stops_getting_rows():
    clock = ManualClock()
    sampler = Sampler(FakeNvml(gpus=2, clock=clock, lost_at=2.0), "h200")
    clock.t = 1.0
    assert [s.gpu for s in map(sampler.sample, range(2))] == [0, 1]
    clock.t = 2.5
    assert [s and s.gpu for s in map(sampler.sample, range(2))] == [0, None]
    assert any("GPU 1" in e and "GPU is lost" in e for e in sampler.take_errors())


def test_event_watcher_records_an_xid():
    nvml = FakeNvml(gpus=2, events=((1, pynvml.nvmlEventTypeXidCriticalError, 79),))
    nvml.nvmlInit()
    stop = threading.Event()
    watcher = EventWatcher(nvml, [0, 1], "h200", stop)
    watcher.start()
    deadline = time.monotonic() + 2
    rows = []
    while not rows and time.monotonic() < deadline:
        rows = watcher.take()
        time.sleep(0.01)
    stop.set()
    watcher.join(2)
    assert [(r.gpu, r.event, r.data) for r in rows] == [(1, "xid", 79)]
    assert watcher.note is None
