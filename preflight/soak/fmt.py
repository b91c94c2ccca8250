"""How the soak's findings write their figures: durations, temperatures, clocks, watts, GPU
lists and clocks-event reasons, the same way in every summary and evidence line (the golden
reports in tests/golden/examples hold them to the letter)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from preflight.parse.smi_records import reasons_from_bitmask


def or_mask(values: pd.Series) -> int:
    """Every clocks-event bit set in any of the (possibly empty) bitmask cells."""
    known = values.dropna().unique()
    return int(np.bitwise_or.reduce(known.astype(np.int64))) if len(known) else 0


def reason_names(mask: int) -> str:
    return ", ".join(sorted(reasons_from_bitmask(int(mask))))


def sample_text(row: pd.Series, t0: float) -> str:
    """One telemetry row as evidence: when (from ``t0``), temperature, SM clock, power, reasons."""
    mask = row["clocks_event_reasons"]
    reasons = "n/a" if pd.isna(mask) else f"{int(mask):#x} ({reason_names(int(mask)) or 'none'})"
    return (f"at +{duration(float(row['time']) - t0)}: {temp(row['temperature_c'])}, "
            f"SM {mhz(row['sm_clock_mhz'])}, {watts(row['power_w'])}, reasons {reasons}")


def gpu_list(ids: Iterable[int]) -> str:
    """``GPU 3``, ``GPUs 0-2, 5``: consecutive indices as ranges."""
    ids = sorted(set(ids))
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"GPU{'s' if len(ids) > 1 else ''} {text}"


def duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def temp(value: Any) -> str:
    return "n/a °C" if _missing(value) else f"{float(value):g} °C"


def mhz(value: Any) -> str:
    return "n/a MHz" if _missing(value) else f"{float(value):.0f} MHz"


def watts(value: Any) -> str:
    return "n/a W" if _missing(value) else f"{float(value):.0f} W"


def num(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
