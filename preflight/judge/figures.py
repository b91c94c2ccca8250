"""The figures a trend needs, read out of a report (``preflight-report/1``) or out of a run's
findings: one number per host, figure and run. Pure: findings in, ``(host, figure, value)`` out.
The results store records them; the checks that read a node's history see this run's own.

Each figure says which way is worse, so that a trend query knows a falling busbw from a rising
temperature without a rule of its own per figure.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    name: str
    label: str
    unit: str
    worse: str  # "lower" (bandwidth, throughput, clocks) | "higher" (temperature, latency)


FIGURES: dict[str, Figure] = {f.name: f for f in (
    Figure("busbw_gbs", "all_reduce busbw", "GB/s", "lower"),
    Figure("soak_tflops", "soak GEMM TFLOP/s", "TFLOP/s", "lower"),
    Figure("soak_hbm_gbps", "soak HBM bandwidth", "GB/s", "lower"),
    Figure("soak_output_tokens_per_s", "soak output tokens/s", "tokens/s", "lower"),
    Figure("soak_max_temperature_c", "soak max GPU temperature", "°C", "higher"),
    Figure("soak_min_sm_clock_mhz", "soak min SM clock", "MHz", "lower"),
    Figure("soak_ttft_p99_ms", "soak TTFT P99", "ms", "higher"),
    Figure("soak_tpot_p99_ms", "soak TPOT P99", "ms", "higher"),
)}

# soak-throughput's data is keyed by metric; the sustained (final) level is what a trend follows.
_SOAK_METRICS = {"tflops": "soak_tflops", "hbm_gbps": "soak_hbm_gbps",
                 "output_tokens_per_s": "soak_output_tokens_per_s"}
_SOAK_SECTION = {"max_temperature_c": "soak_max_temperature_c", "min_sm_clock_mhz": "soak_min_sm_clock_mhz"}
_LATENCY = {"ttft_p99_ms": "soak_ttft_p99_ms", "tpot_p99_ms": "soak_tpot_p99_ms"}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


HISTORY_FACT = "history"  # the fact of a node's past; checks that read it run after the others


def readings_of(findings) -> dict[str, float]:
    """This run's figures on one host, from its findings (``model.Finding`` records)."""
    report = {"findings": [f.to_dict() for f in findings]}
    return {name: value for _, name, value in figures_of(report)}


def figures_of(report: dict) -> Iterator[tuple[str, str, float]]:
    """(host, figure, value) for every figure the report measured. Only passing or warning
    findings' figures count as readings of the node; a failed all_reduce's busbw is a symptom,
    already kept as the failure, and would drag a node's baseline towards its own fault."""
    for f in report.get("findings") or ():
        if not isinstance(f, dict) or not isinstance(f.get("host"), str) or f.get("status") not in ("pass", "warn"):
            continue
        data = f.get("data") if isinstance(f.get("data"), dict) else {}
        host, check = f["host"], f.get("check")
        if check == "nccl-all-reduce" and (v := _number(data.get("busbw_median_gbs"))) is not None:
            yield host, "busbw_gbs", v
        elif check == "soak-throughput":
            for metric, name in _SOAK_METRICS.items():
                entry = data.get(metric)
                if isinstance(entry, dict) and (v := _number(entry.get("final"))) is not None:
                    yield host, name, v
        elif check == "soak-latency":
            for key, name in _LATENCY.items():
                if (v := _number(data.get(key))) is not None:
                    yield host, name, v
    soak = report.get("soak")
    if isinstance(soak, dict):
        for host, section in soak.items():
            if isinstance(section, dict):
                for key, name in _SOAK_SECTION.items():
                    if (v := _number(section.get(key))) is not None:
                        yield str(host), name, v
