"""Judging a soak: figures worked out, checks run, findings and the report's ``soak`` section out.

The soak checks are registered like every other check (``@soak_check`` in ``checks/soak.py``,
found by ``preflight.judge.loader``); this module gives each one the soak's ``SoakContext``
(context.py) and collects what they say. The numbers are worked out in figures.py, judged in
gpu_verdicts.py, throughput.py and server_log.py, which say what each verdict fails or warns on:

- ``soak-thermal``: FAIL ``thermal-throttling`` (a thermal slowdown bit, or the slowdown
  temperature, held for more than ``sustained_s``);
- ``soak-power``: PASS when power-capped at load, as a GPU is meant to run; WARN
  ``power-capping`` when the SM clock under the cap falls below its floor, the HW power brake
  engages, or HW slowdown shows unexplained;
- ``soak-throughput``: FAIL ``throughput-cliff``, else WARN ``throughput-decay``;
- ``soak-outliers``: WARN ``gpu-outlier`` (a GPU hotter or slower than its node's or the
  fleet's median);
- ``soak-telemetry``: FAIL ``gpu-fallen-off-bus``; gaps are notes. A host without any
  telemetry is an ERROR, except a ``vllm`` soak whose agent found no NVIDIA driver: SKIP "no GPU
  telemetry", and only its throughput is judged;
- ``soak-memory``: WARN ``gpu-memory-growth``;
- ``soak-vllm-server``: FAIL with the symptom of each known failure in a ``vllm`` soak's
  server log.

The report's ``soak`` section (one ``HostSoak`` per host) comes from the figures alone, whichever
checks ran: ``max_temperature_c``, ``min_sm_clock_mhz`` (over loaded samples, since idle clocks
say nothing), the clocks-event reasons seen, and the host's primary throughput metric's
baseline, final level and ``throughput_decay`` (its node-wide series, or the sum of its per-GPU
series when the node has none; figures.py defines them).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from preflight.judge.loader import load_checks
from preflight.judge.outcomes import CheckOutputError, outcomes_of
from preflight.model import Check, Finding, Status
from preflight.parse.smi_records import reasons_from_bitmask
from preflight.soak import ib
from preflight.soak.context import SoakContext, soak_context
from preflight.soak.data import ANALYSIS_COLUMNS, SoakData, read_soak
from preflight.soak.figures import DEFAULT_THRESHOLDS, GpuSummary, MetricTrend, Thresholds, node_throughput
from preflight.soak.slo import run_rates

# The order findings are reported in, which the soak's report has always had: host by host,
# each host's in check order, except that a host without GPU telemetry starts with its
# CHECK_TELEMETRY finding (it says why the rest is not judged); then the findings of the
# EVENT_CHECKS, which read the agents' event log rather than the figures, in the order found.
CHECK_TELEMETRY = "soak-telemetry"
CHECK_SERVER_LOG = "soak-vllm-server"
EVENT_CHECKS = (CHECK_SERVER_LOG,)


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
    # The RDMA counters' readings (soak/ib.py ``section``), where the agent took any.
    ib_counters: Mapping[str, Any] | None = None
    # A served model's (added keys: present only where the soak has them).
    requests_per_s: float | None = None
    goodput_requests_per_s: float | None = None  # requests within every --goodput limit, per second
    sweep: dict[str, Any] | None = None  # levels, knee, recommended (sweep.py)

    def to_dict(self) -> dict[str, Any]:
        extra = {k: v for k, v in (("requests_per_s", self.requests_per_s),
                                   ("goodput_requests_per_s", self.goodput_requests_per_s),
                                   ("sweep", self.sweep)) if v is not None}
        if self.ib_counters is not None:
            extra["ib_counters"] = dict(self.ib_counters)
        return {
            "engine": self.engine,
            "duration_s": self.duration_s,
            "max_temperature_c": self.max_temperature_c,
            "min_sm_clock_mhz": self.min_sm_clock_mhz,
            "throttle_reasons_seen": list(self.throttle_reasons_seen),
            "throughput_baseline": self.throughput_baseline,
            "throughput_final": self.throughput_final,
            "throughput_decay": self.throughput_decay,
            **extra,
        }


@dataclass(frozen=True)
class SoakResult:
    hosts: Mapping[str, HostSoak]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()
    sweeps: Mapping[str, tuple] | None = None  # host -> (levels, knee) of a swept host (sweep.py)

    def soak_section(self) -> dict[str, dict[str, Any]]:
        """The value of ``report.json``'s ``"soak"`` key."""
        return {host: s.to_dict() for host, s in self.hosts.items()}

    @property
    def failed(self) -> bool:
        return any(f.status in (Status.FAIL, Status.ERROR) for f in self.findings)


def soak_checks(extra_dirs: Iterable[Path] = ()) -> list[Check]:
    """The soak-scope checks: the built-in ones, then those of ``extra_dirs`` and of installed
    packages (``preflight.checks`` entry points), as ``preflight checks`` lists them."""
    return [c for c in load_checks(extra_dirs) if c.scope == "soak"]


def analyze_soak(soak_dir: str | Path, *, thresholds: Thresholds = DEFAULT_THRESHOLDS,
                 slowdown_temperature_c: float | None = None) -> SoakResult:
    """Read and judge a soak directory; raises ``SoakDataError`` when it breaks the contract."""
    with tempfile.TemporaryDirectory(prefix="preflight-soak-") as spill:  # one host in memory at a time
        return analyze(read_soak(soak_dir, columns=ANALYSIS_COLUMNS, spill_dir=spill), thresholds=thresholds,
                       slowdown_temperature_c=slowdown_temperature_c)


def analyze(data: SoakData, *, thresholds: Thresholds = DEFAULT_THRESHOLDS,
            slowdown_temperature_c: float | None = None, checks: Sequence[Check] | None = None) -> SoakResult:
    """Judge an already read soak with ``checks`` (default: ``soak_checks()``).
    ``slowdown_temperature_c`` applies where the telemetry has no per-GPU threshold (from a
    platform profile, say)."""
    soak = soak_context(data, thresholds, slowdown_temperature_c)
    findings = run_checks(soak_checks() if checks is None else checks, soak)
    sweeps = {h: soak.sweep_of(h) for h in soak.swept_hosts}
    return SoakResult(soak_section(soak), tuple(findings), soak.notes, sweeps)


def run_checks(checks: Sequence[Check], soak: SoakContext) -> list[Finding]:
    """Every check's findings, in the report's order (``EVENT_CHECKS`` above). A check that
    raises never takes the analysis down: it becomes an ERROR finding naming the check."""
    host_rank = {h: i for i, h in enumerate(soak.hosts)}
    per_host: list[tuple[tuple[int, bool, int, int], Finding]] = []
    after: list[Finding] = []
    for rank, check in enumerate(checks):
        for i, f in enumerate(_findings(check, soak)):
            if check.id in EVENT_CHECKS or f.host not in host_rank:
                after.append(f)
            else:
                first = check.id == CHECK_TELEMETRY and not soak.gpus[f.host]
                per_host.append(((host_rank[f.host], not first, rank, i), f))
    return [f for _, f in sorted(per_host, key=lambda kf: kf[0])] + after


def _findings(check: Check, soak: SoakContext) -> list[Finding]:
    try:
        outcomes = outcomes_of(check.func(soak), hosts=soak.hosts)
    except Exception as exc:  # noqa: BLE001 - a broken check is reported, not fatal
        what = str(exc) if isinstance(exc, CheckOutputError) else f"{type(exc).__name__}: {exc}"
        return [Finding(check.id, None, Status.ERROR, f"check crashed: {what} ({check.origin})", ("check-crashed",))]
    return [Finding(check.id, o.host, o.status, o.summary, o.symptoms, o.evidence, o.data, o.action) for o in outcomes]


# --- the soak section --------------------------------------------------------------------------


def soak_section(soak: SoakContext) -> dict[str, HostSoak]:
    """Per host: its figures; a host without GPU telemetry, its throughput's (when excused) or
    nothing."""
    sections = {}
    for host in soak.hosts:
        if soak.gpus[host]:
            section = host_section(soak.engine, soak.gpus[host], soak.trends[host])
        elif host in soak.no_telemetry:
            section = throughput_only_section(soak.engine, soak.throughput[host], soak.trends[host])
        else:
            section = HostSoak(soak.engine, 0.0, None, None, (), None, None, None)
        if (readings := soak.ib_readings.get(host)) is not None and (ib_section := ib.section(readings)):
            section = replace(section, ib_counters=ib_section)
        sections[host] = replace(section, **serving_fields(soak, host))
    return sections


def serving_fields(soak: SoakContext, host: str) -> dict[str, Any]:
    """A served model's run rates and, for a sweep, its levels and knee."""
    rows = soak.throughput[host]
    if soak.engine == "burn" or rows.empty:
        return {}
    rates = run_rates(rows)
    out: dict[str, Any] = {"requests_per_s": rates.get("requests_per_s"),
                           "goodput_requests_per_s": rates.get("goodput_requests_per_s")}
    swept = soak.sweep_of(host)
    if swept is not None:
        levels, knee = swept
        out["sweep"] = {"levels": [lv.to_dict() for lv in levels], "knee": knee.knee,
                        "recommended": knee.recommended, "reason": knee.reason}
    return out


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
