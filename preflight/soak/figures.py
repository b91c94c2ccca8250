"""A soak's telemetry and throughput reduced to the figures its checks judge.

Input is a validated ``SoakData`` (see ``data.py``); every function here is pure, works on whole
columns with numpy/pandas, and loops only over GPUs, so a one-hour run of eight GPUs at 10 Hz
(288k rows) is reduced in well under a second. ``GpuSummary`` is one GPU's run (loaded medians,
time spent under each clocks-event reason, gaps, the samples that showed each), ``MetricTrend``
one throughput series (baseline, final level, decay, the longest cliff); ``Thresholds`` holds
every number the verdicts (``gpu_verdicts.py``, ``throughput.py``) depend on.

"Loaded" samples are those at ``loaded_utilization_pct`` (80%) utilisation or more; where
utilisation is not available, those drawing at least half the power limit; where neither is,
all of them.

Throughput series are the metrics of throughput.csv other than the load generator's
latencies, error counts and server gauges (``NOT_THROUGHPUT``, ``*_ms``): a fall in TTFT or in
requests waiting is no throughput cliff. Baseline and final throughput are medians over a
window of ``min(baseline_max_s, span x baseline_fraction)`` at the start and at the end (5
minutes of a long soak, the first and last quarter of a short one), never fewer than 3
windows; the median shrugs off the warm-up window. ``decay`` is the fraction lost, ``1 - final
/ baseline`` (0.08 means 8% lower at the end; negative when it rose). A cliff is where the
throughput, smoothed by a centred median of 3 windows, stays more than ``cliff_drop`` below the
baseline for longer than ``min(cliff_min_s, span x cliff_min_fraction)``, with the median of
its own windows below that line too. A host's primary
metric is the first of ``PRIMARY_METRICS`` present, else the first by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from preflight.contracts import SLOWDOWN_COLUMN
from preflight.soak import fmt

SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
THERMAL = 0x20 | 0x40  # SW thermal slowdown, HW thermal slowdown
HW_POWER_BRAKE = 0x80
GPU_IDLE = 0x1

PRIMARY_METRICS = ("output_tokens_per_s", "tflops", "gpu_tflops", "hbm_gbps", "gpu_hbm_gbps")
# The load generator's per-window figures that are not rates of work done (loadgen_windows.py;
# its latency percentiles end in _ms). Goodput is a rate, but of requests within the latency
# limits: soak-latency and soak-sweep judge it with the latencies, not as a throughput trend.
NOT_THROUGHPUT = frozenset({"errors", "in_flight", "requests_running", "requests_waiting", "kv_cache_usage",
                            "preemptions", "concurrency", "goodput_requests_per_s"})


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
    slos: tuple = ()  # preflight.soak.slo_spec.Slo, from --slo
    slo_budget: float = 0.05  # share of the windows an SLO may be broken in before it FAILs
    coverage_shortfall: float = 0.05
    # A concurrency sweep's knee and fleet comparison (sweep.py says why these values).
    knee_tokens_growth: float = 0.10
    knee_ttft_growth: float = 0.50
    sweep_outlier_fraction: float = 0.10
    # A decay is the GPUs' when their loaded SM clock fell by at least this share of the decay
    # over the same windows (throughput.py says why).
    decay_clock_share: float = 0.5
    coverage_min_intervals: float = 2.0

    def baseline_s(self, span_s: float) -> float:
        return min(self.baseline_max_s, self.baseline_fraction * span_s)


DEFAULT_THRESHOLDS = Thresholds()


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
    # The spans (start, end in epoch seconds) the baseline and the final level were taken over,
    # so a decay can be set against the clocks of the same minutes.
    baseline_span: tuple[float, float] | None = None
    final_span: tuple[float, float] | None = None


@dataclass(frozen=True)
class NodeThroughput:
    """The node's figure for its primary metric, as the ``soak`` section reports it."""

    metric: str
    baseline: float
    final: float
    decay: float | None

# --- per GPU -------------------------------------------------------------------------------


def loaded_mask(util: np.ndarray, power: np.ndarray, limit: np.ndarray, th: Thresholds) -> np.ndarray:
    by_power = np.where(np.isnan(power) | np.isnan(limit), True, power >= th.loaded_power_fraction * limit)
    return np.where(np.isnan(util), by_power, util >= th.loaded_utilization_pct)


def gpu_summaries(tele: pd.DataFrame, th: Thresholds, slowdown_c: float | None = None) -> list[GpuSummary]:
    """One summary per (host, gpu), in host then GPU order. ``tele`` must be sorted by time."""
    return [_summarise(host, int(gpu), g, th, slowdown_c)
            for (host, gpu), g in tele.groupby(["host", "gpu"], sort=True)]


def nanmedian(a: np.ndarray) -> float | None:
    a = a[~np.isnan(a)]
    return float(np.median(a)) if len(a) else None


def nanmax(a: np.ndarray) -> float | None:
    a = a[~np.isnan(a)]
    return float(a.max()) if len(a) else None


def nanmin(a: np.ndarray) -> float | None:
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
        slowdown = nanmedian(g[SLOWDOWN_COLUMN].to_numpy(float))
    slowdown = slowdown if slowdown is not None else slowdown_default
    at_slowdown = temp >= slowdown if slowdown is not None else np.zeros(len(t), bool)

    baseline_sm = None
    if loaded.any():
        start = t[loaded][0]
        base = loaded & (t <= start + th.baseline_s(t[-1] - t[0]))
        baseline_sm = nanmedian(sm[base])
    floor = th.clock_floor_fraction * baseline_sm if baseline_sm is not None else None
    below = capped & (sm < floor) if floor is not None else np.zeros(len(t), bool)

    cap_known = loaded & ~np.isnan(raw_mask)
    evidence = {kind: fmt.sample_text(g.iloc[int(np.argmax(m))], t[0])
                for kind, m in (("thermal", thermal), ("slowdown", at_slowdown), ("brake", brake),
                                ("hw_slowdown", hw_only), ("below_floor", below)) if m.any()}
    if readings.any():
        evidence["last"] = fmt.sample_text(g.iloc[int(np.flatnonzero(readings)[-1])], t[0])
    gap_at = np.flatnonzero(dt > th.gap_intervals * interval) if interval > 0 else np.array([], int)
    return GpuSummary(
        host=host, gpu=gpu, samples=len(t), first_t=float(t[0]), last_t=float(t[-1]),
        last_reading_t=last_reading, interval_s=interval,
        max_temperature_c=nanmax(temp), loaded_samples=int(loaded.sum()),
        loaded_temperature_c=nanmedian(temp[loaded]), loaded_sm_clock_mhz=nanmedian(sm[loaded]),
        min_loaded_sm_clock_mhz=nanmin(sm[loaded]), baseline_sm_clock_mhz=baseline_sm,
        reasons_seen=int(np.bitwise_or.reduce(np.unique(mask))) if len(mask) else 0,
        reasons_recorded=bool((~np.isnan(raw_mask)).any()),
        thermal_s=float(thermal.sum() * interval),
        thermal_reasons=int(np.bitwise_or.reduce(np.unique(mask[thermal]))) if thermal.any() else 0,
        slowdown_c=slowdown, at_slowdown_s=float(at_slowdown.sum() * interval),
        power_cap_fraction=float(((mask & SW_POWER_CAP) != 0)[cap_known].mean()) if cap_known.any() else None,
        loaded_power_w=nanmedian(power[loaded]), power_limit_w=nanmedian(limit),
        below_floor_s=float(below.sum() * interval), min_capped_sm_clock_mhz=nanmin(sm[capped]),
        brake_s=float(brake.sum() * interval), hw_slowdown_s=float(hw_only.sum() * interval),
        gaps=tuple((float(t[i]), float(t[i + 1])) for i in gap_at),
        evidence=evidence,
    )

# --- throughput series ---------------------------------------------------------------------


def throughput_trends(rows: pd.DataFrame, th: Thresholds) -> list[MetricTrend]:
    """One trend per (metric, gpu) throughput series (``is_throughput``) of one host's rows."""
    # Asked once per metric name, not once per row: a long soak has millions of rows, a few names.
    rows = rows[rows["metric"].isin([m for m in rows["metric"].unique() if is_throughput(m)])]
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
    first_n = max(least, int(np.sum(t <= t[0] + window)))
    last_n = max(least, int(np.sum(t >= t[-1] - window)))
    baseline = float(np.median(v[:first_n]))
    final = float(np.median(v[-last_n:]))
    decay = 1.0 - final / baseline if baseline > 0 else None
    # Each row is stamped at its window's end: a span starts one step before its first row.
    step0 = float(np.median(np.diff(t))) if len(t) > 1 else 0.0
    spans = ((float(t[0]) - step0, float(t[first_n - 1])), (float(t[-last_n]) - step0, float(t[-1])))

    cliff = None
    if baseline > 0 and len(v) > 1:
        step = float(np.median(np.diff(t)))
        # A centred median of 3 windows: one noisy window neither makes nor breaks a cliff.
        smooth = pd.Series(v).rolling(3, center=True, min_periods=1).median().to_numpy()
        line = (1.0 - th.cliff_drop) * baseline
        low = smooth < line
        need = min(th.cliff_min_s, th.cliff_min_fraction * span)
        for i, j in _runs(low):
            duration = float(t[j - 1] - t[i]) + step
            level = float(np.median(v[i:j]))
            # The smoothed curve dips too where a run's own windows do not: at an end the median
            # is of two windows, one of them a neighbour's dip (a real vLLM soak's 2054, 847, 1808
            # tokens/s read as a cliff "0% below" 1808). The windows themselves must be low.
            if duration > need and level < line and (cliff is None or duration > cliff.duration_s):
                cliff = Cliff(float(t[i]) - step, float(t[j - 1]), duration, level)
    return MetricTrend(metric, gpu, len(v), baseline, final, decay, cliff, *spans)


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) index pairs of the runs of True."""
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))


def node_throughput(trends: Sequence[MetricTrend]) -> NodeThroughput | None:
    """The primary metric's node-wide series, or the sum of its per-GPU series when the node has none."""
    if not trends:
        return None
    metric = metric_order(trends)[0]
    series = [t for t in trends if t.metric == metric]
    node = [t for t in series if t.gpu is None] or series
    baseline, final = sum(t.baseline for t in node), sum(t.final for t in node)
    return NodeThroughput(metric, baseline, final, 1.0 - final / baseline if baseline > 0 else None)


def metric_order(trends: Sequence[MetricTrend]) -> list[str]:
    """The metrics of these series, the primary one first."""
    names = {t.metric for t in trends}
    return [m for m in PRIMARY_METRICS if m in names] + sorted(names - set(PRIMARY_METRICS))
