"""A node's rails from its own evidence: the RDMA ports ``ibv_devinfo -v`` lists as active, else
those ``ibstat`` lists (perftest's rails), or the IPv4 interfaces ``ip -o -4 addr show`` lists
(iperf3's, on a TCP test bed). Pure: text in, ``Rail`` records out, in the node's own order
(mlx5_0 before mlx5_1)."""

from __future__ import annotations

import re

from preflight.fabric.pairing import Rail
from preflight.parse import ParseError
from preflight.parse.ibverbs import IbInventory, parse_ibstat, parse_ibv_devinfo

IP_ADDR_PROBE = "ip-addr"
IBV_PROBE = "ibv-devinfo"
IBSTAT_PROBE = "ibstat"
# `ip -o -4 addr show`: "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\ ..."
_IP_LINE = re.compile(r"^\d+:\s+([^\s:@]+)(?:@\S+)?\s+inet\s+([0-9.]+)/\d+")


def rails_from_ibv_devinfo(text: str) -> list[Rail]:
    """Every ACTIVE port of every device, as ``device:port``, with its rate and link layer."""
    return _active(parse_ibv_devinfo(text))


def rails_from_ibstat(text: str) -> list[Rail]:
    """The same from ``ibstat`` (``State: Active``, ``Rate: 400``), where ibv_devinfo is missing."""
    return _active(parse_ibstat(text))


def _active(inventory: IbInventory) -> list[Rail]:
    rails = []
    for dev in inventory.devices:
        for port in dev.ports:
            if port.state == "ACTIVE":
                rails.append(Rail(dev.name, port.number, None, port.rate_gbps, port.link_layer))
    return rails


def rails_from_ip_addr(text: str) -> list[Rail]:
    """Every interface with an IPv4 address except loopback ``lo`` (its first address)."""
    rails: dict[str, Rail] = {}
    for line in text.splitlines():
        m = _IP_LINE.match(line.strip())
        if m and m.group(1) != "lo" and m.group(1) not in rails:
            rails[m.group(1)] = Rail(m.group(1), None, m.group(2))
    if not rails and text.strip() and not any(_IP_LINE.match(x.strip()) for x in text.splitlines()):
        raise ParseError("not `ip -o -4 addr show` output")
    return list(rails.values())


def rdma_rails(results) -> list[Rail]:
    """A node's RDMA rails from its probe results (probe id -> ProbeResult): ibv_devinfo's when it
    ran and reads, else ibstat's; none when neither does."""
    for probe, read in ((IBV_PROBE, rails_from_ibv_devinfo), (IBSTAT_PROBE, rails_from_ibstat)):
        r = results.get(probe)
        if r is None or not r.ok:
            continue
        try:
            return read(r.text)
        except ParseError:
            continue
    return []
