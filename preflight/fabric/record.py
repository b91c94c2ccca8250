"""The rail stage's saved record, and the measurements read back from it.

One record per pair and round, saved under the pair's first node (the client side) as probe
``fabric-rail-<round>``: a JSON document (``FORMAT``) holding both nodes' rails, and every run
of every rail and repetition with both sides' raw output, exit, time and transport error, so
that ``analyze`` re-judges from the bundle alone and nothing measured is lost when a partner
does not answer. ``measurements`` turns a record into one ``RailRun`` per rail and repetition.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from preflight.fabric.pairing import Rail
from preflight.parse import ParseError
from preflight.parse.iperf3 import parse_iperf3
from preflight.parse.perftest import parse_perftest

FORMAT = "preflight-fabric-rail/1"
PROBE_PREFIX = "fabric-rail-"
TOOLS = ("ib_write_bw", "iperf3")


def probe_id(round_number: int) -> str:
    return f"{PROBE_PREFIX}{round_number}"


def is_rail_probe(probe: str) -> bool:
    return probe.startswith(PROBE_PREFIX) and probe[len(PROBE_PREFIX):].isdigit()


@dataclass(frozen=True)
class Side:
    """One side of one run, as the transport returned it (stdout decoded, stderr capped)."""

    argv: tuple[str, ...]
    exit_code: int | None
    seconds: float
    timed_out: bool = False
    error: str | None = None
    stdout: str = ""
    stderr: str = ""


@dataclass(frozen=True)
class RunRecord:
    rail: int  # index into both nodes' rails
    rep: int  # 1-based; 0 for the latency run
    test: str  # "bw" | "lat"
    client: Side
    server: Side


@dataclass(frozen=True)
class PairRecord:
    round: int
    tool: str
    node: str  # the client side
    partner: str  # the server side
    reps: int
    node_rails: tuple[Rail, ...]
    partner_rails: tuple[Rail, ...]
    runs: tuple[RunRecord, ...]


def dump(record: PairRecord) -> bytes:
    doc = {"format": FORMAT, **asdict(record)}
    return (json.dumps(doc, indent=1) + "\n").encode()


def load(text: str) -> PairRecord:
    """A saved record back; ``ParseError`` when it is not one (never anything else)."""
    try:
        doc = json.loads(text)
        if doc.get("format") != FORMAT:
            raise ParseError(f"not a {FORMAT} record (format {doc.get('format')!r})")
        return PairRecord(int(doc["round"]), str(doc["tool"]), str(doc["node"]), str(doc["partner"]),
                          int(doc["reps"]), tuple(Rail(**r) for r in doc["node_rails"]),
                          tuple(Rail(**r) for r in doc["partner_rails"]),
                          tuple(_run(r) for r in doc["runs"]))
    except ParseError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ParseError(f"unreadable {FORMAT} record: {type(exc).__name__}: {exc}") from None


def _run(r: dict[str, Any]) -> RunRecord:
    def side(s: dict[str, Any]) -> Side:
        return Side(tuple(s["argv"]), s["exit_code"], float(s["seconds"]), bool(s["timed_out"]), s["error"],
                    s["stdout"], s["stderr"])

    return RunRecord(int(r["rail"]), int(r["rep"]), str(r["test"]), side(r["client"]), side(r["server"]))


@dataclass(frozen=True)
class RailRun:
    """One repetition of one rail of one pair, read: ``gbps`` when it measured, else ``why``
    (``unreachable`` says the partner side never answered: a finding, not a crash)."""

    node: str
    partner: str
    rail: int
    node_rail: Rail
    partner_rail: Rail
    rep: int
    gbps: float | None
    why: str | None = None
    unreachable: bool = False
    latency_us: float | None = None


def measurements(record: PairRecord) -> list[RailRun]:
    """Every bandwidth repetition of the record, read from the client's output; latency runs
    are folded into the rail's first repetition."""
    out: list[RailRun] = []
    latency: dict[int, float] = {}
    for run in record.runs:
        if run.test == "lat":
            try:
                rep = parse_perftest(run.client.stdout)
            except ParseError:
                continue
            if rep.lat_rows:
                latency[run.rail] = rep.lat_rows[-1].t_avg
    for run in record.runs:
        if run.test != "bw" or run.rail >= min(len(record.node_rails), len(record.partner_rails)):
            continue
        gbps, why, unreachable = _read_bw(record.tool, run)
        out.append(RailRun(record.node, record.partner, run.rail, record.node_rails[run.rail],
                           record.partner_rails[run.rail], run.rep, gbps, why, unreachable,
                           latency.get(run.rail) if run.rep == 1 else None))
    return out


def _read_bw(tool: str, run: RunRecord) -> tuple[float | None, str | None, bool]:
    c, s = run.client, run.server
    if c.error or s.error:
        # Either side not answering means the rail did not run; name the side that failed on its
        # own account (the other one is then recorded as "not run: X did not answer").
        client_failed = c.error is not None and not c.error.startswith("not run:")
        side, why = ("client side", c.error) if client_failed or not s.error else ("partner side", s.error)
        return None, f"{side} did not start: {why}", True
    try:
        if tool == "iperf3":
            rep = parse_iperf3(c.stdout)
            if rep.error or rep.gbits is None:
                why = rep.error or "no received total"
                return None, why, "unable to connect" in why or "unreachable" in why.lower()
            return rep.gbits, None, False
        report = parse_perftest(c.stdout)
        if report.average_gbits is None:
            return None, "no result row", False
        return report.average_gbits, None, False
    except ParseError as exc:
        said = (c.stderr.strip().splitlines() or [str(exc)])[-1]
        if c.timed_out:
            return None, f"timed out after {c.seconds:g} s ({said})", True
        return None, said, "connect" in said.lower()
