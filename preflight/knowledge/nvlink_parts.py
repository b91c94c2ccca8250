"""NVLink by GPU part (``playbooks/nvlink_parts.yaml``): which product names are SXM modules
with NVLink, and, where a source states it, how many links each has.

The nvlink check reads it on nodes no platform profile matches, so that an A100-SXM4 node with
every link inactive is a fault and not "no NVLink expectation". A file that would mislead the
check (a pattern that does not compile, a count that is not a whole number above zero) is refused
with its file and entry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from preflight.knowledge.datafile import read_yaml
from preflight.shipped import playbooks_dir

PARTS_PATH = playbooks_dir() / "nvlink_parts.yaml"
FORMAT = "preflight-nvlink-parts/1"


class NvlinkPartsError(ValueError):
    pass


@dataclass(frozen=True)
class NvlinkPart:
    family: str
    pattern: re.Pattern[str]
    links_per_gpu: int | None  # None: it has NVLink, the count is not known from a source
    source: str


@cache
def load_parts(path: Path = PARTS_PATH) -> tuple[NvlinkPart, ...]:
    data = read_yaml(path, NvlinkPartsError)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise NvlinkPartsError(f"{path}: not a {FORMAT} file")
    parts = []
    for i, entry in enumerate(data.get("parts") or []):
        where = f"{path}: parts[{i}]"
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("match", "family", "source")):
            raise NvlinkPartsError(f"{where}: needs match, family and source strings")
        links = entry.get("links_per_gpu")
        if links is not None and (isinstance(links, bool) or not isinstance(links, int) or links < 1):
            raise NvlinkPartsError(f"{where}: links_per_gpu must be a whole number above 0, not {links!r}")
        try:
            pattern = re.compile(entry["match"], re.IGNORECASE)
        except re.error as exc:
            raise NvlinkPartsError(f"{where}: match {entry['match']!r} is not a regex ({exc})") from None
        parts.append(NvlinkPart(entry["family"], pattern, links, entry["source"]))
    return tuple(parts)


def part_of(name: str | None, parts: Iterable[NvlinkPart] | None = None) -> NvlinkPart | None:
    """The SXM part a product name is, or None (a PCIe card, or a part not listed)."""
    if not name:
        return None
    return next((p for p in (load_parts() if parts is None else parts) if p.pattern.search(name)), None)
