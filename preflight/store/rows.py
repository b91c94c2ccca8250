"""A finished report (``preflight-report/1``) as the rows the store keeps. Pure: the same
function records a live run and backfills a saved ``reports/`` folder, so both land alike.

What is kept: the run (id, kind, start, duration, launcher, version, command, the checks it
judged); per host its verdict and profile; every finding that did not pass (a passing check is
known from the run's checks and the host's verdict, and keeping 30 of them per node per run
would be most of the store); every diagnosis, one row per host it blames; the figures a trend
needs (``figures.py``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from preflight.judge.figures import figures_of

KINDS = ("run", "analyze", "merge", "soak", "healthcheck", "prolog")
_KEPT = ("warn", "fail", "error")
_STATUS_ORDER = {"pass": 0, "warn": 1, "error": 2, "fail": 3}
# The times a run may have started at. Before 2000 no run of this tool; more than a day ahead of
# the recording machine's clock is a clock gone wrong or a time in milliseconds (started_at
# 1.7e12 is the year 55,000): kept, either would never be shown by a history that ends at the
# reader's now. Up to a day ahead is a writer whose clock is merely off: recorded, and shown
# (`history` reads up to the latest run recorded).
EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc).timestamp()
FUTURE_SLACK_S = 86400.0
# What neither engine's text can hold: NUL (PostgreSQL refuses it) and a lone surrogate (a name
# that was not valid UTF-8 and came through Python's surrogateescape; no driver encodes it).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class ReportShapeError(ValueError):
    """A report.json the store cannot record: not preflight's, without a run id, or with a start
    time that cannot be (the message names the field)."""


def storable(text: str) -> str:
    """``text`` as both engines can store it: NUL and lone surrogates written as the escapes
    Python would print (``\\x00``, ``\\udcff``), so what was there stays visible. Every
    parameter the store binds passes through here (``Store.execute``), written or looked up."""
    if not _UNSTORABLE.search(text):
        return text
    return _UNSTORABLE.sub(lambda m: "\\x00" if m.group() == "\x00" else f"\\u{ord(m.group()):04x}", text)


def fingerprint(run_id: str, created, hosts) -> str:
    """What tells one run from another that reuses its id: the id, the run's own creation time
    (as its report and bundle write it: a re-analysis of the bundle carries the same) and the
    hosts it covered. The same report recorded live and imported later, or a bundle analysed
    again, give the same; two healthchecks of two nodes that drew one id do not."""
    key = json.dumps([run_id, created if isinstance(created, str) else None, sorted(map(str, hosts))],
                     ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class RunRow:
    run_id: str
    kind: str
    started: float
    duration_s: float | None
    launcher: str | None
    version: str | None
    command: str | None
    status: str
    checks: str  # JSON list of the check ids the run judged
    hosts: int
    report_dir: str | None = None  # where report.json (and the run's bundle/) were
    fingerprint: str | None = None  # tells a re-recording of this run from another run reusing its id


@dataclass(frozen=True)
class Rows:
    run: RunRow
    hosts: list[tuple] = field(default_factory=list)  # (run_id, host, started, status, reachable, profile)
    findings: list[tuple] = field(default_factory=list)  # (run_id, host, started, check, status, symptoms, summary)
    diagnoses: list[tuple] = field(default_factory=list)  # (run_id, host, started, cause, confidence, action)
    figures: list[tuple] = field(default_factory=list)  # (run_id, host, started, figure, value)


def epoch(text) -> float | None:
    """ISO-8601 (as reports write it) to seconds since the epoch; a naive time is UTC."""
    if not isinstance(text, str) or not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def kind_of(report: dict) -> str:
    """The report's own ``kind`` (written since the store exists); for older reports, what
    their run id and sections say."""
    if report.get("kind") in KINDS:
        return report["kind"]
    run_id = str(report.get("run_id") or "")
    if isinstance(report.get("soak"), dict) or report.get("soak_dir"):
        return "soak"
    if isinstance(report.get("healthcheck"), dict) or run_id.startswith("healthcheck-"):
        return "healthcheck"
    for kind in ("prolog", "analyze", "merge"):
        if run_id.startswith(kind + "-"):
            return kind
    return "run"


def rows_of(report: dict, *, started_fallback: float, command: str | None = None,
            duration_s: float | None = None, report_dir: str | None = None, now: float | None = None) -> Rows:
    """The rows of one report. ``started_fallback`` (the report file's time, say) stands in for
    a report that carries no start time (soak reports written before the store existed).
    ``now`` (default: this machine's clock) bounds the start time a report may claim."""
    if not isinstance(report, dict) or report.get("format") != "preflight-report/1":
        raise ReportShapeError("not a preflight-report/1 report")
    # A re-analysis is recorded as the run whose evidence it judged (`analyze` writes
    # source_run_id): the same evidence is one reading of the node, however often it is judged.
    run_id = report.get("source_run_id") or report.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise ReportShapeError("the report has no run_id")
    hosts = report.get("hosts") if isinstance(report.get("hosts"), dict) else {}
    # started_at: the run's start to the millisecond (created is to the second), so that a
    # reading taken just after a lifecycle decision is seen as after it.
    precise = report.get("started_at")
    if isinstance(precise, (int, float)) and not isinstance(precise, bool):
        try:
            started, field_name = float(precise), "started_at"
        except OverflowError:
            raise ReportShapeError(f"started_at: {precise} is no time") from None
    elif (created := epoch(report.get("created"))) is not None:
        started, field_name = created, "created"
    else:
        started, field_name = started_fallback, None
    if field_name:
        _plausible(started, field_name, time.time() if now is None else now)
    if duration_s is None and isinstance(report.get("duration_s"), (int, float)):
        duration_s = float(report["duration_s"])
    checks = [c.get("id") for c in report.get("checks") or () if isinstance(c, dict) and isinstance(c.get("id"), str)]
    statuses = [v.get("status") for v in hosts.values() if isinstance(v, dict)]
    status = max((s for s in statuses if s in _STATUS_ORDER), key=_STATUS_ORDER.__getitem__, default="pass")
    launcher = report.get("launcher") if isinstance(report.get("launcher"), str) else None
    if launcher is None and report.get("local") is True:
        launcher = "local"
    run = RunRow(run_id, kind_of(report), started, duration_s, launcher,
                 report.get("preflight_version") if isinstance(report.get("preflight_version"), str) else None,
                 command if command is not None else (report.get("command") if isinstance(report.get("command"), str)
                                                      else None),
                 status, json.dumps(checks), len(hosts), report_dir,
                 fingerprint(run_id, report.get("created"), hosts))
    out = Rows(run)
    for host, v in hosts.items():
        if isinstance(v, dict):
            out.hosts.append((run_id, str(host), started, str(v.get("status") or "error"), bool(v.get("reachable")),
                              v.get("profile") if isinstance(v.get("profile"), str) else None))
    for f in report.get("findings") or ():
        if isinstance(f, dict) and f.get("status") in _KEPT and isinstance(f.get("check"), str):
            symptoms = [s for s in f.get("symptoms") or () if isinstance(s, str)]
            out.findings.append((run_id, f.get("host") if isinstance(f.get("host"), str) else None, started,
                                 f["check"], f["status"], json.dumps(symptoms), str(f.get("summary") or "")))
    for d in report.get("diagnoses") or ():
        if isinstance(d, dict) and isinstance(d.get("cause"), str):
            for host in d.get("hosts") or ():
                if isinstance(host, str):
                    out.diagnoses.append((run_id, host, started, d["cause"], str(d.get("confidence") or ""),
                                          str(d.get("action") or "")))
    for host, name, value in figures_of(report):
        out.figures.append((run_id, host, started, name, value))
    return out


def _plausible(started: float, field_name: str, now: float) -> None:
    if not (started == started and EARLIEST <= started <= now + FUTURE_SLACK_S):  # NaN fails both
        shown = iso(started) if 0 <= started < 253402300800 else repr(started)  # up to the year 9999
        raise ReportShapeError(f"{field_name}: the run cannot have started at {shown} (before "
                               f"{iso(EARLIEST)} or more than {FUTURE_SLACK_S / 3600:g} h after this machine's "
                               f"clock, {iso(now)}; a time in milliseconds?)")
