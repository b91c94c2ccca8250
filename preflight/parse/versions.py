"""Version strings of ConnectX firmware and mlx5 drivers, and which mlx5 driver a node runs.

The strings this module reads, all seen in real captures:

- firmware: ``28.39.1002`` (family major, minor, sub-minor; ``ibv_devinfo``, ``ethtool -i``,
  ``mlxfwmanager``), ``3.6.0502`` (expansion ROMs);
- OFED as ``ofed_info -s`` prints it: ``MLNX_OFED_LINUX-24.10-3.2.5.0:``, or
  ``OFED-internal-24.07-0.3.5.0.110:`` for the OFED built inside DOCA;
- OFED as the loaded module reports it (``modinfo`` ``version:``, ``ethtool -i`` ``version:``):
  the same release without its last field, ``24.10-2.1.8`` for 24.10-2.1.8.0;
- DOCA-OFED carrying its DOCA release: ``doca3.1.0-25.07-0.9.7.0``;
- the inbox driver: ``modinfo`` has no ``version:`` line; ``ethtool -i`` reports the kernel
  release (cut to 31 characters by ethtool's field, ``5.11.0-net-next-alloc_pages_bul``) on
  kernels since 2020, and the old in-tree ``DRIVER_VERSION`` (``3.0-1 (January 2015)``,
  ``5.0-0``) before.

``driver_release`` folds those sources into one ``DriverRelease`` and says which one decided.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from preflight.parse.mlnx import EthtoolInfo, ModInfo, OfedInfo

_VERSION_RE = re.compile(r"[0-9]+(?:[.-][0-9]+)*")


@dataclass(frozen=True, order=True)
class Version:
    """A dotted/dashed version compared numerically field by field.

    ``text`` keeps the spelling it was read from (``24.10-3.2.5.0``) for display; it takes
    no part in comparisons, so 28.39.1002 < 28.39.5124 < 40.44.1036 whatever the padding.
    A shorter version that is a prefix of a longer one sorts first (24.10-3.2.5 < 24.10-3.2.5.0).
    """

    parts: tuple[int, ...]
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.text or ".".join(str(p) for p in self.parts)

    @property
    def major(self) -> int:
        # For firmware this is the adapter family (28 = ConnectX-7, 40 = ConnectX-8).
        return self.parts[0]

    def has_prefix(self, other: Version) -> bool:
        """True when ``other``'s fields open this version (24.10-3.2.5.0 starts with 24.10-3.2.5)."""
        return self.parts[: len(other.parts)] == other.parts


def parse_version(text: str | None) -> Version | None:
    """The version the whole of ``text`` spells, or None when it is not purely a version.

    Strict on purpose: ``N/A``, ``...`` (redacted) or a kernel release with a suffix are not
    versions, and guessing one out of them would make a comparison lie.
    """
    if text is None:
        return None
    s = text.strip()
    if not _VERSION_RE.fullmatch(s):
        return None
    return Version(tuple(int(p) for p in re.split(r"[.-]", s)), s)


# An OFED module version: two fields, a dash, then at least three (5.8-1.1.2, 24.10-3.2.5).
# The old in-tree DRIVER_VERSION has one field after the dash (5.0-0), a kernel release has
# three before it (5.14.0-284.11.1.el9_2.x86_64), so the three forms never overlap.
_OFED_MODULE_RE = re.compile(r"([0-9]+\.[0-9]+-[0-9]+\.[0-9]+\.[0-9]+(?:\.[0-9]+)*)")
_DOCA_RE = re.compile(r"doca([0-9]+(?:\.[0-9]+)+)-([0-9]+\.[0-9]+-[0-9]+(?:\.[0-9]+)*)")
_KERNEL_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:[-+.~_].*)?")
_ETHTOOL_VERSION_MAX = 31  # struct ethtool_drvinfo.version is char[32]

INBOX, MLNX_OFED, DOCA_OFED = "inbox", "mlnx-ofed", "doca-ofed"
# Out of tree, but the module alone does not say whether MLNX_OFED or DOCA built it: both
# print the same version form, and only ``ofed_info -s`` tells them apart.
OFED = "ofed"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class DriverRelease:
    """Which mlx5 driver a node runs, as far as its evidence tells.

    ``flavour`` is ``inbox``, ``mlnx-ofed``, ``doca-ofed``, ``ofed`` (out of tree, MLNX_OFED or
    DOCA not told apart) or ``unknown``. ``ofed`` is the OFED release (24.10-3.2.5.0 when
    ``ofed_info`` confirms the loaded module, else the module's 24.10-3.2.5); ``doca`` only when
    a string encodes it; ``kernel`` the kernel release an inbox driver belongs to.
    ``source`` names what decided (``ethtool``, ``modinfo``, ``ofed_info`` or ``none``) and
    ``raw`` the string it decided on.
    """

    flavour: str
    ofed: Version | None
    doca: Version | None
    kernel: str | None
    source: str
    raw: str | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Identity:
    flavour: str
    ofed: Version | None = None
    doca: Version | None = None
    kernel: str | None = None


def _module_identity(version: str) -> _Identity:
    """Classify a version string reported by a loaded or installed mlx5_core module."""
    s = version.strip()
    doca = _DOCA_RE.search(s)
    if doca:
        return _Identity(DOCA_OFED, ofed=parse_version(doca.group(2)), doca=parse_version(doca.group(1)))
    ofed = _OFED_MODULE_RE.fullmatch(s)
    if ofed:
        return _Identity(OFED, ofed=parse_version(ofed.group(1)))
    if _KERNEL_RE.fullmatch(s):
        return _Identity(INBOX, kernel=s)
    return _Identity(INBOX)


def _ofed_info_identity(info: OfedInfo) -> _Identity:
    doca = _DOCA_RE.search(info.raw)
    if doca:
        return _Identity(DOCA_OFED, ofed=parse_version(doca.group(2)), doca=parse_version(doca.group(1)))
    dist = (info.distribution or "").upper()
    # DOCA ships its OFED as OFED-internal-<version> (its source tarball carries that name);
    # the standalone MLNX_OFED installer says MLNX_OFED_LINUX-<version>.
    if dist.startswith("MLNX_OFED"):
        flavour = MLNX_OFED
    elif dist.startswith("OFED-INTERNAL"):
        flavour = DOCA_OFED
    else:
        flavour = OFED
    return _Identity(flavour, ofed=parse_version(info.version))


def driver_release(
    modinfo: ModInfo | None, ofed: OfedInfo | None, ethtool: EthtoolInfo | None
) -> DriverRelease:
    """Decide the node's mlx5 driver identity from whichever evidence exists.

    The loaded driver decides: ``ethtool -i`` reports the module actually bound to the NIC,
    ``modinfo`` the module ``modprobe`` would load, ``ofed_info`` only the installed packages.
    An OFED installed but not loaded (openibd not restarted, built for another kernel) is the
    classic way for these to disagree, and the firmware must match what runs, so the
    disagreement is noted and the running driver wins. ``ofed_info`` still names the flavour
    and the full release when it agrees with the loaded module.
    """
    notes: list[str] = []
    decided: tuple[str, str, _Identity] | None = None

    if ethtool is not None:
        if ethtool.driver != "mlx5_core":
            notes.append(f"ethtool -i reports driver {ethtool.driver!r}, not mlx5_core: not used")
        elif ethtool.version:
            decided = ("ethtool", ethtool.version, _module_identity(ethtool.version))
            if len(ethtool.version) == _ETHTOOL_VERSION_MAX:
                notes.append("ethtool version is 31 characters long: probably cut by ethtool's field")

    mod_identity = None
    if modinfo is not None and (modinfo.version or modinfo.filename):
        if modinfo.version:
            mod_identity = _module_identity(modinfo.version)
            mod_raw = modinfo.version
        else:
            mod_identity = _Identity(INBOX, kernel=modinfo.kernel_release)
            mod_raw = modinfo.filename or ""
        if decided is None:
            decided = ("modinfo", mod_raw, mod_identity)
        elif _disagree(decided[2], mod_identity):
            notes.append(
                f"modinfo describes a different mlx5_core ({mod_raw}) from the loaded one "
                f"({decided[1]}): a driver was installed but not loaded"
            )

    installed = _ofed_info_identity(ofed) if ofed is not None and ofed.version else None

    if decided is None:
        if installed is None:
            return DriverRelease(UNKNOWN, None, None, None, "none", None, tuple(notes) + (
                "no mlx5 driver evidence: ethtool, modinfo and ofed_info all missing or empty",))
        notes.append("only ofed_info -s was read: it names the installed packages, not the loaded module")
        return DriverRelease(installed.flavour, installed.ofed, installed.doca, None, "ofed_info",
                             ofed.raw, tuple(notes))

    source, raw, ident = decided
    flavour, ofed_version, doca, kernel = ident.flavour, ident.ofed, ident.doca, ident.kernel

    if flavour == INBOX:
        if kernel is None and mod_identity is not None and mod_identity.flavour == INBOX:
            kernel = mod_identity.kernel
        if kernel is None:
            notes.append(f"inbox driver version {raw!r} is the old in-tree DRIVER_VERSION, not a kernel release")
        if installed is not None:
            notes.append(f"ofed_info -s reports {ofed.raw} installed, but the loaded mlx5_core is the inbox driver")
    elif installed is not None and installed.ofed is not None and ofed_version is not None:
        if installed.ofed.has_prefix(ofed_version):
            ofed_version = installed.ofed
            if flavour == OFED:
                flavour = installed.flavour
            doca = doca or installed.doca
        else:
            notes.append(f"ofed_info -s reports {ofed.raw} but the loaded mlx5_core is {raw}")

    return DriverRelease(flavour, ofed_version, doca, kernel, source, raw, tuple(notes))


def _disagree(a: _Identity, b: _Identity) -> bool:
    if (a.flavour == INBOX) != (b.flavour == INBOX):
        return True
    if a.ofed is not None and b.ofed is not None:
        return not (a.ofed.has_prefix(b.ofed) or b.ofed.has_prefix(a.ofed))
    return False
