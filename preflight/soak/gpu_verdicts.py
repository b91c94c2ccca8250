"""The verdicts on each host's GPUs: thermal slowdown, power capping, lost telemetry, memory growth.

Each function judges one host from its ``GpuSummary``s (figures.py) or its telemetry rows and
returns an ``Outcome`` naming the host; the soak checks in ``checks/soak.py`` call them through
the ``SoakContext`` (context.py). What each one fails or warns on, and why:

- ``thermal`` (``soak-thermal``): FAIL ``thermal-throttling`` when a GPU carries a thermal
  slowdown bit (SW 0x20, HW 0x40) for more than ``sustained_s`` in total, or sits at or above
  its slowdown temperature that long (when the threshold is known: the
  ``slowdown_temperature_c`` column or the caller's value). Shorter blips are mentioned, not
  failed: NVML samples are instants and a single one says little.
- ``power`` (``soak-power``): the SW power cap (0x4) at full load is how a GPU is meant to run
  (measured here, bench/RESULTS.md: an H200 under a bf16 GEMM sits at 692 of 700 W with 0x4
  set), so it PASSes with a summary. WARN ``power-capping`` when, under the power cap and without a thermal bit, the SM
  clock stays below the *clock floor* for more than ``sustained_s``, when the HW power brake
  (0x80) engages at all, or when HW slowdown (0x8) shows without a thermal or brake bit to
  explain it. The floor is ``clock_floor_fraction`` (70%) of the GPU's loaded median SM clock
  in the baseline window: the median of the whole run would be dragged down by the very
  episode being looked for.
- ``telemetry`` (``soak-telemetry``): FAIL ``gpu-fallen-off-bus`` for a GPU whose last reading
  comes more than ``max(fallen_off_intervals x interval, fallen_off_min_s)`` before its host's
  last sample (rows that keep coming with every reading empty count as stopped). Gaps longer
  than ``gap_intervals`` sampling intervals are notes (``gap_notes``).
- ``memory`` (``soak-memory``): WARN ``gpu-memory-growth`` for memory used that keeps growing
  under a steady load (see its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from preflight.check import Outcome
from preflight.contracts import TELEMETRY_CSV
from preflight.model import Evidence, Status
from preflight.soak import coverage, fmt
from preflight.soak.figures import THERMAL, GpuSummary, Thresholds, loaded_mask, nanmedian
from preflight.soak.order import StepBack


def thermal(host: str, gpus: Sequence[GpuSummary], th: Thresholds) -> Outcome:
    hottest = max(gpus, key=lambda g: g.max_temperature_c if g.max_temperature_c is not None else -1e9)
    slowed = [g for g in gpus if g.thermal_s > th.sustained_s]
    at_limit = [g for g in gpus if g.at_slowdown_s > th.sustained_s]
    data = {"gpus": {g.gpu: {"max_temperature_c": g.max_temperature_c, "thermal_slowdown_s": round(g.thermal_s, 2),
                             "at_slowdown_s": round(g.at_slowdown_s, 2), "slowdown_temperature_c": g.slowdown_c}
                     for g in gpus}}
    if hottest.max_temperature_c is None and not any(g.reasons_recorded for g in gpus):
        return Outcome(Status.ERROR, "neither temperature nor clock-event reasons recorded: thermal state unknown",
                       data=data, host=host)
    if slowed or at_limit:
        parts = []
        if slowed:
            worst_gpu = max(slowed, key=lambda g: g.thermal_s)
            names = fmt.reason_names(np.bitwise_or.reduce([g.thermal_reasons for g in slowed]) & THERMAL)
            parts.append(f"thermal slowdown ({names}) on {fmt.gpu_list(g.gpu for g in slowed)} "
                         f"for up to {fmt.duration(worst_gpu.thermal_s)}")
        if at_limit:
            worst_gpu = max(at_limit, key=lambda g: g.at_slowdown_s)
            parts.append(f"at or above the slowdown temperature ({worst_gpu.slowdown_c:g} °C) on "
                         f"{fmt.gpu_list(g.gpu for g in at_limit)} for up to {fmt.duration(worst_gpu.at_slowdown_s)}")
        parts.append(f"max {fmt.temp(hottest.max_temperature_c)} (GPU {hottest.gpu})")
        first = slowed[0] if slowed else at_limit[0]
        excerpt = first.evidence.get("thermal") or first.evidence.get("slowdown", "")
        return Outcome(Status.FAIL, "; ".join(parts), ("thermal-throttling",),
                       (Evidence(TELEMETRY_CSV, f"GPU {first.gpu} {excerpt}"),), data, host=host)
    if hottest.max_temperature_c is None:
        summary = "temperature not recorded"
    else:
        summary = f"max {fmt.temp(hottest.max_temperature_c)} (GPU {hottest.gpu})"
    if hottest.slowdown_c is not None and hottest.max_temperature_c is not None:
        summary += f", {hottest.slowdown_c - hottest.max_temperature_c:g} °C below slowdown ({hottest.slowdown_c:g} °C)"
    summary += "; no thermal slowdown"
    blips = [g for g in gpus if g.thermal_s > 0]
    if blips:
        summary += (f" beyond {th.sustained_s:g} s (bits seen for {fmt.duration(max(g.thermal_s for g in blips))} "
                    f"on {fmt.gpu_list(g.gpu for g in blips)})")
    return Outcome(Status.PASS, summary, data=data, host=host)


def power(host: str, gpus: Sequence[GpuSummary], th: Thresholds) -> Outcome:
    loaded = [g for g in gpus if g.loaded_samples]
    if not loaded:
        return Outcome(Status.SKIP, "GPUs never at load: power capping not judged", host=host)
    data = {"gpus": {g.gpu: {"power_cap_fraction": g.power_cap_fraction, "loaded_power_w": g.loaded_power_w,
                             "power_limit_w": g.power_limit_w, "baseline_sm_clock_mhz": g.baseline_sm_clock_mhz,
                             "clock_floor_mhz": _floor(g, th), "below_floor_s": round(g.below_floor_s, 2),
                             "power_brake_s": round(g.brake_s, 2)} for g in loaded}}
    problems, evidence = [], []
    braked = [g for g in loaded if g.brake_s > 0]
    if braked:
        worst_gpu = max(braked, key=lambda g: g.brake_s)
        problems.append(f"HW power brake (0x80) engaged on {fmt.gpu_list(g.gpu for g in braked)} "
                        f"for up to {fmt.duration(worst_gpu.brake_s)}")
        evidence.append(Evidence(TELEMETRY_CSV, f"GPU {worst_gpu.gpu} {worst_gpu.evidence['brake']}"))
    low = [g for g in loaded if g.below_floor_s > th.sustained_s]
    if low:
        worst_gpu = max(low, key=lambda g: g.below_floor_s)
        problems.append(
            f"SM clock under the power cap below the floor on {fmt.gpu_list(g.gpu for g in low)}: down to "
            f"{fmt.mhz(worst_gpu.min_capped_sm_clock_mhz)} for up to {fmt.duration(worst_gpu.below_floor_s)} "
            f"(floor {fmt.mhz(_floor(worst_gpu, th))} = {th.clock_floor_fraction:.0%} of the "
            f"{fmt.mhz(worst_gpu.baseline_sm_clock_mhz)} baseline median)")
        evidence.append(Evidence(TELEMETRY_CSV, f"GPU {worst_gpu.gpu} {worst_gpu.evidence['below_floor']}"))
    unexplained = [g for g in loaded if g.hw_slowdown_s > th.sustained_s]
    if unexplained:
        worst_gpu = max(unexplained, key=lambda g: g.hw_slowdown_s)
        problems.append(f"HW slowdown (0x8) without a thermal or power-brake bit on "
                        f"{fmt.gpu_list(g.gpu for g in unexplained)} for up to {fmt.duration(worst_gpu.hw_slowdown_s)} "
                        "(external power brake or over-current)")
        evidence.append(Evidence(TELEMETRY_CSV, f"GPU {worst_gpu.gpu} {worst_gpu.evidence['hw_slowdown']}"))
    if problems:
        return Outcome(Status.WARN, "; ".join(problems), ("power-capping",), tuple(evidence), data, host=host)

    fractions = [g.power_cap_fraction for g in loaded if g.power_cap_fraction is not None]
    power = nanmedian(np.array([g.loaded_power_w for g in loaded if g.loaded_power_w is not None], float))
    limit = nanmedian(np.array([g.power_limit_w for g in loaded if g.power_limit_w is not None], float))
    clock = nanmedian(np.array([g.loaded_sm_clock_mhz for g in loaded if g.loaded_sm_clock_mhz is not None], float))
    drawn = f"median {fmt.watts(power)}" + (f" of {fmt.watts(limit)}" if limit is not None else "")
    if fractions and max(fractions) > 0:
        summary = (f"power-capped at load, as expected: SW power cap in {min(fractions):.0%}-{max(fractions):.0%} "
                   f"of loaded samples, {drawn}, SM clock median {fmt.mhz(clock)}, never below the floor")
        if min(fractions) == max(fractions):
            summary = summary.replace(f"{min(fractions):.0%}-{max(fractions):.0%}", f"{max(fractions):.0%}")
    elif fractions:
        summary = f"power cap never reached at load: {drawn}, SM clock median {fmt.mhz(clock)}"
    else:
        summary = f"clock-event reasons not recorded: {drawn}, SM clock median {fmt.mhz(clock)}"
    return Outcome(Status.PASS, summary, data=data, host=host)


def _floor(g: GpuSummary, th: Thresholds) -> float | None:
    return None if g.baseline_sm_clock_mhz is None else round(th.clock_floor_fraction * g.baseline_sm_clock_mhz, 1)


def telemetry(host: str, gpus: Sequence[GpuSummary], th: Thresholds, plan: coverage.Plan | None = None,
              steps_back: Sequence[StepBack] = ()) -> Outcome:
    """Fallen-off GPUs (FAIL); gaps are named in the summary (``gap_notes`` says where), and
    the time covered against the plan (coverage.py judges a shortfall before this runs). Time
    that went backwards in the file (``steps_back``, order.py) and GPUs that came late (within
    the tolerance coverage.py allows) are said too: the rows were sorted by time, so what was
    measured across a step is uncertain, and the verdict must not read as if nothing happened."""
    start = min(g.first_t for g in gpus)
    end = max(g.last_t for g in gpus)
    fallen = []
    for g in gpus:
        allowed = max(th.fallen_off_intervals * g.interval_s, th.fallen_off_min_s)
        last = g.last_reading_t if g.last_reading_t is not None else g.first_t
        if end - last > allowed:
            fallen.append((g, last))
    gaps = gap_notes(host, gpus)
    interval = float(np.median([g.interval_s for g in gpus]))
    data = {"gpus": len(gpus), "samples": sum(g.samples for g in gpus), "interval_s": round(interval, 3),
            "duration_s": round(end - start, 2), "gaps": len(gaps)}
    said = _order_words(gpus, start, th, steps_back, data)
    if fallen:
        parts = [f"GPU {g.gpu} stopped reporting at +{fmt.duration(last - start)} of {fmt.duration(end - start)}"
                 for g, last in fallen]
        evidence = tuple(Evidence(TELEMETRY_CSV, f"GPU {g.gpu} last reading {g.evidence.get('last', 'none')}")
                         for g, _ in fallen)
        return Outcome(Status.FAIL, "; ".join(parts + said), ("gpu-fallen-off-bus",), evidence, data, host=host)
    summary = (f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} sampled every {interval:.2g} s "
               f"for {fmt.duration(end - start)}, {data['samples']} samples")
    if plan is not None and plan.planned_s is not None:
        summary += f" (planned {fmt.duration(plan.planned_s)})"
        data["planned_s"] = plan.planned_s
    if gaps:
        summary += f"; {len(gaps)} gap{'s' if len(gaps) > 1 else ''} longer than {th.gap_intervals:g} intervals"
    return Outcome(Status.PASS, "; ".join([summary, *said]), data=data, host=host)


def _order_words(gpus: Sequence[GpuSummary], start: float, th: Thresholds, steps_back: Sequence[StepBack],
                 data: dict) -> list[str]:
    """What the verdict says of time going back and of GPUs that came late (and records in ``data``)."""
    words = []
    if steps_back:
        data["time_steps_back"] = {str(s.gpu): s.times for s in steps_back}
        worst = max(steps_back, key=lambda s: s.largest_s)
        times = sum(s.times for s in steps_back)
        words.append(f"time went back {times} time{'s' if times > 1 else ''} on "
                     f"{fmt.gpu_list([s.gpu for s in steps_back])} (up to {fmt.duration(worst.largest_s)}, first at "
                     f"{TELEMETRY_CSV}:{min(s.line for s in steps_back)}): rows sorted by time, so what was "
                     "measured across a step is uncertain")
    late_after = max(th.coverage_min_intervals * max((g.interval_s for g in gpus), default=0.0), 5.0)
    late = [g for g in gpus if g.first_t - start > late_after]
    if late:
        data["late_gpus"] = {str(g.gpu): round(g.first_t - start, 2) for g in late}
        words.append("; ".join(f"GPU {g.gpu} first sampled at +{fmt.duration(g.first_t - start)}" for g in late))
    return words


def gap_notes(host: str, gpus: Sequence[GpuSummary]) -> list[str]:
    """One note per stretch without telemetry (longer than ``gap_intervals`` sampling intervals),
    the GPUs that share it named together, in order of time."""
    start = min(g.first_t for g in gpus)
    gap_groups: dict[tuple[float, float], list[int]] = {}
    for g in gpus:
        for a, b in g.gaps:
            key = (round(a - start, 1), round(b - a, 1))
            gap_groups.setdefault(key, []).append(g.gpu)
    return [f"{host}: no telemetry for {fmt.duration(length)} after +{fmt.duration(offset)} ({fmt.gpu_list(ids)})"
            for (offset, length), ids in sorted(gap_groups.items())]


def memory(host: str, host_tele: pd.DataFrame, th: Thresholds) -> Outcome:
    """GPU memory that keeps growing under a steady load is a leak (a serving engine such as
    vLLM allocates its KV cache up front, the burn its buffers): the median of memory used in
    the last window is compared with the first one, both ``baseline_s`` long, counted from
    the GPU's first loaded sample. WARN above ``memory_growth_mib`` and
    ``memory_growth_fraction`` of the starting figure together, so small allocator noise on a
    big card and a big relative jump on a nearly empty one both pass."""
    grown = []
    judged = 0
    for gpu, g in host_tele.groupby("gpu", sort=True):
        used = g["memory_used_mib"].to_numpy(dtype=float)
        t = g["time"].to_numpy(dtype=float)
        loaded = loaded_mask(g["utilization_pct"].to_numpy(dtype=float), g["power_w"].to_numpy(dtype=float),
                             g["power_limit_w"].to_numpy(dtype=float), th)
        ok = ~np.isnan(used)
        if not loaded.any() or ok.sum() < 2:
            continue
        t0, t_end = t[loaded][0], t[ok][-1]
        window = th.baseline_s(t_end - t0)
        first = used[ok & (t >= t0) & (t <= t0 + window)]
        last = used[ok & (t >= t_end - window)]
        if t_end - t0 < 2 * window or not len(first) or not len(last):
            continue
        judged += 1
        start, end = float(np.median(first)), float(np.median(last))
        growth = end - start
        if growth > th.memory_growth_mib and growth > th.memory_growth_fraction * max(start, 1.0):
            grown.append((int(gpu), start, end))
    if not judged:
        return Outcome(Status.SKIP, "GPU memory used not recorded (or the run too short to compare)", host=host)
    if grown:
        listed = ", ".join(f"GPU {gpu}: {start:,.0f} -> {end:,.0f} MiB" for gpu, start, end in grown)
        return Outcome(Status.WARN, f"GPU memory kept growing under load ({listed})",
                       ("gpu-memory-growth",), data={"grown": [list(x) for x in grown]}, host=host)
    return Outcome(Status.PASS, f"GPU memory used steady on {judged} GPU(s)", host=host)
