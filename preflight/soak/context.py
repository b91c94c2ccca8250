"""What a soak check sees: one soak, its figures worked out once, and the verdicts that judge them.

A ``@soak_check`` function (``checks/soak.py``) gets one ``SoakContext`` for the whole soak and
returns outcomes naming their hosts, as a fleet check does. Checks sit at the judge layer and
may not import ``preflight.soak`` (tests/test_layers.py), so the context carries both the
figures (per-GPU summaries, throughput trends, each host's rows, the events) and, as its
``judge_*`` methods, the built-in verdicts of gpu_verdicts.py, throughput.py and server_log.py;
a check decides which hosts a verdict covers, the verdict holds the thresholds and the words.

Hosts are soak.json's, then any host only the telemetry names. A host has GPU telemetry when
it has rows in telemetry.csv; a ``vllm`` soak's host without any is excused when its agent
found no NVIDIA driver (soak.json ``no_telemetry``: vLLM on the CPU, as in CI), and only its
throughput is judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import pandas as pd

from preflight.check import Outcome
from preflight.model import Status
from preflight.parse.ib_counters import TimedReading
from preflight.soak import coverage, gpu_verdicts, ib, sdc, server_log, slo, sweep, throughput
from preflight.soak.data import HostFrames, SoakData, read_events
from preflight.soak.figures import (
    DEFAULT_THRESHOLDS,
    GpuSummary,
    MetricTrend,
    Thresholds,
    gpu_summaries,
    throughput_trends,
)


@dataclass(frozen=True, eq=False)
class SoakContext:
    """One soak, ready to judge. ``gpus``, ``trends`` and ``throughput`` have every host (empty
    where it recorded none); ``telemetry`` only the hosts with rows. ``notes`` say what was
    tolerated while reading and where the telemetry has gaps."""

    data: SoakData
    thresholds: Thresholds
    hosts: tuple[str, ...]
    gpus: Mapping[str, tuple[GpuSummary, ...]]
    trends: Mapping[str, tuple[MetricTrend, ...]]
    telemetry: Mapping[str, pd.DataFrame]
    throughput: Mapping[str, pd.DataFrame]
    no_telemetry: Mapping[str, str]  # host -> why its agent ran without GPU telemetry
    events: tuple[Mapping[str, str], ...]  # events.csv's rows, in file order
    notes: tuple[str, ...] = ()
    # host -> its readings of the RDMA counters in time order (ib-counters.txt); empty when the
    # directory has no such file
    ib_readings: Mapping[str, tuple[TimedReading, ...]] = field(default_factory=dict)

    @property
    def engine(self) -> str:
        return self.data.meta.engine

    @property
    def plan(self) -> coverage.Plan:
        """What soak.json says was planned: length, interval, each agent's outcome."""
        return coverage.plan_of(self.data.meta.extra)

    @property
    def planned_s(self) -> float | None:
        """How long the soak was meant to run (soak.json ``planned_s``), where it says."""
        return self.plan.planned_s

    def covered_s(self, host: str) -> float:
        """The time a host's soak covered: its telemetry's span, or on a host without GPU
        telemetry its throughput windows' (each stamped at its end, so the first adds one step)."""
        gpus = self.gpus.get(host) or ()
        if gpus:
            return float(max(g.last_t for g in gpus) - min(g.first_t for g in gpus))
        rows = self.throughput.get(host)
        t = sorted(set(rows["time"].tolist())) if rows is not None else []
        if len(t) < 2:
            return 0.0
        steps = sorted(b - a for a, b in zip(t[:-1], t[1:], strict=True))
        return float(t[-1] - t[0] + steps[len(steps) // 2])

    @property
    def sampled_hosts(self) -> tuple[str, ...]:
        """The hosts with GPU telemetry, in host order."""
        return tuple(h for h in self.hosts if self.gpus[h])

    # --- the built-in verdicts, one host each

    def judge_thermal(self, host: str) -> Outcome:
        return gpu_verdicts.thermal(host, self.gpus[host], self.thresholds)

    def judge_power(self, host: str) -> Outcome:
        return gpu_verdicts.power(host, self.gpus[host], self.thresholds)

    def judge_telemetry(self, host: str) -> Outcome:
        steps = tuple(s for s in self.data.steps_back if s.host == host)
        return gpu_verdicts.telemetry(host, self.gpus[host], self.thresholds, self.plan, steps)

    def judge_coverage(self, host: str) -> Outcome | None:
        """An ERROR when the host's soak did not run as planned (its agent did not finish, it
        covered less than its plan, or one of its GPUs joined too late to), else None (coverage.py)."""
        back = max((s.largest_s for s in self.data.steps_back if s.host == host), default=0.0)
        return (coverage.incomplete(host, self.covered_s(host), self.plan, self.thresholds, back)
                or coverage.late_gpus(host, self.gpus.get(host) or (), self.plan, self.thresholds))

    def judge_memory(self, host: str) -> Outcome:
        return gpu_verdicts.memory(host, self.telemetry[host], self.thresholds)

    def judge_throughput(self, host: str) -> Outcome:
        """Times count from the host's first telemetry sample, or from its first throughput row
        on a host without telemetry. A sweep's throughput rises level by level by design: it is
        judged per level (``judge_sweep``)."""
        if host in self._sweeps:
            return Outcome(Status.SKIP, "a concurrency sweep: throughput is judged level by level (soak-sweep)",
                           host=host)
        rows = self.telemetry.get(host)
        if rows is not None:
            return throughput.throughput(host, self.trends[host], rows, self.thresholds)
        host_thr = self.throughput[host]
        t0 = float(host_thr["time"].min()) if len(host_thr) else None
        return throughput.throughput(host, self.trends[host], self.data.telemetry.iloc[:0], self.thresholds, t0=t0)

    def judge_latency(self, host: str) -> Outcome:
        if host in self._sweeps:
            # Latency grows with the concurrency by design: judged per level, SLOs included.
            return Outcome(Status.SKIP, "a concurrency sweep: latency and SLOs are judged level by level "
                           "(soak-sweep)", host=host)
        return slo.latency(host, self.throughput[host], self.thresholds.slos, self.thresholds.slo_budget,
                           self.telemetry.get(host), self.thresholds)

    @property
    def swept_hosts(self) -> tuple[str, ...]:
        return tuple(h for h in self.hosts if h in self._sweeps)

    def judge_sweep(self, host: str) -> Outcome:
        return self._sweep_verdicts[host]

    def sweep_of(self, host: str) -> tuple[tuple[sweep.Level, ...], sweep.Knee] | None:
        """A swept host's levels and knee (None for a host that was not swept)."""
        return self._sweeps.get(host)

    @cached_property
    def _sweeps(self) -> dict[str, tuple[tuple[sweep.Level, ...], sweep.Knee]]:
        th, out = self.thresholds, {}
        for host in self.hosts:
            rows = self.throughput[host]
            if sweep.is_sweep(rows):
                lvs = tuple(sweep.levels(rows, th.slos, th.slo_budget))
                out[host] = (lvs, sweep.find_knee(lvs, th.knee_tokens_growth, th.knee_ttft_growth))
        return out

    @cached_property
    def _sweep_verdicts(self) -> dict[str, Outcome]:
        return sweep.verdicts(self._sweeps, self.thresholds.sweep_outlier_fraction)

    def judge_sdc(self, host: str) -> Outcome:
        return sdc.sdc(host, self.throughput[host], self.data.meta.engine, _burn_checked(self.data.meta.extra, host))

    def judge_ib_counters(self, host: str) -> Outcome:
        return ib.ib_counters(host, self.ib_readings.get(host, ()))

    def judge_outliers(self, host: str) -> Outcome:
        return self._outliers[host]

    def judge_server_log(self) -> list[Outcome]:
        """Every server-log failure the agents recorded, for soak.json's hosts, in event order."""
        return server_log.server_log(self.data.path, self.data.meta.hosts, self.events)

    @cached_property
    def _outliers(self) -> dict[str, Outcome]:
        # One pass for every host: each host's GPUs are compared with the fleet's median.
        return throughput.outliers(self.gpus, self.trends, self.thresholds)


def _burn_checked(extra, host: str) -> bool | None:
    """Whether the host's burn checked its results, from its agent's summary in soak.json
    (``agents.HOST.summary.engine.GPU.sdc``); None where no GPU's summary says."""
    agent = ((extra or {}).get("agents") or {}).get(host) or {}
    engine = (agent.get("summary") or {}).get("engine") if isinstance(agent, dict) else None
    said = [g.get("sdc") for g in engine.values() if isinstance(g, dict)] if isinstance(engine, dict) else []
    said = [v for v in said if isinstance(v, bool)]
    return any(said) if said else None


class _EveryHost(Mapping[str, pd.DataFrame]):
    """Every host of the soak, those without rows mapped to ``empty``."""

    def __init__(self, frames: HostFrames, hosts: tuple[str, ...], empty: pd.DataFrame):
        self._frames, self._hosts, self._empty = frames, hosts, empty

    def __getitem__(self, host: str) -> pd.DataFrame:
        if host not in self._hosts:
            raise KeyError(host)
        return self._frames[host] if host in self._frames else self._empty

    def __iter__(self):
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)


def soak_context(data: SoakData, thresholds: Thresholds = DEFAULT_THRESHOLDS,
                 slowdown_temperature_c: float | None = None) -> SoakContext:
    """The figures of an already read soak. ``slowdown_temperature_c`` applies where the
    telemetry has no per-GPU threshold (from a platform profile, say)."""
    th = thresholds
    thr = data.throughput
    # Every host the soak names counts: soak.json's, any only the telemetry or throughput has,
    # and those whose agent the controller recorded (a host that delivered nothing is listed
    # under "missing", not "hosts", and must not vanish from the verdicts).
    plan = coverage.plan_of(data.meta.extra)
    # Host by host: each host's rows are taken for its summaries (and again when a check asks
    # for them), so a fleet's frame is never split into a second whole copy.
    tele_by_host, thr_by_host = data.telemetry_by_host, data.throughput_by_host
    hosts = tuple(dict.fromkeys([*data.meta.hosts, *sorted(tele_by_host), *sorted(thr_by_host),
                                 *plan.agents, *plan.missing]))
    by_host: dict[str, list[GpuSummary]] = {h: [] for h in hosts}
    for host in sorted(tele_by_host):
        by_host[host] = gpu_summaries(tele_by_host[host], th, slowdown_temperature_c)
    excused = (data.meta.extra or {}).get("no_telemetry") if data.meta.engine == "vllm" else None
    # host -> why; a hand-made soak.json may hold anything here, and only that shape excuses.
    no_telemetry = ({str(h): str(why) for h, why in excused.items() if isinstance(why, str)}
                    if isinstance(excused, Mapping) else {})
    notes = list(data.notes)
    ib_readings, ib_notes = ib.by_host(ib.read_readings(data.path), hosts)
    notes += ib_notes
    for host in hosts:
        if by_host[host]:
            notes += gpu_verdicts.gap_notes(host, by_host[host])
    events = read_events(data.path, notes)
    return SoakContext(
        data=data, thresholds=th, hosts=hosts,
        gpus={h: tuple(by_host[h]) for h in hosts},
        trends={h: tuple(throughput_trends(thr_by_host[h], th)) if h in thr_by_host else () for h in hosts},
        telemetry=tele_by_host.only(h for h in hosts if by_host[h]),
        throughput=_EveryHost(thr_by_host, hosts, thr.iloc[:0]),
        no_telemetry=no_telemetry, events=events, notes=tuple(notes), ib_readings=ib_readings)
