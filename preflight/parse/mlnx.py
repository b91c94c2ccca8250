"""Parsers for the mlx5 driver and ConnectX firmware tools.

Inputs, as real captures show them:

- ``ethtool -i IFACE``: ``key: value`` lines (``driver: mlx5_core``, ``version: 23.10-1.1.9``,
  ``firmware-version: 28.39.3560 (MT_0000000838)``, ``expansion-rom-version:`` often empty or
  with a trailing space). The ``ethtool-i`` probe concatenates one block per netdev, each
  headed by ``== IFACE ==``; a single block without a header is read too.
- ``modinfo mlx5_core``: ``key:   value`` lines, repeated ``alias:`` and ``parm:`` keys, and
  signature lines continued with leading blanks. Inbox modules have ``intree: Y`` and no
  ``version:``; OFED/DOCA builds live under ``/updates/`` with ``version: 24.10-2.1.8``.
- ``ofed_info -s``: one line, ``MLNX_OFED_LINUX-24.10-3.2.5.0:`` or
  ``OFED-internal-24.07-0.3.5.0.110:``; plain ``ofed_info`` opens with
  ``MLNX_OFED_LINUX-4.5-1.0.1.0 (OFED-4.5-1.0.1):`` followed by package lists.
- ``mlxfwmanager --query`` and ``mlxup --query``: ``Device #N:`` blocks with ``Key: value``
  lines, a ``Versions: Current Available`` table (``N/A`` where nothing is available) and a
  ``Status:``. The table's ``FW`` row is the firmware on the flash; a ``FW (Running)`` row
  follows (not always next) only when the NIC still runs another one, i.e. new firmware was
  burnt and the NIC not reset since (MFT's ``mlxfwmanager`` adds that row only when the running
  version differs from the flashed one); ``--query-format XML`` gives ``<Device pciName= type= psid= partNumber=>``
  elements; ``flint``/``mstflint ... q`` gives ``FW Version:``, ``PSID:``, ``Rom Info:`` for one
  device. Tool errors (``-E- Cannot open Device: ... MFE_CR_ERROR``) become notes.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from preflight.parse import ParseError
from preflight.parse.xml_damage import pull_events

_SHELL_ERROR_RE = re.compile(r"command not found|: not found|No such file or directory", re.I)


def _reject_non_output(text: str, tool: str) -> None:
    """Raise ParseError for text that is no output of ``tool`` at all."""
    stripped = text.strip()
    if not stripped:
        raise ParseError(f"{tool}: empty output")
    first = stripped.splitlines()[0]
    if _SHELL_ERROR_RE.search(first) and tool in first:
        raise ParseError(f"{tool}: shell error: {first.strip()}")


# --- ethtool -i ---------------------------------------------------------------------------

@dataclass(frozen=True)
class EthtoolInfo:
    """One interface's ``ethtool -i``.

    ``firmware_version`` is only the version token (``28.39.3560``); ``firmware_raw`` keeps the
    whole field and ``psid`` the board id mlx5 appends in parentheses.
    """

    iface: str | None
    driver: str | None = None
    version: str | None = None
    firmware_version: str | None = None
    firmware_raw: str | None = None
    psid: str | None = None
    expansion_rom_version: str | None = None
    bus_info: str | None = None
    notes: tuple[str, ...] = ()


_ETHTOOL_HEADER_RE = re.compile(r"^==\s*(\S+)\s*==\s*$")
_ETHTOOL_KV_RE = re.compile(r"^([a-z][a-z-]*):\s?(.*)$")
_FW_PSID_RE = re.compile(r"\(([^()]+)\)\s*$")


def parse_ethtool_i(text: str) -> tuple[EthtoolInfo, ...]:
    """Parse ``== IFACE ==``-headed ``ethtool -i`` blocks, or one bare block."""
    _reject_non_output(text, "ethtool")
    blocks: list[tuple[str | None, list[str]]] = []
    current: tuple[str | None, list[str]] | None = None
    for line in text.splitlines():
        header = _ETHTOOL_HEADER_RE.match(line.strip())
        if header:
            current = (header.group(1), [])
            blocks.append(current)
        elif line.strip():
            if current is None:
                current = (None, [])
                blocks.append(current)
            current[1].append(line)
    infos = tuple(_ethtool_block(iface, lines) for iface, lines in blocks)
    if not any(i.driver or i.iface for i in infos):
        raise ParseError("ethtool -i: no 'driver:' line and no '== IFACE ==' header")
    return infos


def _ethtool_block(iface: str | None, lines: list[str]) -> EthtoolInfo:
    values: dict[str, str] = {}
    notes: list[str] = []
    for line in lines:
        kv = _ETHTOOL_KV_RE.match(line.strip())
        if kv:
            values[kv.group(1)] = kv.group(2).strip()
        else:
            # ethtool's own failures ("Cannot get driver information: No such device").
            notes.append(line.strip())
    if not lines:
        notes.append("no ethtool -i output for this interface")
    fw_raw = values.get("firmware-version") or None
    fw_token = fw_raw.split()[0] if fw_raw else None
    psid = _FW_PSID_RE.search(fw_raw) if fw_raw else None
    return EthtoolInfo(
        iface=iface,
        driver=values.get("driver") or None,
        version=values.get("version") or None,
        firmware_version=fw_token,
        firmware_raw=fw_raw,
        psid=psid.group(1) if psid else None,
        expansion_rom_version=values.get("expansion-rom-version") or None,
        bus_info=values.get("bus-info") or None,
        notes=tuple(notes),
    )


# --- modinfo mlx5_core --------------------------------------------------------------------

@dataclass(frozen=True)
class ModInfo:
    """``modinfo`` of one kernel module.

    ``pci_device_ids`` are the Mellanox (vendor 0x15b3) device ids from the ``alias:`` lines:
    the adapters this build of the driver knows (0x1021 ConnectX-7, 0x1023 ConnectX-8).
    """

    filename: str | None
    name: str | None = None
    version: str | None = None
    vermagic: str | None = None
    srcversion: str | None = None
    depends: tuple[str, ...] = ()
    intree: bool | None = None
    pci_device_ids: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def kernel_release(self) -> str | None:
        """The kernel the module was built for: vermagic's first word, else its /lib/modules dir."""
        if self.vermagic:
            return self.vermagic.split()[0]
        match = re.search(r"/lib/modules/([^/]+)/", self.filename or "")
        return match.group(1) if match else None

    @property
    def out_of_tree(self) -> bool:
        # OFED/DOCA install under updates/ (DKMS) or extra/ (kmod RPMs); only they set a version.
        path = self.filename or ""
        return self.version is not None or "/updates/" in path or "/extra/" in path


_MODINFO_KV_RE = re.compile(r"^([a-z_]+):\s*(.*?)\s*$")
_PCI_ALIAS_RE = re.compile(r"^pci:v000015B3d0000([0-9A-Fa-f]{4})", re.I)


def parse_modinfo(text: str) -> ModInfo:
    """Parse ``modinfo MODULE`` output."""
    _reject_non_output(text, "modinfo")
    values: dict[str, str] = {}
    pci_ids: list[int] = []
    notes: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line[0].isspace():
            continue  # continuation of a multi-line signature
        if line.startswith("modinfo: ERROR"):
            notes.append(line.strip())
            continue
        kv = _MODINFO_KV_RE.match(line)
        if not kv:
            notes.append(f"unrecognised line: {line.strip()}")
            continue
        key, value = kv.groups()
        if key == "alias":
            pci = _PCI_ALIAS_RE.match(value)
            if pci:
                pci_ids.append(int(pci.group(1), 16))
        elif key not in values:
            values[key] = value
    if not values and not any(n.startswith("modinfo: ERROR") for n in notes):
        raise ParseError("modinfo: no 'key: value' lines")
    intree = values.get("intree")
    return ModInfo(
        filename=values.get("filename"),
        name=values.get("name"),
        version=values.get("version") or None,
        vermagic=values.get("vermagic"),
        srcversion=values.get("srcversion"),
        depends=tuple(d for d in values.get("depends", "").split(",") if d),
        intree=None if intree is None else intree.upper() == "Y",
        pci_device_ids=tuple(pci_ids),
        notes=tuple(notes),
    )


# --- ofed_info -s -------------------------------------------------------------------------

@dataclass(frozen=True)
class OfedInfo:
    """The installed OFED as ``ofed_info -s`` names it.

    ``raw`` is the line as printed (``MLNX_OFED_LINUX-24.10-3.2.5.0:``), ``distribution`` the
    part before the version (``MLNX_OFED_LINUX``, ``OFED-internal``), ``version`` the rest.
    """

    raw: str
    distribution: str | None = None
    version: str | None = None
    notes: tuple[str, ...] = ()


_OFED_LINE_RE = re.compile(
    r"^(?P<dist>[A-Za-z][\w-]*?)-(?P<ver>(?:doca[0-9]+(?:\.[0-9]+)+-)?[0-9]+\.[0-9]+-[0-9]+(?:\.[0-9]+)*)"
    r"(?:\s*\(.*\))?:?\s*$"
)


def parse_ofed_info(text: str) -> OfedInfo:
    """Parse ``ofed_info -s`` (or the first line of plain ``ofed_info``)."""
    _reject_non_output(text, "ofed_info")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0]
    notes = []
    if len(lines) > 1:
        notes.append(f"{len(lines)} lines where ofed_info -s prints one: read the first")
    match = _OFED_LINE_RE.match(first)
    if not match:
        if not re.search(r"[0-9]+\.[0-9]+-[0-9]+", first):
            raise ParseError(f"ofed_info: no OFED release in {first!r}")
        # A release string in a naming this parser does not know yet: keep it for the report.
        return OfedInfo(raw=first, notes=tuple(notes) + (f"unrecognised OFED line: {first}",))
    return OfedInfo(raw=first, distribution=match.group("dist"), version=match.group("ver"),
                    notes=tuple(notes))


# --- mlxfwmanager / mlxup / flint ---------------------------------------------------------

RUNNING_FW = "FW (Running)"


@dataclass(frozen=True)
class FirmwareComponent:
    """One row of the Versions table: FW, FW (Running), PXE, UEFI, CLP. ``available`` is None for N/A."""

    name: str
    current: str | None
    available: str | None = None


@dataclass(frozen=True)
class FirmwareDevice:
    """One adapter as a firmware query tool reports it."""

    index: int | None = None
    device_type: str | None = None
    part_number: str | None = None
    description: str | None = None
    psid: str | None = None
    pci_name: str | None = None
    base_mac: str | None = None
    base_guid: str | None = None
    status: str | None = None
    components: tuple[FirmwareComponent, ...] = ()

    def component(self, name: str) -> FirmwareComponent | None:
        return next((c for c in self.components if c.name == name), None)

    @property
    def fw_current(self) -> str | None:
        fw = self.component("FW")
        return fw.current if fw else None

    @property
    def fw_available(self) -> str | None:
        fw = self.component("FW")
        return fw.available if fw else None

    @property
    def fw_running(self) -> str | None:
        """The firmware the NIC runs: the ``FW (Running)`` row where there is one, else the
        flashed ``FW``, which the tool then reports as running too."""
        running = self.component(RUNNING_FW)
        return running.current if running and running.current else self.fw_current

    @property
    def reset_pending(self) -> bool:
        """New firmware on the flash that the NIC does not run yet (it needs a reset)."""
        running = self.component(RUNNING_FW)
        return bool(running and running.current and self.fw_current and running.current != self.fw_current)


@dataclass(frozen=True)
class FirmwareQuery:
    """All adapters one query reported.

    ``source`` is the format read: ``mlxfwmanager`` (text, also mlxup's), ``mlxfwmanager-xml``,
    ``flint``, or ``error`` when the tool only printed ``-E-`` lines (the firmware is unknown).
    """

    devices: tuple[FirmwareDevice, ...]
    source: str
    notes: tuple[str, ...] = ()


def _na(value: str | None) -> str | None:
    return None if value is None or value.strip() in ("", "N/A") else value.strip()


def parse_mlxfwmanager(text: str) -> FirmwareQuery:
    """Parse ``mlxfwmanager --query`` / ``mlxup --query``, their XML form, or ``flint ... q``."""
    _reject_non_output(text, "mlxfwmanager")
    stripped = text.strip()
    if stripped.startswith("<"):
        return _parse_fw_xml(stripped)
    if re.search(r"^Device #[0-9]+:", text, re.M):
        return _parse_fw_text(text)
    if re.search(r"^FW Version:", text, re.M):
        return _parse_flint(text)
    tool_lines = [line.strip() for line in text.splitlines() if re.match(r"\s*-[EWI]-", line)]
    if tool_lines:
        # The tool ran and said why it could not read the adapter: an answer, not garbage.
        return FirmwareQuery(devices=(), source="error", notes=tuple(tool_lines))
    raise ParseError("not mlxfwmanager, mlxup or flint query output")


_FW_KV_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 ]*?):\s*(.*?)\s*$")
# "     FW             28.47.1026     28.47.1026", "     FW (Running)   28.46.3048     N/A".
_FW_ROW_RE = re.compile(r"^\s+([A-Z][A-Za-z0-9]*(?: \([A-Za-z]+\))?)\s+(\S+)(?:\s+(\S+))?\s*$")
_FW_FIELDS = {
    "Device Type": "device_type", "Part Number": "part_number", "Description": "description",
    "PSID": "psid", "PCI Device Name": "pci_name", "Base MAC": "base_mac",
    "Base GUID": "base_guid", "Status": "status",
}


def _parse_fw_text(text: str) -> FirmwareQuery:
    devices: list[FirmwareDevice] = []
    notes: list[str] = []
    current: dict | None = None
    in_versions = False

    def close() -> None:
        if current is not None:
            devices.append(FirmwareDevice(**current))

    for line in text.splitlines():
        header = re.match(r"^Device #([0-9]+):", line)
        if header:
            close()
            current = {"index": int(header.group(1)), "components": ()}
            in_versions = False
            continue
        if re.match(r"\s*-[EWI]-", line):
            notes.append(line.strip())
            continue
        if current is None or not line.strip() or set(line.strip()) == {"-"}:
            in_versions = in_versions and bool(line.strip())
            continue
        row = _FW_ROW_RE.match(line) if in_versions else None
        if row:
            name, cur, avail = row.groups()
            current["components"] += (FirmwareComponent(name, _na(cur), _na(avail)),)
            continue
        kv = _FW_KV_RE.match(line)
        if kv:
            key, value = kv.groups()
            in_versions = key == "Versions"
            if key in _FW_FIELDS:
                current[_FW_FIELDS[key]] = value or None
    close()
    if not devices:
        notes.append("no 'Device #N:' block could be read")
    return FirmwareQuery(devices=tuple(devices), source="mlxfwmanager", notes=tuple(notes))


def _parse_fw_xml(text: str) -> FirmwareQuery:
    devices: list[FirmwareDevice] = []
    notes: list[str] = []
    for elem in _closed_elements(text, notes):
        if elem.tag != "Device":
            continue
        versions = elem.find("Versions")
        components = tuple(
            FirmwareComponent(v.tag, _na(v.get("current")), _na(v.get("available")))
            for v in (versions if versions is not None else [])
        )
        macs, guids = elem.find("MACs"), elem.find("GUIDs")
        devices.append(FirmwareDevice(
            device_type=elem.get("type"),
            part_number=elem.get("partNumber"),
            description=(elem.findtext("Description") or "").strip() or None,
            psid=elem.get("psid"),
            pci_name=elem.get("pciName"),
            base_mac=macs.get("Base_Mac") if macs is not None else None,
            base_guid=guids.get("Base_Guid") if guids is not None else None,
            status=(elem.findtext("Status") or "").strip() or None,
            components=components,
        ))
    return FirmwareQuery(devices=tuple(devices), source="mlxfwmanager-xml", notes=tuple(notes))


def _closed_elements(text: str, notes: list[str]) -> list[ET.Element]:
    """Every element that closed before the XML broke off: a cut-off capture still yields every
    <Device> that closed before the cut."""
    events, error = pull_events(text, ("end",))
    closed = [elem for _, elem in events]
    if error is not None:
        notes.append(f"XML ends early or is malformed ({error}); kept the complete devices")
    return closed


_ROM_RE = re.compile(r"type=(\w+)\s+version=(\S+)")


def _parse_flint(text: str) -> FirmwareQuery:
    values: dict[str, str] = {}
    components: list[FirmwareComponent] = []
    notes: list[str] = []
    last_key = None
    for line in text.splitlines():
        if re.match(r"\s*-[EWI]-", line):
            notes.append(line.strip())
            continue
        kv = _FW_KV_RE.match(line) if line[:1].strip() else None
        if kv:
            last_key, value = kv.groups()
            values.setdefault(last_key, value)
        else:
            value = line.strip()
        # "Rom Info:" continues on indented lines, one expansion ROM per line.
        if last_key == "Rom Info":
            rom = _ROM_RE.search(value)
            if rom:
                components.append(FirmwareComponent(rom.group(1), rom.group(2)))
    fw = values.get("FW Version")
    base_guid = values.get("Base GUID", "").split()
    base_mac = values.get("Base MAC", "").split()
    device = FirmwareDevice(
        psid=_na(values.get("PSID")),
        base_guid=base_guid[0] if base_guid else None,
        base_mac=base_mac[0] if base_mac else None,
        components=(FirmwareComponent("FW", _na(fw)),) + tuple(components),
    )
    return FirmwareQuery(devices=(device,), source="flint", notes=tuple(notes))


__all__ = [
    "RUNNING_FW", "EthtoolInfo", "FirmwareComponent", "FirmwareDevice", "FirmwareQuery", "ModInfo", "OfedInfo",
    "parse_ethtool_i", "parse_mlxfwmanager", "parse_modinfo", "parse_ofed_info",
]
