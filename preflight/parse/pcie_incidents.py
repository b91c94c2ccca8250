"""PCIe error incidents: the kernel-log lines of one AER error, containment or link loss, together.

``parse_kernel_log`` reads each line of a PCIe error report as an event of its own (the kinds
``aer``, ``aer-bus-error``, ``aer-status``, ``aer-no-recovery``, ``aer-recovery``, ``pcie-dpc``,
``pcie-link-down``, ``pcie-card-removed``; see kernel_signatures.py) because the lines of one
report name different devices. The kernel's AER driver prints, for one error message a root
port received (drivers/pci/pcie/aer.c, err.c; Documentation/PCI/pcieaer-howto.rst):

- ``pcieport <port>: AER: <Severity> error received: <source>`` (older: ``... id=00e5``),
- for each device below the port that logged the error, ``<driver> <bdf>: PCIe Bus Error:
  severity=..., type=...``, ``<bdf>:   device [vvvv:dddd] error status/mask=SSSSSSSS/MMMMMMMM``
  and one line per error bit (``[14] CmpltTO``),
- for an uncorrectable error, the recovery: ``<driver> <bdf>: AER: can't recover (no
  error_detected callback)`` for a device whose driver has no error handler (the NVIDIA driver
  registers none: NVIDIA/open-gpu-kernel-modules#1229), then ``pcieport <port>: AER: device
  recovery failed`` or ``... successful``.

A hot-plug port that loses its device prints ``pciehp: Slot(N): Link Down`` and ``Card not
present`` (a surprise removal), and a port with downstream port containment ``DPC: containment
event``, followed by the same error and recovery lines.

``incidents`` groups those events, per host, into ``PcieIncident`` records: an ``aer`` line
always begins one, a link-down / removal / containment line begins one unless it continues a
link incident of the same port, and every other line joins the incident still open on its host
(one that has not printed its recovery outcome and grew within ``WINDOW`` lines), or begins one
of its own when the log starts mid-report. The error names come from the status and mask
registers (``status & ~mask``, the bits the kernel prints), decoded with the kernel's own tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from preflight.parse.kernel_signatures import KernelEvent

KINDS = ("aer", "aer-bus-error", "aer-status", "aer-no-recovery", "aer-recovery", "pcie-dpc",
         "pcie-link-down", "pcie-card-removed")
_LINK_KINDS = ("pcie-dpc", "pcie-link-down", "pcie-card-removed")
# Lines of one report arrive together; the kernel's AER ratelimit (10 messages per 5 s per
# device, pcieaer-howto.rst) can interleave another device's report, hence a window and not "next".
WINDOW = 16
# A source id of 0 means the root port could not tell who sent the message (a switch may report
# 0000:00:00.0, sonic-net/sonic-linux-kernel#588); the lines that follow name the device.
_UNKNOWN_SOURCE = "0000:00:00.0"

# drivers/pci/pcie/aer.c aer_correctable_error_string[] / aer_uncorrectable_error_string[]:
# bit position -> the name the kernel prints.
CORRECTABLE_BITS = {0: "RxErr", 6: "BadTLP", 7: "BadDLLP", 8: "Rollover", 12: "Timeout", 13: "NonFatalErr",
                    14: "CorrIntErr", 15: "HeaderOF"}
UNCORRECTABLE_BITS = {0: "Undefined", 4: "DLP", 5: "SDES", 12: "TLP", 13: "FCP", 14: "CmpltTO", 15: "CmpltAbrt",
                      16: "UnxCmplt", 17: "RxOF", 18: "MalfTLP", 19: "ECRC", 20: "UnsupReq", 21: "ACSViol",
                      22: "UncorrIntErr", 23: "BlockedTLP", 24: "AtomicOpBlocked", 25: "TLPBlockedErr",
                      26: "PoisonTLPBlocked"}


@dataclass(frozen=True)
class PcieIncident:
    """One PCIe error, containment or link loss and what the kernel did about it."""

    kind: str  # "aer" | "link-down" | "card-removed" | "containment" | "partial" (the log begins mid-report)
    severity: str  # "fatal" | "non-fatal" | "corrected" | "unknown"
    line: int  # where it begins
    host: str | None
    timestamp: str | None
    port: str | None  # the port that received the message or lost the link
    devices: tuple[str, ...]  # every PCI address the incident's lines name, port first
    drivers: dict[str, str]  # address -> the driver that printed a line for it (nvidia, mlx5_core, ...)
    pci_ids: dict[str, str]  # address -> vendor:device from its status line
    errors: tuple[str, ...]  # decoded error names, CmpltTO, RxErr, ...
    layer: str | None  # Physical / Data Link / Transaction Layer
    recovery: str | None  # "failed" | "successful" | None when the log does not say
    unrecoverable: tuple[str, ...]  # devices whose driver has no error handler ("can't recover")
    link_lost: bool  # a Link Down, Card not present or DPC line is part of it
    lines: tuple[int, ...]

    @property
    def uncorrectable(self) -> bool:
        return self.severity in ("fatal", "non-fatal")


@dataclass
class _Open:
    kind: str
    events: list[KernelEvent] = field(default_factory=list)
    closed: bool = False


def severity_class(printed: str | None) -> str:
    """'Uncorrected (Fatal)', 'Uncorrectable (Non-Fatal)', 'Corrected', 'Correctable' -> the class."""
    text = (printed or "").casefold()
    if "non-fatal" in text:
        return "non-fatal"
    if "fatal" in text:
        return "fatal"
    if text.startswith("correct"):
        return "corrected"
    return "unknown"


def decode(status_mask: str, corrected: bool) -> tuple[str, ...]:
    """'00004020/00000000' -> ('SDES', 'CmpltTO'): the set, unmasked bits the kernel names."""
    status, _, mask = status_mask.partition("/")
    bits = int(status, 16) & ~int(mask or "0", 16)
    table = CORRECTABLE_BITS if corrected else UNCORRECTABLE_BITS
    return tuple(table.get(i, f"bit {i}") for i in range(32) if bits >> i & 1)


def incidents(events: tuple[KernelEvent, ...] | list[KernelEvent]) -> tuple[PcieIncident, ...]:
    """The PCIe incidents of a log's events, in line order (see the module)."""
    done: list[_Open] = []
    open_by_host: dict[str | None, _Open] = {}
    for e in events:
        if e.kind not in KINDS:
            continue
        current = open_by_host.get(e.host)
        live = current is not None and not current.closed and e.line - current.events[-1].line <= WINDOW
        if e.kind == "aer" or not live or (e.kind in _LINK_KINDS and not _continues_link(current, e)):
            current = _Open(_start_kind(e.kind))
            done.append(current)
            open_by_host[e.host] = current
        current.events.append(e)
        if e.kind == "aer-recovery":
            current.closed = True
    return tuple(_record(o) for o in done)


def _start_kind(kind: str) -> str:
    return {"aer": "aer", "pcie-dpc": "containment", "pcie-link-down": "link-down",
            "pcie-card-removed": "card-removed"}.get(kind, "partial")


def _continues_link(current: _Open, e: KernelEvent) -> bool:
    """A link-down, removal or containment line continues an incident that began with one of
    them at the same port (pciehp prints Link Down then Card not present, DPC follows)."""
    return current.kind in ("link-down", "card-removed", "containment") and current.events[0].device == e.device


def _record(o: _Open) -> PcieIncident:
    first = o.events[0]
    devices: dict[str, None] = {}
    drivers: dict[str, str] = {}
    pci_ids: dict[str, str] = {}
    errors: dict[str, None] = {}
    severity, layer, recovery, port = "unknown", None, None, None
    unrecoverable: dict[str, None] = {}
    rank = {"unknown": 0, "corrected": 1, "non-fatal": 2, "fatal": 3}
    line_severity = "unknown"
    for e in o.events:
        if e.kind in ("aer", *_LINK_KINDS, "aer-recovery") and port is None:
            port = e.origin or e.device  # the printer; an aer line names the source, its origin the port
        for bdf in (e.origin, e.device):
            if bdf and not (bdf == _UNKNOWN_SOURCE and e.origin not in (None, bdf)):
                devices[bdf] = None
        printer = e.origin or e.device  # dev_printk's device: the one the driver owns
        if printer and e.driver:
            drivers.setdefault(printer, e.driver)
        if e.kind in ("aer", "aer-bus-error"):
            line_severity = severity_class(e.severity)
            severity = max(severity, line_severity, key=rank.get)
            layer = layer or (e.detail if e.kind == "aer-bus-error" else None)
        elif e.kind == "aer-status" and e.detail:
            if e.device and e.pci_id:
                pci_ids[e.device] = e.pci_id
            errors.update(dict.fromkeys(decode(e.detail, line_severity == "corrected")))
        elif e.kind == "aer-no-recovery" and e.device:
            unrecoverable[e.device] = None
        elif e.kind == "aer-recovery":
            recovery = e.detail
    ordered = ([port] if port else []) + [d for d in devices if d != port]
    return PcieIncident(
        kind=o.kind, severity=severity, line=first.line, host=first.host, timestamp=first.timestamp, port=port,
        devices=tuple(ordered), drivers=drivers, pci_ids=pci_ids, errors=tuple(errors), layer=layer,
        recovery=recovery, unrecoverable=tuple(unrecoverable),
        link_lost=any(e.kind in _LINK_KINDS for e in o.events), lines=tuple(e.line for e in o.events))


def seconds(stamp: str | None) -> float | None:
    """A log timestamp as seconds on one scale: dmesg's seconds since boot, or the wall clock of
    ISO, ``dmesg -T`` and syslog stamps (syslog has no year: only differences within one log are
    meaningful). None for ``dmesg -H`` deltas (``+0.000844``) and anything unreadable."""
    text = (stamp or "").strip()
    if not text or text.startswith("+"):
        return None
    try:
        return float(text)
    except ValueError:
        pass
    for shape in ("%a %b %d %H:%M:%S %Y", "%b %d %H:%M:%S"):
        try:
            return datetime.strptime(" ".join(text.split()), shape).timestamp()
        except ValueError:
            continue
    try:
        return datetime.fromisoformat(text.replace(",", ".").replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
