"""Parsers for RDMA device and port state: ``ibv_devinfo [-v]``, ``ibstat``, ``ibstatus`` and sysfs.

All four describe the same things in different spellings, and all four parse into the same
``IbInventory`` so a check never cares which tool a node had:

- ``ibv_devinfo``: ``hca_id: mlx5_0`` blocks, ``key: value`` padded with tabs (raw) or spaces
  (most pastes), ports opened by ``port: 1``; ``state: PORT_ACTIVE (4)``, ``port_lid: 65535``,
  ``active_mtu: 4096 (5)``. With ``-v`` there are many more device keys (some continued on
  bare flag lines) and per port ``phys_state: LINK_UP (5)``, ``active_width: 4X (2)``,
  ``active_speed: 100.0 Gbps (128)``.
- ``ibstat``: ``CA 'mlx5_0'`` blocks, ``Port 1:`` sections, ``State: Active``,
  ``Physical state: LinkUp``, ``Rate: 400``, ``Base lid: 0`` (RoCE), tab- or space-indented.
  It can abort half way with ``ibpanic: ... stat of IB device 'mlx5_8' failed``: what came
  before is kept and the abort noted.
- ``ibstatus``: ``Infiniband device 'mlx5_0' port 1 status:`` blocks of sysfs values
  (``state: 4: ACTIVE``, ``rate: 100 Gb/sec (4X EDR)``, ``base lid: 0x0``).
- the ``ib-sysfs`` probe: ``grep -H`` lines ``/sys/class/infiniband/mlx5_0/fw_ver:28.39.1002`` and
  ``/sys/class/infiniband/mlx5_0/ports/1/rate:400 Gb/sec (4X NDR)``.

Normalisation: port state is the upper-case word without its numeric code (``ACTIVE``, ``DOWN``,
``INIT``), physical state likewise with separators dropped (``LINKUP``, ``DISABLED``,
``POLLING``); GUIDs are 16 lower-case hex digits; ``hca_type`` is ``MT<vendor_part_id>``, which is
how ibstat and sysfs spell it, so ``ibv_devinfo``'s part id maps onto the same value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parse import ParseError, finite, is_number
from preflight.parse.garbled import garbled, shown


@dataclass(frozen=True)
class IbPort:
    """One port. ``lid`` stays 0 on RoCE and 65535 when no subnet manager assigned one."""

    number: int
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    width: str | None = None
    speed: str | None = None
    link_layer: str | None = None
    lid: int | None = None
    sm_lid: int | None = None
    active_mtu: int | None = None


@dataclass(frozen=True)
class IbDevice:
    """One RDMA device (``mlx5_0``). ``board_id`` is the PSID (``MT_0000000838``)."""

    name: str
    hca_type: str | None = None
    fw_ver: str | None = None
    board_id: str | None = None
    node_guid: str | None = None
    sys_image_guid: str | None = None
    vendor_part_id: int | None = None
    node_desc: str | None = None
    ports: tuple[IbPort, ...] = ()


@dataclass(frozen=True)
class IbInventory:
    """Every device one source listed. ``source``: ibv_devinfo, ibstat, ibstatus or sysfs."""

    devices: tuple[IbDevice, ...]
    notes: tuple[str, ...]
    source: str
    # Set when the tool failed part-way (ibstat's ibpanic on a device it could not stat): the
    # devices before it are kept, and this says the listing stopped; see preflight/judge/partial.py.
    cut: str | None = None


# --- shared value readers -------------------------------------------------------------------

_KV_RE = re.compile(r"^\s*([A-Za-z_][\w \[\]]*?):\s*(.*?)\s*$")
_CODE_SUFFIX_RE = re.compile(r"\s*\([0-9]+\)$")
_SYSFS_CODE_PREFIX_RE = re.compile(r"^[0-9]+:\s*")
# ibv_devinfo names the lane speed by its IB speed code; FDR10 and QDR share "10.0 Gbps".
_SPEED_CODES = {1: "SDR", 2: "DDR", 4: "QDR", 8: "FDR10", 16: "FDR", 32: "EDR", 64: "HDR",
                128: "NDR", 256: "XDR"}


def _word(raw: str) -> str:
    """``PORT_ACTIVE (4)``, ``4: ACTIVE``, ``Active`` -> ``ACTIVE``."""
    return _CODE_SUFFIX_RE.sub("", _SYSFS_CODE_PREFIX_RE.sub("", raw.strip())).upper()


def _state(raw: str) -> str | None:
    s = _word(raw).removeprefix("PORT_")
    # ibstat spells INIT out; sysfs and ibv_devinfo do not.
    return {"INITIALIZING": "INIT"}.get(s, s) or None


def _phys_state(raw: str) -> str | None:
    # LINK_UP (ibv_devinfo), LinkUp (ibstat, sysfs), Phy Test (sysfs) all become one word.
    return re.sub(r"[\s_]", "", _word(raw)) or None


def _int(raw: str | None) -> int | None:
    if raw is None:
        return None
    match = re.match(r"\s*(?:0x([0-9a-fA-F]{1,16})|([0-9]{1,19}))", raw)
    if not match:
        return None
    # Base given, not 0: int("09", 0) refuses a leading zero; and bounded, so a run of digits
    # from a damaged capture is not read as a number Python refuses to convert.
    return int(match.group(1), 16) if match.group(1) else int(match.group(2))


def _guid(raw: str | None) -> str | None:
    if raw is None:
        return None
    s = raw.strip().lower().removeprefix("0x").replace(":", "")
    return s if re.fullmatch(r"[0-9a-f]{16}", s) else None


def _part_id_from_type(hca_type: str) -> int | None:
    match = re.fullmatch(r"MT([0-9]+)", hca_type.strip())
    return int(match.group(1)) if match else None


def _sysfs_rate(raw: str) -> tuple[float | None, str | None, str | None]:
    """``400 Gb/sec (4X NDR)`` -> (400.0, "4X", "NDR"); a bare ``200`` (ibstat) -> (200.0, None, None)."""
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:Gb/sec)?\s*(?:\(([0-9]+X)\s*([A-Z0-9]+)?\))?", raw)
    if not match:
        return None, None, None
    return finite(match.group(1)), match.group(2), match.group(3)


class _PortBuilder:
    """Mutable accumulator for one port while its lines are read."""

    def __init__(self, number: int):
        self.number = number
        self.values: dict[str, object] = {}
        self.lane_gbps: float | None = None

    def set(self, key: str, value: object) -> None:
        if value is not None:
            self.values[key] = value

    def build(self) -> IbPort:
        values = dict(self.values)
        width = values.get("width")
        if "rate_gbps" not in values and width and self.lane_gbps is not None:
            # ibv_devinfo -v gives lanes and per-lane speed, not the total.
            values["rate_gbps"] = int(str(width).rstrip("X")) * self.lane_gbps
        return IbPort(number=self.number, **values)


@dataclass
class _DeviceBuilder:
    name: str
    values: dict[str, object] = field(default_factory=dict)
    ports: dict[int, _PortBuilder] = field(default_factory=dict)
    declared_ports: int | None = None

    unreadable: list[str] = field(default_factory=list)

    def port(self, number: int) -> _PortBuilder:
        return self.ports.setdefault(number, _PortBuilder(number))

    def set(self, key: str, value: object) -> None:
        if isinstance(value, str) and garbled(value):
            # Damage, not another firmware or PSID (preflight.parse.garbled): left unknown.
            self.unreadable.append(f"{self.name}: {key} unreadable: bytes that are not text in {shown(value)}")
        elif value is not None:
            self.values[key] = value

    def build(self) -> IbDevice:
        values = dict(self.values)
        if "hca_type" not in values and "vendor_part_id" in values:
            values["hca_type"] = f"MT{values['vendor_part_id']}"
        if "vendor_part_id" not in values:
            part = _part_id_from_type(str(values.get("hca_type") or ""))
            if part is not None:
                values["vendor_part_id"] = part
        ports = tuple(self.ports[n].build() for n in sorted(self.ports))
        return IbDevice(name=self.name, ports=ports, **values)

    def truncation_note(self) -> str | None:
        # Every RDMA device has a port, so a device without one was cut off mid-listing.
        if self.declared_ports is not None and len(self.ports) < self.declared_ports:
            return (f"{self.name}: {self.declared_ports} port(s) declared, {len(self.ports)} listed "
                    "(output cut short?)")
        if not self.ports:
            return f"{self.name}: no port listed (output cut short?)"
        return None


def _finish(builders: list[_DeviceBuilder], notes: list[str], source: str) -> IbInventory:
    notes = notes + [n for b in builders for n in b.unreadable] + [n for b in builders if (n := b.truncation_note())]
    return IbInventory(devices=tuple(b.build() for b in builders), notes=tuple(notes), source=source)


def _reject(text: str, tool: str) -> str:
    stripped = text.strip()
    if not stripped:
        raise ParseError(f"{tool}: empty output")
    first = stripped.splitlines()[0]
    if re.search(r"command not found|: not found", first) and tool in first:
        raise ParseError(f"{tool}: shell error: {first}")
    return stripped


# --- ibv_devinfo ----------------------------------------------------------------------------

# Bytes that are no text: U+FFFD is what invalid UTF-8 decodes to (ProbeResult.text), and
# control characters other than tab never appear in these tools' output.
_UNDECODABLE = re.compile(r"[\ufffd\x00-\x08\x0b-\x1f\x7f]")
# What is left of a device name (mlx5_3, rxe0) at the end of a damaged ``hca_id:`` line.
_NAME_TAIL = re.compile(r"(?<![\w.-])([A-Za-z][\w.-]*[0-9])\s*$")


def undecodable_lines(text: str, tool: str) -> list[str]:
    """A note for each line holding bytes that are not text, naming its number."""
    return [f"{tool} line {n}: bytes that are not text ({line.strip()[:60]!r}): unreadable"
            for n, line in enumerate(text.splitlines(), 1) if _UNDECODABLE.search(line)]


def parse_ibv_devinfo(text: str) -> IbInventory:
    """Parse ``ibv_devinfo`` or ``ibv_devinfo -v``.

    Read block by block: ``hca_id:`` opens a device at the start of a line. A line there that
    holds bytes that are not text (invalid UTF-8) and no ``key: value`` is a device header
    damaged, not a line to skip: skipped, its device's lines would land in the device before
    it, and an 8-NIC node would list 7. When what is left of the line ends in a device name, it
    opens that device, and the damage is noted (any such line is)."""
    stripped = _reject(text, "ibv_devinfo")
    builders: list[_DeviceBuilder] = []
    notes: list[str] = []
    device: _DeviceBuilder | None = None
    port: _PortBuilder | None = None
    for line in stripped.splitlines():
        kv = _KV_RE.match(line)
        if not kv:
            if line.strip().startswith("No IB devices found"):
                notes.append(line.strip())
            elif (line[:1].strip() and _UNDECODABLE.search(line) and (device is None or device.ports)
                  and (tail := _NAME_TAIL.search(_UNDECODABLE.sub(" ", line)))):
                name = tail.group(1)
                device, port = _DeviceBuilder(name), None
                builders.append(device)
                notes.append(f"ibv_devinfo: device header unreadable ({line.strip()[:60]!r}), read as {name}")
            continue  # -v flag continuation lines
        key, value = kv.groups()
        if key == "hca_id":
            device, port = _DeviceBuilder(value), None
            builders.append(device)
        elif device is None:
            continue
        elif key == "port":
            port = device.port(int(value)) if is_number(value) else None
        elif port is not None:
            _ibv_port_value(port, key, value)
        else:
            _ibv_device_value(device, key, value)
    if not builders and not notes:
        raise ParseError("ibv_devinfo: no 'hca_id:' line")
    return _finish(builders, undecodable_lines(stripped, "ibv_devinfo") + notes, "ibv_devinfo")


def _ibv_device_value(device: _DeviceBuilder, key: str, value: str) -> None:
    if key in ("fw_ver", "board_id"):
        device.set(key, value or None)
    elif key in ("node_guid", "sys_image_guid"):
        device.set(key, _guid(value))
    elif key == "vendor_part_id":
        device.set(key, _int(value))
    elif key == "phys_port_cnt":
        device.declared_ports = _int(value)


def _ibv_port_value(port: _PortBuilder, key: str, value: str) -> None:
    if key == "state":
        port.set("state", _state(value))
    elif key == "phys_state":
        port.set("phys_state", _phys_state(value))
    elif key == "link_layer":
        port.set("link_layer", value or None)
    elif key == "port_lid":
        port.set("lid", _int(value))
    elif key == "sm_lid":
        port.set("sm_lid", _int(value))
    elif key == "active_mtu":
        port.set("active_mtu", _int(value))
    elif key == "active_width":
        width = re.match(r"([0-9]+X)", value)
        port.set("width", width.group(1) if width else None)
    elif key == "active_speed":
        lane = re.match(r"([0-9]+(?:\.[0-9]+)?)\s*Gbps(?:\s*\(([0-9]+)\))?", value)
        if lane:
            port.lane_gbps = finite(lane.group(1))
            if lane.group(2):
                port.set("speed", _SPEED_CODES.get(int(lane.group(2))))


# --- ibstat / ibstatus ----------------------------------------------------------------------

_CA_RE = re.compile(r"^CA '([^']+)'")
_IBSTATUS_RE = re.compile(r"^Infiniband device '([^']+)' port ([0-9]+) status:")


def parse_ibstat(text: str) -> IbInventory:
    """Parse ``ibstat`` (all CAs or one); ``ibstatus`` output is recognised and read too."""
    stripped = _reject(text, "ibstat")
    if not re.search(r"^CA '", stripped, re.M) and re.search(r"^Infiniband device '", stripped, re.M):
        return parse_ibstatus(text)
    builders: list[_DeviceBuilder] = []
    notes: list[str] = []
    device: _DeviceBuilder | None = None
    port: _PortBuilder | None = None
    skipped = 0
    for line in stripped.splitlines():
        s = line.strip()
        if s.startswith(("ibpanic:", "ibwarn:", "ibstat:")):
            notes.append(f"ibstat stopped or warned: {s}" if s.startswith("ibpanic") else s)
            continue
        ca = _CA_RE.match(s)
        if ca:
            device, port = _DeviceBuilder(ca.group(1)), None
            builders.append(device)
            continue
        if device is None:
            skipped += bool(s)
            continue
        port_header = re.match(r"^Port ([0-9]+):$", s)
        if port_header:
            port = device.port(int(port_header.group(1)))
            continue
        kv = _KV_RE.match(line)
        if not kv:
            continue
        key, value = kv.groups()
        if port is not None:
            _ibstat_port_value(port, key, value)
        else:
            _ibstat_device_value(device, key, value)
    if not builders and not notes:
        raise ParseError("ibstat: no \"CA '...'\" header")
    if skipped:
        notes.append(f"{skipped} line(s) before the first CA header ignored")
    return _finish(builders, notes, "ibstat")


def _ibstat_device_value(device: _DeviceBuilder, key: str, value: str) -> None:
    if key == "CA type":
        device.set("hca_type", value or None)
    elif key == "Firmware version":
        device.set("fw_ver", value or None)
    elif key == "Node GUID":
        device.set("node_guid", _guid(value))
    elif key == "System image GUID":
        device.set("sys_image_guid", _guid(value))
    elif key == "Number of ports":
        device.declared_ports = _int(value)


def _ibstat_port_value(port: _PortBuilder, key: str, value: str) -> None:
    if key == "State":
        port.set("state", _state(value))
    elif key == "Physical state":
        port.set("phys_state", _phys_state(value))
    elif key == "Rate":
        port.set("rate_gbps", _sysfs_rate(value)[0])
    elif key == "Base lid":
        port.set("lid", _int(value))
    elif key == "SM lid":
        port.set("sm_lid", _int(value))
    elif key == "Link layer":
        port.set("link_layer", value or None)


def parse_ibstatus(text: str) -> IbInventory:
    """Parse ``ibstatus``: one block per device port, values as sysfs spells them."""
    stripped = _reject(text, "ibstatus")
    builders: dict[str, _DeviceBuilder] = {}
    port: _PortBuilder | None = None
    for line in stripped.splitlines():
        header = _IBSTATUS_RE.match(line.strip())
        if header:
            device = builders.setdefault(header.group(1), _DeviceBuilder(header.group(1)))
            port = device.port(int(header.group(2)))
            continue
        kv = _KV_RE.match(line)
        if port is None or not kv:
            continue
        key, value = kv.groups()
        _sysfs_port_value(port, key.replace(" ", "_"), value)
    if not builders:
        raise ParseError("ibstatus: no \"Infiniband device '...' port N status:\" header")
    return _finish(list(builders.values()), [], "ibstatus")


# --- sysfs ----------------------------------------------------------------------------------

_SYSFS_RE = re.compile(r"^/sys/class/infiniband/([^/]+)/(?:ports/([0-9]+)/)?([\w]+):(.*)$")


def _sysfs_port_value(port: _PortBuilder, key: str, value: str) -> None:
    """Port files of /sys/class/infiniband (ibstatus prints the same values)."""
    if key == "state":
        port.set("state", _state(value))
    elif key == "phys_state":
        port.set("phys_state", _phys_state(value))
    elif key == "rate":
        rate, width, speed = _sysfs_rate(value)
        port.set("rate_gbps", rate)
        port.set("width", width)
        port.set("speed", speed)
    elif key == "link_layer":
        port.set("link_layer", value.strip() or None)
    elif key in ("lid", "base_lid"):
        port.set("lid", _int(value))
    elif key == "sm_lid":
        port.set("sm_lid", _int(value))


def parse_ib_sysfs(text: str) -> IbInventory:
    """Parse the ``ib-sysfs`` probe: ``path:value`` lines from ``grep -H .`` over sysfs files."""
    stripped = _reject(text, "grep")
    builders: dict[str, _DeviceBuilder] = {}
    notes: list[str] = []
    unread = 0
    for line in stripped.splitlines():
        match = _SYSFS_RE.match(line.strip())
        if not match:
            if line.startswith("grep:"):
                notes.append(line.strip())
            else:
                unread += bool(line.strip())
            continue
        name, port_number, key, value = match.groups()
        device = builders.setdefault(name, _DeviceBuilder(name))
        if port_number is not None:
            _sysfs_port_value(device.port(int(port_number)), key, value)
        elif key in ("fw_ver", "board_id", "hca_type", "node_desc"):
            device.set(key, value.strip() or None)
        elif key in ("node_guid", "sys_image_guid"):
            device.set(key, _guid(value))
    if not builders and not notes:
        raise ParseError("ib-sysfs: no /sys/class/infiniband lines")
    if unread:
        notes.append(f"{unread} line(s) not of the form /sys/class/infiniband/...:value ignored")
    return _finish(list(builders.values()), notes, "sysfs")
