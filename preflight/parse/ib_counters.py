"""Parser for RDMA port counters read from sysfs: the ``ib-counters`` / ``ib-counters-after`` probes.

Input: ``path:value`` lines, as ``grep -Hs . FILES`` prints them, for
``/sys/class/infiniband/DEV/ports/N/counters/*`` (the IBTA PortCounters every RDMA NIC exposes),
``.../hw_counters/*`` (the driver's own: out_of_buffer, rnr_nak_retry_err, ... on mlx5) and
``.../{state,phys_state,link_layer}``. The device and port are read from the path, so the
``/sys/devices/.../infiniband/DEV/...`` spelling parses too. A counter that reads ``N/A (no PMA)``
(iWARP devices without a performance-management agent) is listed as unreadable, not as 0.

Empty output is a result: the glob matched nothing, i.e. no RDMA device. Lines that are not
``path:value`` under an ``infiniband/`` directory are ParseError: the text is something else.

The same parser reads the counter tables users already have, told apart by content: ``perfquery``
and ``perfquery -x`` output (``# Port counters: Lid L port P ...`` / ``# Port extended counters: ...``
headers, then ``SymbolErrorCounter:......0`` lines), one block per port, named ``lidL``. The
PMA names become the sysfs names (``PERFQUERY_NAMES``). Extended (``-x``) blocks carry 64-bit
counters where the port supports them, so the PortCounters widths do not apply there.

Counter widths (``COUNTER_BITS``) are those of the IBTA PortCounters attribute (InfiniBand
Architecture Specification vol. 1, PortCounters; the same widths perfquery prints): a counter at
its maximum has stopped counting, so growth can no longer be seen (docs/sources.md, IB counters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parse import ParseError, is_number

_LINE = re.compile(r"^(?P<path>/\S*?/infiniband/(?P<dev>[^/\s]+)/ports/(?P<port>[0-9]+)/"
                   r"(?:(?P<kind>counters|hw_counters)/)?(?P<name>[^/:\s]+)):(?P<value>.*)$")
_STATE = re.compile(r"^\s*[0-9]+\s*:\s*(\S+)")
_PQ_HEADER = re.compile(r"^# Port (extended )?counters: Lid ([0-9]+) port ([0-9]+)")
_PQ_LINE = re.compile(r"^(\w+):\.*(\S+)\s*$")
PERFQUERY_NAMES = {
    "SymbolErrorCounter": "symbol_error", "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed", "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors", "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors", "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors", "VL15Dropped": "VL15_dropped",
    "PortXmitWait": "port_xmit_wait", "PortXmitData": "port_xmit_data", "PortRcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets", "PortRcvPkts": "port_rcv_packets",
    "PortUnicastXmitPkts": "unicast_xmit_packets", "PortUnicastRcvPkts": "unicast_rcv_packets",
    "PortMulticastXmitPkts": "multicast_xmit_packets", "PortMulticastRcvPkts": "multicast_rcv_packets",
}

# PortCounters field widths (IBTA): SymbolErrorCounter 16 bits, LinkErrorRecoveryCounter 8, ...
COUNTER_BITS = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16,
}  # port_xmit_wait (32 bits) is left out: a congestion tally that saturates routinely, not an error


@dataclass(frozen=True)
class PortCounters:
    device: str
    port: int
    counters: dict[str, int] = field(default_factory=dict)  # counters/
    hw_counters: dict[str, int] = field(default_factory=dict)  # hw_counters/
    unreadable: tuple[str, ...] = ()  # counters whose file said e.g. "N/A (no PMA)"
    state: str | None = None  # ACTIVE, DOWN, INIT, ...
    phys_state: str | None = None  # LINKUP, POLLING, DISABLED, ...
    link_layer: str | None = None
    wide: bool = False  # perfquery -x: 64-bit counters, the PortCounters widths do not apply

    @property
    def label(self) -> str:
        return f"{self.device} port {self.port}"

    def saturated(self) -> list[str]:
        """Error counters stuck at the maximum of their width: they no longer count."""
        if self.wide:
            return []
        return [name for name, bits in COUNTER_BITS.items() if self.counters.get(name) == (1 << bits) - 1]


@dataclass(frozen=True)
class CounterSnapshot:
    ports: tuple[PortCounters, ...]
    notes: tuple[str, ...] = ()

    def port(self, device: str, port: int) -> PortCounters | None:
        return next((p for p in self.ports if (p.device, p.port) == (device, port)), None)


def parse_ib_counters(text: str) -> CounterSnapshot:
    if any(_PQ_HEADER.match(line) for line in text.splitlines()):
        return _perfquery(text)
    found: dict[tuple[str, int], dict] = {}
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.match(line.strip())
        if not m:
            bad.append(line.strip())
            continue
        port = found.setdefault((m["dev"], int(m["port"])), {"counters": {}, "hw_counters": {}, "unreadable": []})
        value = m["value"].strip()
        if m["kind"]:
            try:
                port[m["kind"]][m["name"]] = int(value)
            except ValueError:
                port["unreadable"].append(f"{m['name']} ({value})")
        elif m["name"] in ("state", "phys_state"):
            s = _STATE.match(value)
            port[m["name"]] = (s.group(1) if s else value).upper()
        elif m["name"] == "link_layer":
            port["link_layer"] = value
    if bad and not found:
        raise ParseError(f"not sysfs counter lines (path:value under /sys/class/infiniband): {bad[0][:80]!r}")
    notes = [f"{len(bad)} line(s) not read, e.g. {bad[0][:80]!r}"] if bad else []
    if not found:
        notes.append("no RDMA device: /sys/class/infiniband holds no port")
    ports = tuple(PortCounters(dev, num, p["counters"], p["hw_counters"], tuple(p["unreadable"]), p.get("state"),
                               p.get("phys_state"), p.get("link_layer"))
                  for (dev, num), p in sorted(found.items(), key=lambda kv: (_natural(kv[0][0]), kv[0][1])))
    return CounterSnapshot(ports, tuple(notes))


def _natural(name: str) -> tuple:
    return tuple(int(t) if is_number(t) else t for t in re.split(r"([0-9]+)", name))


def _perfquery(text: str) -> CounterSnapshot:
    ports: list[PortCounters] = []
    current: dict | None = None
    for line in text.splitlines():
        if m := _PQ_HEADER.match(line.strip()):
            current = {"lid": m.group(2), "port": int(m.group(3)), "wide": bool(m.group(1)), "counters": {}}
            ports.append(current)  # type: ignore[arg-type]
        elif current is not None and (v := _PQ_LINE.match(line.strip())):
            name = PERFQUERY_NAMES.get(v.group(1))
            if name:
                try:
                    current["counters"][name] = int(v.group(2), 0)
                except ValueError:
                    pass
    return CounterSnapshot(tuple(PortCounters(f"lid{p['lid']}", p["port"], p["counters"], wide=p["wide"])
                                 for p in ports))


# --------------------------------------------------------------------------- a soak's readings

SERIES_FORMAT = "preflight-ib-counters/1"
_SERIES_HEAD = re.compile(rf"^# {re.escape(SERIES_FORMAT)} host=(?P<host>\S+) time=(?P<time>\S+) "
                          r"phase=(?P<phase>before|during|after)\s*$")
_SERIES_END = "# end"


@dataclass(frozen=True)
class TimedReading:
    """One reading of a soak agent's ib-counters.txt (preflight/node/ib_snapshots.py)."""

    host: str
    time: float  # seconds since the epoch
    phase: str  # before | during | after
    snapshot: CounterSnapshot
    line: int  # of its header, for messages


@dataclass(frozen=True)
class ReadingSeries:
    readings: tuple[TimedReading, ...]  # in file order
    notes: tuple[str, ...] = ()

    def of(self, host: str) -> tuple[TimedReading, ...]:
        """A host's readings in time order."""
        return tuple(sorted((r for r in self.readings if r.host == host), key=lambda r: r.time))

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.host for r in self.readings))


def parse_ib_series(text: str) -> ReadingSeries:
    """The blocks of an ib-counters.txt. A block without its ``# end`` was cut while being
    written or copied: dropped, with a note. Anything else out of shape is a ParseError naming
    the line."""
    readings: list[TimedReading] = []
    notes: list[str] = []
    head: tuple[str, float, str] | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if head is None and not line.strip():
            continue
        if line.startswith(f"# {SERIES_FORMAT} "):
            if head is not None:
                # The previous block was cut (a host's copy that stopped mid-reading, then the
                # next host's file in a merged directory): dropped like a cut last block.
                notes.append(f"line {start}: the reading ({head[0]}, {head[2]}) has no '{_SERIES_END}' before "
                             "the next one starts; ignored")
            head, start, body = _series_head(line, number), number, []
        elif head is None:
            raise ParseError(f"line {number}: expected '# {SERIES_FORMAT} host=H time=T phase=P', got {line[:80]!r}")
        elif line.strip() == _SERIES_END:
            try:
                snapshot = parse_ib_counters("\n".join(body))
            except ParseError as exc:
                raise ParseError(f"lines {start + 1}-{number - 1}: {exc}") from None
            readings.append(TimedReading(head[0], head[1], head[2], snapshot, start))
            head = None
        else:
            body.append(line)
    if head is not None:
        notes.append(f"line {start}: the last reading ({head[0]}, {head[2]}) has no '{_SERIES_END}' "
                     "(cut off while being written or copied); ignored")
    return ReadingSeries(tuple(readings), tuple(notes))


def _series_head(line: str, number: int) -> tuple[str, float, str]:
    m = _SERIES_HEAD.match(line)
    if m is None:
        raise ParseError(f"line {number}: a reading's header must be '# {SERIES_FORMAT} host=H time=T "
                         f"phase=before|during|after', got {line[:80]!r}")
    try:
        when = float(m["time"])
    except ValueError:
        raise ParseError(f"line {number}: time {m['time']!r} is not a number") from None
    if not 0 < when < 1e11:
        raise ParseError(f"line {number}: time {m['time']!r} is not seconds since the epoch")
    return m["host"], when, m["phase"]
