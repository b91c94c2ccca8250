"""Parser for ``lspci -vvv`` (probe ``lspci``): the PCIe link each device has and runs at.

Input is one block per device: a header at column 0, then tab-indented details, among them
the PCI Express capability's link lines::

    0000:05:00.0 Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]
    \\t\\tLnkCap:\\tPort #0, Speed 32GT/s, Width x16, ASPM not supported
    \\t\\tLnkSta:\\tSpeed 32GT/s (ok), Width x16 (ok)

Real variants handled:

- Newer pciutils annotate LnkSta with "(ok)", "(downgraded)" or "(strange)" (status above
  capability); older ones print no annotation and put the TrErr-/Train- flags on the same line.
  The annotation is lspci's own verdict and is taken when present; otherwise capability and
  status are compared.
- "Speed unknown": the installed pciutils cannot decode the speed code (too old for the
  link's PCIe generation). The speed is None, with a note.
- Excerpts grep'd down to the LnkCap/LnkSta lines, with no device header: each LnkCap, or a
  LnkSta with no LnkCap before it, begins a device whose address is unknown (bdf None).
- LnkCap2/LnkSta2 lines (supported speeds vector, equalisation state) are not mistaken for
  LnkCap/LnkSta.

A link below its capability is not always a fault: GPUs drop to 2.5GT/s when idle to save
power. Judging that is the check's job; the parser reports what lspci printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parse import ParseError

_HEADER = re.compile(r"((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(.+?)\s*")
_LINK_LINE = re.compile(r"\s*(LnkCap|LnkSta):\s*(.*)")
_SPEED = re.compile(r"Speed\s+(unknown|\d+(?:\.\d+)?)(?:GT/s)?(?:\s*\((\w+)\))?")
_WIDTH = re.compile(r"Width\s+x(\d+)(?:\s*\((\w+)\))?")
_GENERATIONS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


@dataclass(frozen=True)
class PciDevice:
    """One device's PCIe link: capability (LnkCap) and current status (LnkSta).

    ``bdf`` and ``description`` ("Ethernet controller: Mellanox ...") are None for a device
    read from a grep'd excerpt. ``speed_downgraded``/``width_downgraded`` are None when
    neither lspci's annotation nor both values are there to tell.
    """

    bdf: str | None
    description: str | None
    cap_speed_gts: float | None
    cap_width: int | None
    sta_speed_gts: float | None
    sta_width: int | None
    speed_downgraded: bool | None
    width_downgraded: bool | None
    notes: tuple[str, ...] = ()

    @property
    def downgraded(self) -> bool | None:
        """True if speed or width is below capability; None if that cannot be told."""
        flags = (self.speed_downgraded, self.width_downgraded)
        if True in flags:
            return True
        return None if None in flags else False


@dataclass
class _Builder:
    """A device being read (internal, mutable until frozen into PciDevice)."""

    bdf: str | None = None
    description: str | None = None
    cap: str | None = None
    sta: str | None = None
    notes: list[str] = field(default_factory=list)


def pcie_gen(speed_gts: float) -> int:
    """PCIe generation of a link speed: 2.5 -> 1, 5 -> 2, 8 -> 3, 16 -> 4, 32 -> 5, 64 -> 6."""
    try:
        return _GENERATIONS[float(speed_gts)]
    except KeyError:
        raise ValueError(f"{speed_gts} GT/s is not a PCIe link speed") from None


def parse_lspci(text: str) -> tuple[PciDevice, ...]:
    """Parse ``lspci -vvv`` output, or an excerpt of its link lines; see the module docstring."""
    builders: list[_Builder] = []
    for line in text.splitlines():
        header = _HEADER.fullmatch(line) if line[:1].strip() else None
        link = _LINK_LINE.fullmatch(line)
        if header:
            builders.append(_Builder(bdf=header.group(1), description=header.group(2)))
        elif link:
            kind, value = link.groups()
            slot = kind[3:].lower()  # "cap" or "sta"
            current = builders[-1] if builders else None
            # Without a header, a LnkCap after any link line, or a second LnkSta, can only
            # belong to the next device: lspci prints LnkCap before LnkSta, once per device.
            if current is None or (
                current.bdf is None
                and (getattr(current, slot) is not None or (slot == "cap" and current.sta))
            ):
                current = _Builder()
                builders.append(current)
            if getattr(current, slot) is not None:
                current.notes.append(f"second {kind} line ignored: {value.strip()!r}")
            else:
                setattr(current, slot, value)
    if not builders:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        raise ParseError(f"not lspci output: {first[:120]!r}" if first else "empty output")
    return tuple(_device(builder) for builder in builders)


def _device(builder: _Builder) -> PciDevice:
    notes = list(builder.notes)
    cap_speed, _, cap_width, _ = _link_fields("LnkCap", builder.cap, notes)
    sta_speed, speed_note, sta_width, width_note = _link_fields("LnkSta", builder.sta, notes)
    if builder.sta is not None and builder.cap is None:
        notes.append("no LnkCap line (excerpt?): downgrade known only from lspci's annotation")
    return PciDevice(
        bdf=builder.bdf,
        description=builder.description,
        cap_speed_gts=cap_speed,
        cap_width=cap_width,
        sta_speed_gts=sta_speed,
        sta_width=sta_width,
        speed_downgraded=_downgraded("speed", speed_note, sta_speed, cap_speed, notes),
        width_downgraded=_downgraded("width", width_note, sta_width, cap_width, notes),
        notes=tuple(notes),
    )


def _link_fields(
    kind: str, value: str | None, notes: list[str]
) -> tuple[float | None, str | None, int | None, str | None]:
    """(speed GT/s, its annotation, width, its annotation) from a LnkCap/LnkSta value."""
    if value is None:
        return None, None, None, None
    speed = _SPEED.search(value)
    width = _WIDTH.search(value)
    speed_gts = None
    if speed is None:
        notes.append(f"{kind}: no speed in {value.strip()!r}")
    elif speed.group(1) == "unknown":
        notes.append(f"{kind}: 'Speed unknown' (pciutils likely too old for this PCIe generation)")
    else:
        speed_gts = float(speed.group(1))
    if width is None:
        notes.append(f"{kind}: no width in {value.strip()!r}")
    return (
        speed_gts,
        speed.group(2) if speed else None,
        int(width.group(1)) if width else None,
        width.group(2) if width else None,
    )


def _downgraded(
    what: str, annotation: str | None, status: float | None, capability: float | None,
    notes: list[str],
) -> bool | None:
    if annotation == "strange":
        notes.append(f"LnkSta {what} above LnkCap: lspci calls it 'strange'")
    if annotation is not None:
        return annotation == "downgraded"
    if status is None or capability is None:
        return None
    return status < capability
