"""Parsers for ``nvidia-smi -q -x`` (XML) and ``nvidia-smi -q`` (text) into one record shape.

Both parsers yield the same ``SmiReport``, so a check never cares which form a node gave.
Every GPU field is read through one table, ``_GPU_FIELDS``, that names the XML path and the
text label path side by side; the shared builder then converts the raw strings to typed
values. Adding a field means adding one row.

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
import string
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from preflight.parse import ParseError, finite
from preflight.parse.garbled import garbled, shown
from preflight.parse.smi_records import (
    EccCounters,
    EccCounts,
    FabricInfo,
    GpuInfo,
    PcieLink,
    RemapHistogram,
    RemappedRows,
    RetiredPages,
    SmiReport,
)
from preflight.parse.smi_text import TextNode, normalise_label, read_sections
from preflight.parse.xml_damage import pull_events

# --- Value conversion ----------------------------------------------------------------------

_UNAVAILABLE = {
    "",
    "n/a",
    "[n/a]",
    "not supported",
    "[not supported]",
    "requested functionality has been deprecated",
}
_TRUE = {"enabled", "yes", "active", "true"}
_FALSE = {"disabled", "no", "not active", "false"}
_NUMBER = re.compile(r"^[-+]?[0-9]+(?:\.[0-9]+)?(?![0-9.])")


def _to_bool(raw: str) -> bool:
    word = normalise_label(raw)
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(raw)


def _to_float(raw: str) -> float:
    """Leading number of a value with its unit ("629.45 W", "16x", "639 bank(s)")."""
    match = _NUMBER.match(raw.strip())
    number = finite(match.group()) if match else None
    if number is None:
        raise ValueError(raw)
    return number


def _to_int(raw: str) -> int:
    number = _to_float(raw)
    if not number.is_integer():
        raise ValueError(raw)
    return int(number)


def _to_str(raw: str) -> str:
    return raw


def _available(raw: str | None) -> bool:
    return raw is not None and normalise_label(raw) not in _UNAVAILABLE


# --- The field table: one row per value, XML path and text label path side by side --------


@dataclass(frozen=True)
class _Field:
    name: str  # "ecc.volatile.dram_uncorrectable": the prefix picks the sub-record
    convert: Callable[[str], object]
    xml: tuple[str, ...]  # alternative element paths below <gpu>, first present wins
    text: tuple[str, ...]  # alternative label paths below "GPU <bus id>"


def _paths(prefixes: str, leaves: str) -> tuple[str, ...]:
    """Every ``prefix/leaf`` of two ``|``-separated lists of alternatives, in order."""
    return tuple(
        "/".join(filter(None, (prefix, leaf)))
        for prefix in prefixes.split("|")
        for leaf in filter(None, leaves.split("|"))
    )


def _section(xml: str, text: str, rows: Iterable[tuple[str, Callable[[str], object], str, str]]):
    """Fields of one output section: (name, converter, XML leaf, text label) rows below the
    section's XML path and text label path (``|`` separates alternatives everywhere)."""
    return tuple(_Field(name, conv, _paths(xml, x), _paths(text, t)) for name, conv, x, t in rows)


_S, _I, _F, _B = _to_str, _to_int, _to_float, _to_bool

_GPU_FIELDS: tuple[_Field, ...] = (
    *_section("", "", [
        ("name", _S, "product_name", "Product Name"),
        ("uuid", _S, "uuid", "GPU UUID"),
        ("serial", _S, "serial", "Serial Number"),
        ("vbios_version", _S, "vbios_version", "VBIOS Version"),
        ("board_part_number", _S, "board_part_number", "Board Part Number"),
        ("pci_bus_id", _S, "pci/pci_bus_id", "PCI/Bus Id"),
        ("persistence_mode", _B, "persistence_mode", "Persistence Mode"),
        ("mig_mode", _B, "mig_mode/current_mig", "MIG Mode/Current"),
        ("ecc_mode", _B, "ecc_mode/current_ecc", "ECC Mode/Current"),
        ("recovery_action", _S, "gpu_recovery_action", "GPU Recovery Action"),
        ("performance_state", _S, "performance_state", "Performance State"),
        # NVML's nvmlGpuVirtualizationMode_t as nvidia-smi prints it: None (bare metal),
        # Pass-Through / VGPU (a guest), Host VGPU / Host VSGA (the hypervisor).
        ("virtualization_mode", _S, "gpu_virtualization_mode/virtualization_mode",
         "GPU Virtualization Mode/Virtualization Mode"),
        ("sm_clock_mhz", _I, "clocks/sm_clock", "Clocks/SM"),
        ("memory_clock_mhz", _I, "clocks/mem_clock", "Clocks/Memory"),
        ("max_sm_clock_mhz", _I, "max_clocks/sm_clock", "Max Clocks/SM"),
        ("utilization_gpu_pct", _I, "utilization/gpu_util", "Utilization/GPU"),
        ("memory_total_mib", _I, "fb_memory_usage/total", "FB Memory Usage/Total"),
        ("memory_used_mib", _I, "fb_memory_usage/used", "FB Memory Usage/Used"),
    ]),
    *_section("gpu_reset_status", "GPU Reset Status", [
        ("reset_required", _B, "reset_required", "Reset Required"),
        ("drain_and_reset_recommended", _B, "drain_and_reset_recommended", "Drain and Reset Recommended"),
    ]),
    *_section("temperature", "Temperature", [
        ("temperature_c", _I, "gpu_temp", "GPU Current Temp|Gpu"),
        ("memory_temperature_c", _I, "memory_temp", "Memory Current Temp"),
        ("temp_shutdown_c", _I, "gpu_temp_max_threshold", "GPU Shutdown Temp"),
        ("temp_slowdown_c", _I, "gpu_temp_slow_threshold", "GPU Slowdown Temp"),
        ("temp_max_operating_c", _I, "gpu_temp_max_gpu_threshold", "GPU Max Operating Temp"),
        ("temp_limit_margin_c", _I, "gpu_temp_tlimit", "GPU T.Limit Temp"),
        ("shutdown_margin_c", _I, "gpu_temp_max_tlimit_threshold", "GPU Shutdown T.Limit Temp"),
        ("slowdown_margin_c", _I, "gpu_temp_slow_tlimit_threshold", "GPU Slowdown T.Limit Temp"),
        ("max_operating_margin_c", _I, "gpu_temp_max_gpu_tlimit_threshold", "GPU Max Operating T.Limit Temp"),
    ]),
    # "GPU Power Readings" since 535, "Power Readings" before (with "Enforced Power Limit").
    *_section("gpu_power_readings|power_readings", "GPU Power Readings|Power Readings", [
        ("power_draw_w", _F, "power_draw|average_power_draw", "Power Draw|Average Power Draw"),
        ("power_draw_instant_w", _F, "instant_power_draw", "Instantaneous Power Draw"),
        ("power_limit_w", _F, "current_power_limit|enforced_power_limit",
         "Current Power Limit|Enforced Power Limit"),
        ("default_power_limit_w", _F, "default_power_limit", "Default Power Limit"),
        ("max_power_limit_w", _F, "max_power_limit", "Max Power Limit"),
    ]),
    *_section("pci/pci_gpu_link_info", "PCI/GPU Link Info", [
        ("pcie.gen_current", _I, "pcie_gen/current_link_gen", "PCIe Generation/Current"),
        ("pcie.gen_max", _I, "pcie_gen/max_link_gen", "PCIe Generation/Max"),
        ("pcie.gen_device_current", _I, "pcie_gen/device_current_link_gen", "PCIe Generation/Device Current"),
        ("pcie.gen_device_max", _I, "pcie_gen/max_device_link_gen", "PCIe Generation/Device Max"),
        ("pcie.gen_host_max", _I, "pcie_gen/max_host_link_gen", "PCIe Generation/Host Max"),
        ("pcie.width_current", _I, "link_widths/current_link_width", "Link Width/Current"),
        ("pcie.width_max", _I, "link_widths/max_link_width", "Link Width/Max"),
    ]),
    *_section("pci", "PCI", [("pcie.replays", _I, "replay_counter", "Replays Since Reset")]),
    *_section("ecc_errors", "ECC Errors", [
        *(
            (f"ecc.{bucket}.{tag}", _I, f"{bucket}/{tag}", f"{bucket}/{label}")
            for bucket in ("volatile", "aggregate")
            for tag, label in (
                ("sram_correctable", "SRAM Correctable"),
                ("sram_uncorrectable", "SRAM Uncorrectable"),
                ("sram_uncorrectable_parity", "SRAM Uncorrectable Parity"),
                ("sram_uncorrectable_secded", "SRAM Uncorrectable SEC-DED"),
                ("dram_correctable", "DRAM Correctable"),
                ("dram_uncorrectable", "DRAM Uncorrectable"),
            )
        ),
        ("ecc.sram_threshold_exceeded", _B, "aggregate/sram_threshold_exceeded",
         "Aggregate/SRAM Threshold Exceeded"),
        ("ecc.channel_repair_pending", _B, "channel_repair_pending", "Channel Repair Pending"),
        ("ecc.tpc_repair_pending", _B, "tpc_repair_pending", "TPC Repair Pending"),
        ("ecc.unrepairable_memory", _B, "unrepairable_memory", "Unrepairable Memory"),
    ]),
    *_section("ecc_errors/aggregate_uncorrectable_sram_sources",
              "ECC Errors/Aggregate Uncorrectable SRAM Sources", [
        (f"ecc.sram_source.{source}", _I, f"sram_{source}", f"SRAM {source}")
        for source in ("l2", "sm", "microcontroller", "pcie", "other")
    ]),
    # Row remapping (Ampere+); the whole section is a bare "N/A" on older boards.
    *_section("remapped_rows", "Remapped Rows", [
        ("remap.correctable", _I, "remapped_row_corr", "Correctable Error"),
        ("remap.uncorrectable", _I, "remapped_row_unc", "Uncorrectable Error"),
        ("remap.correctable_inactive", _I, "remapped_row_corr_inactive", "Inactive Correctable Error"),
        ("remap.uncorrectable_inactive", _I, "remapped_row_unc_inactive", "Inactive Uncorrectable Error"),
        ("remap.pending", _B, "remapped_row_pending", "Pending"),
        ("remap.failure", _B, "remapped_row_failure", "Remapping Failure Occurred"),
        *(
            (f"remap.histogram.{level}", _I, f"row_remapper_histogram/row_remapper_histogram_{level}",
             f"Bank Remap Availability Histogram/{level}")
            for level in ("max", "high", "partial", "low", "none")
        ),
    ]),
    # Page retirement (pre-Ampere; N/A on Ampere+). Old text drivers say just "Pending".
    *_section("retired_pages", "Retired Pages", [
        ("retired.single_bit", _I, "multiple_single_bit_retirement/retired_count", "Single Bit ECC"),
        ("retired.double_bit", _I, "double_bit_retirement/retired_count", "Double Bit ECC"),
        # Two pending flags in XML, one in text; RetiredPages.pending is true if either is.
        ("retired_pending.blacklist", _B, "pending_blacklist", "Pending Page Blacklist|Pending"),
        ("retired_pending.retirement", _B, "pending_retirement", ""),
    ]),
    # NVSwitch fabric (all N/A off NVSwitch systems).
    *_section("fabric", "Fabric", [
        ("fabric.state", _S, "state", "State"),
        ("fabric.status", _S, "status", "Status"),
        ("fabric.clique_id", _S, "cliqueId", "CliqueId"),
        ("fabric.cluster_uuid", _S, "clusterUuid", "ClusterUUID"),
        ("fabric.health_summary", _S, "health/summary", "Health/Summary"),
    ]),
)

_REPORT_FIELDS: tuple[_Field, ...] = _section("", "", [
    ("timestamp", _S, "timestamp", "Timestamp"),
    ("driver_version", _S, "driver_version", "Driver Version"),
    ("cuda_version", _S, "cuda_version", "CUDA Version"),
    ("attached_gpus", _I, "attached_gpus", "Attached GPUs"),
])

# Clock-event reason labels to NVML's names. XML element suffixes already are NVML's names
# except the display clock one; anything else is snake_cased from the label.
_TEXT_REASONS = {
    "idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clock_setting",
}
_XML_REASONS = {"display_clocks_setting": "display_clock_setting"}
# Counters carry the name of the reason they time.
_TEXT_COUNTERS = {
    "sw power capping": "sw_power_cap",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power braking": "hw_power_brake_slowdown",
}
_XML_COUNTERS = {
    "sw_power_cap": "sw_power_cap",
    "sync_boost": "sync_boost",
    "sw_therm_slowdown": "sw_thermal_slowdown",
    "hw_therm_slowdown": "hw_thermal_slowdown",
    "hw_power_brake": "hw_power_brake_slowdown",
}


def _snake(label: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", label.casefold()).strip("_")


# --- Shared builder: raw strings in, typed records out -------------------------------------

_Lookup = Callable[[_Field], str | None]


class _Reader:
    """Converts the raw strings of one GPU (or the report header), noting unreadable ones.
    ``unreadable`` collects the fields whose value held bytes that are not text."""

    def __init__(self, where: str, notes: list[str], unreadable: list[str] | None = None):
        self.where = where
        self.notes = notes
        self.unreadable = unreadable if unreadable is not None else []

    def convert(self, name: str, convert: Callable[[str], object], raw: str | None) -> object:
        if raw is None or not _available(raw):
            return None
        if garbled(raw.strip()):
            # Damage to the evidence, not another value (preflight.parse.garbled).
            self.notes.append(f"{self.where}: {name} unreadable: bytes that are not text in {shown(raw)}")
            self.unreadable.append(name)
            return None
        try:
            return convert(raw.strip())
        except ValueError:
            self.notes.append(f"{self.where}: {name} unreadable: {raw.strip()!r}")
            return None

    def fields(self, table: Iterable[_Field], lookup: _Lookup) -> dict[str, object]:
        return {f.name: self.convert(f.name, f.convert, lookup(f)) for f in table}

    def reasons(self, pairs: Iterable[tuple[str, str | None]]) -> tuple[frozenset[str], frozenset[str]]:
        states = {name: self.convert(f"clocks event reason {name}", _to_bool, raw) for name, raw in pairs}
        known = {name: state for name, state in states.items() if state is not None}
        return frozenset(n for n, state in known.items() if state), frozenset(known)

    def counters(self, pairs: Iterable[tuple[str, str | None]]) -> tuple[tuple[str, int], ...]:
        values = {name: self.convert(f"clocks event counter {name}", _to_int, raw) for name, raw in pairs}
        return tuple(sorted((n, v) for n, v in values.items() if v is not None))


_Groups = dict[str, dict[str, object]]


def _by_prefix(values: dict[str, object]) -> _Groups:
    """The values grouped by their name up to its last dot: ``groups["ecc.volatile."]`` holds
    the values directly under that prefix (not deeper), keyed by the rest of their name. One
    pass for all the sub-records, where a scan of every value per sub-record cost a GPU ten."""
    groups: _Groups = {}
    for key, value in values.items():
        head, dot, tail = key.rpartition(".")
        groups.setdefault(head + dot, {})[tail] = value
    return groups


def _record(cls: type, groups: _Groups, prefix: str, **extra: object):
    """``cls`` built from the values under ``prefix``; None when none of them was readable."""
    fields = {**groups.get(prefix, {}), **extra}
    return cls(**fields) if any(v not in (None, ()) for v in fields.values()) else None


def _total(*parts: object) -> int | None:
    known = [p for p in parts if isinstance(p, int)]
    return sum(known) if known else None


def _ecc_counters(groups: _Groups, bucket: str) -> EccCounters | None:
    v = groups[f"ecc.{bucket}."]
    sram_unc = v["sram_uncorrectable"]
    if sram_unc is None:
        sram_unc = _total(v["sram_uncorrectable_parity"], v["sram_uncorrectable_secded"])
    counters = {**v, "sram_uncorrectable": sram_unc}
    if all(x is None for x in counters.values()):
        return None
    return EccCounters(
        correctable=_total(v["sram_correctable"], v["dram_correctable"]),
        uncorrectable=_total(sram_unc, v["dram_uncorrectable"]),
        **counters,
    )


def _build_gpu(
    index: int | None,
    header_bus_id: str | None,
    lookup: _Lookup,
    reason_pairs: Iterable[tuple[str, str | None]],
    counter_pairs: Iterable[tuple[str, str | None]],
    notes: list[str],
) -> GpuInfo:
    reader = _Reader(f"GPU {header_bus_id or 'without header'}", notes)
    values = reader.fields(_GPU_FIELDS, lookup)
    active, known = reader.reasons(reason_pairs)
    groups = _by_prefix(values)
    sources = tuple((k, v) for k, v in groups.get("ecc.sram_source.", {}).items() if v is not None)
    pending = [flag for flag in groups.get("retired_pending.", {}).values() if flag is not None]
    return GpuInfo(
        index=index,
        pci_bus_id=header_bus_id or values["pci_bus_id"],
        ecc=_record(
            EccCounts,
            groups,
            "ecc.",
            volatile=_ecc_counters(groups, "volatile"),
            aggregate=_ecc_counters(groups, "aggregate"),
            aggregate_uncorrectable_sram_sources=sources,
        ),
        remapped_rows=_record(
            RemappedRows, groups, "remap.", histogram=_record(RemapHistogram, groups, "remap.histogram.")
        ),
        retired_pages=_record(RetiredPages, groups, "retired.", pending=any(pending) if pending else None),
        pcie=_record(PcieLink, groups, "pcie."),
        fabric=_record(FabricInfo, groups, "fabric."),
        clocks_event_reasons=active,
        clocks_event_reasons_known=known,
        clocks_event_counters_us=reader.counters(counter_pairs),
        unreadable=tuple(reader.unreadable),
        **{k: v for k, v in values.items() if "." not in k and k != "pci_bus_id"},
    )


def _report(header: dict[str, object], gpus: list[GpuInfo], notes: list[str], headed: bool) -> SmiReport:
    attached = header["attached_gpus"]
    if headed and isinstance(attached, int) and attached != len(gpus):
        notes.append(f"Attached GPUs says {attached} but the output lists {len(gpus)}")
    return SmiReport(gpus=tuple(gpus), notes=tuple(notes), **header)


def _not_smi(text: str, what: str) -> ParseError:
    """The error for text that is no report at all. Its message carries the first line, which
    is what a node printed instead ("NVIDIA-SMI has failed because it couldn't communicate
    with the NVIDIA driver", "bash: nvidia-smi: command not found"); the probe's exit code
    tells those cases apart."""
    lines = text.strip().splitlines()
    return ParseError(f"not {what} output: {lines[0][:160]!r}" if lines else f"empty {what} output")


# --- XML -----------------------------------------------------------------------------------

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


def _xml_value(index: dict[str, ET.Element], paths: tuple[str, ...]) -> str | None:
    for path in paths:
        node = index.get(path)
        if node is not None and len(node) == 0 and node.text and node.text.strip():
            return node.text.strip()
    return None


# Every path of the field table, and each of its leading parts ("pci", "pci/pci_bus_id").
_GPU_PATHS = frozenset("/".join(path.split("/")[:n]) for f in _GPU_FIELDS for path in f.xml
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
    return _XML_REASONS.get(short, short)


def _xml_counter_name(tag: str) -> str:
    short = tag.removeprefix(_XML_COUNTER_PREFIX)
    return _XML_COUNTERS.get(short, short)


def _xml_pairs(section: ET.Element | None, strip: Callable[[str], str]) -> list[tuple[str, str | None]]:
    return [(strip(child.tag), child.text) for child in (section if section is not None else ())]


def parse_smi_xml(text: str) -> SmiReport:
    """Parse ``nvidia-smi -q -x`` output. Raises ParseError only when the text is no
    nvidia-smi output at all."""
    notes: list[str] = []
    root, damage = _read_xml(text, notes) if text.lstrip().startswith("<") else (None, None)
    if root is None or root.tag != "nvidia_smi_log":
        raise _not_smi(text, "nvidia-smi -q -x")
    gpus = []
    elements = root.findall("gpu")
    for index, gpu in enumerate(elements):
        reasons = gpu.find("clocks_event_reasons")
        if reasons is None:
            reasons = gpu.find("clocks_throttle_reasons")
        paths = _path_index(gpu)
        gpus.append(
            _build_gpu(
                index,
                gpu.get("id"),
                lambda f, paths=paths: _xml_value(paths, f.xml),
                _xml_pairs(reasons, _xml_reason_name),
                _xml_pairs(gpu.find("clocks_event_reasons_counters"), _xml_counter_name),
                notes,
            )
        )
    top = _top_index(root)
    top_reader = _Reader("report", notes)
    header = top_reader.fields(_REPORT_FIELDS, lambda f: _xml_value(top, f.xml))
    header["unreadable"] = tuple(top_reader.unreadable)
    if damage is None:
        return _report(header, gpus, notes, headed=True)
    # What is missing is the file's end, not GPUs: the report holds the GPUs read (one perhaps
    # in part) and says which were not, so no check passes a GPU it never saw and the GPU
    # count is taken from another view of the node.
    return SmiReport(gpus=tuple(gpus), notes=tuple(notes), cut=_cut(damage, elements, header["attached_gpus"]),
                     **header)


# --- Text ----------------------------------------------------------------------------------

_GPU_HEADER = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")


def _text_pairs(section: TextNode | None, names: dict[str, str]) -> list[tuple[str, str | None]]:
    """(reason name, raw state) for every line under a section, however deep: HW Thermal
    and HW Power Brake Slowdown are printed nested under HW Slowdown."""
    if section is None:
        return []
    lines = [n for n in section.walk() if n.value is not None]
    return [(names.get(normalise_label(n.key), _snake(n.key)), n.value) for n in lines]


def _text_gpu(index: int | None, bus_id: str | None, node: TextNode, notes: list[str]) -> GpuInfo:
    reasons = node.child("Clocks Event Reasons") or node.child("Clocks Throttle Reasons")
    return _build_gpu(
        index,
        bus_id,
        lambda f: next((v for v in map(node.value_at, f.text) if v is not None), None),
        _text_pairs(reasons, _TEXT_REASONS),
        _text_pairs(node.child("Clocks Event Reasons Counters"), _TEXT_COUNTERS),
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
    top_reader = _Reader("report", notes)
    header = top_reader.fields(_REPORT_FIELDS, lambda f: root.value_at(f.text[0]))
    header["unreadable"] = tuple(top_reader.unreadable)
    if not gpus and all(v in (None, ()) for v in header.values()):
        raise _not_smi(text, "nvidia-smi -q")
    return _report(header, gpus, notes, headed=bool(headers))
