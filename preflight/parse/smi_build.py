"""The shared builder of ``nvidia-smi -q`` records: the raw strings one GPU's lookup gives (from
XML or text alike) converted through the field table into a ``GpuInfo``, and the report around them."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from preflight.parse import ParseError
from preflight.parse.garbled import garbled, shown
from preflight.parse.smi_fields import GPU_FIELDS, Field
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
from preflight.parse.smi_values import available, to_bool, to_int

_Lookup = Callable[[Field], str | None]


class Reader:
    """Converts the raw strings of one GPU (or the report header), noting unreadable ones.
    ``unreadable`` collects the fields whose value held bytes that are not text."""

    def __init__(self, where: str, notes: list[str], unreadable: list[str] | None = None):
        self.where = where
        self.notes = notes
        self.unreadable = unreadable if unreadable is not None else []

    def convert(self, name: str, convert: Callable[[str], object], raw: str | None) -> object:
        if raw is None or not available(raw):
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

    def fields(self, table: Iterable[Field], lookup: _Lookup) -> dict[str, object]:
        return {f.name: self.convert(f.name, f.convert, lookup(f)) for f in table}

    def reasons(self, pairs: Iterable[tuple[str, str | None]]) -> tuple[frozenset[str], frozenset[str]]:
        states = {name: self.convert(f"clocks event reason {name}", to_bool, raw) for name, raw in pairs}
        known = {name: state for name, state in states.items() if state is not None}
        return frozenset(n for n, state in known.items() if state), frozenset(known)

    def counters(self, pairs: Iterable[tuple[str, str | None]]) -> tuple[tuple[str, int], ...]:
        values = {name: self.convert(f"clocks event counter {name}", to_int, raw) for name, raw in pairs}
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


def build_gpu(
    index: int | None,
    header_bus_id: str | None,
    lookup: _Lookup,
    reason_pairs: Iterable[tuple[str, str | None]],
    counter_pairs: Iterable[tuple[str, str | None]],
    notes: list[str],
) -> GpuInfo:
    reader = Reader(f"GPU {header_bus_id or 'without header'}", notes)
    values = reader.fields(GPU_FIELDS, lookup)
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


def build_report(header: dict[str, object], gpus: list[GpuInfo], notes: list[str], headed: bool) -> SmiReport:
    attached = header["attached_gpus"]
    if headed and isinstance(attached, int) and attached != len(gpus):
        notes.append(f"Attached GPUs says {attached} but the output lists {len(gpus)}")
    return SmiReport(gpus=tuple(gpus), notes=tuple(notes), **header)


def not_smi(text: str, what: str) -> ParseError:
    """The error for text that is no report at all. Its message carries the first line, which
    is what a node printed instead ("NVIDIA-SMI has failed because it couldn't communicate
    with the NVIDIA driver", "bash: nvidia-smi: command not found"); the probe's exit code
    tells those cases apart."""
    lines = text.strip().splitlines()
    return ParseError(f"not {what} output: {lines[0][:160]!r}" if lines else f"empty {what} output")
