"""Which GPU part (and form factor) each GPU of an ``nvidia-smi nvlink --status`` listing is,
learnt from every probe that names it, for the nvlink check's judgement without a platform figure.

The product name says whether a GPU is an SXM module wired to its peers (every link meant to
train) or a PCIe card (links without a bridge inactive by design): ``playbooks/nvlink_parts.yaml``
for the SXM parts whose names carry no form factor ("NVIDIA H100 80GB HBM3"), and the name's own
"SXM" / "PCIe" / "NVL" (checks/_link_states.py) otherwise. Several probes name the GPUs, and one of
them may print a name that tells nothing (an unreleased board's "NVIDIA Graphics Device") or be
absent, so each GPU's name is looked for in this order, the first that tells a form factor winning:

1. the GPU's own header in the link listing ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)"): the
   NVML name, on the very line whose links are judged;
2. the node's model as each other source names it, in the GPU census's order (nvidia-smi -q,
   nvlink --status, dcgmi discovery -l, lspci's pci.ids name: ``preflight.judge.census``).

Sources that tell different form factors for one GPU (two captures of different nodes in one
bundle?) are said in the verdict, with the one used.
"""

from __future__ import annotations

from dataclasses import dataclass

from preflight.judge.census import COMMANDS
from preflight.knowledge.nvlink_parts import NvlinkPart, part_of

from ._link_states import form_factor

STATUS = "nvidia-smi-nvlink-status"


@dataclass(frozen=True)
class GpuPart:
    shape: str  # "sxm", "pcie" or "unknown"
    part: NvlinkPart | None  # the table's SXM part, where the name is one
    name: str | None  # the name that told it
    source: str | None  # the probe that printed that name
    others: tuple[str, ...] = ()  # "PROBE names NAME" for sources that told another form factor


def _told(name: str | None) -> tuple[str, NvlinkPart | None] | None:
    """(shape, part) a name tells, or None when it tells no form factor."""
    part = part_of(name)
    if part is not None:
        return "sxm", part
    shape = form_factor(name)
    return (shape, None) if shape != "unknown" else None


def parts_of(gpus, census=None) -> dict[int | None, GpuPart]:
    """GPU index -> its ``GpuPart``, for the ``NvlinkGpu`` records of a listing; ``census``: the
    node's ``GpuCensus`` (its ``names``), or None."""
    node = [(probe, max(set(names), key=names.count)) for probe, names in (census.names if census else ())]
    out: dict[int | None, GpuPart] = {}
    for g in gpus:
        candidates = [(STATUS, g.name), *node]
        told = [(probe, name, t) for probe, name in candidates if (t := _told(name)) is not None]
        if not told:
            out[g.index] = GpuPart("unknown", None, g.name, STATUS if g.name else None)
            continue
        probe, name, (shape, part) = told[0]
        others = tuple(dict.fromkeys(f"{COMMANDS.get(p, p)} names {n!r}" for p, n, (s, pt) in told[1:]
                                     if (s, pt) != (shape, part)))
        out[g.index] = GpuPart(shape, part, name, probe, others)
    return out


def common_part(parts: dict[int | None, GpuPart]) -> GpuPart | None:
    """The SXM part every GPU is, or None (mixed parts, a PCIe card, or a part not in the table)."""
    found = {p.part for p in parts.values()}
    if len(found) != 1 or None in found:
        return None
    return next(iter(parts.values()))


def said(part: GpuPart) -> str:
    """Where the part was learnt, for the verdict: nothing when the link listing named it itself."""
    where = "" if part.source == STATUS else f" (named by {COMMANDS.get(part.source, part.source)})"
    if part.others:
        where += f"; judged so although {', '.join(part.others)}"
    return where
