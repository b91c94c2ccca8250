"""The verdicts on each host's throughput, and on GPUs that run unlike their peers.

Each function returns ``Outcome``s naming the host; the soak checks in ``checks/soak.py`` call
them through the ``SoakContext`` (context.py). What each one fails or warns on, and why:

- ``throughput`` (``soak-throughput``), per series (a metric of the node, or of one GPU where
  the row's ``gpu`` is set; figures.py says how baseline, final level and cliff are found):
  FAIL ``throughput-cliff`` when the smoothed throughput stays more than ``cliff_drop`` (20%)
  below the baseline for longer than ``min(cliff_min_s, span / 4)`` (2 minutes on a long soak;
  a quarter of a short run, which cannot hold 2 minutes of anything). Otherwise WARN
  ``throughput-decay`` when the final throughput is more than ``decay_warn`` (5%) below the
  baseline; on a host with a cliff the decay is only mentioned, since the cliff is where that
  throughput went. A decay is set against the GPUs' loaded SM clock and clock-event reasons
  over the same baseline and final windows (``blame_decay``): with steady clocks it is WARN
  ``software-slowdown`` (the server or the software slowed, not the GPUs) instead.
- ``outliers`` (``soak-outliers``): WARN ``gpu-outlier`` for a GPU whose loaded median
  temperature is more than ``outlier_temperature_c`` above, or whose loaded median SM clock or
  per-GPU throughput baseline is more than ``outlier_clock_fraction`` below, the median of its
  node (nodes of at least 3 GPUs) or of the fleet (at least 2 hosts and 3 GPUs): a median of
  two cannot say which one is off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from preflight.check import Outcome
from preflight.contracts import TELEMETRY_CSV, THROUGHPUT_CSV
from preflight.model import Evidence, Status, worst
from preflight.soak import fmt
from preflight.soak.figures import (
    GPU_IDLE,
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    THERMAL,
    GpuSummary,
    MetricTrend,
    Thresholds,
    loaded_mask,
    metric_order,
    nanmax,
    nanmedian,
)


def throughput(host: str, trends: Sequence[MetricTrend], host_tele: pd.DataFrame, th: Thresholds,
               t0: float | None = None) -> Outcome:
    """``t0``, where times are counted from: the host's first telemetry sample unless given."""
    if not trends:
        return Outcome(Status.SKIP, f"no throughput recorded for this host in {THROUGHPUT_CSV}", host=host)
    t0 = float(host_tele["time"].min()) if t0 is None else t0
    statuses, symptoms, parts, evidence = [], [], [], []
    any_cliff = any(t.cliff is not None for t in trends)
    for metric in metric_order(trends):
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
            reasons = fmt.reason_names(fmt.or_mask(during["clocks_event_reasons"]) & ~GPU_IDLE) or "none"
            parts.append(f"{metric}{_on(cliffs)} fell {1 - c.level / w.baseline:.0%} from {fmt.num(w.baseline)} to "
                         f"{fmt.num(c.level)} at +{fmt.duration(c.start_t - t0)} for {fmt.duration(c.duration_s)} "
                         f"(clock-event reasons meanwhile: {reasons}; "
                         f"max {fmt.temp(nanmax(during['temperature_c'].to_numpy(float)))})")
            statuses.append(Status.FAIL)
            symptoms.append("throughput-cliff")
            evidence.append(Evidence(THROUGHPUT_CSV, f"{_label(w)}: baseline {fmt.num(w.baseline)}, "
                                     f"median {fmt.num(c.level)} over {fmt.duration(c.duration_s)}"))
        elif decays and any_cliff:
            # The throughput a cliff lost also shows as decay, in this or an aggregate metric.
            w = max(decays, key=lambda t: t.decay)
            parts.append(f"{metric}{_on(decays)} {w.decay:.1%} lower at the end (the cliff's share)")
            statuses.append(Status.PASS)
        elif decays:
            w = max(decays, key=lambda t: t.decay)
            symptom, why = blame_decay(w, host_tele, th)
            parts.append(f"{metric}{_on(decays)} decayed {w.decay:.1%} over the run "
                         f"({fmt.num(w.baseline)} at first, {fmt.num(w.final)} at the end); {why}")
            statuses.append(Status.WARN)
            symptoms.append(symptom)
            evidence.append(Evidence(THROUGHPUT_CSV,
                                     f"{_label(w)}: baseline {fmt.num(w.baseline)}, final {fmt.num(w.final)}"))
        else:
            w = max(series, key=lambda t: abs(t.decay or 0.0))
            change = f"{0.0 - w.decay:+.1%}" if w.decay is not None else "n/a"
            if len(series) == 1:
                parts.append(f"{metric}{_on(series)} steady: {fmt.num(w.baseline)} at first, "
                             f"{fmt.num(w.final)} at the end ({change})")
            else:
                parts.append(f"{metric}{_on(series)} steady (largest change {change}, {_label(w)})")
            statuses.append(Status.PASS)
    data = {_label(t): {"baseline": t.baseline, "final": t.final, "decay": t.decay, "windows": t.windows,
                        "cliff_s": t.cliff.duration_s if t.cliff else None} for t in trends}
    return Outcome(worst(statuses), "; ".join(parts), tuple(dict.fromkeys(symptoms)),
                   tuple(evidence), data, host=host)


def blame_decay(trend: MetricTrend, host_tele: pd.DataFrame, th: Thresholds) -> tuple[str, str]:
    """Whose decay it is: the GPUs' (``throughput-decay``) when their loaded SM clock over the
    final windows fell by at least ``decay_clock_share`` of the decay from the baseline windows',
    or a thermal slowdown or power-brake reason shows in the final windows that the baseline did
    not have; else, with steady clocks, a software or serving slowdown (``software-slowdown``).
    A throughput bound by the GPUs' compute scales at most with their clock, so a clock drop
    under half the decay leaves most of the decay to something else: the server (KV cache,
    preemptions, a memory leak), other processes, the host. Without telemetry over both spans it
    stays ``throughput-decay``, said to be unexplained."""
    if trend.baseline_span is None or trend.final_span is None:
        return "throughput-decay", "no GPU telemetry over the same windows to tell the GPUs from the software"
    change = clock_change(host_tele, trend.baseline_span, trend.final_span, trend.gpu, th)
    if change is None:
        return "throughput-decay", "no loaded SM clock over the same windows to tell the GPUs from the software"
    if change.slowed(th.decay_clock_share * (trend.decay or 0.0)):
        return "throughput-decay", f"the GPUs slowed: {change.text()}, clock-event reasons at the end: {change.reasons}"
    return "software-slowdown", (f"clocks steady ({change.text()}, no new thermal or power-brake reason): a software "
                                 f"or serving slowdown, not the GPUs")


@dataclass(frozen=True)
class ClockChange:
    """The GPUs' loaded SM clock (median) over a first and a last span, and the clock-event
    reasons of the last that the first did not have."""

    before_mhz: float
    after_mhz: float
    new_reasons: int  # thermal, HW slowdown or power brake bits new in the last span
    reasons: str  # every reason of the last span, named

    @property
    def drop(self) -> float:
        return 1.0 - self.after_mhz / self.before_mhz

    def slowed(self, by_at_least: float) -> bool:
        return bool(self.new_reasons) or self.drop >= by_at_least

    def text(self) -> str:
        return (f"loaded SM clock {fmt.mhz(self.before_mhz)} at first, {fmt.mhz(self.after_mhz)} at the end, "
                f"{self.after_mhz / self.before_mhz - 1:+.1%}")


def clock_change(host_tele: pd.DataFrame, first: tuple[float, float], last: tuple[float, float],
                 gpu: int | None, th: Thresholds) -> ClockChange | None:
    """None without loaded samples in both spans (no telemetry: vLLM on a CPU, say)."""
    tele = host_tele if gpu is None or host_tele.empty else host_tele[host_tele["gpu"] == gpu]
    if tele.empty:
        return None
    figures = []
    for start, end in (first, last):
        during = tele[(tele["time"] > start) & (tele["time"] <= end)]
        util, power, limit = (during[c].to_numpy(float) for c in ("utilization_pct", "power_w", "power_limit_w"))
        loaded = during[loaded_mask(util, power, limit, th)]
        figures.append((nanmedian(loaded["sm_clock_mhz"].to_numpy(float)),
                        fmt.or_mask(during["clocks_event_reasons"]) & ~GPU_IDLE))
    (clock0, reasons0), (clock1, reasons1) = figures
    if clock0 is None or clock1 is None or clock0 <= 0:
        return None
    return ClockChange(clock0, clock1, reasons1 & ~reasons0 & (THERMAL | HW_POWER_BRAKE | HW_SLOWDOWN),
                       fmt.reason_names(reasons1) or "none")


def _on(series: Sequence[MetricTrend]) -> str:
    gpus = [t.gpu for t in series if t.gpu is not None]
    return f" on {fmt.gpu_list(gpus)}" if gpus else ""


def _label(t: MetricTrend) -> str:
    return t.metric if t.gpu is None else f"{t.metric} GPU {t.gpu}"


@dataclass(frozen=True)
class _Figures:
    """What one GPU (or the median of a group of them) runs at under load."""

    temperature_c: float | None
    sm_clock_mhz: float | None
    rates: Mapping[str, float]  # per-GPU throughput metric -> baseline


def outliers(by_host: Mapping[str, Sequence[GpuSummary]], trends: Mapping[str, Sequence[MetricTrend]],
             th: Thresholds) -> dict[str, Outcome]:
    """Per host, GPUs hotter or slower (SM clock, or per-GPU throughput where recorded) than the
    median of their node and of the fleet."""
    figures = {(g.host, g.gpu): _Figures(g.loaded_temperature_c, g.loaded_sm_clock_mhz,
                                         {t.metric: t.baseline for t in trends.get(g.host, ()) if t.gpu == g.gpu})
               for gs in by_host.values() for g in gs}
    fleet_ok = sum(1 for gs in by_host.values() if gs) >= 2 and len(figures) >= th.outlier_min_gpus
    fleet = _median_figures(list(figures.values())) if fleet_ok else None
    out: dict[str, Outcome] = {}
    for host, gpus in by_host.items():
        node = _median_figures([figures[(host, g.gpu)] for g in gpus]) if len(gpus) >= th.outlier_min_gpus else None
        many = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
        if node is None and fleet is None:
            out[host] = Outcome(Status.SKIP, f"{many} and no fleet to compare with", host=host)
            continue
        scopes = [(name, ref) for name, ref in (("node", node), ("fleet", fleet)) if ref is not None]
        found = []
        for g in gpus:
            for scope, ref in scopes:
                why = _outlier(figures[(host, g.gpu)], ref, th)
                if why:
                    found.append(f"GPU {g.gpu} {why} the median of the {scope}")
                    break
        refs = "; ".join(f"{scope} median {fmt.temp(ref.temperature_c)}, {fmt.mhz(ref.sm_clock_mhz)}"
                         + "".join(f", {m} {fmt.num(v)}" for m, v in sorted(ref.rates.items()))
                         for scope, ref in scopes)
        data = {f"{scope}_median": {"temperature_c": ref.temperature_c, "sm_clock_mhz": ref.sm_clock_mhz,
                                    **ref.rates} for scope, ref in scopes}
        if found:
            out[host] = Outcome(Status.WARN, "; ".join(found), ("gpu-outlier",),
                                (Evidence(TELEMETRY_CSV, refs),), data, host=host)
        else:
            out[host] = Outcome(Status.PASS,
                                f"{many} within {th.outlier_temperature_c:g} °C and {th.outlier_clock_fraction:.0%} "
                                f"of the {refs}", data=data, host=host)
    return out


def _median_figures(group: Sequence[_Figures]) -> _Figures:
    def median(values) -> float | None:
        return nanmedian(np.array([v for v in values if v is not None], float))

    metrics = sorted({m for f in group for m in f.rates})
    return _Figures(median(f.temperature_c for f in group), median(f.sm_clock_mhz for f in group),
                    {m: median(f.rates.get(m) for f in group) for m in metrics})


def _outlier(gpu: _Figures, ref: _Figures, th: Thresholds) -> str | None:
    reasons = []
    if None not in (gpu.temperature_c, ref.temperature_c) and \
            gpu.temperature_c > ref.temperature_c + th.outlier_temperature_c:
        reasons.append(f"runs at {fmt.temp(gpu.temperature_c)}, {gpu.temperature_c - ref.temperature_c:g} °C above")
    slow = 1 - th.outlier_clock_fraction
    if None not in (gpu.sm_clock_mhz, ref.sm_clock_mhz) and gpu.sm_clock_mhz < slow * ref.sm_clock_mhz:
        reasons.append(f"clocks {fmt.mhz(gpu.sm_clock_mhz)}, {1 - gpu.sm_clock_mhz / ref.sm_clock_mhz:.0%} below")
    for metric, rate in sorted(gpu.rates.items()):
        median = ref.rates.get(metric)
        if median and rate < slow * median:
            reasons.append(f"{metric} {fmt.num(rate)}, {1 - rate / median:.0%} below")
    return " and ".join(reasons) if reasons else None
