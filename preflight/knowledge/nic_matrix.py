"""The ConnectX firmware x mlx5 driver matrix: which firmware a driver release expects, and why.

The knowledge is data, ``playbooks/nic_firmware.yaml`` (format ``preflight-nic-firmware/1``,
every row sourced); a site's policy file of the same shape is merged over it (see ``merge``)
so a fleet can pin a version ("we run 40.46.1006") or add a release the project has not
listed yet. The policy is named by the platform profile's ``nic.policy_file`` (relative to
the profile file; a site overrides a built-in profile with ``--profile-file``). This module
only loads that data and answers questions about it; nothing here does I/O after
``load_matrix``.

The questions, each a pure function:

- ``identify``: which adapter family a NIC is, from its ``hca_type`` (``MT4131``), PCI device
  id (``0x1023``), the tool's device type (``ConnectX7``) or, last, its firmware major (40.x);
  ``nics_from_ib`` / ``nics_from_ethtool`` / ``nics_from_fwquery`` apply it to each source's
  parsed listing, giving ``Nic`` records.
- ``releases_for``: the matrix rows a ``DriverRelease`` (preflight.parse.versions) is.
- ``judge``: firmware against that driver: ``ok``, ``older`` (FAIL: the driver expects newer
  firmware), ``newer`` (WARN: the release was not tested with it), ``unsupported`` (FAIL:
  e.g. ConnectX-8 under MLNX_OFED), ``pin-mismatch`` (FAIL: not the site's pinned version) or
  ``undecided`` (WARN: the matrix cannot tell, and the verdict says why; never a silent pass).

A release ships one firmware per family; that is the firmware it was tested with. An
``approx`` cell (``28.43.36xx``, where the source gives only part of the number) matches any
firmware in that range. A floor (ConnectX-8: nothing below 40.45.1020 once updated) turns a
"flash the older firmware the driver ships" action into "move the driver forward instead".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from preflight.knowledge.datafile import read_yaml
from preflight.parse.versions import (
    DOCA_OFED,
    INBOX,
    MLNX_OFED,
    OFED,
    UNKNOWN,
    DriverRelease,
    Version,
    parse_version,
)
from preflight.shipped import playbooks_dir

FORMAT = "preflight-nic-firmware/1"
MATRIX_FILE = playbooks_dir() / "nic_firmware.yaml"

# Verdict levels, from the check's point of view.
OK, OLDER, NEWER, UNSUPPORTED, PIN_MISMATCH, UNDECIDED = (
    "ok", "older", "newer", "unsupported", "pin-mismatch", "undecided")

# Which matrix lists a driver flavour may be found in: the module alone cannot tell an
# MLNX_OFED build from a DOCA-OFED one, so plain "ofed" searches both.
_STACKS = {MLNX_OFED: ("mlnx_ofed",), DOCA_OFED: ("doca",), OFED: ("mlnx_ofed", "doca")}
# Release versions shorter than this are too vague to match by prefix (24.10 alone is a year).
_MIN_PREFIX_FIELDS = 5


class NicMatrixError(ValueError):
    """The matrix or a policy file is unreadable or not of the expected shape."""


@dataclass(frozen=True)
class Family:
    name: str
    fw_major: int | None
    pci_device_id: int | None
    hca_type: str | None
    source: str = ""


@dataclass(frozen=True)
class FirmwareCell:
    """What one release says about one family: a version, a range, or "not supported"."""

    version: Version | None
    supported: bool = True
    approx: str | None = None
    note: str | None = None
    source: str | None = None

    @property
    def bounds(self) -> tuple[Version, Version] | None:
        """(lowest, highest) firmware the cell allows: equal for a version, a range for ``approx``."""
        if self.version is not None:
            return self.version, self.version
        if self.approx and re.fullmatch(r"[\dx]+(?:\.[\dx]+)*", self.approx):
            low = parse_version(self.approx.replace("x", "0"))
            high = parse_version(self.approx.replace("x", "9"))
            if low is not None and high is not None:
                return low, high
        return None

    @property
    def text(self) -> str:
        return str(self.version) if self.version is not None else (self.approx or "?")


@dataclass(frozen=True)
class Release:
    """One row: a driver release and the firmware it ships per family."""

    name: str
    stack: str  # "mlnx_ofed" | "doca"
    ofed: Version | None
    doca: Version | None
    firmware: dict[str, FirmwareCell] = field(compare=False, hash=False)
    source: str = ""
    note: str | None = None


@dataclass(frozen=True)
class Floor:
    family: str
    version: Version
    kind: str
    meaning: str
    source: str


@dataclass(frozen=True)
class Pin:
    family: str
    version: Version
    reason: str


@dataclass(frozen=True)
class NicMatrix:
    families: tuple[Family, ...]
    releases: tuple[Release, ...]
    floors: tuple[Floor, ...]
    observed: tuple[tuple[str, Version], ...]
    pins: tuple[Pin, ...]
    files: tuple[str, ...]  # the matrix and the policy merged into it, for messages


@dataclass(frozen=True)
class Verdict:
    """Firmware against the driver. ``action`` is the next step for a non-ok level; ``source``
    where the expectation comes from (the matrix row's source, or the policy file)."""

    level: str
    reason: str
    expected: str | None = None
    release: str | None = None
    action: str | None = None
    notes: tuple[str, ...] = ()
    source: str | None = None


@dataclass(frozen=True)
class Nic:
    """One NIC as a check sees it, whichever tool listed it.

    ``name`` is what the source calls it (``mlx5_0``, a netdev, ``/dev/mst/...``); ``how``
    says what identified the family (``hca_type MT4129``, ``firmware major 40``), or for an
    unknown adapter what was seen of it (``hca_type MT4117, firmware 14.x``).

    ``firmware`` is the firmware the NIC runs, which is what the driver talks to: the kernel's
    fw_ver (ibv_devinfo, sysfs, ethtool) is read from the running firmware's initialisation
    segment, and mlxfwmanager's ``FW (Running)`` row wins over its flashed ``FW``. ``flashed``
    is set only where a firmware query shows another version on the flash (a reset pending).
    """

    name: str
    firmware: str | None
    family: Family | None
    how: str
    source: str  # the probe id
    hca_type: str | None = None
    bdf: str | None = None
    flashed: str | None = None


# --- loading ---------------------------------------------------------------------------------

_LIST_KEYS = {"families": "name", "mlnx_ofed": "release", "doca": "release", "pins": "family"}


def merge(base: dict[str, Any], policy: dict[str, Any]) -> dict[str, Any]:
    """The matrix with a policy laid over it: a row whose key (family name, release name,
    pinned family) is already there replaces it, any other row is added; floors and observed
    rows are added."""
    merged = dict(base)
    for key, ident in _LIST_KEYS.items():
        rows = list(base.get(key) or [])
        for row in policy.get(key) or []:
            at = next((i for i, r in enumerate(rows) if r.get(ident) == row.get(ident)), None)
            if at is None:
                rows.append(row)
            else:
                rows[at] = row
        merged[key] = rows
    for key in ("floors", "observed"):
        merged[key] = list(base.get(key) or []) + list(policy.get(key) or [])
    return merged


def _read(path: Path) -> dict[str, Any]:
    data = read_yaml(path, NicMatrixError)
    if not isinstance(data, dict):
        raise NicMatrixError(f"{path}: expected a mapping in the {FORMAT} shape")
    if data.get("format", FORMAT) != FORMAT:
        raise NicMatrixError(f"{path}: format {data.get('format')!r}, expected {FORMAT}")
    return data


def _version(text: Any, where: str) -> Version:
    version = parse_version(None if text is None else str(text))
    if version is None:
        raise NicMatrixError(f"{where}: {text!r} is not a version")
    return version


def _optional_version(text: Any, where: str) -> Version | None:
    return None if text is None else _version(text, where)


def _cell(raw: dict[str, Any], where: str) -> FirmwareCell:
    return FirmwareCell(_optional_version(raw.get("version"), where), raw.get("supported", True) is not False,
                        raw.get("approx"), raw.get("note"), raw.get("source"))


def build(data: dict[str, Any], files: tuple[str, ...] = ()) -> NicMatrix:
    """Typed matrix from its YAML data (already merged)."""
    where = files[-1] if files else "nic matrix"
    try:
        families = tuple(Family(f["name"], f.get("fw_major"), f.get("pci_device_id"), f.get("hca_type"),
                                f.get("source", "")) for f in data.get("families") or [])
        releases = tuple(
            Release(r["release"], stack, _optional_version(r.get("ofed"), f"{where}: {r['release']} ofed"),
                    _optional_version(r.get("doca"), f"{where}: {r['release']} doca"),
                    {fam: _cell(c or {}, f"{where}: {r['release']} {fam}")
                     for fam, c in (r.get("firmware") or {}).items()},
                    r.get("source", ""), r.get("note"))
            for stack in ("mlnx_ofed", "doca") for r in data.get(stack) or [])
        floors = tuple(Floor(f["family"], _version(f["version"], f"{where}: floor"), f.get("kind", ""),
                             f.get("meaning", ""), f.get("source", "")) for f in data.get("floors") or [])
        observed = tuple((o["family"], _version(o["version"], f"{where}: observed"))
                         for o in data.get("observed") or [])
        pins = tuple(Pin(p["family"], _version(p["version"], f"{where}: pin {p['family']}"), p.get("reason", ""))
                     for p in data.get("pins") or [])
    except (KeyError, TypeError, AttributeError) as exc:
        raise NicMatrixError(f"{where}: a row lacks a required field or has the wrong shape ({exc!r})") from None
    known = {f.name for f in families}
    for name in [p.family for p in pins] + [f.family for f in floors]:
        if name not in known:
            raise NicMatrixError(f"{where}: unknown adapter family {name!r} (known: {', '.join(sorted(known))})")
    return NicMatrix(families, releases, floors, observed, pins, files)


@lru_cache(maxsize=16)
def load_matrix(policy: str | None = None, base: str = str(MATRIX_FILE)) -> NicMatrix:
    """The built-in matrix, with the policy file at ``policy`` merged over it when given."""
    data = _read(Path(base))
    files = (base,)
    if policy:
        data = merge(data, _read(Path(policy)))
        files += (policy,)
    return build(data, files)


# --- identification ----------------------------------------------------------------------------

def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def identify(matrix: NicMatrix, *, hca_type: str | None = None, pci_device_id: int | None = None,
             device_type: str | None = None, firmware: str | None = None) -> tuple[Family | None, str]:
    """(family, how it was told) or (None, what was seen). The device's own id is trusted before
    the firmware major, which a virtual function or an unknown adapter shares with others."""
    for fam in matrix.families:
        if hca_type and fam.hca_type and hca_type.strip().upper() == fam.hca_type.upper():
            return fam, f"hca_type {fam.hca_type}"
        if pci_device_id is not None and fam.pci_device_id == pci_device_id:
            return fam, f"PCI id {pci_device_id:#06x}"
        if device_type and _squash(device_type) == _squash(fam.name):
            return fam, f"device type {device_type}"
    version = parse_version(firmware)
    if version is not None:
        for fam in matrix.families:
            if fam.fw_major == version.major:
                return fam, f"firmware major {version.major}"
    unreadable = firmware and not version and f"firmware {firmware!r}"
    seen = ", ".join(x for x in (hca_type and f"hca_type {hca_type}", device_type and f"type {device_type}",
                                 version and f"firmware {version.major}.x", unreadable) if x)
    return None, seen or "no id and no firmware"


def expects_nics(profile) -> bool:
    """Whether a platform profile says its nodes carry RDMA NICs (any ``nic.`` expectation)."""
    return bool(profile.get("nic.family") or profile.get("nic.rate_gbps") or profile.get("nic.count"))


def nics_from_ib(matrix: NicMatrix, inventory, probe: str) -> tuple[Nic, ...]:
    """NICs of an ``IbInventory`` (ibv_devinfo, ibstat or sysfs)."""
    out = []
    for dev in inventory.devices:
        fam, how = identify(matrix, hca_type=dev.hca_type, firmware=dev.fw_ver)
        out.append(Nic(dev.name, dev.fw_ver, fam, how, probe, dev.hca_type))
    return tuple(out)


def nics_from_ethtool(matrix: NicMatrix, infos, probe: str = "ethtool-i") -> tuple[Nic, ...]:
    """NICs of ``ethtool -i`` blocks; only mlx5_core netdevs (an mlx4 card is not ours)."""
    out = []
    for info in infos:
        if info.driver != "mlx5_core":
            continue
        fam, how = identify(matrix, firmware=info.firmware_version)
        out.append(Nic(info.iface or info.bus_info or "?", info.firmware_version, fam, how, probe,
                       bdf=info.bus_info))
    return tuple(out)


def nics_from_fwquery(matrix: NicMatrix, query, probe: str = "mlxfwmanager") -> tuple[Nic, ...]:
    """NICs of an ``mlxfwmanager``/``mlxup``/``flint`` query."""
    out = []
    for i, dev in enumerate(query.devices):
        fam, how = identify(matrix, device_type=dev.device_type, firmware=dev.fw_running)
        bdf = dev.pci_name if dev.pci_name and re.fullmatch(r"[0-9a-fA-F:.]+", dev.pci_name) else None
        name = dev.pci_name or (f"device #{dev.index}" if dev.index is not None else f"device {i + 1}")
        out.append(Nic(name, dev.fw_running, fam, how, probe, bdf=bdf,
                       flashed=dev.fw_current if dev.reset_pending else None))
    return tuple(out)


# --- the matrix's answers ----------------------------------------------------------------------

def _same_release(a: Version, b: Version) -> bool:
    # 24.10-3.2.5 (the module) is 24.10-3.2.5.0 (the release); 25.07-0.9.7 (ofed_info of DOCA 3.1)
    # is 25.07-0.9.7.0. Either may be the longer one.
    short, long_ = sorted((a, b), key=lambda v: len(v.parts))
    return a == b or (len(short.parts) >= _MIN_PREFIX_FIELDS and long_.has_prefix(short))


def releases_for(matrix: NicMatrix, driver: DriverRelease) -> tuple[Release, ...]:
    """The rows that describe this driver; empty for inbox/unknown drivers and unlisted releases."""
    stacks = _STACKS.get(driver.flavour, ())
    found = []
    for row in matrix.releases:
        if row.stack not in stacks:
            continue
        if driver.ofed is not None and row.ofed is not None:
            if _same_release(driver.ofed, row.ofed):
                found.append(row)
        elif driver.doca is not None and row.doca is not None and driver.doca == row.doca:
            found.append(row)
    return tuple(found)


def driver_label(driver: DriverRelease) -> str:
    """How a report names the driver: ``DOCA-OFED 25.07-0.9.7.0 (doca 3.1.0)``, ``inbox (kernel ...)``."""
    if driver.flavour == INBOX:
        return f"inbox mlx5_core (kernel {driver.kernel})" if driver.kernel else f"inbox mlx5_core ({driver.raw})"
    if driver.flavour == UNKNOWN:
        return "unknown mlx5 driver"
    name = {MLNX_OFED: "MLNX_OFED", DOCA_OFED: "DOCA-OFED", OFED: "OFED"}[driver.flavour]
    doca = f" (DOCA {driver.doca})" if driver.doca else ""
    return f"{name} {driver.ofed or driver.raw}{doca}"


def _cell_for(rows: tuple[Release, ...], family: str) -> tuple[Release, FirmwareCell] | None:
    # DOCA 2.9.0 has two builds (LTS and _CX8) under one version: a node that drives a CX-8
    # with DOCA 2.9.0 runs the _CX8 build, so a row that supports the family wins.
    cells = [(r, r.firmware[family]) for r in rows if family in r.firmware]
    cells.sort(key=lambda rc: (not rc[1].supported, rc[1].bounds is None))
    return cells[0] if cells else None


def floor_of(matrix: NicMatrix, family: str) -> Floor | None:
    return next((f for f in matrix.floors if f.family == family and f.kind == "no-downgrade"), None)


def shipping(matrix: NicMatrix, family: str, firmware: Version) -> tuple[str, ...]:
    """Releases whose firmware for the family is (or spans) this version."""
    out = []
    for row in matrix.releases:
        cell = row.firmware.get(family)
        bounds = cell.bounds if cell else None
        if bounds and bounds[0] <= firmware <= bounds[1]:
            out.append(row.name)
    return tuple(out)


def first_supporting(matrix: NicMatrix, family: str) -> Release | None:
    """The oldest listed release that ships a firmware version for the family."""
    return next((r for r in matrix.releases if (c := r.firmware.get(family)) and c.supported and c.bounds), None)


def _then(step: str) -> str:
    return f"{step}, reboot, re-run nccl all_reduce"


def judge(matrix: NicMatrix, driver: DriverRelease, family: Family | None, firmware: str | None,
          how: str = "") -> Verdict:
    """Firmware of one NIC family against the driver the node runs (see the module docstring)."""
    if family is None:
        return Verdict(UNDECIDED, f"adapter not in the NIC firmware matrix ({how or 'unidentified'})",
                       action="add the adapter family to a NIC policy file, or check this NIC by hand")
    fw = parse_version(firmware)
    if fw is None:
        said = "firmware version unreadable or not reported" if firmware is None else \
            f"firmware version {firmware!r} is not a version"
        return Verdict(UNDECIDED, said,
                       action=f"read the firmware with mlxfwmanager --query or ethtool -i on the {family.name}")
    if family.fw_major is not None and fw.major != family.fw_major:
        return Verdict(UNDECIDED, f"{how} says {family.name}, but firmware {fw} is not {family.fw_major}.x",
                       action="check the NIC identity with mlxfwmanager --query")
    notes = _floor_notes(matrix, family, fw)
    rows = releases_for(matrix, driver)
    label = driver_label(driver)
    hit = _cell_for(rows, family.name)
    if hit and not hit[1].supported:
        first = first_supporting(matrix, family.name)
        needs = f"DOCA-OFED ({first.name} or later ships its firmware)" if first else "DOCA-OFED"
        return Verdict(UNSUPPORTED, f"{hit[0].name} does not support {family.name}", release=hit[0].name,
                       action=_then(f"{family.name} needs {needs} or the inbox driver: replace {label}"),
                       notes=notes, source=hit[1].source or hit[0].source)
    pin = next((p for p in matrix.pins if p.family == family.name), None)
    if pin is not None:
        why = f" ({pin.reason})" if pin.reason else ""
        policy = f"site policy {matrix.files[-1]}"
        if fw == pin.version:
            return Verdict(OK, f"firmware {fw} is the site's pinned version{why}", str(pin.version), notes=notes,
                           source=policy)
        return Verdict(PIN_MISMATCH, f"firmware {fw} is not the site's pinned {pin.version}{why}", str(pin.version),
                       action=_then(f"flash {family.name} firmware {pin.version} with mlxfwmanager -u "
                                    "(or the OEM package)"), notes=notes, source=policy)
    undecided = _undecided(driver, label, rows, hit, family)
    if undecided:
        return Verdict(UNDECIDED, undecided, notes=notes,
                       action="pin the firmware this fleet validated in a NIC policy file (nic.policy_file), "
                              "or use a driver release the matrix lists")
    release, cell = hit
    low, high = cell.bounds
    shipped = f"the {cell.text} that {release.name} ships"
    source = cell.source or release.source
    if low <= fw <= high:
        return Verdict(OK, f"firmware {fw} is {shipped}", cell.text, release.name, notes=notes, source=source)
    if fw < low:
        return Verdict(OLDER, f"firmware {fw} is older than {shipped} ({label})", cell.text, release.name,
                       action=_then(f"update NIC firmware to {cell.text} with mlxfwmanager -u (or the OEM package)"),
                       notes=notes, source=source)
    if (family.name, fw) in matrix.observed:
        notes += (f"{fw} has been seen on a live system, but no listed release ships it",)
    return Verdict(NEWER, f"firmware {fw} is newer than {shipped}; that release was not tested with it ({label})",
                   cell.text, release.name, action=_newer_action(matrix, family, fw, cell), notes=notes,
                   source=source)


def _undecided(driver: DriverRelease, label: str, rows, hit, family: Family) -> str | None:
    if driver.flavour == UNKNOWN:
        return "no mlx5 driver evidence (ethtool -i, modinfo mlx5_core and ofed_info all missing)"
    if driver.flavour == INBOX:
        return (f"{label}: the matrix lists MLNX_OFED and DOCA releases only; the kernel's own "
                "driver names no firmware")
    if not rows:
        return f"{label} is not in the NIC firmware matrix"
    if hit is None:
        return f"{', '.join(r.name for r in rows)} lists no {family.name} firmware"
    if hit[1].bounds is None:
        return f"{hit[0].name} supports {family.name} but the source gives no firmware version"
    return None


def _floor_notes(matrix: NicMatrix, family: Family, fw: Version) -> tuple[str, ...]:
    floor = floor_of(matrix, family.name)
    if floor is not None and fw < floor.version:
        note = (f"{family.name} firmware {fw} is below {floor.version}: once updated it cannot be "
                f"downgraded below {floor.version} ({floor.source})")
        return (note,)
    return ()


def _newer_action(matrix: NicMatrix, family: Family, fw: Version, cell: FirmwareCell) -> str:
    ships = shipping(matrix, family.name, fw)
    driver_step = f"move the driver to {' / '.join(ships)}, which ships {fw}" if ships else \
        f"move the driver to a release tested with {fw}"
    floor = floor_of(matrix, family.name)
    if floor is not None and cell.bounds[1] < floor.version <= fw:
        return _then(f"{driver_step} (flashing back to {cell.text} is not possible: "
                     f"{family.name} firmware cannot go below {floor.version})")
    return _then(f"{driver_step}, or flash the {cell.text} it ships with mlxfwmanager -u")
