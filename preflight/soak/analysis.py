"""Judging a soak: telemetry and throughput tables in, findings and the report's ``soak`` section out.

Input is a validated ``SoakData`` (see ``data.py``); every function below is pure, works on
whole columns with numpy/pandas, and loops only over GPUs, so a one-hour run of eight GPUs
at 10 Hz (288k rows) is judged in well under a second.

Checks and their symptoms (findings carry the soak's host):

- ``soak-thermal``: FAIL ``thermal-throttling`` when a GPU carries a thermal slowdown bit
  (SW 0x20, HW 0x40) for more than ``sustained_s`` in total, or sits at or above its slowdown
  temperature that long (when the threshold is known: the ``slowdown_temperature_c`` column
  or the caller's value). Shorter blips are mentioned, not failed: NVML samples are instants
  and a single one says little.
- ``soak-power``: the SW power cap (0x4) at full load is how a GPU is meant to run (measured here, bench/RESULTS.md:
  an H200 under a bf16 GEMM sits at 692 of 700 W with 0x4 set), so it PASSes with a summary.
  WARN ``power-capping`` when, under the power cap and without a thermal bit, the SM clock
  stays below the *clock floor* for more than ``sustained_s``, when the HW power brake (0x80)
  engages at all, or when HW slowdown (0x8) shows without a thermal or brake bit to explain it.
  The floor is ``clock_floor_fraction`` (70%) of the GPU's loaded median SM clock in the
  baseline window: the median of the whole run would be dragged down by the very episode
  being looked for.
- ``soak-throughput``, per series (a metric of the node, or of one GPU where the row's ``gpu``
  is set): FAIL ``throughput-cliff`` when the throughput, smoothed by a centred median of 3
  windows, stays more than ``cliff_drop`` (20%) below the baseline for longer than
  ``min(cliff_min_s, span / 4)`` (2 minutes on a long soak; a quarter of a short run, which
  cannot hold 2 minutes of anything). Otherwise WARN ``throughput-decay`` when the final
  throughput is more than ``decay_warn`` (5%) below the baseline; on a host with a cliff the
  decay is only mentioned, since the cliff is where that throughput went.
- ``soak-outliers``: WARN ``gpu-outlier`` for a GPU whose loaded median temperature is more
  than ``outlier_temperature_c`` above, or whose loaded median SM clock or per-GPU throughput
  baseline is more than ``outlier_clock_fraction`` below, the median of its node (nodes of at
  least 3 GPUs) or of the fleet (at least 2 hosts and 3 GPUs): a median of two cannot say
  which one is off.
- ``soak-telemetry``: FAIL ``gpu-fallen-off-bus`` for a GPU whose last reading comes more
  than ``max(fallen_off_intervals x interval, fallen_off_min_s)`` before its host's last
  sample (rows that keep coming with every reading empty count as stopped). Gaps longer than
  ``gap_intervals`` sampling intervals are notes. A host without any telemetry is an ERROR,
  except a ``vllm`` soak whose agent found no NVIDIA driver (soak.json ``no_telemetry``: vLLM
  on the CPU, as in CI): SKIP "no GPU telemetry", and only its throughput is judged.

Throughput series are the metrics of throughput.csv other than the load generator's
latencies, error counts and server gauges (``NOT_THROUGHPUT``, ``*_ms``): a fall in TTFT or in
requests waiting is no throughput cliff.

Baseline and final throughput are medians over a window of ``min(baseline_max_s, span x
baseline_fraction)`` at the start and at the end (5 minutes of a long soak, the first and
last quarter of a short one), never fewer than 3 windows; the median shrugs off the
warm-up window. ``throughput_decay`` is the fraction lost, ``1 - final / baseline`` (0.08
means 8% lower at the end; negative when it rose). The section reports the host's primary
metric (the first of ``PRIMARY_METRICS`` present, else the first by name): its node-wide
series, or the sum of its per-GPU series when the node has none.

"Loaded" samples are those at ``loaded_utilization_pct`` (80%) utilisation or more; where
utilisation is not available, those drawing at least half the power limit; where neither is,
all of them. ``min_sm_clock_mhz`` is taken over loaded samples, since idle clocks say nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from preflight.model import Evidence, Finding, Status, worst
from preflight.parse.smi_records import reasons_from_bitmask
from preflight.soak.data import SLOWDOWN_COLUMN, TELEMETRY_CSV, THROUGHPUT_CSV, SoakData, read_soak

SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
THERMAL = 0x20 | 0x40  # SW thermal slowdown, HW thermal slowdown
HW_POWER_BRAKE = 0x80
GPU_IDLE = 0x1

CHECK_THERMAL = "soak-thermal"
CHECK_POWER = "soak-power"
CHECK_THROUGHPUT = "soak-throughput"
CHECK_OUTLIERS = "soak-outliers"
CHECK_TELEMETRY = "soak-telemetry"
CHECK_MEMORY = "soak-memory"

PRIMARY_METRICS = ("output_tokens_per_s", "tflops", "gpu_tflops", "hbm_gbps", "gpu_hbm_gbps")
# loadgen.py's per-window figures that are not rates of work done (its latency percentiles end in _ms).
NOT_THROUGHPUT = frozenset({"errors", "in_flight", "requests_running", "requests_waiting", "kv_cache_usage",
                            "preemptions"})


def is_throughput(metric: str) -> bool:
    return metric not in NOT_THROUGHPUT and not metric.endswith("_ms")


@dataclass(frozen=True)
class Thresholds:
    """Every number the verdicts depend on, with the defaults documented in the module docstring."""

    loaded_utilization_pct: float = 80.0
    loaded_power_fraction: float = 0.5
    sustained_s: float = 5.0
    clock_floor_fraction: float = 0.70
    baseline_max_s: float = 300.0
    baseline_fraction: float = 0.25
    baseline_min_windows: int = 3
    cliff_drop: float = 0.20
    cliff_min_s: float = 120.0
    cliff_min_fraction: float = 0.25
    decay_warn: float = 0.05
    outlier_temperature_c: float = 10.0
    outlier_clock_fraction: float = 0.10
    outlier_min_gpus: int = 3
    gap_intervals: float = 10.0
    fallen_off_intervals: float = 10.0
    fallen_off_min_s: float = 5.0
    memory_growth_mib: float = 1024.0
    memory_growth_fraction: float = 0.05

    def baseline_s(self, span_s: float) -> float:
        return min(self.baseline_max_s, self.baseline_fraction * span_s)


@dataclass(frozen=True)
class HostSoak:
    """One host's entry of the report's ``soak`` section (contract ``preflight-soak/1``)."""

    engine: str
    duration_s: float
    max_temperature_c: float | None
    min_sm_clock_mhz: float | None
    throttle_reasons_seen: tuple[str, ...]
    throughput_baseline: float | None
    throughput_final: float | None
    throughput_decay: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "duration_s": self.duration_s,
            "max_temperature_c": self.max_temperature_c,
            "min_sm_clock_mhz": self.min_sm_clock_mhz,
            "throttle_reasons_seen": list(self.throttle_reasons_seen),
            "throughput_baseline": self.throughput_baseline,
            "throughput_final": self.throughput_final,
            "throughput_decay": self.throughput_decay,
        }


@dataclass(frozen=True)
class SoakResult:
    hosts: Mapping[str, HostSoak]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()

    def soak_section(self) -> dict[str, dict[str, Any]]:
        """The value of ``report.json``'s ``"soak"`` key."""
        return {host: s.to_dict() for host, s in self.hosts.items()}

    @property
    def failed(self) -> bool:
        return any(f.status in (Status.FAIL, Status.ERROR) for f in self.findings)


@dataclass(frozen=True)
class GpuSummary:
    """What one GPU's samples say, reduced to the figures the checks compare."""

    host: str
    gpu: int
    samples: int
    first_t: float
    last_t: float
    last_reading_t: float | None
    interval_s: float
    max_temperature_c: float | None
    loaded_samples: int
    loaded_temperature_c: float | None  # median while loaded
    loaded_sm_clock_mhz: float | None  # median while loaded
    min_loaded_sm_clock_mhz: float | None
    baseline_sm_clock_mhz: float | None  # median while loaded, baseline window
    reasons_seen: int  # OR of every bitmask
    reasons_recorded: bool  # False when every bitmask cell is empty
    thermal_s: float
    thermal_reasons: int
    slowdown_c: float | None
    at_slowdown_s: float
    power_cap_fraction: float | None  # share of loaded samples with 0x4
    loaded_power_w: float | None
    power_limit_w: float | None
    below_floor_s: float
    min_capped_sm_clock_mhz: float | None
    brake_s: float
    hw_slowdown_s: float  # 0x8 with neither a thermal nor a brake bit
    gaps: tuple[tuple[float, float], ...]
    evidence: Mapping[str, str]  # kind -> the first sample that showed it


@dataclass(frozen=True)
class Cliff:
    start_t: float
    end_t: float
    duration_s: float
    level: float  # median throughput inside the cliff


@dataclass(frozen=True)
class MetricTrend:
    """One throughput series: a metric of the node (``gpu`` None) or of one GPU."""

    metric: str
    gpu: int | None
    windows: int
    baseline: float
    final: float
    decay: float | None
    cliff: Cliff | None


@dataclass(frozen=True)
class NodeThroughput:
    """The node's figure for its primary metric, as the ``soak`` section reports it."""

    metric: str
    baseline: float
    final: float
    decay: float | None


# --- entry points --------------------------------------------------------------------------


def analyze_soak(soak_dir: str | Path, *, thresholds: Thresholds = Thresholds(),
                 slowdown_temperature_c: float | None = None) -> SoakResult:
    """Read and judge a soak directory; raises ``SoakDataError`` when it breaks the contract."""
    return analyze(read_soak(soak_dir), thresholds=thresholds, slowdown_temperature_c=slowdown_temperature_c)


def analyze(data: SoakData, *, thresholds: Thresholds = Thresholds(),
            slowdown_temperature_c: float | None = None) -> SoakResult:
    """Judge an already read soak. ``slowdown_temperature_c`` applies where the telemetry has no
    per-GPU threshold (from a platform profile, say)."""
    th = thresholds
    tele, thr = data.telemetry, data.throughput
    hosts = list(dict.fromkeys([*data.meta.hosts, *sorted(set(tele["host"]))]))
    gpus = gpu_summaries(tele, th, slowdown_temperature_c)
    by_host: dict[str, list[GpuSummary]] = {h: [] for h in hosts}
    for g in gpus:
        by_host[g.host].append(g)

    findings: list[Finding] = []
    notes = list(data.notes)
    sections: dict[str, HostSoak] = {}
    tele_by_host = dict(tuple(tele.groupby("host", sort=False)))
    thr_by_host = dict(tuple(thr.groupby("host", sort=False)))
    trends = {host: throughput_trends(thr_by_host[host], th) if host in thr_by_host else [] for host in hosts}
    outliers = outlier_findings(by_host, trends, th)
    no_telemetry = ((data.meta.extra or {}).get("no_telemetry") or {}) if data.meta.engine == "vllm" else {}
    for host in hosts:
        host_gpus = by_host[host]
        if not host_gpus and host in no_telemetry:
            host_thr = thr_by_host.get(host, thr.iloc[:0])
            findings += [Finding(CHECK_TELEMETRY, host, Status.SKIP,
                                 f"no GPU telemetry: {no_telemetry[host]}; temperature, clocks and power not judged"),
                         throughput_check(host, trends[host], tele.iloc[:0], th, t0=_first_time(host_thr))]
            sections[host] = throughput_only_section(data.meta.engine, host_thr, trends[host])
            continue
        if not host_gpus:
            findings.append(Finding(CHECK_TELEMETRY, host, Status.ERROR,
                                    f"no telemetry samples for this host in {TELEMETRY_CSV}: not judged"))
            sections[host] = HostSoak(data.meta.engine, 0.0, None, None, (), None, None, None)
            continue
        host_tele = tele_by_host[host]
        telemetry_finding, gap_notes = telemetry_check(host, host_gpus, th)
        notes += gap_notes
        findings += [
            thermal_check(host, host_gpus, th),
            power_check(host, host_gpus, th),
            throughput_check(host, trends[host], host_tele, th),
            outliers[host],
            telemetry_finding,
            memory_check(host, host_tele, th),
        ]
        sections[host] = host_section(data.meta.engine, host_gpus, trends[host])
    return SoakResult(sections, tuple(findings), tuple(notes))


def memory_check(host: str, host_tele: pd.DataFrame, th: Thresholds) -> Finding:
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
        return Finding(CHECK_MEMORY, host, Status.SKIP, "GPU memory used not recorded (or the run too short to compare)")
    if grown:
        listed = ", ".join(f"GPU {gpu}: {start:,.0f} -> {end:,.0f} MiB" for gpu, start, end in grown)
        return Finding(CHECK_MEMORY, host, Status.WARN, f"GPU memory kept growing under load ({listed})",
                       ("gpu-memory-growth",), data={"grown": [list(x) for x in grown]})
    return Finding(CHECK_MEMORY, host, Status.PASS, f"GPU memory used steady on {judged} GPU(s)")


# --- per GPU -------------------------------------------------------------------------------


def loaded_mask(util: np.ndarray, power: np.ndarray, limit: np.ndarray, th: Thresholds) -> np.ndarray:
    by_power = np.where(np.isnan(power) | np.isnan(limit), True, power >= th.loaded_power_fraction * limit)
    return np.where(np.isnan(util), by_power, util >= th.loaded_utilization_pct)


def gpu_summaries(tele: pd.DataFrame, th: Thresholds, slowdown_c: float | None = None) -> list[GpuSummary]:
    """One summary per (host, gpu), in host then GPU order. ``tele`` must be sorted by time."""
    return [_summarise(host, int(gpu), g, th, slowdown_c)
            for (host, gpu), g in tele.groupby(["host", "gpu"], sort=True)]


def _nanmedian(a: np.ndarray) -> float | None:
    a = a[~np.isnan(a)]
    return float(np.median(a)) if len(a) else None


def _nanmax(a: np.ndarray) -> float | None:
    a = a[~np.isnan(a)]
    return float(a.max()) if len(a) else None


def _nanmin(a: np.ndarray) -> float | None:
    a = a[~np.isnan(a)]
    return float(a.min()) if len(a) else None


def _summarise(host: str, gpu: int, g: pd.DataFrame, th: Thresholds, slowdown_default: float | None) -> GpuSummary:
    t = g["time"].to_numpy(float)
    temp = g["temperature_c"].to_numpy(float)
    sm = g["sm_clock_mhz"].to_numpy(float)
    power = g["power_w"].to_numpy(float)
    limit = g["power_limit_w"].to_numpy(float)
    util = g["utilization_pct"].to_numpy(float)
    raw_mask = g["clocks_event_reasons"].to_numpy(float)
    mask = np.where(np.isnan(raw_mask), 0, raw_mask).astype(np.int64)

    dt = np.diff(t)
    interval = float(np.median(dt)) if len(dt) else 0.0
    loaded = loaded_mask(util, power, limit, th)
    readings = ~(np.isnan(temp) & np.isnan(sm) & np.isnan(power) & np.isnan(util) & np.isnan(raw_mask))
    last_reading = float(t[readings][-1]) if readings.any() else None

    thermal = (mask & THERMAL) != 0
    brake = (mask & HW_POWER_BRAKE) != 0
    hw_only = ((mask & HW_SLOWDOWN) != 0) & ((mask & (THERMAL | HW_POWER_BRAKE)) == 0)
    capped = loaded & ((mask & SW_POWER_CAP) != 0) & ~thermal & ~brake

    slowdown = None
    if SLOWDOWN_COLUMN in g:
        slowdown = _nanmedian(g[SLOWDOWN_COLUMN].to_numpy(float))
    slowdown = slowdown if slowdown is not None else slowdown_default
    at_slowdown = temp >= slowdown if slowdown is not None else np.zeros(len(t), bool)

    baseline_sm = None
    if loaded.any():
        start = t[loaded][0]
        base = loaded & (t <= start + th.baseline_s(t[-1] - t[0]))
        baseline_sm = _nanmedian(sm[base])
    floor = th.clock_floor_fraction * baseline_sm if baseline_sm is not None else None
    below = capped & (sm < floor) if floor is not None else np.zeros(len(t), bool)

    cap_known = loaded & ~np.isnan(raw_mask)
    evidence = {kind: _sample_text(g.iloc[int(np.argmax(m))], t[0])
                for kind, m in (("thermal", thermal), ("slowdown", at_slowdown), ("brake", brake),
                                ("hw_slowdown", hw_only), ("below_floor", below)) if m.any()}
    if readings.any():
        evidence["last"] = _sample_text(g.iloc[int(np.flatnonzero(readings)[-1])], t[0])
    gap_at = np.flatnonzero(dt > th.gap_intervals * interval) if interval > 0 else np.array([], int)
    return GpuSummary(
        host=host, gpu=gpu, samples=len(t), first_t=float(t[0]), last_t=float(t[-1]),
        last_reading_t=last_reading, interval_s=interval,
        max_temperature_c=_nanmax(temp), loaded_samples=int(loaded.sum()),
        loaded_temperature_c=_nanmedian(temp[loaded]), loaded_sm_clock_mhz=_nanmedian(sm[loaded]),
        min_loaded_sm_clock_mhz=_nanmin(sm[loaded]), baseline_sm_clock_mhz=baseline_sm,
        reasons_seen=int(np.bitwise_or.reduce(np.unique(mask))) if len(mask) else 0,
        reasons_recorded=bool((~np.isnan(raw_mask)).any()),
        thermal_s=float(thermal.sum() * interval),
        thermal_reasons=int(np.bitwise_or.reduce(np.unique(mask[thermal]))) if thermal.any() else 0,
        slowdown_c=slowdown, at_slowdown_s=float(at_slowdown.sum() * interval),
        power_cap_fraction=float(((mask & SW_POWER_CAP) != 0)[cap_known].mean()) if cap_known.any() else None,
        loaded_power_w=_nanmedian(power[loaded]), power_limit_w=_nanmedian(limit),
        below_floor_s=float(below.sum() * interval), min_capped_sm_clock_mhz=_nanmin(sm[capped]),
        brake_s=float(brake.sum() * interval), hw_slowdown_s=float(hw_only.sum() * interval),
        gaps=tuple((float(t[i]), float(t[i + 1])) for i in gap_at),
        evidence=evidence,
    )


# --- checks --------------------------------------------------------------------------------


def thermal_check(host: str, gpus: Sequence[GpuSummary], th: Thresholds) -> Finding:
    hottest = max(gpus, key=lambda g: g.max_temperature_c if g.max_temperature_c is not None else -1e9)
    slowed = [g for g in gpus if g.thermal_s > th.sustained_s]
    at_limit = [g for g in gpus if g.at_slowdown_s > th.sustained_s]
    data = {"gpus": {g.gpu: {"max_temperature_c": g.max_temperature_c, "thermal_slowdown_s": round(g.thermal_s, 2),
                             "at_slowdown_s": round(g.at_slowdown_s, 2), "slowdown_temperature_c": g.slowdown_c}
                     for g in gpus}}
    if hottest.max_temperature_c is None and not any(g.reasons_recorded for g in gpus):
        return Finding(CHECK_THERMAL, host, Status.ERROR,
                       "neither temperature nor clock-event reasons recorded: thermal state unknown", data=data)
    if slowed or at_limit:
        parts = []
        if slowed:
            worst_gpu = max(slowed, key=lambda g: g.thermal_s)
            names = _names(np.bitwise_or.reduce([g.thermal_reasons for g in slowed]) & THERMAL)
            parts.append(f"thermal slowdown ({names}) on {_gpu_list(g.gpu for g in slowed)} "
                         f"for up to {_duration(worst_gpu.thermal_s)}")
        if at_limit:
            worst_gpu = max(at_limit, key=lambda g: g.at_slowdown_s)
            parts.append(f"at or above the slowdown temperature ({worst_gpu.slowdown_c:g} °C) on "
                         f"{_gpu_list(g.gpu for g in at_limit)} for up to {_duration(worst_gpu.at_slowdown_s)}")
        parts.append(f"max {_temp(hottest.max_temperature_c)} (GPU {hottest.gpu})")
        first = slowed[0] if slowed else at_limit[0]
        excerpt = first.evidence.get("thermal") or first.evidence.get("slowdown", "")
        return Finding(CHECK_THERMAL, host, Status.FAIL, "; ".join(parts), ("thermal-throttling",),
                       (Evidence(TELEMETRY_CSV, f"GPU {first.gpu} {excerpt}"),), data)
    if hottest.max_temperature_c is None:
        summary = "temperature not recorded"
    else:
        summary = f"max {_temp(hottest.max_temperature_c)} (GPU {hottest.gpu})"
    if hottest.slowdown_c is not None and hottest.max_temperature_c is not None:
        summary += f", {hottest.slowdown_c - hottest.max_temperature_c:g} °C below slowdown ({hottest.slowdown_c:g} °C)"
    summary += "; no thermal slowdown"
    blips = [g for g in gpus if g.thermal_s > 0]
    if blips:
        summary += (f" beyond {th.sustained_s:g} s (bits seen for {_duration(max(g.thermal_s for g in blips))} "
                    f"on {_gpu_list(g.gpu for g in blips)})")
    return Finding(CHECK_THERMAL, host, Status.PASS, summary, data=data)


def power_check(host: str, gpus: Sequence[GpuSummary], th: Thresholds) -> Finding:
    loaded = [g for g in gpus if g.loaded_samples]
    if not loaded:
        return Finding(CHECK_POWER, host, Status.SKIP, "GPUs never at load: power capping not judged")
    data = {"gpus": {g.gpu: {"power_cap_fraction": g.power_cap_fraction, "loaded_power_w": g.loaded_power_w,
                             "power_limit_w": g.power_limit_w, "baseline_sm_clock_mhz": g.baseline_sm_clock_mhz,
                             "clock_floor_mhz": _floor(g, th), "below_floor_s": round(g.below_floor_s, 2),
                             "power_brake_s": round(g.brake_s, 2)} for g in loaded}}
    problems, evidence = [], []
    braked = [g for g in loaded if g.brake_s > 0]
    if braked:
        worst_gpu = max(braked, key=lambda g: g.brake_s)
        problems.append(f"HW power brake (0x80) engaged on {_gpu_list(g.gpu for g in braked)} "
                        f"for up to {_duration(worst_gpu.brake_s)}")
        evidence.append(Evidence(TELEMETRY_CSV, f"GPU {worst_gpu.gpu} {worst_gpu.evidence['brake']}"))
    low = [g for g in loaded if g.below_floor_s > th.sustained_s]
    if low:
        worst_gpu = max(low, key=lambda g: g.below_floor_s)
        problems.append(
            f"SM clock under the power cap below the floor on {_gpu_list(g.gpu for g in low)}: down to "
            f"{_mhz(worst_gpu.min_capped_sm_clock_mhz)} for up to {_duration(worst_gpu.below_floor_s)} "
            f"(floor {_mhz(_floor(worst_gpu, th))} = {th.clock_floor_fraction:.0%} of the "
            f"{_mhz(worst_gpu.baseline_sm_clock_mhz)} baseline median)")
        evidence.append(Evidence(TELEMETRY_CSV, f"GPU {worst_gpu.gpu} {worst_gpu.evidence['below_floor']}"))
    unexplained = [g for g in loaded if g.hw_slowdown_s > th.sustained_s]
    if unexplained:
        worst_gpu = max(unexplained, key=lambda g: g.hw_slowdown_s)
        problems.append(f"HW slowdown (0x8) without a thermal or power-brake bit on "
                        f"{_gpu_list(g.gpu for g in unexplained)} for up to {_duration(worst_gpu.hw_slowdown_s)} "
                        "(external power brake or over-current)")
        evidence.append(Evidence(TELEMETRY_CSV, f"GPU {worst_gpu.gpu} {worst_gpu.evidence['hw_slowdown']}"))
    if problems:
        return Finding(CHECK_POWER, host, Status.WARN, "; ".join(problems), ("power-capping",), tuple(evidence), data)

    fractions = [g.power_cap_fraction for g in loaded if g.power_cap_fraction is not None]
    power = _nanmedian(np.array([g.loaded_power_w for g in loaded if g.loaded_power_w is not None], float))
    limit = _nanmedian(np.array([g.power_limit_w for g in loaded if g.power_limit_w is not None], float))
    clock = _nanmedian(np.array([g.loaded_sm_clock_mhz for g in loaded if g.loaded_sm_clock_mhz is not None], float))
    drawn = f"median {_watts(power)}" + (f" of {_watts(limit)}" if limit is not None else "")
    if fractions and max(fractions) > 0:
        summary = (f"power-capped at load, as expected: SW power cap in {min(fractions):.0%}-{max(fractions):.0%} "
                   f"of loaded samples, {drawn}, SM clock median {_mhz(clock)}, never below the floor")
        if min(fractions) == max(fractions):
            summary = summary.replace(f"{min(fractions):.0%}-{max(fractions):.0%}", f"{max(fractions):.0%}")
    elif fractions:
        summary = f"power cap never reached at load: {drawn}, SM clock median {_mhz(clock)}"
    else:
        summary = f"clock-event reasons not recorded: {drawn}, SM clock median {_mhz(clock)}"
    return Finding(CHECK_POWER, host, Status.PASS, summary, data=data)


def _floor(g: GpuSummary, th: Thresholds) -> float | None:
    return None if g.baseline_sm_clock_mhz is None else round(th.clock_floor_fraction * g.baseline_sm_clock_mhz, 1)


def telemetry_check(host: str, gpus: Sequence[GpuSummary], th: Thresholds) -> tuple[Finding, list[str]]:
    """Fallen-off GPUs (FAIL) and gaps (notes, returned separately and named in the summary)."""
    start = min(g.first_t for g in gpus)
    end = max(g.last_t for g in gpus)
    fallen = []
    for g in gpus:
        allowed = max(th.fallen_off_intervals * g.interval_s, th.fallen_off_min_s)
        last = g.last_reading_t if g.last_reading_t is not None else g.first_t
        if end - last > allowed:
            fallen.append((g, last))
    gap_groups: dict[tuple[float, float], list[int]] = {}
    for g in gpus:
        for a, b in g.gaps:
            key = (round(a - start, 1), round(b - a, 1))
            gap_groups.setdefault(key, []).append(g.gpu)
    gap_notes = [f"{host}: no telemetry for {_duration(length)} after +{_duration(offset)} ({_gpu_list(ids)})"
                 for (offset, length), ids in sorted(gap_groups.items())]
    interval = float(np.median([g.interval_s for g in gpus]))
    data = {"gpus": len(gpus), "samples": sum(g.samples for g in gpus), "interval_s": round(interval, 3),
            "duration_s": round(end - start, 2), "gaps": len(gap_groups)}
    if fallen:
        parts = [f"GPU {g.gpu} stopped reporting at +{_duration(last - start)} of {_duration(end - start)}"
                 for g, last in fallen]
        evidence = tuple(Evidence(TELEMETRY_CSV, f"GPU {g.gpu} last reading {g.evidence.get('last', 'none')}")
                         for g, _ in fallen)
        return Finding(CHECK_TELEMETRY, host, Status.FAIL, "; ".join(parts), ("gpu-fallen-off-bus",), evidence,
                       data), gap_notes
    summary = (f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} sampled every {interval:.2g} s "
               f"for {_duration(end - start)}, {data['samples']} samples")
    if gap_notes:
        summary += f"; {len(gap_notes)} gap{'s' if len(gap_notes) > 1 else ''} longer than {th.gap_intervals:g} intervals"
    return Finding(CHECK_TELEMETRY, host, Status.PASS, summary, data=data), gap_notes


def throughput_trends(rows: pd.DataFrame, th: Thresholds) -> list[MetricTrend]:
    """One trend per (metric, gpu) throughput series (``is_throughput``) of one host's rows."""
    rows = rows[rows["metric"].map(is_throughput).astype(bool)]
    gpu = rows["gpu"] if "gpu" in rows else pd.Series(np.nan, index=rows.index)
    key = gpu.fillna(-1).astype(int)
    trends = [throughput_trend(metric, series["time"].to_numpy(float), series["value"].to_numpy(float), th,
                               None if g < 0 else int(g))
              for (metric, g), series in rows.groupby([rows["metric"], key], sort=True)]
    return [t for t in trends if t is not None]


def throughput_trend(metric: str, times: np.ndarray, values: np.ndarray, th: Thresholds,
                     gpu: int | None = None) -> MetricTrend | None:
    """Baseline, final level, decay and the longest cliff of one throughput series (sorted by time)."""
    ok = ~np.isnan(values)
    t, v = times[ok], values[ok]
    if not len(v):
        return None
    span = float(t[-1] - t[0])
    window = th.baseline_s(span)
    least = min(th.baseline_min_windows, len(v))
    baseline = float(np.median(v[:max(least, int(np.sum(t <= t[0] + window)))]))
    final = float(np.median(v[-max(least, int(np.sum(t >= t[-1] - window))):]))
    decay = 1.0 - final / baseline if baseline > 0 else None

    cliff = None
    if baseline > 0 and len(v) > 1:
        step = float(np.median(np.diff(t)))
        # A centred median of 3 windows: one noisy window neither makes nor breaks a cliff.
        smooth = pd.Series(v).rolling(3, center=True, min_periods=1).median().to_numpy()
        low = smooth < (1.0 - th.cliff_drop) * baseline
        need = min(th.cliff_min_s, th.cliff_min_fraction * span)
        for i, j in _runs(low):
            duration = float(t[j - 1] - t[i]) + step
            if duration > need and (cliff is None or duration > cliff.duration_s):
                cliff = Cliff(float(t[i]) - step, float(t[j - 1]), duration, float(np.median(v[i:j])))
    return MetricTrend(metric, gpu, len(v), baseline, final, decay, cliff)


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) index pairs of the runs of True."""
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def throughput_check(host: str, trends: Sequence[MetricTrend], host_tele: pd.DataFrame, th: Thresholds,
                     t0: float | None = None) -> Finding:
    """``t0``, where times are counted from: the host's first telemetry sample unless given."""
    if not trends:
        return Finding(CHECK_THROUGHPUT, host, Status.SKIP, f"no throughput recorded for this host in {THROUGHPUT_CSV}")
    t0 = float(host_tele["time"].min()) if t0 is None else t0
    statuses, symptoms, parts, evidence = [], [], [], []
    any_cliff = any(t.cliff is not None for t in trends)
    for metric in _metric_order(trends):
        series = [t for t in trends if t.metric == metric]
        cliffs = [t for t in series if t.cliff is not None]
        decays = [t for t in series if t.cliff is None and t.decay is not None and t.decay > th.decay_warn]
        if cliffs:
            w = max(cliffs, key=lambda t: 1 - t.cliff.level / t.baseline)
            c = w.cliff
            during = host_tele[(host_tele["time"] >= c.start_t) & (host_tele["time"] <= c.end_t)]
            gpus = {t.gpu for t in cliffs if t.gpu is not None}
            if gpus:
                during = during[during["gpu"].isin(gpus)]
            reasons = _names(_or_mask(during["clocks_event_reasons"]) & ~GPU_IDLE) or "none"
            parts.append(f"{metric}{_on(cliffs)} fell {1 - c.level / w.baseline:.0%} from {_num(w.baseline)} to "
                         f"{_num(c.level)} at +{_duration(c.start_t - t0)} for {_duration(c.duration_s)} "
                         f"(clock-event reasons meanwhile: {reasons}; "
                         f"max {_temp(_nanmax(during['temperature_c'].to_numpy(float)))})")
            statuses.append(Status.FAIL)
            symptoms.append("throughput-cliff")
            evidence.append(Evidence(THROUGHPUT_CSV, f"{_label(w)}: baseline {_num(w.baseline)}, "
                                     f"median {_num(c.level)} over {_duration(c.duration_s)}"))
        elif decays and any_cliff:
            # The throughput a cliff lost also shows as decay, in this or an aggregate metric.
            w = max(decays, key=lambda t: t.decay)
            parts.append(f"{metric}{_on(decays)} {w.decay:.1%} lower at the end (the cliff's share)")
            statuses.append(Status.PASS)
        elif decays:
            w = max(decays, key=lambda t: t.decay)
            parts.append(f"{metric}{_on(decays)} decayed {w.decay:.1%} over the run "
                         f"({_num(w.baseline)} at first, {_num(w.final)} at the end)")
            statuses.append(Status.WARN)
            symptoms.append("throughput-decay")
            evidence.append(Evidence(THROUGHPUT_CSV, f"{_label(w)}: baseline {_num(w.baseline)}, final {_num(w.final)}"))
        else:
            w = max(series, key=lambda t: abs(t.decay or 0.0))
            change = f"{0.0 - w.decay:+.1%}" if w.decay is not None else "n/a"
            if len(series) == 1:
                parts.append(f"{metric}{_on(series)} steady: {_num(w.baseline)} at first, "
                             f"{_num(w.final)} at the end ({change})")
            else:
                parts.append(f"{metric}{_on(series)} steady (largest change {change}, {_label(w)})")
            statuses.append(Status.PASS)
    data = {_label(t): {"baseline": t.baseline, "final": t.final, "decay": t.decay, "windows": t.windows,
                        "cliff_s": t.cliff.duration_s if t.cliff else None} for t in trends}
    return Finding(CHECK_THROUGHPUT, host, worst(statuses), "; ".join(parts), tuple(dict.fromkeys(symptoms)),
                   tuple(evidence), data)


def _metric_order(trends: Sequence[MetricTrend]) -> list[str]:
    names = {t.metric for t in trends}
    return [m for m in PRIMARY_METRICS if m in names] + sorted(names - set(PRIMARY_METRICS))


def _on(series: Sequence[MetricTrend]) -> str:
    gpus = [t.gpu for t in series if t.gpu is not None]
    return f" on {_gpu_list(gpus)}" if gpus else ""


def _label(t: MetricTrend) -> str:
    return t.metric if t.gpu is None else f"{t.metric} GPU {t.gpu}"


@dataclass(frozen=True)
class _Figures:
    """What one GPU (or the median of a group of them) runs at under load."""

    temperature_c: float | None
    sm_clock_mhz: float | None
    rates: Mapping[str, float]  # per-GPU throughput metric -> baseline


def outlier_findings(by_host: Mapping[str, Sequence[GpuSummary]], trends: Mapping[str, Sequence[MetricTrend]],
                     th: Thresholds) -> dict[str, Finding]:
    """Per host, GPUs hotter or slower (SM clock, or per-GPU throughput where recorded) than the
    median of their node and of the fleet."""
    figures = {(g.host, g.gpu): _Figures(g.loaded_temperature_c, g.loaded_sm_clock_mhz,
                                         {t.metric: t.baseline for t in trends.get(g.host, ()) if t.gpu == g.gpu})
               for gs in by_host.values() for g in gs}
    fleet_ok = sum(1 for gs in by_host.values() if gs) >= 2 and len(figures) >= th.outlier_min_gpus
    fleet = _median_figures(list(figures.values())) if fleet_ok else None
    out: dict[str, Finding] = {}
    for host, gpus in by_host.items():
        node = _median_figures([figures[(host, g.gpu)] for g in gpus]) if len(gpus) >= th.outlier_min_gpus else None
        many = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
        if node is None and fleet is None:
            out[host] = Finding(CHECK_OUTLIERS, host, Status.SKIP, f"{many} and no fleet to compare with")
            continue
        scopes = [(name, ref) for name, ref in (("node", node), ("fleet", fleet)) if ref is not None]
        found = []
        for g in gpus:
            for scope, ref in scopes:
                why = _outlier(figures[(host, g.gpu)], ref, th)
                if why:
                    found.append(f"GPU {g.gpu} {why} the median of the {scope}")
                    break
        refs = "; ".join(f"{scope} median {_temp(ref.temperature_c)}, {_mhz(ref.sm_clock_mhz)}"
                         + "".join(f", {m} {_num(v)}" for m, v in sorted(ref.rates.items())) for scope, ref in scopes)
        data = {f"{scope}_median": {"temperature_c": ref.temperature_c, "sm_clock_mhz": ref.sm_clock_mhz,
                                    **ref.rates} for scope, ref in scopes}
        if found:
            out[host] = Finding(CHECK_OUTLIERS, host, Status.WARN, "; ".join(found), ("gpu-outlier",),
                                (Evidence(TELEMETRY_CSV, refs),), data)
        else:
            out[host] = Finding(CHECK_OUTLIERS, host, Status.PASS,
                                f"{many} within {th.outlier_temperature_c:g} °C and {th.outlier_clock_fraction:.0%} "
                                f"of the {refs}", data=data)
    return out


def _median_figures(group: Sequence[_Figures]) -> _Figures:
    def median(values) -> float | None:
        return _nanmedian(np.array([v for v in values if v is not None], float))

    metrics = sorted({m for f in group for m in f.rates})
    return _Figures(median(f.temperature_c for f in group), median(f.sm_clock_mhz for f in group),
                    {m: median(f.rates.get(m) for f in group) for m in metrics})


def _outlier(gpu: _Figures, ref: _Figures, th: Thresholds) -> str | None:
    reasons = []
    if None not in (gpu.temperature_c, ref.temperature_c) and \
            gpu.temperature_c > ref.temperature_c + th.outlier_temperature_c:
        reasons.append(f"runs at {_temp(gpu.temperature_c)}, {gpu.temperature_c - ref.temperature_c:g} °C above")
    slow = 1 - th.outlier_clock_fraction
    if None not in (gpu.sm_clock_mhz, ref.sm_clock_mhz) and gpu.sm_clock_mhz < slow * ref.sm_clock_mhz:
        reasons.append(f"clocks {_mhz(gpu.sm_clock_mhz)}, {1 - gpu.sm_clock_mhz / ref.sm_clock_mhz:.0%} below")
    for metric, rate in sorted(gpu.rates.items()):
        median = ref.rates.get(metric)
        if median and rate < slow * median:
            reasons.append(f"{metric} {_num(rate)}, {1 - rate / median:.0%} below")
    return " and ".join(reasons) if reasons else None


def host_section(engine: str, gpus: Sequence[GpuSummary], trends: Sequence[MetricTrend]) -> HostSoak:
    temps = [g.max_temperature_c for g in gpus if g.max_temperature_c is not None]
    clocks = [g.min_loaded_sm_clock_mhz for g in gpus if g.min_loaded_sm_clock_mhz is not None]
    seen = int(np.bitwise_or.reduce([g.reasons_seen for g in gpus]))
    return HostSoak(
        engine=engine,
        duration_s=round(float(max(g.last_t for g in gpus) - min(g.first_t for g in gpus)), 2),
        max_temperature_c=float(max(temps)) if temps else None,
        min_sm_clock_mhz=float(min(clocks)) if clocks else None,
        throttle_reasons_seen=tuple(sorted(reasons_from_bitmask(seen))),
        **_throughput_fields(trends),
    )


def throughput_only_section(engine: str, rows: pd.DataFrame, trends: Sequence[MetricTrend]) -> HostSoak:
    """The ``soak`` section of a host without GPU telemetry, its duration that of its throughput
    windows (each row is stamped at its window's end, so the first window adds one step)."""
    t = np.unique(rows["time"].to_numpy(float))
    span = float(t[-1] - t[0] + np.median(np.diff(t))) if len(t) > 1 else 0.0
    return HostSoak(engine=engine, duration_s=round(span, 2), max_temperature_c=None, min_sm_clock_mhz=None,
                    throttle_reasons_seen=(), **_throughput_fields(trends))


def _throughput_fields(trends: Sequence[MetricTrend]) -> dict[str, float | None]:
    node = node_throughput(trends)
    return {"throughput_baseline": round(float(node.baseline), 3) if node else None,
            "throughput_final": round(float(node.final), 3) if node else None,
            "throughput_decay": round(float(node.decay), 4) if node and node.decay is not None else None}


def _first_time(rows: pd.DataFrame) -> float | None:
    return float(rows["time"].min()) if len(rows) else None


def node_throughput(trends: Sequence[MetricTrend]) -> NodeThroughput | None:
    """The primary metric's node-wide series, or the sum of its per-GPU series when the node has none."""
    if not trends:
        return None
    metric = _metric_order(trends)[0]
    series = [t for t in trends if t.metric == metric]
    node = [t for t in series if t.gpu is None] or series
    baseline, final = sum(t.baseline for t in node), sum(t.final for t in node)
    return NodeThroughput(metric, baseline, final, 1.0 - final / baseline if baseline > 0 else None)


# --- formatting ----------------------------------------------------------------------------


def _or_mask(values: pd.Series) -> int:
    known = values.dropna().unique()
    return int(np.bitwise_or.reduce(known.astype(np.int64))) if len(known) else 0


def _names(mask: int) -> str:
    return ", ".join(sorted(reasons_from_bitmask(int(mask))))


def _sample_text(row: pd.Series, t0: float) -> str:
    mask = row["clocks_event_reasons"]
    reasons = "n/a" if pd.isna(mask) else f"{int(mask):#x} ({_names(int(mask)) or 'none'})"
    return (f"at +{_duration(float(row['time']) - t0)}: {_temp(row['temperature_c'])}, "
            f"SM {_mhz(row['sm_clock_mhz'])}, {_watts(row['power_w'])}, reasons {reasons}")


def _gpu_list(ids: Iterable[int]) -> str:
    ids = sorted(set(ids))
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"GPU{'s' if len(ids) > 1 else ''} {text}"


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _temp(value: Any) -> str:
    return "n/a °C" if _missing(value) else f"{float(value):g} °C"


def _mhz(value: Any) -> str:
    return "n/a MHz" if _missing(value) else f"{float(value):.0f} MHz"


def _watts(value: Any) -> str:
    return "n/a W" if _missing(value) else f"{float(value):.0f} W"


def _num(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
