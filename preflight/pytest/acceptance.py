"""Acceptance criteria over a preflight report, written the way the contract reads.

Input: a ``report.json`` (contract ``preflight-report/1``), as the dict or as the file that
``preflight run`` / ``preflight analyze`` wrote, possibly with the ``soak`` section a soak
analysis adds. Only the contract's fields are read, so a report saved months ago, one from
a live run and one from a customer's bundle are read alike, inside pytest or not::

    report = Report.load("reports/20261129-101500-ab12/report.json")
    assert report.host("gpu007").passed
    assert report.busbw("all_reduce", hosts="all") >= 450
    assert not report.diagnoses(cause="thermal-throttling")
    assert report.soak.max_temperature < 85 and report.soak.throughput_decay < 0.05

Findings and diagnoses come back as the project's own records (``preflight.model.Finding``
and ``Diagnosis``); their ``status`` is a ``Status``, a str enum, so ``f.status == "fail"``
holds. A figure an assertion needs but the report does not hold (no all_reduce measured on a
host, a host not in the report) raises ``MissingResult`` naming what is missing, instead of
comparing ``None`` with a number.

Bandwidth figures are read from the ``data`` of the ``nccl-<collective>`` check's findings
(checks/nccl_all_reduce.py): ``busbw_median_gbs``, the median bus bandwidth in GB/s over the
passing repetitions at the run's largest message size, and ``largest_bytes``, that size.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preflight.model import Diagnosis, Evidence, Finding, Status, worst

FORMAT = "preflight-report/1"
BUSBW_KEY = "busbw_median_gbs"
SIZE_KEY = "largest_bytes"
# Host verdicts that let a node serve: warnings are allowed, as in the CLI's exit code 0.
PASSING = ("pass", "warn")


class ReportError(ValueError):
    """The file or dict is not a preflight report; the message says what is wrong."""


class MissingResult(LookupError):
    """The report lacks a result an acceptance criterion needs; the message names it."""


@dataclass(frozen=True)
class HostResult:
    """One host's verdict (``status``: pass | warn | fail | error) and its own findings."""

    name: str
    status: str
    reachable: bool
    profile: str | None
    findings: tuple[Finding, ...]

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    def status_of(self, check: str) -> Status | None:
        """The worst status ``check`` gave this host; None when it said nothing about it."""
        mine = [f.status for f in self.findings if f.check == check]
        return worst(mine) if mine else None


@dataclass(frozen=True)
class HostSoak:
    """One host's entry of the report's ``soak`` section; None where the soak could not tell."""

    engine: str | None
    duration_s: float | None
    max_temperature_c: float | None
    min_sm_clock_mhz: float | None
    throttle_reasons_seen: tuple[str, ...]
    throughput_baseline: float | None
    throughput_final: float | None
    throughput_decay: float | None


@dataclass(frozen=True)
class Soak:
    """The soak section across hosts; each figure is the worst host's, None when no host has one."""

    hosts: Mapping[str, HostSoak] = field(default_factory=dict)

    @property
    def ran(self) -> bool:
        return bool(self.hosts)

    @property
    def max_temperature(self) -> float | None:
        return _extreme(max, (h.max_temperature_c for h in self.hosts.values()))

    @property
    def throughput_decay(self) -> float | None:
        return _extreme(max, (h.throughput_decay for h in self.hosts.values()))

    @property
    def min_sm_clock_mhz(self) -> float | None:
        return _extreme(min, (h.min_sm_clock_mhz for h in self.hosts.values()))

    @property
    def duration_s(self) -> float | None:
        """The shortest host's soak: an hour-long criterion holds only if every host ran that long."""
        return _extreme(min, (h.duration_s for h in self.hosts.values()))

    @property
    def throttle_reasons_seen(self) -> tuple[str, ...]:
        return tuple(sorted({r for h in self.hosts.values() for r in h.throttle_reasons_seen}))

    def host(self, name: str) -> HostSoak:
        if name not in self.hosts:
            raise MissingResult(f"no soak result for host {name!r} (soaked: {', '.join(self.hosts) or 'none'})")
        return self.hosts[name]


@dataclass(frozen=True)
class Report:
    """A preflight report, queried like an acceptance contract."""

    data: Mapping[str, Any] = field(repr=False)
    host_results: Mapping[str, HostResult] = field(repr=False)
    all_findings: tuple[Finding, ...] = field(repr=False)
    all_diagnoses: tuple[Diagnosis, ...] = field(repr=False)
    soak: Soak = field(repr=False)

    @classmethod
    def load(cls, path: str | Path) -> Report:
        """Read ``report.json``, or the run directory that holds it."""
        path = Path(path)
        if path.is_dir():
            path = path / "report.json"
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ReportError(f"{path}: cannot read ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
        try:
            return cls.from_dict(data)
        except ReportError as exc:
            raise ReportError(f"{path}: {exc}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ReportError(f"not a {FORMAT} report (format: {got!r})")
        try:
            findings = tuple(_finding(f) for f in data.get("findings") or ())
            diagnoses = tuple(_diagnosis(d) for d in data.get("diagnoses") or ())
            of: dict[str | None, list[Finding]] = {}
            for f in findings:
                of.setdefault(f.host, []).append(f)
            hosts = {
                name: HostResult(name, v["status"], bool(v.get("reachable", True)), v.get("profile"),
                                 tuple(of.get(name, ())))
                for name, v in (data.get("hosts") or {}).items()
            }
            soak = Soak({name: _host_soak(s) for name, s in (data.get("soak") or {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReportError(f"does not follow {FORMAT}: {type(exc).__name__}: {exc}") from None
        return cls(data, hosts, findings, diagnoses, soak)

    @property
    def hosts(self) -> tuple[str, ...]:
        """Host names in report order (the inventory's)."""
        return tuple(self.host_results)

    @property
    def passed(self) -> bool:
        return all(h.passed for h in self.host_results.values())

    def host(self, name: str) -> HostResult:
        if name not in self.host_results:
            raise MissingResult(f"host {name!r} is not in the report (hosts: {', '.join(self.hosts) or 'none'})")
        return self.host_results[name]

    def findings(self, check: str | Iterable[str] | None = None, host: str | Iterable[str] | None = None,
                 status: str | Iterable[str] | None = None) -> tuple[Finding, ...]:
        """Findings matching every filter given; each filter takes one value or several."""
        checks, hosts, statuses = _wanted(check), _wanted(host), _wanted(status)
        return tuple(f for f in self.all_findings
                     if (checks is None or f.check in checks)
                     and (hosts is None or f.host in hosts)
                     and (statuses is None or f.status.value in statuses))

    def diagnoses(self, cause: str | Iterable[str] | None = None,
                  host: str | Iterable[str] | None = None) -> tuple[Diagnosis, ...]:
        """Diagnoses of the given cause(s), and/or naming the given host(s)."""
        causes, hosts = _wanted(cause), _wanted(host)
        return tuple(d for d in self.all_diagnoses
                     if (causes is None or d.cause in causes)
                     and (hosts is None or any(h in d.hosts for h in hosts)))

    def explain(self, finding: Finding) -> tuple[Diagnosis, ...]:
        """The diagnoses that account for a finding: its host's, sharing one of its symptoms."""
        symptoms = set(finding.symptoms)
        return tuple(d for d in self.all_diagnoses
                     if symptoms & set(d.symptoms)
                     and (finding.host in d.hosts if finding.host is not None else not d.hosts))

    def busbw(self, collective: str = "all_reduce", hosts: str | Iterable[str] = "all") -> float:
        """The lowest bus bandwidth (GB/s) over ``hosts`` at the largest message size measured.

        ``hosts`` is "all" (every host of the report), one name or several. Every host must have
        a figure at that size: a host without one (not run, a single GPU, unreachable, or a run
        that stopped at a smaller size) raises ``MissingResult``, since the minimum of the
        others would overstate the fleet.
        """
        check = "nccl-" + collective.replace("_", "-")
        names = self.hosts if hosts == "all" else tuple(_wanted(hosts) or ())
        measured: dict[str, tuple[int, float]] = {}
        for name in names:
            figures = [(int(f.data[SIZE_KEY]), float(f.data[BUSBW_KEY]))
                       for f in self.findings(check=check, host=name)
                       if f.data.get(BUSBW_KEY) is not None and f.data.get(SIZE_KEY) is not None]
            if figures:
                measured[name] = min(figures, key=lambda sb: (-sb[0], sb[1]))
        if not names:
            raise MissingResult(f"no hosts to read {check} from")
        largest = max((size for size, _ in measured.values()), default=None)
        missing = [n for n in names if n not in measured]
        smaller = [f"{n} (up to {measured[n][0]} B)" for n in names if n in measured and measured[n][0] != largest]
        if missing or smaller:
            parts = ([f"no {check} bandwidth for {', '.join(missing)}"] if missing else []) + (
                [f"measured below the largest size {largest} B on {', '.join(smaller)}"] if smaller else [])
            raise MissingResult("; ".join(parts))
        return min(busbw for _, busbw in measured.values())


def _wanted(value: str | Iterable[str] | None) -> list[str] | None:
    """A filter's values as plain strings, in the order given; None for "no filter"."""
    if value is None:
        return None
    values = [value] if isinstance(value, str) else list(value)
    # A Status hashes by its name, not its value: compare plain strings.
    return [v.value if isinstance(v, Status) else str(v) for v in values]


def _extreme(pick, values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return pick(known) if known else None


def _finding(d: Mapping[str, Any]) -> Finding:
    data = dict(d.get("data") or {})
    action = data.pop("action", None)
    return Finding(d["check"], d.get("host"), Status(d["status"]), d.get("summary", ""),
                   tuple(d.get("symptoms") or ()),
                   tuple(Evidence(e.get("probe", ""), e.get("excerpt", "")) for e in d.get("evidence") or ()),
                   data, action)


def _diagnosis(d: Mapping[str, Any]) -> Diagnosis:
    return Diagnosis(d["cause"], tuple(d.get("hosts") or ()), d.get("confidence", ""),
                     tuple(d.get("symptoms") or ()), d.get("action", ""), d.get("title", ""),
                     d.get("evidence", ""))


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _host_soak(s: Mapping[str, Any]) -> HostSoak:
    return HostSoak(s.get("engine"), _number(s.get("duration_s")), _number(s.get("max_temperature_c")),
                    _number(s.get("min_sm_clock_mhz")), tuple(s.get("throttle_reasons_seen") or ()),
                    _number(s.get("throughput_baseline")), _number(s.get("throughput_final")),
                    _number(s.get("throughput_decay")))
