"""ConnectX (mlx5) trouble in the kernel log (check ``mlx5-kernel-log``).

Input is the ``kernel-log`` probe as ``preflight/parse/kernel_log.py`` reads it. The mlx5
signatures and what they mean (strings from the mlx5 sources, docs/sources.md §1.4):

- firmware not answering the driver: command timeouts (``ACCESS_REG(0x805) timeout. Will cause
  a leak of a command resource``), ``health compromised - reached miss count``, the health
  dump's ``synd 0x7: irisc not responding``, ``FW is unable to respond to initialization
  segment reads``, ``Waiting for FW initialization, timeout``, ``Fatal error N detected``.
  This is how firmware older than the driver expects shows itself at run time, and also how a
  hung or failing NIC does; the diagnosis ties it to the firmware/driver mismatch when
  ``nic-fw-driver-mismatch`` found one on the same node. FAIL.
- the driver could not bring a NIC up (``handle_hca_cap failed``, ``mlx5_load_one failed``,
  ``probe of <bdf> failed``): the NIC is absent to RDMA. FAIL.
- a module from another mlx5 stack (``mlx5_vdpa: disagrees about version of symbol ...``):
  inbox and OFED/DOCA modules mixed. FAIL when a module on the RDMA path (mlx5_core,
  mlx5_ib, ib_core, ib_uverbs, rdma_cm/rdma_ucm, nvidia_peermem) is the one refused; an
  auxiliary module (mlx5_vdpa) only warns.
- a NIC on a PCIe link below its capability (``... available PCIe bandwidth, limited by 16.0 GT/s
  PCIe x8 link ...``): the NIC cannot reach line rate. FAIL as ``pcie-link-degraded``. The
  kernel prints this for any device; a line is this check's when mlx5_core printed it or its
  address is a NIC's (ethtool bus-info, lspci Mellanox devices, mlxfwmanager, other mlx5
  lines). GPU lines are left to ``pcie-link``. The kernel measures the link when the device
  is enumerated, so an idle-time downshift (which GPUs do, NICs do not) is not what it reports.

- the slot cannot power the NIC (``Detected insufficient power on the PCIe slot (27W).``, which
  mlx5 prints as a warning): WARN ``nic-power-insufficient``. The firmware decides what to
  power down and says so in a port module error (below); some platforms print this line on
  every boot while running at line rate, so the line alone does not fail the node.
- a port module error (``Port module event[error]: module N, Cable error, <error>``, printed
  as an error): FAIL. Ports powered down for want of slot power, or a module over its power
  budget, are ``nic-power-insufficient``; the others (high temperature, a bad or shorted
  cable or module, a stuck I2C bus, no EEPROM, an unknown or non-approved module) are
  ``nic-module-error``. The info-level lines (``PCIe slot advertised sufficient power``,
  ``... power capability was not advertised``, ``Port module event: module N, Cable plugged``)
  are no fault. Texts from mlx5 ``events.c``; docs/sources.md §1.4.

The log holds everything since boot (dmesg) or this boot (journalctl -k); an event there is
judged as current, since nothing in the log says it was dealt with.
"""

from __future__ import annotations

from preflight.check import fail, host_check, ok, warn
from preflight.judge.context import EvidenceMissing
from preflight.knowledge.nic_matrix import OLDER, PIN_MISMATCH, UNSUPPORTED, judge
from preflight.model import Evidence

PROBE = "kernel-log"
FW_HANG = ("mlx5-cmd-timeout", "mlx5-health-compromised", "mlx5-fw-syndrome", "mlx5-fw-unresponsive",
           "mlx5-fw-init-timeout", "mlx5-fatal-error")
RDMA_PATH = frozenset({"mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "rdma_cm", "rdma_ucm", "nvidia_peermem"})
ACTIONS = {
    "fw": "compare the firmware with the driver (nic-fw-driver-mismatch) and update the older one; reset the NIC "
          "(mlxfwreset -d <bdf> reset, or reboot), re-run nccl all_reduce; replace the NIC if it recurs on "
          "matching firmware",
    "probe": "the mlx5 driver could not bring the NIC up: check firmware against driver (nic-fw-driver-mismatch) and "
             "that the driver knows the adapter (modinfo mlx5_core | grep -i 15b3); update the older one, reboot",
    "module": "inbox and OFED/DOCA mlx5 modules are mixed: reinstall DOCA-OFED / MLNX_OFED for the running kernel "
              "(or remove it and use the inbox driver), depmod -a, restart openibd or reboot",
    "pcie": "reseat the NIC (or its riser) and check the slot's PCIe generation/width in the BIOS; the NIC cannot "
            "reach line rate on this link",
    "power": "check that the slot (or riser / OCP bay) is rated for the NIC's power and that the BIOS advertises it "
             "(lspci -vvv: SlotPowerLimit); move the NIC to a full-power slot, then re-run preflight",
    "heat": "the module or cable in the named cage is overheating: check the chassis airflow and fans at the NIC, "
            "and that the module is one the NIC supports; replace it if it stays hot, then re-run preflight",
    "cable": "reseat the cable / transceiver in the named cage, then replace it (or use one on the NIC's supported "
              "list) if the error returns; re-run preflight",
}
# Port module errors that are the slot's or module's power, not the cable itself.
POWER_MODULE_ERRORS = ("insufficient/unadvertised power", "Power budget exceeded")


def _describe(e) -> str:
    kind = e.kind
    if kind == "mlx5-cmd-timeout":
        return f"command {e.detail or '?'} timed out"
    if kind == "mlx5-health-compromised":
        return "health compromised (firmware stopped its health counter)"
    if kind == "mlx5-fw-syndrome":
        return f"health syndrome {e.code:#x}: {e.detail}" if e.code is not None else f"health syndrome: {e.detail}"
    if kind == "mlx5-fw-unresponsive":
        return "firmware does not answer initialization segment reads"
    if kind == "mlx5-fw-init-timeout":
        return f"firmware initialisation timed out ({e.detail})"
    if kind == "mlx5-fatal-error":
        return f"fatal error {e.code} detected"
    if kind == "mlx5-probe-failed":
        return "probe failed" + (f" (error {e.code})" if e.code is not None else f": {e.message[-60:]}")
    if kind == "module-symbol-mismatch":
        return f"{e.driver} refused: symbol {e.detail}"
    if kind == "mlx5-pcie-power-insufficient":
        return f"the PCIe slot advertises {e.detail}, not enough for the NIC"
    if kind == "mlx5-module-error":
        return f"port module {e.code}: {e.detail}"
    p = e.pcie
    speed = f"{p.speed_gts:g} GT/s" if p.speed_gts else "unknown speed"
    capable = f"{p.capable_speed_gts:g} GT/s" if p.capable_speed_gts else "unknown speed"
    return (f"{p.available_gbps:g} Gb/s available, limited by {speed} x{p.width} at {p.limited_at} "
            f"(capable of {p.capable_gbps:g} Gb/s at {capable} x{p.capable_width})")


def _bus(address: str) -> str:
    # lspci may print addresses without the PCI domain ("05:00.0"): compare bus:dev.fn only.
    address = address.lower()
    return address.split(":", 1)[1] if address.count(":") == 2 else address


def _nic_addresses(host, log) -> set[str]:
    """PCI addresses (bus:dev.fn) of the node's NICs, from every source that names one."""
    found = {e.device for e in log.events if (e.driver or "").startswith("mlx5") and e.device}
    for attribute, read in (("ethtool", lambda v: [i.bus_info for i in v]),
                            ("lspci", lambda v: [d.bdf for d in v if "Mellanox" in (d.description or "")]),
                            ("mlxfwmanager", lambda v: [d.pci_name for d in v.devices])):
        try:
            found |= {a for a in read(getattr(host, attribute)) if a}
        except EvidenceMissing:
            continue
    return {_bus(a) for a in found}


def _rdma_module(e) -> bool:
    names = ((e.driver or "").replace("-", "_"), e.detail or "")
    return any(n.startswith(("mlx", "ib_", "rdma", "nvidia_peermem")) for n in names)


def _group(events) -> str:
    """'0000:5e:00.0: health compromised ...; 0000:5e:00.0: health syndrome 0x7 ...', each once, in
    log order. The driver prints one fault on several lines (a timeout is announced, then
    reported), so lines are not counted as faults; the evidence shows them."""
    seen = dict.fromkeys(f"{e.device or e.driver or 'a NIC the line does not name'}: {_describe(e)}" for e in events)
    return "; ".join(seen) + f" ({len(events)} log line{'s' if len(events) != 1 else ''})"


# Besides the log: where the NICs sit (ethtool, lspci, mlxfwmanager), and their firmware and
# driver, whose verdict decides the action for firmware timeouts.
@host_check("mlx5-kernel-log", facts=["kernel_log", "driver_release", "nic_matrix", "nics", "lspci"],
            summary="no ConnectX firmware timeouts, probe failures, module mismatches, slow NIC PCIe links, "
                    "slot power or port module errors")
def mlx5_kernel_log(host):
    log = host.kernel_log
    caveat = f" ({'; '.join(log.notes)})" if log.notes else ""
    nics = _nic_addresses(host, log)
    fw_versions = {e.device: e.version for e in log.of_kind("mlx5-fw-version") if e.device}
    hang = log.of_kind(*FW_HANG)
    probe = log.of_kind("mlx5-probe-failed")
    modules = [e for e in log.of_kind("module-symbol-mismatch") if _rdma_module(e)]
    slow = [e for e in log.of_kind("pcie-bandwidth-limited")
            if (e.driver or "").startswith("mlx5") or _bus(e.device or "") in nics]
    slot_power = log.of_kind("mlx5-pcie-power-insufficient")
    module_errors = log.of_kind("mlx5-module-error")
    powered_down = [e for e in module_errors if any(t in (e.detail or "") for t in POWER_MODULE_ERRORS)]
    hot = [e for e in module_errors if e not in powered_down and "Temperature" in (e.detail or "")]
    bad_module = [e for e in module_errors if e not in powered_down and e not in hot]

    outcomes = []
    if hang:
        action = _firmware_action(host) or ACTIONS["fw"]
        firmware = sorted({f"{d} fw {v}" for d, v in fw_versions.items() if any(e.device == d for e in hang)})
        outcomes.append(fail(f"NIC firmware stopped answering the driver: {_group(hang)}"
                             + (f" [{', '.join(firmware)}]" if firmware else "") + caveat,
                             symptoms=sorted({e.kind for e in hang}), evidence=[_lines(hang)],
                             action=action, data={"devices": sorted({e.device for e in hang if e.device})}))
    if probe:
        outcomes.append(fail(f"mlx5 could not bring a NIC up: {_group(probe)}" + caveat, symptoms=["nic-probe-failed"],
                             evidence=[_lines(probe)], action=ACTIONS["probe"]))
    if modules:
        core = any((e.driver or "").replace("-", "_") in RDMA_PATH for e in modules)
        verdict = fail if core else warn
        outcomes.append(verdict(f"modules of another mlx5 driver stack refused: {_group(modules)}" + caveat,
                                symptoms=["rdma-module-mismatch"], evidence=[_lines(modules)],
                                action=ACTIONS["module"]))
    if slow:
        outcomes.append(fail(f"NIC PCIe link below its capability: {_group(slow)}" + caveat,
                             symptoms=["pcie-link-degraded"], evidence=[_lines(slow)],
                             action=ACTIONS["pcie"], data={"devices": sorted({e.device for e in slow if e.device})}))
    if powered_down:
        outcomes.append(fail(f"NIC ports powered down or over their power budget: {_group(powered_down)}" + caveat,
                             symptoms=["nic-power-insufficient"], evidence=[_lines(powered_down + slot_power)],
                             action=ACTIONS["power"], data={"devices": _devices(powered_down)}))
    elif slot_power:
        outcomes.append(warn(f"PCIe slot power below what the NIC needs: {_group(slot_power)}" + caveat,
                             symptoms=["nic-power-insufficient"], evidence=[_lines(slot_power)],
                             action=ACTIONS["power"], data={"devices": _devices(slot_power)}))
    for events, why in ((hot, "heat"), (bad_module, "cable")):
        if events:
            outcomes.append(fail(f"NIC port module errors: {_group(events)}" + caveat,
                                 symptoms=["nic-module-error"], evidence=[_lines(events)],
                                 action=ACTIONS[why], data={"devices": _devices(events),
                                                            "modules": sorted({e.code for e in events
                                                                               if e.code is not None})}))
    if outcomes:
        return outcomes
    seen = f"; {len(fw_versions)} NIC(s) reported firmware at probe" if fw_versions else ""
    return ok(f"no mlx5 firmware, probe, module or NIC PCIe trouble in {log.line_count} log lines{seen}{caveat}",
              evidence=[_lines(log.of_kind("mlx5-fw-version"))] if fw_versions else [])


def _firmware_action(host) -> str | None:
    """The firmware verdict's own action ("update NIC firmware to X ...") when the node's firmware
    is older than its driver expects: then that is what the timeouts call for."""
    try:
        nics, matrix, driver = host.nics, host.nic_matrix, host.driver_release
    except EvidenceMissing:
        return None
    for nic in nics:
        verdict = judge(matrix, driver, nic.family, nic.firmware, nic.how)
        if verdict.level in (OLDER, UNSUPPORTED, PIN_MISMATCH):
            return verdict.action
    return None


def _devices(events) -> list[str]:
    return sorted({e.device for e in events if e.device})


def _lines(events, limit: int = 6) -> Evidence:
    return Evidence(PROBE, "\n".join(e.raw.strip() for e in events[:limit]))
