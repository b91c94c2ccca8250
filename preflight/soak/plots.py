"""One PNG per host of a soak: temperature, SM clock, power against its limit, throughput, and
the RDMA error counters where they grew.

Four panels share a time axis in minutes since the host's first sample, one line per GPU.
Spans where any GPU of the host carried a clock-event reason are shaded on every panel:
red for thermal slowdown (0x20/0x40), orange for HW power brake or HW slowdown (0x80/0x8),
pale blue for the SW power cap (0x4, normal at full load). The slowdown temperature and the
power limit are drawn dashed where the telemetry has them. A host whose ib-counters.txt
readings show an error counter growing gets a fifth panel: per port, the growth of its error
counters (those ``preflight.judge.ib_growth.RULES`` judge) since the first reading, a step at
each reading.

A one-hour run at 10 Hz has 36,000 samples per GPU; each line is reduced to the mean of at
most ``max_points`` equal time bins (the shading to "any sample in the bin"), which keeps a
plot to well under a second and loses nothing visible at that width.

Needs matplotlib (the ``plots`` extra); the Agg backend is forced so no display is touched.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from preflight.contracts import SLOWDOWN_COLUMN
from preflight.judge.ib_growth import RULES, value
from preflight.parse.ib_counters import TimedReading
from preflight.soak import ib
from preflight.soak.data import SoakData
from preflight.soak.figures import (
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    SW_POWER_CAP,
    THERMAL,
    Thresholds,
    node_throughput,
    throughput_trends,
)

_SHADES = (  # drawn in this order, so the worse reason paints over the milder one
    ("SW power cap", SW_POWER_CAP, "#cfe3f7"),
    ("HW power brake / HW slowdown", HW_POWER_BRAKE | HW_SLOWDOWN, "#f8c471"),
    ("thermal slowdown", THERMAL, "#f1948a"),
)
# Legends sit right of the panels: inside, they would hide the lines of a long run.
_OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": "small"}


def plot_soak(data: SoakData, out_dir: str | Path, *, max_points: int = 1500) -> dict[str, Path]:
    """Write ``<out_dir>/soak-<host>.png`` for every host with telemetry; returns host -> path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    throughput = data.throughput_by_host
    readings = ib.read_readings(data.path)
    # One host's rows at a time (a fleet's frame is not split whole).
    for host in sorted(data.telemetry_by_host):
        tele = data.telemetry_by_host[host]
        path = out_dir / f"soak-{_safe(host)}.png"
        plot_host(tele, throughput.get(host, data.throughput.iloc[:0]), host, path, max_points=max_points,
                  ib_readings=readings.of(host) if readings else ())
        paths[host] = path
    return paths


def plot_host(tele: pd.DataFrame, throughput: pd.DataFrame, host: str, path: str | Path, *,
              max_points: int = 1500, ib_readings: tuple[TimedReading, ...] = ()) -> Path:
    """Draw one host's telemetry (its rows of ``telemetry.csv``) and throughput to ``path``, with
    its RDMA counters' growth where any grew."""
    path = Path(path)
    t0 = float(tele["time"].min())
    span = max(float(tele["time"].max()) - t0, 1e-9)
    # Never more bins than samples per GPU, or a short capture would leave most bins empty.
    n_bins = max(1, min(max_points, int(tele.groupby("gpu").size().max())))
    bins = np.minimum((tele["time"].to_numpy(float) - t0) / span * n_bins, n_bins - 1).astype(int)
    binned = tele.assign(_bin=bins)

    grown = error_growth(ib_readings)
    panels = 5 if grown else 4
    fig, axes = plt.subplots(panels, 1, figsize=(12, 11 + 2.5 * (panels - 4)), sharex=True, constrained_layout=True)
    ax_temp, ax_clock, ax_power, ax_thr = axes[:4]
    per_gpu = binned.groupby(["gpu", "_bin"], sort=True)[["time", "temperature_c", "sm_clock_mhz", "power_w"]].mean()
    for gpu, rows in per_gpu.groupby(level="gpu"):
        minutes = (rows["time"].to_numpy() - t0) / 60
        ax_temp.plot(minutes, rows["temperature_c"].to_numpy(), lw=0.8, label=f"GPU {gpu}")
        ax_clock.plot(minutes, rows["sm_clock_mhz"].to_numpy(), lw=0.8)
        ax_power.plot(minutes, rows["power_w"].to_numpy(), lw=0.8)
    _reference(ax_temp, tele.get(SLOWDOWN_COLUMN), "slowdown")
    _reference(ax_power, tele["power_limit_w"], "power limit")
    ax_temp.set_ylabel("temperature (°C)")
    ax_clock.set_ylabel("SM clock (MHz)")
    ax_power.set_ylabel("power (W)")
    ax_temp.legend(**_OUTSIDE)
    if ax_power.get_legend_handles_labels()[0]:
        ax_power.legend(**_OUTSIDE)

    metric = _plot_throughput(ax_thr, throughput, t0)
    ax_thr.set_ylabel(metric or "throughput")
    if grown:
        for label, steps in grown.items():
            ax_ib = axes[4]
            ax_ib.step([(t - t0) / 60 for t, _ in steps], [n for _, n in steps], where="post", lw=1.0, label=label)
        axes[4].set_ylabel("IB error counters\n(growth since the first reading)")
        axes[4].legend(**_OUTSIDE)
    axes[-1].set_xlabel("minutes since the first sample")

    _shade(axes, binned, span, n_bins)
    fig.suptitle(f"{host}: soak telemetry ({tele['gpu'].nunique()} GPUs, {span / 60:.1f} min)")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def error_growth(readings: tuple[TimedReading, ...]) -> dict[str, list[tuple[float, int]]]:
    """Per port that grew: (time, sum of its error counters' growth since the first reading) at
    each reading. A counter lower than at first (cleared) counts as 0."""
    if len(readings) < 2:
        return {}
    first = readings[0].snapshot
    out: dict[str, list[tuple[float, int]]] = {}
    for r in readings:
        for port in r.snapshot.ports:
            base = first.port(port.device, port.port)
            if base is None:
                continue
            total = sum(max(0, (value(port, n) or 0) - (value(base, n) or 0)) for n in RULES)
            out.setdefault(port.label, []).append((r.time, total))
    return {label: steps for label, steps in out.items() if any(n for _, n in steps)}


def _reference(ax, column: pd.Series | None, label: str) -> None:
    if column is None:
        return
    values = column.dropna()
    if len(values):
        ax.axhline(float(values.median()), color="black", ls="--", lw=0.8, label=label)


def _plot_throughput(ax, throughput: pd.DataFrame, t0: float) -> str | None:
    """Plot the metric the host's ``soak`` section reports, node-wide as one black line with its
    baseline dotted, or per GPU; None when the host has no throughput."""
    rows = throughput.dropna(subset=["value"])
    node = node_throughput(throughput_trends(rows, Thresholds()))
    if node is None:
        ax.text(0.5, 0.5, "no throughput recorded", ha="center", va="center", transform=ax.transAxes)
        return None
    series = rows[rows["metric"] == node.metric]
    per_gpu = "gpu" in series and series["gpu"].notna().all()
    if per_gpu:
        for _, one in series.groupby("gpu", sort=True):
            ax.plot((one["time"].to_numpy() - t0) / 60, one["value"].to_numpy(), lw=0.8)
    else:
        series = series[series["gpu"].isna()] if "gpu" in series else series
        ax.plot((series["time"].to_numpy() - t0) / 60, series["value"].to_numpy(), lw=0.9, color="black")
        ax.axhline(node.baseline, color="grey", ls=":", lw=0.8)
    return node.metric


def _shade(axes, binned: pd.DataFrame, span: float, n_bins: int) -> None:
    mask = binned["clocks_event_reasons"].fillna(0).astype(np.int64).to_numpy()
    bin_of = binned["_bin"].to_numpy()
    x = np.arange(n_bins + 1) / n_bins * span / 60
    # A bin no sample fell in keeps the state of the last one that had a sample.
    filled = np.zeros(n_bins, bool)
    filled[bin_of] = True
    carry = np.maximum.accumulate(np.where(filled, np.arange(n_bins), 0))
    handles = []
    for label, bits, colour in _SHADES:
        hit = np.zeros(n_bins, bool)
        hit[bin_of[(mask & bits) != 0]] = True
        hit = hit[carry]
        if not hit.any():
            continue
        # Steps one bin wide, so a shaded span starts and ends on the bins that carry the bit.
        where = np.concatenate([hit, hit[-1:]])
        for ax in axes:
            ax.fill_between(x, 0, 1, where=where, step="post", color=colour, alpha=0.5, lw=0,
                            transform=ax.get_xaxis_transform(), zorder=0)
        handles.append(Patch(color=colour, alpha=0.5, label=label))
    if handles:
        # On the throughput panel, the fourth: a fifth (the IB counters) has its own legend.
        axes[min(3, len(axes) - 1)].legend(handles=handles, **_OUTSIDE)


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host)


def plot_sweep(by_host: dict[str, tuple], out_dir: str | Path) -> dict[str, Path]:
    """``<out_dir>/sweep-<host>.png`` for every swept host (``by_host``: host -> (levels, knee) of
    sweep.py): output tokens/s and P99 TTFT against the concurrency, every host on one pair of
    axes so a curve unlike the others shows, the knee marked x and the recommended level o."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for host, (levels, knee) in by_host.items():
        if not levels:
            continue
        fig, (ax_tok, ax_ttft) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, constrained_layout=True)
        for other, (lvs, _) in by_host.items():
            if other != host and lvs:
                x = [lv.concurrency for lv in lvs]
                ax_tok.plot(x, [lv.tokens_per_s for lv in lvs], color="lightgrey", lw=0.8)
                ax_ttft.plot(x, [lv.ttft_p99_ms or np.nan for lv in lvs], color="lightgrey", lw=0.8)
        x = [lv.concurrency for lv in levels]
        ax_tok.plot(x, [lv.tokens_per_s for lv in levels], "-o", color="black", lw=1.2, ms=4, label=host)
        ax_ttft.plot(x, [lv.ttft_p99_ms or np.nan for lv in levels], "-o", color="black", lw=1.2, ms=4)
        for ax, values in ((ax_tok, [lv.tokens_per_s for lv in levels]),
                           (ax_ttft, [lv.ttft_p99_ms or np.nan for lv in levels])):
            at = dict(zip(x, values, strict=True))
            if knee.knee in at:
                ax.plot([knee.knee], [at[knee.knee]], "x", color="#c0392b", ms=12, mew=2, label="knee")
            if knee.recommended in at:
                ax.plot([knee.recommended], [at[knee.recommended]], "o", mfc="none", color="#27ae60", ms=14, mew=2,
                        label="recommended")
        ax_tok.set_xscale("log", base=2)
        ax_tok.set_ylabel("output tokens/s")
        ax_ttft.set_ylabel("P99 TTFT (ms)")
        ax_ttft.set_yscale("log")
        ax_ttft.set_xlabel("requests in flight")
        ax_ttft.set_xticks(x, [str(c) for c in x])
        ax_tok.legend(**_OUTSIDE)
        fig.suptitle(f"{host}: concurrency sweep (recommended {knee.recommended or 'none'}, "
                     f"knee {knee.knee or 'not reached'})")
        path = out_dir / f"sweep-{_safe(host)}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths[host] = path
    return paths
