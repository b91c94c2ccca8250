"""What a PCI address is on this node (GPU, NIC, NVSwitch), from every probe that says so.

The kernel log names devices by address only. nvidia-smi lists the GPUs' bus ids, lspci says
what each address is ("3D controller: NVIDIA ...", "Infiniband controller: Mellanox ...",
"Bridge: NVIDIA ..." for an NVSwitch), and the log itself shows which driver owns an address
("nvidia 0000:03:00.0: ...", "mlx5_core 0000:5c:00.0: ...") and the vendor id in an AER status
line ("device [10de:2330]"). Each is optional; an address none of them names is "device".
"""

from __future__ import annotations

import re

from preflight.judge.context import EvidenceMissing

GPU, NIC, SWITCH, DEVICE = "GPU", "NIC", "NVSwitch", "device"
_ADDRESS = re.compile(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?$")
_GPU_DEVICE = re.compile(r"(?:3D|VGA compatible) controller: NVIDIA")
_NIC_DEVICE = re.compile(r"(?:Ethernet|Infiniband|Network) controller: Mellanox")
_SWITCH_DEVICE = re.compile(r"^Bridge: NVIDIA")
# PCI vendor ids (the PCI-SIG registry as pciutils' pci.ids lists it): NVIDIA 10de, Mellanox 15b3.
_VENDORS = {"10de": GPU, "15b3": NIC}
# Driver names as the kernel prints them in front of a device's lines.
_DRIVERS = ((GPU, re.compile(r"^nvidia$")), (SWITCH, re.compile(r"^nvidia-nvswitch")), (NIC, re.compile(r"^mlx5")))


def address_key(bdf: str | None) -> str | None:
    """'00000000:18:00.0', '0000:18:00.0', '0000:18:00' and '18:00.0' -> '0000:18:00': the
    forms nvidia-smi, the kernel, NVRM and lspci print for the same device (function dropped)."""
    match = _ADDRESS.match((bdf or "").strip())
    if not match:
        return None
    domain, bus, dev = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{dev.lower()}"


def optional(host, fact: str):
    """(fact, None) or (None, why it is missing): a source the check can do without."""
    try:
        return getattr(host, fact), None
    except EvidenceMissing as exc:
        return None, exc


def roles(host, kernel_log) -> dict[str, str]:
    """address key -> GPU / NIC / NVSwitch for every address some probe identifies."""
    found: dict[str, str] = {}
    smi, _ = optional(host, "smi")
    for gpu in (smi.gpus if smi else ()):
        if address_key(gpu.pci_bus_id):
            found[address_key(gpu.pci_bus_id)] = GPU
    devices, _ = optional(host, "lspci")
    for d in devices or ():
        key, desc = address_key(d.bdf), d.description or ""
        role = (GPU if _GPU_DEVICE.search(desc) else NIC if _NIC_DEVICE.search(desc)
                else SWITCH if _SWITCH_DEVICE.search(desc) else None)
        if key and role:
            found.setdefault(key, role)
    for e in kernel_log.events:
        printer = address_key(e.origin or e.device)
        for role, driver in _DRIVERS:
            if printer and e.driver and driver.search(e.driver):
                found.setdefault(printer, role)
        # An AER status line printed by the device itself (not a port) carries its vendor id.
        vendor = (e.pci_id or "").partition(":")[0].lower()
        if printer and e.driver != "pcieport" and vendor in _VENDORS:
            found.setdefault(printer, _VENDORS[vendor])
    return found


def role_of(found: dict[str, str], bdf: str | None) -> str:
    return found.get(address_key(bdf) or "", DEVICE)
