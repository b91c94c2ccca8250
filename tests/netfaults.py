"""Real network faults on a SimCluster's links, for the fabric tests.

This kernel has no ``netem`` (no delay, loss or corruption), so a slow NIC, cable or switch port
is a token-bucket rate limit (``tc tbf``), a slow path between two hosts is an ``htb`` class that
a ``u32`` filter feeds with the traffic to one destination only, and a hang is a link taken down.
A host's egress is shaped on its ``eth0``; its ingress on the bridge port toward it (the root
namespace's end of its veth pair), since a qdisc shapes only what a device sends.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

from simcluster import SimCluster


def _tc(netns: str | None, *args: str) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "tc", *args], check=True, capture_output=True, text=True, timeout=30)


def _clear(netns: str | None, dev: str) -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        _tc(netns, "qdisc", "del", "dev", dev, "root")


@contextlib.contextmanager
def slow_host(cluster: SimCluster, name: str, rate: str = "20mbit", rail: int = 0) -> Iterator[None]:
    """Every byte to or from ``name`` at ``rate``: a NIC, cable or switch port slow with any partner.
    ``rail``: which of the host's links (``eth<rail>``, a cluster made with ``rails=``); the others
    stay at full speed."""
    netns, port = cluster.namespaces[name], cluster.link_of(name, rail)
    shaped = [(netns, f"eth{rail}"), (None, port)]
    try:
        for ns, dev in shaped:
            _tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kbit",
                "latency", "400ms")
        yield
    finally:
        for ns, dev in shaped:
            _clear(ns, dev)


@contextlib.contextmanager
def slow_path(cluster: SimCluster, a: str, b: str, rate: str = "20mbit") -> Iterator[None]:
    """Traffic between ``a`` and ``b`` (both ways) at ``rate``; either host at full speed with others."""
    ends = [(cluster.namespaces[a], cluster.address(b)), (cluster.namespaces[b], cluster.address(a))]
    try:
        for netns, peer in ends:
            _tc(netns, "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1")
            _tc(netns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit")
            _tc(netns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:2", "htb", "rate", rate,
                "ceil", rate)
            _tc(netns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                "match", "ip", "dst", f"{peer}/32", "flowid", "1:2")
        yield
    finally:
        for netns, _ in ends:
            _clear(netns, "eth0")


@contextlib.contextmanager
def link_down(cluster: SimCluster, name: str) -> Iterator[None]:
    """The host's link down: its sessions hang rather than fail, as on a dead port."""
    netns = cluster.namespaces[name]
    subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "set", "eth0", "down"], check=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "set", "eth0", "up"], timeout=30)


def _stall(netns: str | None, dev: str, matches: list[list[str]]) -> None:
    """Traffic matching any of ``matches`` (u32 selectors) into an htb class of 8 bit/s: it
    stalls (this kernel has no drop action either), everything else goes at full speed."""
    _tc(netns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
    _tc(netns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit")
    _tc(netns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:2", "htb", "rate", "8bit", "ceil", "8bit")
    for match in matches:
        _tc(netns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", *match,
            "flowid", "1:2")


@contextlib.contextmanager
def data_ports_stalled(cluster: SimCluster, name: str, first_port: int = 40000, mask: str = "0xffc0") -> Iterator[None]:
    """TCP to and from ports ``first_port``.. (``mask``: 0xffc0 is 64 ports) of ``name`` stalls both
    ways; ssh and every other port still work: the nodes answer, the collective's data path
    hangs (pin MPI's ports there: btl_tcp_port_min_v4 / btl_tcp_port_range_v4)."""
    netns, port = cluster.namespaces[name], cluster.link_of(name)
    tcp = ["match", "ip", "protocol", "6", "0xff"]
    matches = [[*tcp, "match", "ip", "dport", str(first_port), mask], [*tcp, "match", "ip", "sport", str(first_port), mask]]
    try:
        for ns, dev in ((netns, "eth0"), (None, port)):
            _stall(ns, dev, matches)
        yield
    finally:
        for ns, dev in ((netns, "eth0"), (None, port)):
            _clear(ns, dev)


@contextlib.contextmanager
def ssh_stalled(cluster: SimCluster, src: str, dst: str) -> Iterator[None]:
    """ssh from ``src`` to ``dst`` stalls (its SYN never gets through in time); every other host
    still reaches ``dst``: a launcher that cannot reach one node."""
    netns = cluster.namespaces[src]
    try:
        _stall(netns, "eth0", [["match", "ip", "dst", f"{cluster.address(dst)}/32", "match", "ip", "dport", "22",
                                "0xffff"]])
        yield
    finally:
        _clear(netns, "eth0")


@contextlib.contextmanager
def controller_ssh_stalled(cluster: SimCluster, dst: str) -> Iterator[None]:
    """ssh from this machine (the controller) to ``dst`` stalls: its SYN waits on the bridge port
    toward ``dst``, so a connect hangs for as long as the client's own timeout lets it."""
    port = cluster.link_of(dst)
    try:
        _stall(None, port, [["match", "ip", "dst", f"{cluster.address(dst)}/32", "match", "ip", "dport", "22",
                             "0xffff"]])
        yield
    finally:
        _clear(None, port)
