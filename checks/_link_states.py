"""NVLink link states judged without a platform figure (the generic profile's part of ``nvlink``).

With no profile there is no link count or speed to hold a GPU to, but some states are a fault
whatever the platform: a GPU that has NVLink and some links up, yet others ``<inactive>``.
Whether that is a fault depends on the form factor, which the product name tells:

- SXM modules ("Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-80GB", "NVIDIA B300 SXM6 AC") are
  wired to their peers on the board: every link is meant to train, so a GPU with links up and
  others inactive lost them (Azure/azhpc-diagnostics#73: a V100-SXM2 with links 3 and 5 down).
- PCIe cards ("... PCIe", "... NVL", RTX/Quadro/GeForce/TITAN boards) reach their peers only
  through the NVLink bridges fitted, so links without a bridge stay inactive by design: an H100
  PCIe uses 12 of its 18 (Azure/azurehpc-health-checks#162; corpus
  nvlink/h100-pcie-gpu0-bridged-12-active-5-inactive-excerpt.txt), and an RTX A6000 without a
  bridge reports all links inactive beside a bridged pair
  (nvlink/rtx-a6000-3gpu-bridged-pair-plus-unbridged-all-inactive.txt). Never a fault here.
- Any other name: a GPU is faulty only where another GPU of the same model on the node has
  more links up (it lost what its peers kept); all alike cannot be told from design.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

_SXM = re.compile(r"SXM", re.IGNORECASE)
_PCIE_CARD = re.compile(r"PCIe|\bNVL\b|\bRTX\b|Quadro|GeForce|TITAN", re.IGNORECASE)


def form_factor(name: str | None) -> str:
    """"sxm", "pcie" or "unknown", from nvidia-smi's product name."""
    if name and _SXM.search(name):
        return "sxm"
    if name and _PCIE_CARD.search(name):
        return "pcie"
    return "unknown"


@dataclass(frozen=True)
class LinkStates:
    problems: tuple[str, ...]  # faults, one phrase per GPU
    bad_links: dict[int, set[int] | None]  # GPU index -> its inactive links (None: all)
    by_design: tuple[str, ...]  # GPUs whose inactive links are their form factor's
    judged: int  # GPUs whose states were judged
    active: int  # links up over the judged GPUs


def judge_states(gpus, shapes: dict[int | None, str] | None = None) -> LinkStates:
    """Link-state faults among ``NvlinkGpu`` records that have NVLink. ``shapes``: each GPU's form
    factor where other evidence told it (checks/_nvlink_part.py); else its own name's."""
    with_links = [g for g in gpus if g.links or g.reason == "all-links-inactive"]
    most_up: dict[str | None, int] = defaultdict(int)
    for g in with_links:
        most_up[g.name] = max(most_up[g.name], g.active_count)
    problems: list[str] = []
    bad: dict[int, set[int] | None] = {}
    by_design: list[str] = []
    for g in with_links:
        inactive = [link.number for link in g.links if not link.active]
        if not inactive and g.reason != "all-links-inactive":
            continue
        label = f"GPU{g.index}"
        shape = (shapes or {}).get(g.index) or form_factor(g.name)
        peers_up = most_up[g.name] > g.active_count
        what = (f"all links inactive ({g.message})" if g.reason == "all-links-inactive"
                else f"{len(inactive)} of {len(g.links)} links inactive (link {', '.join(map(str, inactive))})")
        if shape == "pcie":
            by_design.append(f"{label} {what}")
        elif (shape == "sxm" and g.active_count > 0) or peers_up:
            why = "while its other links are up" if g.active_count else "while a peer of the same model has links up"
            problems.append(f"{label} ({g.name}): {what} {why}")
            bad[g.index] = set(inactive) if inactive else None
        elif shape == "sxm":
            by_design.append(f"{label} {what} (no GPU of this model has a link up: a dead fabric "
                             "cannot be told from a board without NVLink)")
        else:
            by_design.append(f"{label} {what} (form factor unknown and no peer has more links up)")
    return LinkStates(tuple(problems), bad, tuple(by_design), len(with_links),
                      sum(g.active_count for g in with_links))
