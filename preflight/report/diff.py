"""Run-to-run comparison of two ``report.json`` files (``preflight diff OLD NEW``, ``--baseline``).

What a maintenance window needs to read: which hosts and checks got worse or better, which
causes appeared or went away, and how the measured figures moved ("gpu017 nccl-all-reduce:
busbw 362 -> 471 GB/s (+30.1%)").

Statuses are ranked pass = skip < warn < error < fail; a change between equal ranks (pass to
skip) is listed as "changed". A (host, check) with several findings is judged by its worst
one, and its figures are the numeric scalars of its findings' ``data`` (first finding wins
for a key two findings share; nested dicts are flattened one level as ``outer.inner``),
plus the per-host figures of the report's ``soak`` section under the check name ``soak``.
A figure that moved less than 1% is measurement noise between two runs and is not listed; a
count that leaves zero always is (0 -> 1 is no rounding error). The unit is read from the
key's suffix (``_gbs`` GB/s, ``_c`` °C, ``_mhz`` MHz, ``_w`` W, ``_pct`` %, ...).

Only the two reports are read, never the bundles, so any two runs of any versions with the
``preflight-report/1`` format compare, provided they are of one kind: a fleet run (a judged
bundle) and a soak share no check, and are refused (``incomparable``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from preflight.contracts import CONNECTIVITY_CHECK, REPORT_FORMAT

NOISE = 0.01
_RANK = {"pass": 0, "skip": 0, "warn": 1, "error": 2, "fail": 3}
_UNITS = (("_gbs", "GB/s"), ("_gbps", "GB/s"), ("_mhz", "MHz"), ("_pct", "%"), ("_mib", "MiB"),
          ("_bytes", "B"), ("_us", "us"), ("_ms", "ms"), ("_s", "s"), ("_w", "W"), ("_c", "°C"))


class ReportError(ValueError):
    """A file that is not a readable ``preflight-report/1`` report."""


@dataclass(frozen=True)
class FigureChange:
    name: str
    old: float
    new: float

    @property
    def label(self) -> str:
        for suffix, _ in _UNITS:
            if self.name.endswith(suffix) and len(self.name) > len(suffix):
                return self.name[: -len(suffix)]
        return self.name

    @property
    def unit(self) -> str:
        return next((unit for suffix, unit in _UNITS
                     if self.name.endswith(suffix) and len(self.name) > len(suffix)), "")

    def text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        change = f" ({(self.new - self.old) / abs(self.old):+.1%})" if self.old else ""
        return f"{self.label} {_num(self.old)} -> {_num(self.new)}{unit}{change}"


@dataclass(frozen=True)
class Change:
    """One host's verdict, or one (host, check), in both runs; None where a run lacks it."""

    host: str | None
    check: str | None  # None: the host's overall verdict
    old: str | None
    new: str | None
    old_summary: str = ""
    new_summary: str = ""
    figures: tuple[FigureChange, ...] = ()

    @property
    def direction(self) -> str:
        """worse | better | changed | same | new | gone."""
        if self.old is None:
            return "new"
        if self.new is None:
            return "gone"
        if _RANK[self.new] != _RANK[self.old]:
            return "worse" if _RANK[self.new] > _RANK[self.old] else "better"
        return "changed" if self.new != self.old else "same"

    @property
    def where(self) -> str:
        return " ".join(p for p in (self.host or "fleet", self.check) if p)


@dataclass(frozen=True)
class CauseChange:
    cause: str
    host: str | None
    appeared: bool  # False: it went away


@dataclass(frozen=True)
class ReportDiff:
    old_run: str
    new_run: str
    hosts: tuple[Change, ...]  # every host of either run
    checks: tuple[Change, ...]  # only (host, check) pairs whose status or figures moved
    causes: tuple[CauseChange, ...]

    @property
    def worse(self) -> bool:
        # A host the new run no longer has was not checked at all: that is not "nothing got worse".
        return (any(c.direction in ("worse", "new") and _RANK.get(c.new or "", 0) > 0 for c in self.hosts)
                or any(c.direction == "gone" for c in self.hosts)
                or any(c.direction == "worse" for c in self.checks)
                or any(c.appeared for c in self.causes))


def load_report(path: str | Path) -> dict:
    """A report.json, given the file or the run directory holding it."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (a run directory or its report.json)") from None
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ReportError(f"{path}: not a readable JSON report ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != REPORT_FORMAT:
        raise ReportError(f"{path}: not a {REPORT_FORMAT} report")
    bad = _malformed(doc)
    if bad:
        raise ReportError(f"{path}: {bad}")
    return doc


def report_kind(doc: dict) -> str:
    """``soak`` for a judged soak (its report has the ``soak`` section or names its soak directory),
    ``run`` for a judged bundle (``run``, ``analyze BUNDLE``, ``merge``, ``healthcheck``)."""
    return "soak" if isinstance(doc.get("soak"), dict) or doc.get("soak_dir") else "run"


_KIND_WORDS = {"run": "a fleet run (its checks judge the probes' evidence)",
               "soak": "a soak (its soak-* checks judge telemetry under load)"}


def incomparable(old: dict, new: dict, old_name: str = "OLD", new_name: str = "NEW") -> str | None:
    """Why two reports cannot be compared, or None. A fleet run and a soak share no check, so a
    diff of the two would list every check of each as new or gone: nothing in it would be a
    change of the hosts."""
    old_kind, new_kind = report_kind(old), report_kind(new)
    if old_kind == new_kind:
        return None
    return (f"{old_name} is {_KIND_WORDS[old_kind]} and {new_name} is {_KIND_WORDS[new_kind]}: they share no "
            f"check, so there is nothing to compare; diff a run with a run and a soak with a soak")


def _malformed(doc: dict) -> str | None:
    """What in a report breaks the shape this comparison reads (docs/contracts.md §5), or None."""
    hosts = doc.get("hosts", {})
    if not isinstance(hosts, dict):
        return "field 'hosts' must be an object of host -> verdict"
    for host, verdict in hosts.items():
        if not isinstance(verdict, dict) or verdict.get("status") not in _RANK:
            return f"hosts.{host}: 'status' must be one of {', '.join(_RANK)}"
    for key in ("findings", "diagnoses"):
        items = doc.get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            return f"field {key!r} must be a list of objects"
    for i, f in enumerate(doc.get("findings", [])):
        if f.get("status") not in _RANK or not isinstance(f.get("check"), str) \
                or not isinstance(f.get("host"), (str, type(None))) or not isinstance(f.get("data", {}), dict):
            return f"findings[{i}]: needs 'check' (str), 'host' (str or null), 'status' (one of {', '.join(_RANK)})"
    for i, d in enumerate(doc.get("diagnoses", [])):
        if not isinstance(d.get("hosts", []), list):
            return f"diagnoses[{i}]: 'hosts' must be a list"
    if not isinstance(doc.get("soak", {}), dict):
        return "field 'soak' must be an object"
    return None


def diff_reports(old: dict, new: dict) -> ReportDiff:
    # A run that did not reach a host judged none of its checks: its connectivity finding says so
    # once (reports before issue 34 also held an ERROR per check, read here as absent). Such a
    # host's checks are then neither "gone" (not reached now) nor "new" when they pass again.
    old_unreached, new_unreached = _unreached(old), _unreached(new)
    old_checks, new_checks = _by_check(old, old_unreached), _by_check(new, new_unreached)
    checks = []
    for key in sorted(old_checks.keys() | new_checks.keys(), key=lambda k: (k[0] or "", k[1])):
        o, n = old_checks.get(key), new_checks.get(key)
        if key[1] != CONNECTIVITY_CHECK and (o is None or n is None):
            if (n is None and key[0] in new_unreached) or (o is None and key[0] in old_unreached
                                                           and _RANK.get(n["status"], 0) == 0):
                continue
        figures = _figure_changes(o["figures"], n["figures"]) if o and n else ()
        change = Change(key[0], key[1], o and o["status"], n and n["status"],
                        o["summary"] if o else "", n["summary"] if n else "", figures)
        if change.direction != "same" or figures:
            checks.append(change)
    old_hosts, new_hosts = old.get("hosts") or {}, new.get("hosts") or {}
    hosts = tuple(Change(h, None, (old_hosts.get(h) or {}).get("status"), (new_hosts.get(h) or {}).get("status"))
                  for h in sorted(old_hosts.keys() | new_hosts.keys()))
    old_causes, new_causes = _causes(old), _causes(new)
    causes = tuple([CauseChange(c, h, True) for c, h in sorted(new_causes - old_causes, key=_cause_key)]
                   + [CauseChange(c, h, False) for c, h in sorted(old_causes - new_causes, key=_cause_key)])
    order = {"worse": 0, "new": 1, "better": 2, "gone": 3, "changed": 4, "same": 5}
    checks.sort(key=lambda c: (order[c.direction], c.host or "", c.check or ""))
    return ReportDiff(_run_name(old), _run_name(new), hosts, tuple(checks), causes)


def _run_name(report: dict) -> str:
    return str(report.get("run_id") or report.get("created") or "?")


def _unreached(report: dict) -> set[str]:
    return {h for h, v in (report.get("hosts") or {}).items() if isinstance(v, dict) and v.get("reachable") is False}


def _by_check(report: dict, unreached: set[str] = frozenset()) -> dict[tuple[str | None, str], dict]:
    out: dict[tuple[str | None, str], dict] = {}
    for f in report.get("findings") or []:
        key = (f.get("host"), f.get("check", "?"))
        if key[0] in unreached and key[1] != CONNECTIVITY_CHECK:
            continue
        slot = out.setdefault(key, {"status": f.get("status", "pass"), "summary": f.get("summary", ""),
                                    "figures": {}})
        if _RANK.get(f.get("status"), 0) > _RANK.get(slot["status"], 0):
            slot["status"], slot["summary"] = f["status"], f.get("summary", "")
        for name, value in _figures(f.get("data") or {}):
            slot["figures"].setdefault(name, value)
    for host, section in (report.get("soak") or {}).items():
        if isinstance(section, dict):
            slot = out.setdefault((host, "soak"), {"status": "pass", "summary": "soak", "figures": {}})
            slot["figures"].update(_figures(section))
    return out


def _figures(data: dict, prefix: str = "") -> Iterable[tuple[str, float]]:
    for key, value in data.items():
        if isinstance(value, dict) and not prefix:
            yield from _figures(value, f"{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield prefix + str(key), float(value)


def _figure_changes(old: dict[str, float], new: dict[str, float]) -> tuple[FigureChange, ...]:
    out = []
    for name in sorted(old.keys() & new.keys()):
        a, b = old[name], new[name]
        if a == b:
            continue
        if a and abs(b - a) / abs(a) < NOISE:
            continue
        out.append(FigureChange(name, a, b))
    return tuple(out)


def _causes(report: dict) -> set[tuple[str, str | None]]:
    return {(d.get("cause", "?"), h) for d in report.get("diagnoses") or [] for h in (d.get("hosts") or [None])}


def _cause_key(item: tuple[str, str | None]) -> tuple[str, str]:
    return item[0], item[1] or ""


def _num(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


DIFF_FORMAT = "preflight-diff/1"


def to_dict(diff: ReportDiff) -> dict:
    """``diff --json`` (docs/contracts.md §1.2): the same facts as ``render``, for a script."""
    return {
        "format": DIFF_FORMAT,
        "old_run": diff.old_run,
        "new_run": diff.new_run,
        "worse": diff.worse,
        "hosts": [{"host": c.host, "old": c.old, "new": c.new, "direction": c.direction} for c in diff.hosts],
        "checks": [{"host": c.host, "check": c.check, "old": c.old, "new": c.new, "direction": c.direction,
                    "old_summary": c.old_summary, "new_summary": c.new_summary,
                    "figures": [{"name": f.name, "old": f.old, "new": f.new, "unit": f.unit} for f in c.figures]}
                   for c in diff.checks],
        "causes": [{"cause": c.cause, "host": c.host, "change": "appeared" if c.appeared else "resolved"}
                   for c in diff.causes],
    }


def render(diff: ReportDiff) -> str:
    """Markdown: readable in a terminal as it is, and as ``diff.md`` in the run directory."""
    out = [f"# preflight diff: {diff.old_run} -> {diff.new_run}", ""]
    moved = [c for c in diff.hosts if c.direction != "same"]
    same = len(diff.hosts) - len(moved)
    out += ["## Hosts", ""]
    out += [f"- {c.host}: {_arrow(c)} ({c.direction})" for c in moved]
    out += [f"- {same} host{'s' if same != 1 else ''} unchanged" if moved
            else f"- all {same} hosts unchanged" if same != 1 else "- the 1 host unchanged", ""]
    if diff.causes:
        out += ["## Diagnoses", ""]
        out += [f"- {'new' if c.appeared else 'resolved'}: {c.cause} on {c.host or 'the fleet'}" for c in diff.causes]
        out.append("")
    out += ["## Checks", ""]
    if not diff.checks:
        out += ["No check changed its verdict or figures.", ""]
    for c in diff.checks:
        line = f"- {c.where}: {_arrow(c)} ({c.direction})" if c.direction != "same" else f"- {c.where}:"
        if c.figures:
            line += " " + "; ".join(f.text() for f in c.figures)
        out.append(line)
        if c.direction in ("worse", "better", "new") and c.new_summary:
            out.append(f"  now: {c.new_summary}")
    out.append("")
    out.append("Something got worse." if diff.worse else "Nothing got worse.")
    return "\n".join(out) + "\n"


def _arrow(c: Change) -> str:
    return f"{(c.old or '-').upper()} -> {(c.new or '-').upper()}"
