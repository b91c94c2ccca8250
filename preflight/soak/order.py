"""What the order of a telemetry file says about the recording, read before its rows are sorted.

Two things are told from it (docs/contracts.md §6): a GPU whose time goes backwards (the
node's clock stepped back, or files were concatenated out of order; the analysis sorts the rows
by time, so anything measured across the step, such as a span or a duration in a state, is
uncertain), and a GPU whose first sample comes well after its host's first (it appeared
mid-run: hot plug, a reset, a driver that came back). The reader notes both; the soak's
``soak-telemetry`` verdict says them again for its host (``StepBack`` is what it reads), and
coverage is judged per GPU (coverage.py), so neither passes without a word.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from preflight.contracts import TELEMETRY_CSV
from preflight.soak.hostrows import host_rows


@dataclass(frozen=True)
class StepBack:
    """One GPU's time going backwards in file order: how often, the first step's size and line,
    and the largest step."""

    host: str
    gpu: int
    times: int
    first_s: float
    line: int
    largest_s: float

    def note(self) -> str:
        return (f"{TELEMETRY_CSV}:{self.line}: {self.host} GPU {self.gpu}: time goes back {self.first_s:.3g} s "
                f"({self.times} time{'s' if self.times > 1 else ''}); rows sorted by time")


def order_of(telemetry: pd.DataFrame, rows: Mapping[str, np.ndarray] | None = None) -> tuple[list[StepBack], list[str]]:
    """(every GPU's steps back, notes of the late GPUs), host by host, with only that host's time,
    GPU and line arrays: a fleet's frame is never split whole."""
    t_all = telemetry["time"].to_numpy(float)
    gpu_all = telemetry["gpu"].to_numpy()
    line_all = telemetry["_line"].to_numpy() if "_line" in telemetry else np.arange(len(telemetry)) + 2
    back, late = [], []
    for host, idx in sorted((host_rows(telemetry) if rows is None else rows).items()):
        b, lt = host_order(host, t_all[idx], gpu_all[idx], line_all[idx])
        back += b
        late += lt
    return back, late


def host_order(host: str, t: np.ndarray, gpu: np.ndarray, line: np.ndarray) -> tuple[list[StepBack], list[str]]:
    """One host's rows in file order: (its GPUs' steps back, notes of its late GPUs)."""
    order = np.argsort(gpu, kind="stable")  # within a GPU the rows keep their file order
    gpus, starts = np.unique(gpu[order], return_index=True)
    parts = np.split(order, starts[1:])
    back = []
    for g, rows in zip(gpus, parts, strict=True):
        tg = t[rows]
        drops = -np.diff(tg)
        steps = np.flatnonzero(drops > 0)
        if len(steps):
            i = steps[0] + 1
            back.append(StepBack(host, int(g), len(steps), float(drops[steps[0]]), int(line[rows[i]]),
                                 float(drops[steps].max())))
    start = t.min()
    firsts = pd.Series([t[rows].min() for rows in parts], index=gpus)
    step = float(np.median(np.diff(np.unique(t)))) if len(t) > 2 else 0.0
    late = [f"{TELEMETRY_CSV}: {host} GPU {g} first appears {first - start:.1f} s into the soak "
            "(not there from the start: a reset, hot plug or a late driver)"
            for g, first in firsts[firsts - start > max(10 * step, 5.0)].items()]
    return back, late
