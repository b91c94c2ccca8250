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
    sampler = Sampler(FakeNvml(clock=clock), "h200")
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
