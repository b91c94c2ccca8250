"""Parsers for ``nvidia-smi -q -x`` (XML) and ``nvidia-smi -q`` (text) into one record shape.

Both parsers yield the same ``SmiReport``, so a check never cares which form a node gave.
Every GPU field is read through one table, ``smi_fields.GPU_FIELDS``, that names the XML path
and the text label path side by side; the shared builder (``smi_build``) then converts the raw
strings to typed values (``smi_values``). Adding a field means adding one row. The XML form is
read by ``smi_xml`` (re-exported here); this module reads the text form.

Real variants handled (see tests/fixtures/corpus/smi-q and h200-vm):

- XML DTD v11 (driver 515: ``<clocks_throttle_reasons>``, ``<power_readings>`` with
  ``enforced_power_limit``), v12 (535: ``<clocks_event_reasons>``, ``<gpu_power_readings>``,
  ``<gpu_reset_status>``, ``<remapped_rows>N/A</remapped_rows>``) and v13 (58x/59x: tabs,
  ``<clocks_event_reasons_counters>``, ``average_/instant_power_draw``, SRAM parity/SEC-DED
  split, ``<gpu_recovery_action>``). The DOCTYPE is stripped, so no DTD or entity is resolved.
  The ``<supported_clocks>`` sections, which no field reads, are left out of the parse
  when whole and plainly formed.
  Truncated XML keeps what was read before the cut; leaves whose closing tag never came are
  dropped because their text may be cut short.
- Text from 2018 drivers ("Clocks Throttle Reasons", narrow label padding) to 590
  ("Clocks Event Reasons" + "Clocks Event Reasons Counters"), excerpts without a
  ``GPU <bus id>`` header (grep'd sections, author elisions ``[...]``, de-indented
  sections); such a GPU has no index and usually no identity.
- ``N/A``, ``[N/A]``, ``Not Supported`` and "Requested functionality has been deprecated" all
  read as not available (None). Any other value that does not parse is kept out of the record
  and reported in ``notes``.
- Temperatures: pre-Hopper boards print absolute thresholds ("GPU Slowdown Temp : 89 C");
  Ada/Hopper+ print T.Limit *margins* ("GPU Slowdown T.Limit Temp : -2 C"). The two go
  to separate fields and are never mixed.
- "Power Draw" (pre-535) and "Average Power Draw" (535+) both fill ``power_draw_w``, which is
  what ``nvidia-smi --query-gpu=power.draw`` reports (the 1 s average on Ampere and newer).

Not handled: the pre-Ampere ECC layout (Single Bit / Double Bit sub-sections with per-memory
counts); no capture of it is in the corpus.
"""

from __future__ import annotations

import re
from dataclasses import replace

from preflight.parse.smi_build import Reader, build_gpu, build_report, not_smi
from preflight.parse.smi_fields import REPORT_FIELDS, TEXT_COUNTERS, TEXT_REASONS, snake
from preflight.parse.smi_records import GpuInfo, SmiReport
from preflight.parse.smi_text import TextNode, normalise_label, read_sections
from preflight.parse.smi_xml import parse_smi_xml

__all__ = ["SmiReport", "parse_smi_text", "parse_smi_xml"]


_GPU_HEADER = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")


def _text_pairs(section: TextNode | None, names: dict[str, str]) -> list[tuple[str, str | None]]:
    """(reason name, raw state) for every line under a section, however deep: HW Thermal
    and HW Power Brake Slowdown are printed nested under HW Slowdown."""
    if section is None:
        return []
    lines = [n for n in section.walk() if n.value is not None]
    return [(names.get(normalise_label(n.key), snake(n.key)), n.value) for n in lines]


def _text_gpu(index: int | None, bus_id: str | None, node: TextNode, notes: list[str]) -> GpuInfo:
    reasons = node.child("Clocks Event Reasons") or node.child("Clocks Throttle Reasons")
    return build_gpu(
        index,
        bus_id,
        lambda f: next((v for v in map(node.value_at, f.text) if v is not None), None),
        _text_pairs(reasons, TEXT_REASONS),
        _text_pairs(node.child("Clocks Event Reasons Counters"), TEXT_COUNTERS),
        notes,
    )


def parse_smi_text(text: str) -> SmiReport:
    """Parse ``nvidia-smi -q`` text (whole, or an excerpt of sections). Raises ParseError
    only when the text is no nvidia-smi output at all."""
    root = read_sections(text)
    notes: list[str] = []
    headers = [(c, m.group(1)) for c in root.children if (m := _GPU_HEADER.match(c.key))]
    gpus = [_text_gpu(i, bus_id, node, notes) for i, (node, bus_id) in enumerate(headers)]
    if not headers:
        # An excerpt: sections with no "GPU <bus id>" line above them belong to one GPU
        # whose identity the excerpt did not keep.
        gpu = _text_gpu(None, None, root, notes)
        if gpu != GpuInfo():
            gpus.append(gpu)
            notes.append("no 'GPU <bus id>' header: an excerpt of one GPU, index unknown")
    top_reader = Reader("report", notes)
    header = top_reader.fields(REPORT_FIELDS, lambda f: root.value_at(f.text[0]))
    header["unreadable"] = tuple(top_reader.unreadable)
    if not gpus and all(v in (None, ()) for v in header.values()):
        raise not_smi(text, "nvidia-smi -q")
    report = build_report(header, gpus, notes, headed=bool(headers))
    cut = _text_cut(text, header["attached_gpus"], headers)
    if cut:
        return replace(report, cut=cut)
    partial, selection = _text_partial(text, header["attached_gpus"], len(gpus), bool(headers))
    return replace(report, partial=partial, selection=selection) if partial else report


# What nvidia-smi prints for a GPU it cannot reach (one fallen off the bus):
# "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error"
# (NVIDIA/open-gpu-kernel-modules#387, NVIDIA/nvidia-docker#1553).
_UNREACHABLE = re.compile(r"Unable to (?:determine|detect) the device handle for GPU", re.IGNORECASE)
_ELIDED = re.compile(r"^\s*(?:\[\.\.\.\]|\.{3,}|\u2026)\s*$", re.MULTILINE)


def _text_cut(text: str, attached: object, headers: list[tuple[TextNode, str]]) -> str | None:
    """Why a whole ``-q`` report (one with GPU headers) lists fewer GPUs than its header counts,
    when its last GPU's section broke off and nothing in it says a GPU could not be reached: the
    output broke off. None otherwise (an excerpt, with no headers or with its author's elisions;
    every GPU listed; a last section that ran to its end, which ``_text_partial`` reads; or a
    GPU nvidia-smi said it could not reach, which is a missing GPU, not a cut)."""
    listed = len(headers)
    if not listed or not isinstance(attached, int) or listed >= attached or _UNREACHABLE.search(text):
        return None
    if _ELIDED.search(text):
        return None  # a pasted excerpt ("[...]" where its author left lines out), not a cut
    if _section_whole(headers[-1][0]):
        return None
    return cut_between(listed, attached)


def cut_between(listed: int, attached: int) -> str:
    """The cut of a text report that lists ``listed`` of the ``attached`` GPUs its header counts."""
    return (f"nvidia-smi -q output lists {listed} GPU section(s) of the {attached} its header counts, and says "
            f"of no GPU that it could not be reached: the tool died mid-way or the capture was cut; "
            f"{attached - listed} GPU(s) never shown")


# nvidia-smi -q prints a GPU's "Processes" entry at the end of its section (followed, from driver
# 580, only by "Capabilities"): a section that has it ran to its end.
def _section_whole(section: TextNode) -> bool:
    return section.child("Processes") is not None


def _text_partial(text: str, attached: object, listed: int, headed: bool) -> tuple[str | None, bool]:
    """(why the GPUs listed are not the node's whole list, or None; whether the output is a whole
    listing of fewer GPUs than its header counts). Only the "Attached GPUs : N" line says how many
    GPUs there are, so an output without it never counts them, whatever it lists."""
    if not listed or _UNREACHABLE.search(text):
        return None, False
    if not isinstance(attached, int):
        header = "" if headed else " and no 'GPU <bus id>' header"
        return (f"nvidia-smi -q output without its 'Attached GPUs' line{header}: an excerpt, which shows "
                f"{listed} GPU section(s) but not how many GPUs the node has"), False
    if listed >= attached:
        return None, False
    if _ELIDED.search(text) or not headed:
        return (f"nvidia-smi -q output lists {listed} of the {attached} GPUs its 'Attached GPUs' line counts, "
                "with lines left out: a pasted excerpt"), False
    return (f"nvidia-smi -q output lists {listed} of the {attached} GPUs its 'Attached GPUs' line counts, each "
            "section whole: a selection of GPUs (nvidia-smi -q -i), not the node's list"), True


def asked_for_every_gpu(report: SmiReport, xml: bool) -> SmiReport:
    """``report`` read as the output of a command that asked for every GPU (the probe's own
    ``nvidia-smi -q [-x]``, no ``-i``): a whole listing of fewer GPUs than the header counts is
    then no selection. In text, the tool stopped between two GPUs (a cut); in XML, whose document
    closed, the tool left GPUs out: the GPUs listed are those it could show, and they count."""
    if not report.selection:
        return report
    if xml:
        return replace(report, partial=None, selection=False)
    return replace(report, partial=None, selection=False,
                   cut=cut_between(len(report.gpus), report.attached_gpus or len(report.gpus)))
