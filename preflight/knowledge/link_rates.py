"""InfiniBand link speeds (``playbooks/link_rates.yaml``): each generation's lane and 4X port rate,
with its source. The rail stage names a port's rate by its generation ("NDR 400 Gb/s"); a file
that would mislead it (a rate that is not a number above zero) is refused with its entry."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from preflight.knowledge.datafile import read_yaml
from preflight.shipped import playbooks_dir

RATES_PATH = playbooks_dir() / "link_rates.yaml"
FORMAT = "preflight-link-rates/1"


class LinkRatesError(ValueError):
    pass


@dataclass(frozen=True)
class LinkSpeed:
    speed: str
    lane_gbps: float
    port_gbps: float
    source: str


@cache
def load_rates(path: Path = RATES_PATH) -> dict[str, LinkSpeed]:
    data = read_yaml(path, LinkRatesError)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise LinkRatesError(f"{path}: not a {FORMAT} file")
    out = {}
    for i, entry in enumerate(data.get("speeds") or []):
        where = f"{path}: speeds[{i}]"
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("speed", "source")):
            raise LinkRatesError(f"{where}: needs speed and source strings")
        rates = [entry.get(k) for k in ("lane_gbps", "port_gbps")]
        if any(isinstance(r, bool) or not isinstance(r, (int, float)) or r <= 0 for r in rates):
            raise LinkRatesError(f"{where}: lane_gbps and port_gbps must be numbers above 0, not {rates!r}")
        out[entry["speed"].upper()] = LinkSpeed(entry["speed"].upper(), float(rates[0]), float(rates[1]),
                                                entry["source"])
    return out


def generation(rate_gbps: float | None, rates: dict[str, LinkSpeed] | None = None) -> str | None:
    """The generation whose lane rate makes ``rate_gbps`` a port of 4, 2, 1 or 8 lanes (in that
    order of preference: HCA ports are 4X, so 400 is NDR 4X, not HDR 8X), named with the width
    ("NDR 4X"); None when no listed generation matches. A rate two generations share (50: EDR
    2X or HDR 1X) gets the wider port's name: the name is a label, never a verdict."""
    if not rate_gbps:
        return None
    speeds = (load_rates() if rates is None else rates).values()
    for lanes in (4, 2, 1, 8):
        for s in speeds:
            if rate_gbps == lanes * s.lane_gbps:
                return f"{s.speed} {lanes}X"
    return None
