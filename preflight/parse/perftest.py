"""Parser for perftest's bandwidth and latency reports (``ib_write_bw``, ``ib_write_lat`` and
their ``send``/``read`` siblings, which print the same layout).

What a client prints, as real captures show it (tests/fixtures/perftest/SOURCES.tsv):
- a rule of dashes, the test's title (``RDMA_Write BW Test``, ``Send Latency Test``,
  ``RDMA_Write Post List BW Test``), then ``key : value`` settings, two to a line when the
  pair is separated by tabs or wide spaces (``Dual-port : OFF<tabs>Device : mlx5_0``);
  ``Link type`` says ``IB`` or ``Ethernet`` (RoCE), ``GID index`` appears on RoCE only;
- address lines (``local address: LID 0x01 QPN ...``, one per QP, ``GID: ...`` on RoCE),
  absent with rdma_cm in some versions;
- the results header: bandwidth ``#bytes #iterations BW peak[U] BW average[U] MsgRate[Mpps]``
  where U is ``Gb/sec`` (``--report_gbits``), ``MB/sec`` (older default) or ``MiB/sec`` (newer
  default, the same unit renamed: 46557.03 MiB/s x 2^20 x 8 is the 390.5 Gb/s that the row's
  own MsgRate x message size gives); latency ``#bytes #iterations t_min[usec] t_max[usec]
  t_typical[usec] t_avg[usec]`` with, in newer versions, ``t_stdev`` and the 99%/99.9%
  percentiles;
- one row per message size (``-a`` prints 23), warnings between header and rows (``Conflicting
  CPU frequency values detected ...``), tabs inside rows.

A server started without ``--report_gbits`` prints ``MB/sec`` over figures its client measured
in Gb/s (a captured pair shows 196.07 under ``BW average[MB/sec]`` on a 200 Gb/s link): only the
client's report is read as a measurement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parse import ParseError, finite, is_number

_BW_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(Gb/sec|MB/sec|MiB/sec)\]\s+BW average\[\1\]", re.I)
_LAT_HEADER = re.compile(r"#bytes\s+#iterations\s+t_min\[usec\]\s+t_max\[usec\]\s+t_typical\[usec\]\s+t_avg\[usec\]")
_TITLE = re.compile(r"^\s*([A-Za-z_ ]+?(?:BW|Latency) Test)\s*$")
_SETTING = re.compile(r"([A-Za-z][\w* .-]*?)\s*:\s*(\S[^\t]*?)(?=\s{2,}[A-Za-z][\w* .-]*?\s*:|\t|$)")
_RULE = re.compile(r"^\s*-{20,}\s*$")
# Gb/s per unit: Gb/sec is 10^9 bits; MB/sec and MiB/sec are both 2^20 bytes (see above).
_TO_GBITS = {"gb/sec": 1.0, "mb/sec": 8 * 2**20 / 1e9, "mib/sec": 8 * 2**20 / 1e9}


@dataclass(frozen=True)
class BwRow:
    size: int  # bytes per message
    iterations: int
    peak: float | None  # in the report's unit; 0.00 in duration mode (-D)
    average: float
    msg_rate_mpps: float | None


@dataclass(frozen=True)
class LatRow:
    size: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    t_stdev: float | None = None
    p99: float | None = None
    p999: float | None = None


@dataclass(frozen=True)
class PerftestReport:
    """One perftest report. ``kind`` is ``bw`` or ``lat``; ``unit`` the bandwidth unit as printed
    (None for latency); ``rows`` in printed order."""

    title: str | None
    kind: str
    device: str | None
    link_type: str | None  # "IB" | "Ethernet" (RoCE)
    gid_index: int | None
    qps: int | None
    unit: str | None
    bw_rows: tuple[BwRow, ...] = ()
    lat_rows: tuple[LatRow, ...] = ()
    notes: tuple[str, ...] = ()

    def gbits(self, row: BwRow) -> float:
        """The row's average bandwidth in Gb/s (10^9 bits per second)."""
        return row.average * _TO_GBITS[(self.unit or "gb/sec").lower()]

    @property
    def largest(self) -> BwRow | None:
        """The row of the largest message: the one that reaches the link's rate."""
        return max(self.bw_rows, key=lambda r: r.size, default=None)

    @property
    def average_gbits(self) -> float | None:
        row = self.largest
        return None if row is None else self.gbits(row)


def parse_perftest(text: str) -> PerftestReport:
    """Read one perftest report; ``ParseError`` when the text has no results header (the tool
    failed before measuring: its error lines are what the caller shows)."""
    lines = text.splitlines()
    header_at, kind, unit = None, "", None
    for i, line in enumerate(lines):
        if m := _BW_HEADER.search(line):
            header_at, kind, unit = i, "bw", m.group(1)
        elif _LAT_HEADER.search(line):
            header_at, kind = i, "lat"
        if header_at is not None:
            break
    if header_at is None:
        raise ParseError("no perftest results header (#bytes #iterations ...)")
    settings: dict[str, str] = {}
    title = None
    for line in lines[:header_at]:
        if title is None and (m := _TITLE.match(line)):
            title = m.group(1).strip()
            continue
        if "address:" in line or line.strip().startswith("GID:"):
            continue
        for m in _SETTING.finditer(line):
            settings.setdefault(m.group(1).strip().lower(), m.group(2).strip())
    notes: list[str] = []
    bw_rows: list[BwRow] = []
    lat_rows: list[LatRow] = []
    for line in lines[header_at + 1:]:
        if _RULE.match(line):
            break
        fields = line.split()
        if not fields:
            continue
        if not (is_number(fields[0]) and len(fields) >= 4 and is_number(fields[1])):
            notes.append(line.strip())
            continue
        row = _bw_row(fields) if kind == "bw" else _lat_row(fields)
        if row is None:
            notes.append(f"unreadable row: {line.strip()}")
        elif kind == "bw":
            bw_rows.append(row)
        else:
            lat_rows.append(row)
    if not bw_rows and not lat_rows:
        notes.append("results header without a row: the test stopped before reporting")
    return PerftestReport(title, kind, settings.get("device"), settings.get("link type"),
                          _int(settings.get("gid index")), _int(settings.get("number of qps")),
                          unit if kind == "bw" else None, tuple(bw_rows), tuple(lat_rows), tuple(notes))


def _int(raw: str | None) -> int | None:
    return int(raw) if raw is not None and is_number(raw) else None


def _bw_row(f: list[str]) -> BwRow | None:
    peak, avg = finite(f[2]), finite(f[3])
    rate = finite(f[4]) if len(f) > 4 else None
    if avg is None:
        return None
    return BwRow(int(f[0]), int(f[1]), peak, avg, rate)


def _lat_row(f: list[str]) -> LatRow | None:
    values = [finite(v) for v in f[2:9]]
    if len(values) < 4 or any(v is None for v in values[:4]):
        return None
    rest = values[4:] + [None] * (3 - len(values[4:]))
    return LatRow(int(f[0]), int(f[1]), *values[:4], *rest)  # type: ignore[arg-type]
