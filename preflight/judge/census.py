"""How many GPUs a node shows, and which model, from whatever evidence holds them.

``nvidia-smi -q`` says both, but a bundle a user sends in often has only one or two other
commands: ``nvidia-smi nvlink --status`` names every GPU ("GPU 0: NVIDIA B300 SXM6 AC (UUID:
...)"), ``nvidia-smi topo -m`` has one row per GPU but no names, and ``lspci`` lists the GPUs
on the PCI bus with their device ids (from which the platform profile's ``gpu.pci_device_id``
tells the model) or, where its pci.ids knows the device, the database's product name
("GH100 [H100 SXM5 80GB]"), which the profiles' name patterns match like nvidia-smi's. The
census takes each from the first source that has it, in the order below, and keeps what every
source counted so a check can say where a figure came from and where two sources disagree.

Order, and why: the driver's own views come first (``-q``, then ``nvlink --status``, then
``topo -m``, then ``dcgmi discovery -l``, whose host engine lists the GPUs by name with the
driver), because they count the GPUs a job can use; ``lspci`` counts what is on the bus,
which includes a GPU the driver lost, so it names the model when nothing else does but only
counts when no driver view is there. A pasted ``nvlink --status`` excerpt with elided lines
names the model but is not counted, and so does an ``nvidia-smi -q`` that does not say it lists
every GPU: one without its "Attached GPUs" line (an excerpt), or a whole one listing fewer GPUs
than that line counts with none said to be unreachable (a selection, ``nvidia-smi -q -i 0``).
Only "Attached GPUs : N" (``<attached_gpus>``) tells how many GPUs an nvidia-smi -q has
to show; ``uncounted`` keeps why a source was not counted, for the checks to say.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from preflight.collect.dcgm import DISCOVERY_PROBE_ID as DCGM_DISCOVERY
from preflight.parse import lspci as lspci_parse
from preflight.parse.dcgm import DcgmDiscovery
from preflight.parse.nvlink import NvlinkStatus
from preflight.parse.smi_records import SmiReport
from preflight.parse.topo import TopoMatrix

# probe id -> the command a reader recognises, for summaries
COMMANDS = {
    "nvidia-smi-q-x": "nvidia-smi -q -x",
    "nvidia-smi-q": "nvidia-smi -q",
    "nvidia-smi-nvlink-status": "nvidia-smi nvlink --status",
    "nvidia-smi-topo": "nvidia-smi topo -m",
    DCGM_DISCOVERY: "dcgmi discovery -l",
    "lspci": "lspci",
}


@dataclass(frozen=True)
class SourceCount:
    probe: str
    count: int

    @property
    def command(self) -> str:
        return COMMANDS.get(self.probe, self.probe)


@dataclass(frozen=True)
class GpuCensus:
    """GPUs of one node as the evidence shows them.

    ``count``/``count_probe``: the GPUs the driver shows, from the first driver view present
    (lspci only when there is none); None when no source counts them. ``models``: product
    names, one per named GPU, and ``model_probe`` where they came from. ``pci_device_ids``:
    the device id of every NVIDIA GPU lspci lists with one. ``counts``: what each source
    counted, in order of preference.
    """

    count: int | None
    count_probe: str | None
    models: tuple[str, ...]
    model_probe: str | None
    pci_device_ids: tuple[int, ...]
    counts: tuple[SourceCount, ...]
    # Every source's product names, in the order of preference above (probe, names): the model
    # is the first that has any; a check that needs a GPU's part reads the others where the first
    # does not tell it (checks/_nvlink_part.py).
    names: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Why a source that lists GPUs was not taken as counting them (an nvidia-smi -q excerpt or
    # selection, an nvlink --status excerpt), in words, for the checks to say.
    uncounted: tuple[str, ...] = ()
    # How many GPUs an nvidia-smi -q says the node has where it lists only some ("Attached GPUs : 8"
    # above the one section of `-q -i 0`, or of an output cut after it): what platform this is, not
    # a count a check may pass.
    attached: int | None = None

    @property
    def model(self) -> str | None:
        """The most common product name, or None."""
        return Counter(self.models).most_common(1)[0][0] if self.models else None

    def counted(self, probe: str) -> int | None:
        return next((c.count for c in self.counts if c.probe == probe), None)

    def disagreements(self) -> list[str]:
        """Sources whose count differs from the one judged, as readable phrases."""
        if self.count is None:
            return []
        return [f"{c.command} shows {c.count}" for c in self.counts
                if c.probe != self.count_probe and c.count != self.count]


def gpu_census(smi: tuple[str, SmiReport] | None, nvlink: NvlinkStatus | None,
               topo: TopoMatrix | None, pci: tuple[lspci_parse.PciDevice, ...] | None,
               dcgm: DcgmDiscovery | None = None) -> GpuCensus:
    """The census from whichever of these readings are there (None where missing)."""
    counts: list[SourceCount] = []
    named: list[tuple[str, tuple[str, ...]]] = []
    uncounted: list[str] = []
    attached = None
    if smi is not None:
        probe, report = smi
        if report.counts_gpus:
            counts.append(SourceCount(probe, len(report.gpus)))
        elif report.cut is not None:
            attached = report.attached_gpus  # the header came before the cut
        elif report.partial:
            # An excerpt or a selection (-i) lists the GPUs someone chose to show, not the node's:
            # it names the model, and the count comes from another view (or none). (A report cut
            # short is not counted either; its cut is said by the checks through ``smi_cut``.)
            uncounted.append(report.partial)
            attached = report.attached_gpus if report.selection else None
        named.append((probe, tuple(g.name for g in report.gpus if g.name)))
    if nvlink is not None and nvlink.gpus:
        named.append(("nvidia-smi-nvlink-status", tuple(g.name for g in nvlink.gpus if g.name)))
        if not nvlink.excerpt:
            counts.append(SourceCount("nvidia-smi-nvlink-status", len(nvlink.gpus)))
        else:
            uncounted.append(f"nvidia-smi nvlink --status lists {len(nvlink.gpus)} GPU(s) with lines elided: "
                             "a pasted excerpt")
    if topo is not None and topo.gpus:
        counts.append(SourceCount("nvidia-smi-topo", len(topo.gpus)))
    if dcgm is not None and dcgm.gpus:
        # DCGM's host engine sees the GPUs through the driver too ("8 GPUs found.").
        named.append((DCGM_DISCOVERY, tuple(g.name for g in dcgm.gpus if g.name)))
        counts.append(SourceCount(DCGM_DISCOVERY, len(dcgm.gpus)))
    pci_ids: tuple[int, ...] = ()
    if pci is not None:
        gpus = lspci_parse.nvidia_gpus(pci)
        pci_ids = tuple(d.device_id for d in gpus if d.device_id is not None)
        named.append(("lspci", tuple(d.product for d in gpus if d.product)))
        if gpus:
            counts.append(SourceCount("lspci", len(gpus)))
    first = counts[0] if counts else None
    model_probe, models = next(((p, m) for p, m in named if m), (None, ()))
    return GpuCensus(first.count if first else None, first.probe if first else None,
                     models, model_probe, pci_ids, tuple(counts), tuple((p, m) for p, m in named if m),
                     tuple(u for u in uncounted if u), attached)
