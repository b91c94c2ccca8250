"""``nvidia-smi -q -x`` (XML) into an ``SmiReport``: the document read (incrementally when damaged,
so a cut capture keeps what came before the cut and says what it did not show), each GPU's
elements indexed by the field table's paths, and the shared builder fed from them."""

from __future__ import annotations

import re
import string
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, replace

from preflight.parse.smi_build import Reader, build_gpu, build_report, not_smi
from preflight.parse.smi_fields import GPU_FIELDS, REPORT_FIELDS, XML_COUNTERS, XML_REASONS
from preflight.parse.smi_records import SmiReport
from preflight.parse.xml_damage import pull_events

_DOCTYPE = re.compile(r"<!DOCTYPE[^\[>]*(?:\[.*?\])?\s*>", re.DOTALL)
_XML_REASON_PREFIX = re.compile(r"^clocks_(?:event|throttle)_reason_")
_XML_COUNTER_PREFIX = "clocks_event_reasons_counters_"


# nvidia-smi's list of every supported clock pair: over half of an H100/H200 GPU's XML and
# of the elements built from it, and read by no row of the field table.
_UNREAD_OPEN, _UNREAD_CLOSE = "<supported_clocks>", "</supported_clocks>"
# All a well-formed such section is made of. An entity, comment, attribute or stray byte in
# one leaves the section in the text, so that damage there is met by the parser as before.
_PLAIN_BYTES = (string.ascii_letters + string.digits + " \t\r\n<>/._").encode()


def _plain_section(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]``, a section's content, can go without changing whether the
    document is well-formed: plain characters only, as many closing tags as opening ones, and
    no second opening tag of the section (the mark of two captures spliced together)."""
    body = text[start:end]
    return (
        body.isascii()
        and not body.encode().translate(None, _PLAIN_BYTES)
        and body.count("<") == 2 * body.count("</")
        and _UNREAD_OPEN not in body
    )


def _without_unread_sections(text: str) -> str:
    """``text`` less its whole, plain ``<supported_clocks>`` sections. One cut inside a section
    has no closing tag after it, so it stays, and the parser meets the cut where it is."""
    kept, pos = [], 0
    while (start := text.find(_UNREAD_OPEN, pos)) != -1:
        end = text.find(_UNREAD_CLOSE, start)
        if end == -1:
            break
        after = end + len(_UNREAD_CLOSE)
        kept.append(text[pos:start] if _plain_section(text, start + len(_UNREAD_OPEN), end) else text[pos:after])
        pos = after
    kept.append(text[pos:])
    return "".join(kept)


@dataclass(frozen=True)
class _Damage:
    """Where a damaged XML broke off: the parser's error, and the elements that were closed."""

    error: ET.ParseError
    closed: frozenset[int]  # ids of the elements whose closing tag came


def _read_xml(text: str, notes: list[str]) -> tuple[ET.Element | None, _Damage | None]:
    """The root element (``<nvidia_smi_log>`` for real output), or None when the text holds
    no XML element at all, and the damage, if any.

    Parsed incrementally so that a truncated or corrupted capture still yields the elements
    read before the damage."""
    text = _DOCTYPE.sub("", text, count=1)
    try:
        # Whole output is the common case, and one pass over it costs half the pull parser.
        return ET.fromstring(_without_unread_sections(text)), None
    except ET.ParseError:
        pass
    # Damaged: read as it came, so the elements kept and the error's line and column are
    # those of the capture itself.
    events, error = pull_events(text, ("start", "end"))
    root, closed = (events[0][1] if events else None), frozenset(id(e) for kind, e in events if kind == "end")
    if root is None or error is None:
        return root, None
    for element in root.iter():
        if id(element) not in closed and len(element) == 0:
            element.text = None
    notes.append(f"XML truncated or malformed ({error}); kept the elements read before it")
    return root, _Damage(error, closed)


def _cut(damage: _Damage, gpus: list[ET.Element], attached: object) -> str:
    """What a damaged output showed and what it did not, in words: the GPUs whose section
    closed, the one the damage fell inside, and how many its header counts that never came."""
    whole = [g for g in gpus if id(g) in damage.closed]
    inside = [g.get("id") or "?" for g in gpus if id(g) not in damage.closed]
    line = damage.error.position[0] if damage.error.position else "?"
    parts = [f"nvidia-smi -q -x output broken off at line {line}: the tool died mid-way or the capture was cut"]
    parts.append(f"{len(whole)} GPU section(s) read whole")
    if inside:
        parts.append(f"GPU {inside[0]} only in part (its section was cut)")
    if isinstance(attached, int):
        never = attached - len(gpus)
        if never > 0:
            parts.append(f"{never} of the {attached} GPUs its header counts never shown")
    else:
        parts.append("the header's GPU count (attached_gpus) never came")
    return "; ".join(parts)


# What nvidia-smi prints for a GPU it cannot reach (preflight.parse.nvidia_smi, the same words).
_UNREACHABLE = re.compile(r"Unable to (?:determine|detect) the device handle for GPU", re.IGNORECASE)


def _xml_partial(text: str, attached: object, listed: int) -> str | None:
    """Why a whole document's ``<gpu>`` elements are not the node's GPU list, or None: only
    ``<attached_gpus>`` says how many there are, and a document listing fewer with no GPU said
    to be unreachable is a selection (``nvidia-smi -q -x -i 0``) or an edited capture."""
    if not listed or _UNREACHABLE.search(text):
        return None
    if not isinstance(attached, int):
        return (f"nvidia-smi -q -x output without <attached_gpus>: it shows {listed} <gpu> element(s) but not "
                "how many GPUs the node has")
    if listed >= attached:
        return None
    return (f"nvidia-smi -q -x output lists {listed} of the {attached} GPUs its <attached_gpus> counts, the "
            "document whole: a selection of GPUs (nvidia-smi -q -x -i), not the node's list")


def _xml_value(index: dict[str, ET.Element], paths: tuple[str, ...]) -> str | None:
    for path in paths:
        node = index.get(path)
        if node is not None and len(node) == 0 and node.text and node.text.strip():
            return node.text.strip()
    return None


# Every path of the field table, and each of its leading parts ("pci", "pci/pci_bus_id").
_GPU_PATHS = frozenset("/".join(path.split("/")[:n]) for f in GPU_FIELDS for path in f.xml
                       for n in range(1, path.count("/") + 2))


def _top_index(root: ET.Element) -> dict[str, ET.Element]:
    """The report's own fields: the root's children that are not GPUs, one level deep."""
    index: dict[str, ET.Element] = {}
    for child in root:
        if child.tag != "gpu":
            index.setdefault(child.tag, child)
    return index


def _path_index(element: ET.Element) -> dict[str, ET.Element]:
    """Every path of the field table below ``element`` -> the element ``element.find(path)``
    gives (the first in document order). One walk of the parts the table names (a GPU's
    element has thousands of others: supported clocks, processes) instead of a search per
    field."""
    index: dict[str, ET.Element] = {}

    def walk(parent: ET.Element, prefix: str) -> None:
        for child in parent:
            path = prefix + child.tag
            if path in _GPU_PATHS:
                index.setdefault(path, child)
                walk(child, path + "/")

    walk(element, "")
    return index


def _xml_reason_name(tag: str) -> str:
    short = _XML_REASON_PREFIX.sub("", tag)
    return XML_REASONS.get(short, short)


def _xml_counter_name(tag: str) -> str:
    short = tag.removeprefix(_XML_COUNTER_PREFIX)
    return XML_COUNTERS.get(short, short)


def _xml_pairs(section: ET.Element | None, strip: Callable[[str], str]) -> list[tuple[str, str | None]]:
    return [(strip(child.tag), child.text) for child in (section if section is not None else ())]


def parse_smi_xml(text: str) -> SmiReport:
    """Parse ``nvidia-smi -q -x`` output. Raises ParseError only when the text is no
    nvidia-smi output at all."""
    notes: list[str] = []
    root, damage = _read_xml(text, notes) if text.lstrip().startswith("<") else (None, None)
    if root is None or root.tag != "nvidia_smi_log":
        raise not_smi(text, "nvidia-smi -q -x")
    gpus = []
    elements = root.findall("gpu")
    for index, gpu in enumerate(elements):
        reasons = gpu.find("clocks_event_reasons")
        if reasons is None:
            reasons = gpu.find("clocks_throttle_reasons")
        paths = _path_index(gpu)
        gpus.append(
            build_gpu(
                index,
                gpu.get("id"),
                lambda f, paths=paths: _xml_value(paths, f.xml),
                _xml_pairs(reasons, _xml_reason_name),
                _xml_pairs(gpu.find("clocks_event_reasons_counters"), _xml_counter_name),
                notes,
            )
        )
    top = _top_index(root)
    top_reader = Reader("report", notes)
    header = top_reader.fields(REPORT_FIELDS, lambda f: _xml_value(top, f.xml))
    header["unreadable"] = tuple(top_reader.unreadable)
    if damage is None or id(root) in damage.closed:
        # Whole, or damaged only after its root element closed (text appended to the capture):
        # every GPU the output had was read.
        report = build_report(header, gpus, notes, headed=True)
        partial = _xml_partial(text, header["attached_gpus"], len(gpus))
        return replace(report, partial=partial, selection=isinstance(header["attached_gpus"], int)) \
            if partial else report
    # What is missing is the file's end, not GPUs: the report holds the GPUs read (one perhaps
    # in part) and says which were not, so no check passes a GPU it never saw and the GPU
    # count is taken from another view of the node.
    return SmiReport(gpus=tuple(gpus), notes=tuple(notes), cut=_cut(damage, elements, header["attached_gpus"]),
                     **header)
