"""What the soak agent's NVML sampler costs per GPU-sample, on a real GPU.

    python3 bench/bench_sampler.py [--gpus 8] [--hz 10] [--seconds 20] [--compare OLD_SAMPLER.py]

Prints three tables:
- each NVML reading alone: this thread's CPU time per call (median of batches), so the cost of a
  tick can be read as the sum of the calls it makes;
- ``Sampler.sample`` at the soak's pace (``--hz``) over ``--gpus`` GPUs, CPU ms per GPU-sample;
  with fewer real GPUs than ``--gpus`` the real ones are read in turn (``Replicated``), which is
  what an 8-GPU node's driver round trips cost if every GPU answers as fast as this one;
  ``--compare FILE`` measures another copy of sampler.py the same way (e.g. the previous commit's);
- the power readings side by side (nvmlDeviceGetPowerUsage, the 1 s average field and the instant
  field), to show which field stands for the call.
Needs pynvml and an NVIDIA driver. Run it under load (a burn in another process) for the soak's case.

The whole agent tick at 8 GPUs on a one-GPU machine:
    python3 preflight/node/agent.py --engine burn --seconds 60 --interval 0.1 --out DIR \
        --fake-nvml bench/bench_sampler.py:replicated_nvml
then heartbeat.json's sampler_cpu_ms_per_gpu_sample.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "preflight" / "node"))


class Replicated:
    """pynvml with ``count`` GPUs, the real ones repeated."""

    def __init__(self, nvml, count: int):
        self._nvml, self._count = nvml, count

    def __getattr__(self, name):
        return getattr(self._nvml, name)

    def nvmlDeviceGetCount(self):
        return self._count

    def nvmlDeviceGetHandleByIndex(self, i):
        return self._nvml.nvmlDeviceGetHandleByIndex(i % self._nvml.nvmlDeviceGetCount())


def replicated_nvml():
    """For the agent's ``--fake-nvml bench/bench_sampler.py:replicated_nvml`` hook: the real
    driver with ``PREFLIGHT_BENCH_GPUS`` (default 8) GPUs, so a whole agent tick (rows, files,
    heartbeat) is measured at an 8-GPU node's count on a machine with one."""
    import os  # noqa: PLC0415

    import pynvml  # noqa: PLC0415

    return Replicated(pynvml, int(os.environ.get("PREFLIGHT_BENCH_GPUS", "8")))


def _load_sampler(path: Path):
    spec = importlib.util.spec_from_file_location(f"sampler_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Sampler


def per_call(nvml, handle, batches: int = 5, calls: int = 200) -> list[tuple[str, float]]:
    n = nvml
    fields = [n.NVML_FI_DEV_POWER_AVERAGE, n.NVML_FI_DEV_POWER_CURRENT_LIMIT, n.NVML_FI_DEV_MEMORY_TEMP]
    slow_fields = [n.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, n.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, n.NVML_FI_DEV_REMAPPED_COR,
                   n.NVML_FI_DEV_REMAPPED_UNC, n.NVML_FI_DEV_REMAPPED_PENDING, n.NVML_FI_DEV_REMAPPED_FAILURE]
    counters = [n.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP, n.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
                n.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
                n.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
                n.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN]
    readings = [
        ("nvmlDeviceGetTemperature", lambda: n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetClockInfo(SM)", lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM)),
        ("nvmlDeviceGetClockInfo(MEM)", lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_MEM)),
        ("nvmlDeviceGetPowerUsage", lambda: n.nvmlDeviceGetPowerUsage(handle)),
        ("nvmlDeviceGetEnforcedPowerLimit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(handle)),
        ("nvmlDeviceGetUtilizationRates", lambda: n.nvmlDeviceGetUtilizationRates(handle)),
        ("nvmlDeviceGetMemoryInfo", lambda: n.nvmlDeviceGetMemoryInfo(handle)),
        ("nvmlDeviceGetCurrentClocksEventReasons", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(handle)),
        ("FieldValues: power avg, limit, mem temp", lambda: n.nvmlDeviceGetFieldValues(handle, fields)),
        ("FieldValues: ECC + remap (6)", lambda: n.nvmlDeviceGetFieldValues(handle, slow_fields)),
        ("FieldValues: clocks-event counters (5)", lambda: n.nvmlDeviceGetFieldValues(handle, counters)),
    ]
    out = []
    for name, fn in readings:
        per_batch = []
        for _ in range(batches):
            t0 = time.thread_time()
            for _ in range(calls):
                fn()
            per_batch.append((time.thread_time() - t0) / calls)
        out.append((name, statistics.median(per_batch) * 1e6))
    return out


def sampler_cost(sampler_cls, nvml, gpus: int, hz: float, seconds: float) -> tuple[float, int]:
    """CPU ms per GPU-sample of ``sampler_cls`` reading ``gpus`` GPUs at ``hz`` for ``seconds``."""
    sampler = sampler_cls(Replicated(nvml, gpus), "bench")
    cpu, samples = 0.0, 0
    next_at = time.monotonic()
    end = next_at + seconds
    while time.monotonic() < end:
        t0 = time.thread_time()
        for gpu in range(gpus):
            if sampler.sample(gpu) is not None:
                samples += 1
        cpu += time.thread_time() - t0
        next_at += 1 / hz
        time.sleep(max(0.0, next_at - time.monotonic()))
    errors = sampler.take_errors()
    sampler.close()
    if errors:
        print(f"  ({len(errors)} NVML errors, first: {errors[0]})")
    return cpu * 1e3 / max(samples, 1), samples


def power_side_by_side(nvml, handle, seconds: float = 5.0) -> None:
    n = nvml
    ids = [n.NVML_FI_DEV_POWER_AVERAGE, n.NVML_FI_DEV_POWER_INSTANT]
    rows = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        usage = n.nvmlDeviceGetPowerUsage(handle)
        avg, inst = (v.value.uiVal if v.nvmlReturn == 0 else None for v in n.nvmlDeviceGetFieldValues(handle, ids))
        rows.append((usage, avg, inst))
        time.sleep(0.1)
    print("\npower readings (mW), 10 Hz for", seconds, "s: GetPowerUsage | FI POWER_AVERAGE | FI POWER_INSTANT")
    for usage, avg, inst in rows[:: max(1, len(rows) // 8)]:
        print(f"  {usage:>8} | {avg!s:>8} | {inst!s:>8}")
    same = sum(1 for u, a, _ in rows if a is not None and abs(u - a) <= max(1000, 0.005 * u))
    print(f"  GetPowerUsage within max(1 W, 0.5 %) of POWER_AVERAGE in {same} of {len(rows)} readings")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--compare", type=Path, help="another sampler.py to measure the same way")
    args = ap.parse_args(argv)
    import pynvml  # noqa: PLC0415 - only where a driver is

    pynvml.nvmlInit()
    real = pynvml.nvmlDeviceGetCount()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(handle)
    print(f"{real} x {name}, driver {pynvml.nvmlSystemGetDriverVersion()}, python {sys.version.split()[0]}")
    print("\nNVML reading | CPU us per call (median of 5 x 200)")
    for reading, us in per_call(pynvml, handle):
        print(f"  {reading:<42} {us:8.1f}")
    contenders = [("this checkout", ROOT / "preflight" / "node" / "sampler.py")]
    if args.compare:
        contenders.append((f"{args.compare}", args.compare))
    print(f"\nSampler.sample over {args.gpus} GPUs ({real} real, read in turn) at {args.hz:g} Hz "
          f"for {args.seconds:g} s")
    for label, path in contenders:
        ms, samples = sampler_cost(_load_sampler(path), pynvml, args.gpus, args.hz, args.seconds)
        core = ms * args.gpus * args.hz / 10  # ms per s of one core -> percent
        print(f"  {label:<40} {ms:.4f} ms per GPU-sample ({samples} samples; {args.gpus} GPUs at {args.hz:g} Hz = "
              f"{core:.2f} % of one core)")
    power_side_by_side(pynvml, handle)
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
