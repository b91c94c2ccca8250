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

Identity: ``vendor_id``/``device_id`` are read from the header when it carries them: the
``[10de:3182]`` of ``lspci -nn``, or the ``NVIDIA Corporation Device 3182`` that lspci prints
when its pci.ids is older than the device (seen on B300 hosts). A header lspci could name
("GH100 [H100 SXM5 80GB]") carries no id, and none is guessed from the name; its bracketed
pci.ids name is kept as ``product``.
``device_class`` is the text before the colon ("3D controller"); ``nvidia_gpus`` picks the
NVIDIA display-class devices, which leaves out NVSwitches (class "Bridge") and audio functions.

A link below its capability is not always a fault: GPUs drop to 2.5GT/s when idle to save
power. Judging that is the check's job; the parser reports what lspci printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parse import ParseError, finite

_HEADER = re.compile(r"((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(.+?)\s*")
_LINK_LINE = re.compile(r"\s*(LnkCap|LnkSta):\s*(.*)")
_SPEED = re.compile(r"Speed\s+(unknown|[0-9]+(?:\.[0-9]+)?)(?:GT/s)?(?:\s*\((\w+)\))?")
_WIDTH = re.compile(r"Width\s+x([0-9]+)(?:\s*\((\w+)\))?")
_GENERATIONS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}
_NN_ID = re.compile(r"\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")
_BRACKETED = re.compile(r"\[([^\]]+)\]")
_UNNAMED = re.compile(r"(NVIDIA Corporation|Mellanox Technologies) Device ([0-9a-fA-F]{4})\b")
# Vendor names lspci prints, for headers without -nn; only the vendors preflight judges.
_VENDORS = {"NVIDIA Corporation": 0x10DE, "Mellanox Technologies": 0x15B3}
NVIDIA = 0x10DE
_DISPLAY_CLASSES = ("3D controller", "VGA compatible controller", "Display controller")


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
    vendor_id: int | None = None
    device_id: int | None = None
    device_class: str | None = None
    product: str | None = None  # pci.ids' bracketed name ("H100 SXM5 80GB"), where lspci printed one

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
        **_identity(builder.description),
    )


def _identity(description: str | None) -> dict:
    """vendor_id, device_id and device_class from a header's description, where it says them."""
    if not description:
        return {}
    device_class, _, rest = description.partition(":")
    out: dict = {"device_class": re.sub(r"\s*\[[0-9a-fA-F]{4}\]$", "", device_class.strip())}
    ids = _NN_ID.findall(rest)
    unnamed = _UNNAMED.search(rest)
    named = [b for b in _BRACKETED.findall(rest) if not _NN_ID.fullmatch(f"[{b}]")]
    if named:
        out["product"] = named[-1]
    if ids:
        # The device's own [vendor:device] is the last bracket pair before "(rev ..)".
        vendor, device = ids[-1]
        out.update(vendor_id=int(vendor, 16), device_id=int(device, 16))
    elif unnamed:
        out.update(vendor_id=_VENDORS[unnamed.group(1)], device_id=int(unnamed.group(2), 16))
    else:
        vendor = next((v for name, v in _VENDORS.items() if rest.strip().startswith(name)), None)
        out["vendor_id"] = vendor
    return out


def nvidia_gpus(devices: tuple[PciDevice, ...]) -> tuple[PciDevice, ...]:
    """The NVIDIA GPUs among the devices: display-class functions of vendor 0x10de."""
    return tuple(d for d in devices if d.vendor_id == NVIDIA and d.device_class in _DISPLAY_CLASSES)


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
        speed_gts = finite(speed.group(1))
        if speed_gts is None:
            notes.append(f"{kind}: speed {speed.group(1)[:20]!r} is not a number")
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
