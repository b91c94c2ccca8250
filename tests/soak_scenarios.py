"""Soak telemetry derived from the one real burn, for the faults the corpus has no capture of.

The real capture (tests/fixtures/corpus/h200-vm): ``burn_samples.json`` is a 60 s bf16 GEMM
burn on one H200 (driver 580.159.04) sampled by NVML at 10 Hz; ``probe.log`` logs the same
burn's TFLOP/s per 5 s window and the GPU's slowdown threshold (89 °C); ``nvidia-smi.txt``
shows its 700 W power limit and the capture's date. Every scenario starts from those numbers:

- the *loaded part* (samples from t = 5 s on, once temperature and clocks have settled at
  64-66 °C, ~1440 MHz, ~692 W, reasons 0x4) is repeated to the wanted length, optionally
  keeping every n-th sample (``every=10`` is a 1 Hz sampler, which keeps the tests fast);
- the 11 real TFLOP/s windows are repeated the same way;
- each GPU of a multi-GPU node gets the same cycle started at another sample, so the GPUs
  are not in lockstep;
- a fault then transforms that steady run in one documented way (a temperature ramp, a
  clock cut, rows removed). Nothing is generated from nothing.

Each scenario returns a ``SoakData`` shaped exactly as ``read_soak`` returns it, so the
analysis can be tested without a round trip through CSV (one test does the round trip).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from preflight.soak.data import (
    SLOWDOWN_COLUMN,
    TELEMETRY_COLUMNS,
    SoakData,
    SoakMeta,
    frames_from_samples,
)

H200_VM = Path(__file__).parent / "fixtures" / "corpus" / "h200-vm"
POWER_LIMIT_W = 700.0  # nvidia-smi.txt: "127W /  700W"
LOADED_FROM_S = 5.0  # the capture has settled by then (temperature 64-66 °C, reasons 0x4)
WINDOW_S = 5.0  # probe.log: "per 5s window"
SAMPLE_S = 0.1  # the capture's 10 Hz
# The capture's date (nvidia-smi.txt header "Sun Nov 29 09:23:34 2026"); the burn ran minutes
# later at a time the capture does not record, so this only anchors the epoch times.
START = datetime(2026, 11, 29, 9, 23, 34, tzinfo=timezone.utc)


@cache
def real_samples() -> tuple[dict, ...]:
    return tuple(json.loads((H200_VM / "burn_samples.json").read_text()))


@cache
def real_tflops_windows() -> tuple[float, ...]:
    """probe.log: ``gemm TFLOP/s avg 674.0 per 5s window [673.2, 673.8, ...]``."""
    m = re.search(r"gemm TFLOP/s avg [\d.]+ per 5s window \[([^\]]+)\]", (H200_VM / "probe.log").read_text())
    assert m, "probe.log lost its TFLOP/s line"
    return tuple(float(v) for v in m.group(1).split(","))


@cache
def real_slowdown_c() -> float:
    """probe.log: ``thr slowdown 89`` (NVML_TEMPERATURE_THRESHOLD_SLOWDOWN of that H200)."""
    m = re.search(r"^thr slowdown (\d+)$", (H200_VM / "probe.log").read_text(), re.MULTILINE)
    assert m, "probe.log lost its slowdown threshold"
    return float(m.group(1))


def real_frames(host: str = "h200-vm") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The real 60 s burn as soak tables, through the package's own converter."""
    return frames_from_samples(real_samples(), host=host, start_epoch=START.timestamp(),
                               power_limit_w=POWER_LIMIT_W, slowdown_temperature_c=real_slowdown_c(),
                               tflops_windows=real_tflops_windows(), window_s=WINDOW_S)


def soak_data(telemetry: pd.DataFrame, throughput: pd.DataFrame, hosts: list[str] | None = None,
              engine: str = "burn") -> SoakData:
    """Wrap tables the way ``read_soak`` returns them: typed, sorted by time."""
    tele = telemetry.copy()
    tele["gpu"] = tele["gpu"].astype(int)
    for col in TELEMETRY_COLUMNS:
        if col not in ("host", "gpu"):
            tele[col] = tele[col].astype(float)
    hosts = hosts or list(dict.fromkeys(tele["host"]))
    meta = SoakMeta(engine, START.isoformat(), tuple(hosts))
    return SoakData(Path("<derived>"), meta,
                    tele.sort_values("time", kind="stable").reset_index(drop=True),
                    throughput.sort_values("time", kind="stable").reset_index(drop=True))


# --- the steady run every fault starts from --------------------------------------------------


def _loaded_cycle(every: int) -> pd.DataFrame:
    df = pd.DataFrame(real_samples())
    return df[df["t"] >= LOADED_FROM_S].iloc[::every].reset_index(drop=True)


def steady_frames(minutes: float = 60, hosts: tuple[str, ...] = ("gpu001",), gpus: int = 8,
                  every: int = 10, per_gpu: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The real loaded part repeated to ``minutes`` on every GPU of every host.

    Throughput is the real TFLOP/s windows as the node's ``tflops``; with ``per_gpu`` it is laid
    out as the soak agent writes it instead: each GPU's windows as ``gpu_tflops`` with its
    ``gpu`` set (the real windows, started at another window per GPU) and the node's
    ``tflops`` as their sum with ``gpu`` empty."""
    cycle = _loaded_cycle(every)
    step = SAMPLE_S * every
    n = round(minutes * 60 / step)
    rel = np.arange(n) * step
    parts = []
    for host in hosts:
        for gpu in range(gpus):
            idx = (np.arange(n) + gpu * 7) % len(cycle)  # another phase of the same cycle per GPU
            c = cycle.iloc[idx]
            parts.append(pd.DataFrame({
                "time": START.timestamp() + rel, "host": host, "gpu": gpu,
                "temperature_c": c["temp"].to_numpy(float), "memory_temperature_c": np.nan,
                "sm_clock_mhz": c["sm"].to_numpy(float), "memory_clock_mhz": c["mem"].to_numpy(float),
                "power_w": c["power_w"].to_numpy(float), "power_limit_w": POWER_LIMIT_W,
                "utilization_pct": c["util"].to_numpy(float), "memory_used_mib": np.nan,
                "clocks_event_reasons": c["reasons"].to_numpy(float),
                SLOWDOWN_COLUMN: real_slowdown_c(),
            }))
    tele = pd.concat(parts, ignore_index=True)
    windows = np.array(real_tflops_windows())
    w = int(minutes * 60 / WINDOW_S)
    times = START.timestamp() + WINDOW_S * (np.arange(w) + 1)
    rows = []
    for host in hosts:
        if not per_gpu:
            rows.append(pd.DataFrame({"time": times, "host": host, "metric": "tflops",
                                      "value": windows[np.arange(w) % len(windows)]}))
            continue
        each = [windows[(np.arange(w) + gpu) % len(windows)] for gpu in range(gpus)]
        rows.append(pd.DataFrame({"time": times, "host": host, "metric": "tflops", "value": np.sum(each, axis=0),
                                  "gpu": np.nan}))
        rows += [pd.DataFrame({"time": times, "host": host, "metric": "gpu_tflops", "value": v, "gpu": float(gpu)})
                 for gpu, v in enumerate(each)]
    return tele, pd.concat(rows, ignore_index=True)


def _minutes(frame: pd.DataFrame) -> np.ndarray:
    return (frame["time"].to_numpy() - START.timestamp()) / 60


# --- faults ----------------------------------------------------------------------------------


def steady(**kw) -> SoakData:
    """A healthy hour: the real 60 s burn's loaded part repeated to 60 minutes on 8 GPUs."""
    return soak_data(*steady_frames(**kw))


def thermal_cliff(onset_min: float = 15, ramp_min: float = 3, gpus_hit: tuple[int, ...] | None = None,
                  **kw) -> SoakData:
    """From ``onset_min`` temperature climbs linearly to the real slowdown threshold (89 °C) over
    ``ramp_min``; from then on the samples gain SW+HW thermal slowdown (0x20|0x40, keeping the
    0x4 they had), SM clock and throughput fall to 60% and power to 80% of the steady values.
    ``gpus_hit`` limits it to some GPUs (with ``per_gpu`` throughput: their ``gpu_tflops``, and
    the node's ``tflops`` by their share of the sum)."""
    tele, thr = steady_frames(**kw)
    m = _minutes(tele)
    hit = tele["gpu"].isin(gpus_hit) if gpus_hit is not None else np.ones(len(tele), bool)
    ramp = np.clip((m - onset_min) / ramp_min, 0, 1) * hit
    tele["temperature_c"] += ramp * (real_slowdown_c() - 65.0)
    hot = hit & (m >= onset_min + ramp_min)
    tele.loc[hot, "clocks_event_reasons"] = tele.loc[hot, "clocks_event_reasons"].astype(int) | 0x20 | 0x40
    tele.loc[hot, "sm_clock_mhz"] *= 0.6
    tele.loc[hot, "power_w"] *= 0.8
    after = _minutes(thr) >= onset_min + ramp_min
    if gpus_hit is None:
        thr.loc[after, "value"] *= 0.6
    else:
        gpu_rows = after & thr["gpu"].isin(gpus_hit)
        lost = thr[gpu_rows].groupby("time")["value"].sum() * 0.4
        thr.loc[gpu_rows, "value"] *= 0.6
        node_rows = after & thr["gpu"].isna()
        thr.loc[node_rows, "value"] -= thr.loc[node_rows, "time"].map(lost).to_numpy()
    return soak_data(tele, thr)


def slow_gpu(gpu: int = 6, fraction: float = 0.85, **kw) -> SoakData:
    """Per-GPU throughput (``per_gpu``) where one GPU's ``gpu_tflops`` windows are scaled to
    ``fraction`` for the whole run, and the node's sum with them: a GPU slower than its peers
    at the same clocks and temperature (an HBM or PCIe fault, say)."""
    tele, thr = steady_frames(per_gpu=True, **kw)
    rows = thr["gpu"] == gpu
    lost = thr[rows].set_index("time")["value"] * (1 - fraction)
    thr.loc[rows, "value"] *= fraction
    node_rows = thr["gpu"].isna()
    thr.loc[node_rows, "value"] -= thr.loc[node_rows, "time"].map(lost).to_numpy()
    return soak_data(tele, thr)


def power_cliff(onset_min: float = 15, **kw) -> SoakData:
    """From ``onset_min`` the SM clock and throughput fall to 60% while the reasons stay the
    real 0x4 (SW power cap) and temperature stays as captured: the GPU holds its power limit
    at far lower clocks, what failing power delivery or rising leakage looks like."""
    tele, thr = steady_frames(**kw)
    tele.loc[_minutes(tele) >= onset_min, "sm_clock_mhz"] *= 0.6
    thr.loc[_minutes(thr) >= onset_min, "value"] *= 0.6
    return soak_data(tele, thr)


def power_brake(at_min: float = 20, seconds: float = 30, gpu: int = 2, **kw) -> SoakData:
    """For ``seconds`` from ``at_min`` one GPU's reasons become HW slowdown + HW power brake
    (0x8|0x80) instead of 0x4, its SM clock halves and its power falls to 60%; the node's
    throughput windows in that span fall to 90% (one GPU of 8 at half speed)."""
    tele, thr = steady_frames(**kw)
    m = _minutes(tele)
    hit = (tele["gpu"] == gpu) & (m >= at_min) & (m < at_min + seconds / 60)
    tele.loc[hit, "clocks_event_reasons"] = 0x8 | 0x80
    tele.loc[hit, "sm_clock_mhz"] *= 0.5
    tele.loc[hit, "power_w"] *= 0.6
    mt = _minutes(thr)
    thr.loc[(mt >= at_min) & (mt < at_min + seconds / 60 + WINDOW_S / 60), "value"] *= 0.9
    return soak_data(tele, thr)


def fallen_off(gpu: int = 5, at_min: float = 40, **kw) -> SoakData:
    """One GPU's rows stop at ``at_min`` (the sampler gets no answer and writes nothing)."""
    tele, thr = steady_frames(**kw)
    return soak_data(tele[~((tele["gpu"] == gpu) & (_minutes(tele) >= at_min))], thr)


def hot_gpu(gpu: int = 3, kelvin: float = 15, **kw) -> SoakData:
    """One GPU of the node runs ``kelvin`` hotter than its siblings (80 °C instead of 65 °C,
    still below the 89 °C slowdown), as a GPU with a clogged heatsink or a bad fan would."""
    tele, thr = steady_frames(**kw)
    tele.loc[tele["gpu"] == gpu, "temperature_c"] += kelvin
    return soak_data(tele, thr)


def hot_host_in_fleet(hot: str = "vm3", kelvin: float = 15, hosts: tuple[str, ...] = ("vm1", "vm2", "vm3", "vm4"),
                      **kw) -> SoakData:
    """Single-GPU hosts like the real one; the GPU of host ``hot`` runs ``kelvin`` hotter."""
    tele, thr = steady_frames(hosts=hosts, gpus=1, **kw)
    tele.loc[tele["host"] == hot, "temperature_c"] += kelvin
    return soak_data(tele, thr)


def decay(fraction: float = 0.08, **kw) -> SoakData:
    """Throughput scaled linearly from 100% at the start to ``1 - fraction`` at the end;
    telemetry unchanged (a slow loss a GPU trace does not explain, e.g. server-side)."""
    tele, thr = steady_frames(**kw)
    m = _minutes(thr)
    thr["value"] *= 1 - fraction * (m - m.min()) / (m.max() - m.min())
    return soak_data(tele, thr)


def clock_decay(fraction: float = 0.08, **kw) -> SoakData:
    """As ``decay``, and the SM clock of every GPU scaled the same way (reasons still the real
    0x4 SW power cap): the GPUs themselves slowed, e.g. power delivery or leakage."""
    tele, thr = steady_frames(**kw)
    for frame in (thr, tele):
        m = _minutes(frame)
        column = "value" if frame is thr else "sm_clock_mhz"
        frame[column] *= 1 - fraction * (m - m.min()) / (m.max() - m.min())
    return soak_data(tele, thr)


def telemetry_gap(at_min: float = 30, seconds: float = 20, **kw) -> SoakData:
    """Every GPU's rows removed for ``seconds`` from ``at_min`` (the sampler stalled)."""
    tele, thr = steady_frames(**kw)
    m = _minutes(tele)
    return soak_data(tele[~((m >= at_min) & (m < at_min + seconds / 60))], thr)
