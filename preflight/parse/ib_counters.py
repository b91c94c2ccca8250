"""Parser for RDMA port counters read from sysfs: the ``ib-counters`` / ``ib-counters-after`` probes.

Input: ``path:value`` lines, as ``grep -Hs . FILES`` prints them, for
``/sys/class/infiniband/DEV/ports/N/counters/*`` (the IBTA PortCounters every RDMA NIC exposes),
``.../hw_counters/*`` (the driver's own: out_of_buffer, rnr_nak_retry_err, ... on mlx5) and
``.../{state,phys_state,link_layer}``. The device and port are read from the path, so the
``/sys/devices/.../infiniband/DEV/...`` spelling parses too. A counter that reads ``N/A (no PMA)``
(iWARP devices without a performance-management agent) is listed as unreadable, not as 0.

Empty output is a result: the glob matched nothing, i.e. no RDMA device. Lines that are not
``path:value`` under an ``infiniband/`` directory are ParseError: the text is something else.

Counter widths (``COUNTER_BITS``) are those of the IBTA PortCounters attribute (InfiniBand
Architecture Specification vol. 1, PortCounters; the same widths perfquery prints): a counter at
its maximum has stopped counting, so growth can no longer be seen (docs/sources.md, IB counters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parse import ParseError

_LINE = re.compile(r"^(?P<path>/\S*?/infiniband/(?P<dev>[^/\s]+)/ports/(?P<port>\d+)/"
                   r"(?:(?P<kind>counters|hw_counters)/)?(?P<name>[^/:\s]+)):(?P<value>.*)$")
_STATE = re.compile(r"^\s*\d+\s*:\s*(\S+)")

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

    @property
    def label(self) -> str:
        return f"{self.device} port {self.port}"

    def saturated(self) -> list[str]:
        """Error counters stuck at the maximum of their width: they no longer count."""
        return [name for name, bits in COUNTER_BITS.items() if self.counters.get(name) == (1 << bits) - 1]


@dataclass(frozen=True)
class CounterSnapshot:
    ports: tuple[PortCounters, ...]
    notes: tuple[str, ...] = ()

    def port(self, device: str, port: int) -> PortCounters | None:
        return next((p for p in self.ports if (p.device, p.port) == (device, port)), None)


def parse_ib_counters(text: str) -> CounterSnapshot:
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
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))
