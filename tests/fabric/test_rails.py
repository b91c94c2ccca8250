"""A node's rails from its own evidence, on real captures (corpus ibv/ and the test bed's
`ip -o -4 addr show`, tests/fixtures/iperf3/SOURCES.tsv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.fabric.rails import rails_from_ibstat, rails_from_ibv_devinfo, rails_from_ip_addr, rdma_rails
from preflight.model import ProbeResult
from preflight.parse import ParseError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = FIXTURES / "corpus" / "ibv"


def result(probe: str, text: str, code: int = 0) -> ProbeResult:
    return ProbeResult(probe, "n1", (), text.encode(), "", code, "2026-12-03T00:00:00+00:00", 0.1)


def test_active_ports_of_ibv_devinfo_in_device_order():
    rails = rails_from_ibv_devinfo((CORPUS / "ibv-devinfo-cx7-roce-fw28.39-raw-tabs.txt").read_text())
    assert [r.name for r in rails] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1"]
    assert {r.link_layer for r in rails} == {"Ethernet"}
    assert rails_from_ibv_devinfo((CORPUS / "ibv-devinfo-cx7-ndr-port-down-lid65535.txt").read_text()) == []


def test_ibstat_gives_the_rate_and_is_the_fallback():
    text = (CORPUS / "ibstat-cx7-ndr-400g-active-ib.txt").read_text()
    rails = rails_from_ibstat(text)
    assert rails[0].name == "mlx5_0:1" and rails[0].rate_gbps == 400.0
    missing = result("ibv-devinfo", "", 127)
    assert rdma_rails({"ibv-devinfo": missing, "ibstat": result("ibstat", text)}) == rails
    assert rdma_rails({"ibv-devinfo": missing}) == []


def test_ip_interfaces_without_loopback():
    rails = rails_from_ip_addr((FIXTURES / "iperf3" / "ip-o-4-addr-show-two-links.txt").read_text())
    assert [(r.name, r.address) for r in rails] == [("f1vc", "10.252.0.1"), ("f1ve", "10.252.1.1")]
    with pytest.raises(ParseError):
        rails_from_ip_addr("Object \"addr\" is unknown, try \"ip help\".")
