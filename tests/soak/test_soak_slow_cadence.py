"""The sampler reads slow-changing figures every SLOW_EVERY_S and leaves their cells empty in
between (preflight/node/sampler.py). A real 10 Hz capture in that shape, from the lent H200
(tests/fixtures/h200-device/agent-10hz-slow-cadence, its MANIFEST says how), judged in full."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from preflight.diagnose.engine import load_knowledge
from preflight.model import Status
from preflight.node.sampler import SLOW_EVERY_S
from preflight.soak.data import read_soak
from preflight.soak.judge import judge_soak

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "h200-device" / "agent-10hz-slow-cadence"


def test_the_slow_columns_hold_a_reading_every_few_seconds_and_the_fast_ones_every_tick():
    tele = read_soak(REAL).telemetry
    t = tele["time"].to_numpy(float)
    for column in ("memory_used_mib", "memory_clock_mhz", "remapped_rows_pending", "hw_power_brake_ns"):
        read = t[pd.to_numeric(tele[column], errors="coerce").notna().to_numpy()]
        assert len(read) >= 9 and np.all(np.diff(read) >= SLOW_EVERY_S - 0.2), column
    for column in ("temperature_c", "sm_clock_mhz", "power_w", "power_limit_w", "utilization_pct"):
        assert not tele[column].isna().any(), column


def test_a_soak_with_sparse_slow_columns_is_judged_like_any_other():
    analysis = judge_soak(REAL, load_knowledge())
    by_check = {f.check: f for f in analysis.findings}
    assert by_check["soak-memory"].status is Status.PASS and "steady on 1 GPU" in by_check["soak-memory"].summary
    assert by_check["soak-power"].status is Status.PASS and "692 W of 700" in by_check["soak-power"].summary
    assert by_check["soak-telemetry"].status is Status.PASS and "463 samples" in by_check["soak-telemetry"].summary
    assert not analysis.diagnoses
