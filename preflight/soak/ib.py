"""The soak's RDMA error counters (``soak-ib-counters``): what grew across the soak, and when.

Input: the agent's readings of ``/sys/class/infiniband/*/ports/*/{counters,hw_counters}`` in
``ib-counters.txt`` (preflight/node/ib_snapshots.py: one before the load starts, one every
``--ib-interval`` seconds, one after it), parsed with the ``ib-counters`` probe's parser.

The verdict on the whole window, first reading to last, is the run-level check's
(``preflight.judge.ib_growth.compare``: the same rules, thresholds, symptoms and words). The
readings in between add what two readings cannot show:
- *when* each counter grew: the intervals (minutes from the first reading) and by how much;
- a link that flapped and came back: ``link_downed`` grew, or the port's state differs between
  two successive readings, though the first and last agree (FAIL ``ib-link-flapping``);
- a burst of symbol errors: an interval whose rate passes the IBTA bound of 120 per hour (with
  at least ``MIN_FOR_RATE`` errors) FAILs even where the whole soak's average stays under it.
A node without RDMA devices says so (SKIP), as does a host with one reading only (its agent
stopped before its last; ``soak-telemetry`` reports the incomplete soak).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.check import Outcome, fail, ok, skip, warn
from preflight.contracts import IB_COUNTERS_TXT
from preflight.judge.ib_growth import (
    IBTA_SYMBOL_ERRORS_PER_HOUR,
    MIN_FOR_RATE,
    Change,
    compare,
    rate_per_hour,
    value,
)
from preflight.model import Evidence
from preflight.parse import ParseError
from preflight.parse.ib_counters import ReadingSeries, TimedReading, parse_ib_series
from preflight.soak import fmt
from preflight.soak.data import SoakDataError

CHECK = "soak-ib-counters"
_WHERE = re.compile(r"^lines? (\d+)(?:-\d+)?: (.*)$", re.S)


def read_readings(soak_dir: Path) -> ReadingSeries | None:
    """The soak directory's ib-counters.txt, or None where it has none (readings were off, or
    the directory was assembled from other telemetry). Raises SoakDataError naming the line."""
    path = Path(soak_dir) / IB_COUNTERS_TXT
    if not path.exists():
        return None
    if not path.is_file():
        raise SoakDataError(path, "not a file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SoakDataError(path, f"not UTF-8 text (byte {exc.start})") from None
    try:
        return parse_ib_series(text)
    except ParseError as exc:
        m = _WHERE.match(str(exc))
        raise SoakDataError(path, m.group(2) if m else str(exc), line=int(m.group(1)) if m else None) from None


@dataclass(frozen=True)
class Interval:
    """Two successive readings and what changed between them."""

    start_s: float  # seconds from the host's first reading
    end_s: float
    changes: tuple[Change, ...]
    first: TimedReading
    last: TimedReading

    @property
    def label(self) -> str:
        return f"{_minutes(self.start_s)}-{_minutes(self.end_s)} min"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}".rstrip("0").rstrip(".")


def intervals(readings: Sequence[TimedReading]) -> list[Interval]:
    t0 = readings[0].time
    out = []
    for a, b in zip(readings[:-1], readings[1:], strict=True):
        span = Interval(a.time - t0, b.time - t0, (), a, b)
        found = compare(a.snapshot, b.snapshot, b.time - a.time, during=f"at {span.label}")
        out.append(Interval(span.start_s, span.end_s, found.changes, a, b))
    return out


def ib_counters(host: str, readings: Sequence[TimedReading]) -> Outcome:
    """The verdict on one host's readings (in time order)."""
    if not readings:
        return skip(f"no reading of the RDMA counters for this host in {IB_COUNTERS_TXT}", host=host)
    if not any(r.snapshot.ports for r in readings):
        return skip(f"no RDMA device: /sys/class/infiniband held no port in any of {len(readings)} reading(s); "
                    "the fabric was not judged", host=host, data={"readings": len(readings), "ports": 0})
    if len(readings) < 2:
        return skip(f"one reading of the RDMA counters only ({readings[0].phase}): the agent stopped before its "
                    "next, so growth across the soak cannot be judged", host=host, data={"readings": 1})
    first, last = readings[0], readings[-1]
    if not any(p.counters or p.hw_counters for p in first.snapshot.ports):
        unreadable = sorted({u for p in first.snapshot.ports for u in p.unreadable})
        said = f" ({', '.join(unreadable[:3])})" if unreadable else ""
        return skip(f"the RDMA ports expose no readable counter{said}", host=host, data={"readings": len(readings)})
    seconds = last.time - first.time
    whole = compare(first.snapshot, last.snapshot, seconds, during="during the soak")
    steps = intervals(readings)
    phrases: list[tuple[str, str]] = []  # (level, phrase)
    symptoms = list(whole.symptoms)
    evidence = [_evidence(first, last, c) for c in whole.changes]
    for c in whole.changes:
        when = _when(c, steps) if c.counter else _first_state_change(c, steps)
        phrases.append((c.level, c.phrase + when))
    flapped = {c.port.label for c in whole.changes if c.flap}
    bursts = set()
    for step in steps:
        for c in step.changes:
            if c.reading is None and c.port.label not in flapped:
                # Gone from one reading and back in a later one: a device reset during the soak.
                phrases.append(("warn", c.phrase))
                evidence.append(_evidence(step.first, step.last, c))
                flapped.add(c.port.label)
                symptoms.append("ib-link-flapping")
            elif c.flap and c.port.label not in flapped:
                # Down and back between two readings: the window's ends agree, the link did not hold.
                phrases.append(("fail", f"{c.phrase} (the link flapped and came back)"))
                evidence.append(_evidence(step.first, step.last, c))
                flapped.add(c.port.label)
                symptoms.append("ib-link-flapping")
            elif c.counter == "symbol_error" and c.level == "fail" and not _failed(whole.changes, c) \
                    and c.port.label not in bursts:
                rate = rate_per_hour(c.grew or 0, step.end_s - step.start_s) or 0.0
                phrases.append(("fail", f"{c.port.label} symbol_error +{c.grew} at {step.label} ({rate:.0f}/hour, "
                                        f"above the IBTA bound of {IBTA_SYMBOL_ERRORS_PER_HOUR:.0f}/hour in that "
                                        "interval, though the whole soak's average is below it)"))
                evidence.append(_evidence(step.first, step.last, c))
                bursts.add(c.port.label)
                symptoms.append("ib-link-errors")
    data = summary(readings, steps, whole)
    span = f"{len(readings)} readings over {fmt.duration(seconds)}"
    fails = [p for lvl, p in phrases if lvl == "fail"]
    warns = [p for lvl, p in phrases if lvl != "fail"]
    if fails or warns:
        out = fail if fails else warn
        return out(f"{len(first.snapshot.ports)} port(s), {span}: " + "; ".join(fails + warns),
                   symptoms=list(dict.fromkeys(symptoms)), evidence=evidence[:6], data=data, host=host)
    if not whole.judged:
        return skip(f"no ACTIVE port in the first or last reading ({span}); see ib-port-down", data=data, host=host)
    tail = ("; lifetime values before the soak (context, not judged): "
            + "; ".join(f"{p} " + ", ".join(f"{n}={v}" for n, v in c.items())
                        for p, c in list(whole.lifetime.items())[:3])) if whole.lifetime else ""
    return ok(f"{whole.judged} active port(s), {span}: no error counter grew and no link changed state{tail}",
              data=data, host=host)


def _failed(changes: Sequence[Change], burst: Change) -> bool:
    """Whether the window's verdict already FAILs this port's symbol errors."""
    return any(c.counter == burst.counter and c.port.label == burst.port.label and c.level == "fail"
               for c in changes)


def _first_state_change(change: Change, steps: Sequence[Interval]) -> str:
    """Where a port's state first changed, for a change of state across the soak."""
    if not change.flap:
        return ""
    label = change.port.label
    first = next((s for s in steps for c in s.changes if c.flap and not c.counter and c.port.label == label), None)
    return f"; first seen at {first.label}" if first else ""


def _when(change: Change, steps: Sequence[Interval]) -> str:
    """Where a counter's growth across the soak happened: its intervals and amounts."""
    grew = [(s, c.grew) for s in steps for c in s.changes
            if c.counter == change.counter and c.port.label == change.port.label and c.grew]
    if not grew:
        return ""
    parts = ", ".join(f"+{n} at {s.label}" for s, n in grew[:4]) + (" …" if len(grew) > 4 else "")
    return f"; grew in {len(grew)} of {len(steps)} interval(s): {parts}"


def summary(readings: Sequence[TimedReading], steps: Sequence[Interval], whole) -> dict[str, Any]:
    """Machine-readable figures (the finding's data and the report's soak section)."""
    first, last = readings[0], readings[-1]
    seconds = last.time - first.time
    rates: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for label, grew in whole.grew.items():
        if "symbol_error" in grew and seconds:
            rates[label] = round(grew["symbol_error"] / seconds * 3600, 1)
    for step in steps:
        for c in step.changes:
            if c.counter == "symbol_error" and c.grew and step.end_s > step.start_s:
                rate = round(c.grew / (step.end_s - step.start_s) * 3600, 1)
                peaks[c.port.label] = max(peaks.get(c.port.label, 0.0), rate)
    return {
        "readings": len(readings), "ports": len(first.snapshot.ports), "window_s": round(seconds, 3),
        "grew": whole.grew, "lifetime": whole.lifetime,
        "flaps": sorted({c.port.label for s in steps for c in s.changes if c.flap}
                        | {c.port.label for c in whole.changes if c.flap}),
        "symbol_error_per_hour": rates, "peak_symbol_error_per_hour": peaks,
        "intervals": [{"start_s": round(s.start_s, 3), "end_s": round(s.end_s, 3),
                       "grew": {c.port.label + " " + c.counter: c.grew for c in s.changes if c.counter and c.grew},
                       "flaps": [c.port.label for c in s.changes if c.flap]}
                      for s in steps if s.changes],
        "min_for_rate": MIN_FOR_RATE,
    }


def section(readings: Sequence[TimedReading]) -> dict[str, Any] | None:
    """The host's ``ib_counters`` entry of the report's soak section (None: nothing to say)."""
    if len(readings) < 2 or not any(r.snapshot.ports for r in readings):
        return {"readings": len(readings), "ports": 0 if readings else None} if readings else None
    whole = compare(readings[0].snapshot, readings[-1].snapshot, readings[-1].time - readings[0].time)
    data = summary(readings, intervals(readings), whole)
    return {k: data[k] for k in ("readings", "ports", "window_s", "grew", "flaps", "symbol_error_per_hour",
                                 "peak_symbol_error_per_hour")}


def _evidence(first: TimedReading, last: TimedReading, c: Change) -> Evidence:
    """The values a change rests on, in the two readings it compares (their header lines)."""
    after = last.snapshot.port(c.port.device, c.port.port)
    values = [f"{n} {_read(c.port, n)} -> {_read(after, n) if after else 'absent'}"
              for n in (c.counters or ("state", "phys_state"))]
    return Evidence(IB_COUNTERS_TXT, f"{c.port.label}: " + ", ".join(values)
                    + f" (readings of lines {first.line} and {last.line})")


def _read(port, name: str):
    if name in ("state", "phys_state"):
        return getattr(port, name)
    return value(port, name) if value(port, name) is not None else port.counters.get(name)


def by_host(series: ReadingSeries | None, hosts: Sequence[str]) -> tuple[Mapping[str, tuple[TimedReading, ...]],
                                                                        list[str]]:
    """Each soaked host's readings in time order, and notes (cut blocks, hosts not soaked)."""
    if series is None:
        return {}, []
    notes = [f"{IB_COUNTERS_TXT}: {n}" for n in series.notes]
    stray = [h for h in series.hosts if h not in hosts]
    if stray:
        notes.append(f"{IB_COUNTERS_TXT} has readings of hosts not in the soak: {', '.join(stray)}")
    return {h: series.of(h) for h in hosts}, notes
