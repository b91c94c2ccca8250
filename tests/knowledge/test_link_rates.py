"""The sourced link-speed table (playbooks/link_rates.yaml) and the names it gives rates."""

from __future__ import annotations

import pytest

from preflight.knowledge.link_rates import LinkRatesError, generation, load_rates


def test_every_speed_has_a_source_and_a_4x_port_of_four_lanes():
    rates = load_rates()
    assert set(rates) == {"EDR", "HDR", "NDR", "XDR"}
    for s in rates.values():
        assert s.port_gbps == 4 * s.lane_gbps and "§15" in s.source


@pytest.mark.parametrize("gbps,name", [(400.0, "NDR 4X"), (800.0, "XDR 4X"), (200.0, "HDR 4X"), (100.0, "EDR 4X"),
                                       (50.0, "EDR 2X"), (2.0, None), (None, None)])
def test_rates_are_named_by_generation_preferring_4x(gbps, name):
    assert generation(gbps) == name


def test_a_bad_table_is_refused_with_its_entry(tmp_path):
    bad = tmp_path / "rates.yaml"
    bad.write_text("format: preflight-link-rates/1\nspeeds:\n  - {speed: NDR, lane_gbps: -1, port_gbps: 400, source: x}\n")
    with pytest.raises(LinkRatesError, match=r"speeds\[0\]: lane_gbps and port_gbps"):
        load_rates(bad)
