"""PCIe links of GPUs and NICs below what they and their slot can do (check ``pcie-link``).

Three sources, each optional; with none of them the check cannot tell (ERROR, or SKIP where
the bundle simply has none of the probes):

1. ``nvidia-smi -q``, per GPU: current generation and width against the max NVML reports (the
   max is already what this GPU *in this slot* can reach).
2. ``lspci -vvv``: LnkSta against LnkCap (lspci's own "(downgraded)" verdict where printed),
   for GPUs and ConnectX NICs identified by the device line or by nvidia-smi's bus ids.
3. The kernel log: "X Gb/s available PCIe bandwidth, limited by ... at <port>", which the
   kernel prints once, at enumeration, for a device whose path to the CPU is slower than the
   device. It also catches a slow link further up (an upstream PCIe switch port), which the
   GPU's own link status cannot show.

Telling an idle GPU from a degraded one. A GPU lowers its PCIe link to save power when it has
no work, and not only the generation: nvidia-smi's own field help says of both
``pcie.link.gen.current`` and ``pcie.link.width.current`` "These may be reduced when the GPU
is not in use", and the real A10G capture in the corpus (smi-q/a10g-...) sits in P8 at Gen1
x8 of Gen4 x16, healthy. lspci shows the same lowered link and calls it "(downgraded)"
(e.g. an idle RTX 4090 at "2.5GT/s (downgraded)", tinygrad/open-gpu-kernel-modules#6), so it
is no second opinion. Hence, for GPUs:

- the link is judged only in performance state P0, the state a GPU with work runs in. That
  the link is then at its full speed is preflight's reading of the evidence, not an NVIDIA
  statement: every P0 capture in the corpus is at Gen5 x16 (the H100 under gpu-burn, and the
  H200 VM even at 0% utilisation) and every lowered link is below P0. In P0, a generation or
  width below max -> FAIL, and lspci's "(downgraded)" for that GPU confirms it;
- below P0 (P2..P12) the link is reported as information only and judged on a later run
  under load (``preflight soak``, or a run while nccl-tests keep the GPUs busy); when nothing
  else could be judged the check SKIPs rather than passing an idle link;
- a max generation below the GPU's own (``Device Max``; the slot or host allows less) -> WARN:
  the link runs as fast as the platform lets it, but slower than the GPU can.

A GPU seen from inside a virtual machine (nvidia-smi's Virtualization Mode ``Pass-Through`` or
``VGPU``, NVML's guest modes) shows the link of the guest's virtual PCIe slot, which the hypervisor
models: a cloud VM's GPU at x8 of x16 says what the guest's slot is, not that the card or its riser
is faulty. There a link below its max is a WARN that says so (check the link on the host, or ask
the provider), never a FAIL; on bare metal (``None``) it stays a FAIL.

ConnectX NICs are not known to lower their link when idle (mlx5 has no such power state in
preflight's sources), so a NIC that lspci shows "(downgraded)" fails.

Kernel lines: at enumeration no driver has touched the link yet, except that NVIDIA GPUs
come up at 2.5 GT/s until the nvidia driver raises the speed (real boot logs of healthy
GeForce/Quadro cards show "limited by 2.5 GT/s PCIe x16 link"). So a 2.5 GT/s limit at full
width on a GPU, or on a device the evidence does not identify, is information; any other
limit (fewer lanes, or an intermediate speed such as a Gen4 switch in front of Gen5 GPUs) on a
GPU or NIC -> FAIL; on any other device -> WARN.

Other devices (NVSwitches, bridges, NVMe) are not judged from lspci: a switch port carries its
GPU's idle link state too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.check import error, fail, host_check, ok, skip, warn
from preflight.judge.context import EvidenceMissing
from preflight.model import Evidence

from ._pci_roles import address_key

_GPU_DEVICE = re.compile(r"(?:3D|VGA compatible) controller: NVIDIA")
_NIC_DEVICE = re.compile(r"(?:Ethernet|Infiniband|Network) controller: Mellanox")
BUSY_STATE = "P0"
GPU_BOOT_SPEED_GTS = 2.5
ACTION = ("reseat {what} (and the riser or cable to its PCIe switch), check the BIOS PCIe link settings, "
          "then re-run preflight with the GPUs under load; replace the riser/cable or open a service case "
          "if the link stays below capability")


@dataclass
class _Verdicts:
    failed: list[str] = field(default_factory=list)
    warned: list[str] = field(default_factory=list)
    healthy: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # what a failed or warned item names
    failed_gpus: set[str] = field(default_factory=set)  # address keys nvidia-smi already failed


@host_check("pcie-link", facts=["smi", "smi_probe", "lspci", "kernel_log"],
            summary="GPU and NIC PCIe links at their max generation and width (GPUs judged in P0 only)")
def pcie_link(host):
    smi, smi_missing = _optional(host, "smi")
    devices, lspci_missing = _optional(host, "lspci")
    log, log_missing = _optional(host, "kernel_log")
    missing = [exc for exc in (smi_missing, lspci_missing, log_missing) if exc is not None]
    if len(missing) == 3:
        # The most telling reason: a probe that ran and failed beats one never collected.
        raise max(missing, key=lambda e: (e.collected, len(e.symptoms)))
    gpus = {address_key(g.pci_bus_id): g for g in (smi.gpus if smi else ()) if address_key(g.pci_bus_id)}
    busy = {key for key, g in gpus.items() if g.performance_state == BUSY_STATE}
    guests = {key for key, g in gpus.items() if g.in_guest}
    v = _Verdicts()
    if smi is not None:
        _judge_smi(smi.gpus, v, host.smi_probe)
    if devices is not None:
        _judge_lspci(devices, gpus, busy, v, guests)
    if log is not None:
        _judge_kernel(log, gpus, devices or (), v)

    tail = "".join([f"; not judged: {'; '.join(v.info)}" if v.info else "",
                    f"; unavailable: {'; '.join(map(str, missing))}" if missing else ""])
    data = {"healthy": v.healthy, "not_judged": v.info}
    action = ACTION.format(what=", ".join(dict.fromkeys(v.devices)))
    out = []
    if v.failed:
        out.append(fail("PCIe link below capability: " + "; ".join(v.failed) + tail,
                        symptoms=["pcie-link-degraded"], evidence=v.evidence, data=data, action=action))
    if v.warned:
        out.append(warn("PCIe link slower than the device can run: " + "; ".join(v.warned)
                        + ("" if v.failed else tail),
                        symptoms=["pcie-link-degraded"], evidence=v.evidence, data=data, action=action))
    if out:
        return out
    # A source that is there but cannot be read is not "healthy": what it would have shown is
    # unknown (random bytes as the kernel log would otherwise pass on smi and lspci alone).
    unreadable = [exc for exc in missing if "probe-unreadable" in exc.symptoms]
    if unreadable:
        return error("; ".join(v.healthy or ["no PCIe link could be judged"]) + tail,
                     symptoms=["probe-unreadable"], evidence=[e for exc in unreadable for e in exc.evidence], data=data)
    if v.healthy:
        return ok("; ".join(v.healthy) + tail, data=data)
    return skip("no PCIe link could be judged" + tail, data=data)


def _optional(host, fact: str):
    """(fact, None) or (None, why it is missing): any one source is enough to judge."""
    try:
        return getattr(host, fact), None
    except EvidenceMissing as exc:
        return None, exc


def _gpu_label(gpu) -> str:
    index = f"GPU{gpu.index}" if gpu.index is not None else "GPU"
    return f"{index} {gpu.pci_bus_id}" if gpu.pci_bus_id else index


def _link(gen, width) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def _judge_smi(gpus, v: _Verdicts, probe: str) -> None:
    full, lines = [], []
    for gpu in gpus:
        p = gpu.pcie
        if p is None or (p.gen_current is None and p.width_current is None):
            continue
        now, best = _link(p.gen_current, p.width_current), _link(p.gen_max, p.width_max)
        below = (_less(p.gen_current, p.gen_max) or _less(p.width_current, p.width_max))
        state = gpu.performance_state or "performance state unknown"
        label = _gpu_label(gpu)
        lines.append(f"{label}: {state}, PCIe {now}, max {best}"
                     + (f", GPU supports Gen{p.gen_device_max}" if p.gen_device_max else ""))
        if below and gpu.performance_state == BUSY_STATE and gpu.in_guest:
            v.warned.append(f"{label} in P0 at {now} of {best} (nvidia-smi) {_guest_reason(gpu)}")
            v.devices.append(label)
            v.failed_gpus.add(address_key(gpu.pci_bus_id))
        elif below and gpu.performance_state == BUSY_STATE:
            v.failed.append(f"{label} in P0 at {now} of {best} (nvidia-smi)")
            v.devices.append(label)
            v.failed_gpus.add(address_key(gpu.pci_bus_id))
        elif below:
            v.info.append(f"{label} at {now} of {best} while idle ({state}): idle GPUs lower link speed "
                          "and width, judged only in P0")
        elif gpu.performance_state == BUSY_STATE:
            full.append(now)
        else:
            v.info.append(f"{label} at {now} while idle ({state})")
        if _less(p.gen_max, p.gen_device_max):
            v.warned.append(f"{label}: the slot allows Gen{p.gen_max}, the GPU supports Gen{p.gen_device_max}")
            v.devices.append(label)
    if full:
        kinds = ", ".join(sorted(set(full)))
        many = len(full) != 1
        v.healthy.append(f"{len(full)} GPU{'s' if many else ''} in P0 at {'their' if many else 'its'} "
                         f"max link ({kinds})")
    if v.failed or v.warned:
        v.evidence.append(Evidence(probe, "\n".join(lines)))


def _guest_reason(gpu) -> str:
    return (f"inside a virtual machine (Virtualization Mode: {gpu.virtualization_mode}): the link is the "
            "guest's virtual slot's, which the hypervisor sets, not necessarily the card's; check the link "
            "on the host (or with the provider)")


def _lnk(speed_gts, width) -> str:
    return f"{f'{speed_gts:g}' if speed_gts else '?'}GT/s x{width or '?'}"


def _less(value, limit) -> bool:
    return value is not None and limit is not None and value < limit


def _judge_lspci(devices, gpus: dict, busy: set, v: _Verdicts, guests: set = frozenset()) -> None:
    full_nics, shown, anonymous = 0, [], 0
    for d in devices:
        key = address_key(d.bdf)
        if key is None:
            anonymous += 1
            continue
        desc = d.description or ""
        is_gpu = key in gpus or bool(_GPU_DEVICE.search(desc))
        is_nic = bool(_NIC_DEVICE.search(desc))
        if not (is_gpu or is_nic):
            continue
        sta = _lnk(d.sta_speed_gts, d.sta_width)
        cap = _lnk(d.cap_speed_gts, d.cap_width) if d.cap_width or d.cap_speed_gts else "its capability"
        what = f"{'GPU' if is_gpu else 'NIC'} {d.bdf}"
        if d.downgraded is None:
            v.info.append(f"{what}: lspci cannot tell its link against capability ({'; '.join(d.notes)})")
        elif not d.downgraded:
            full_nics += is_nic
        elif is_nic:
            v.failed.append(f"{what} at {sta} of {cap} (lspci: downgraded)")
            v.devices.append(what)
            shown.append(f"{d.bdf} {desc}: LnkSta {sta}, LnkCap {cap}")
        elif key in busy:
            if key in guests and key not in v.failed_gpus:
                v.warned.append(f"{what} in P0 at {sta} of {cap} (lspci: downgraded) {_guest_reason(gpus[key])}")
                v.devices.append(what)
            elif key not in v.failed_gpus:  # else lspci only confirms what nvidia-smi said
                v.failed.append(f"{what} in P0 at {sta} of {cap} (lspci: downgraded)")
                v.devices.append(what)
            shown.append(f"{d.bdf} {desc}: LnkSta {sta}, LnkCap {cap}")
        else:
            v.info.append(f"{what} at {sta} of {cap} per lspci, not known to be busy")
    if full_nics:
        v.healthy.append(f"{full_nics} NIC link{'s' if full_nics != 1 else ''} at full speed and width (lspci)")
    if anonymous:
        v.info.append(f"{anonymous} link(s) in an lspci excerpt without device addresses")
    if shown:
        v.evidence.append(Evidence("lspci", "\n".join(shown)))


def _judge_kernel(log, gpus: dict, devices, v: _Verdicts) -> None:
    descriptions = {address_key(d.bdf): d.description or "" for d in devices if address_key(d.bdf)}
    mlx5 = {address_key(e.device) for e in log.events if e.driver == "mlx5_core" and e.device}
    lines = []
    limited = log.of_kind("pcie-bandwidth-limited")
    for e in limited:
        p, key = e.pcie, address_key(e.device)
        desc = descriptions.get(key, "")
        kind = ("GPU" if key in gpus or _GPU_DEVICE.search(desc)
                else "NIC" if key in mlx5 or _NIC_DEVICE.search(desc) else "device")
        what = f"{kind} {e.device}"
        speed = f"{p.speed_gts:g} GT/s" if p.speed_gts else "unknown speed"
        capable = f"{p.capable_speed_gts:g} GT/s" if p.capable_speed_gts else "unknown speed"
        said = (f"{what}: {p.available_gbps:g} of {p.capable_gbps:g} Gb/s, limited by {speed} x{p.width} at "
                f"{p.limited_at} (capable of {capable} x{p.capable_width}; kernel, at boot)")
        narrow = p.width < p.capable_width
        if not narrow and p.speed_gts in (None, GPU_BOOT_SPEED_GTS) and kind != "NIC":
            v.info.append(f"{said}: NVIDIA GPUs enumerate at 2.5 GT/s until their driver raises the link")
            continue
        guest = gpus.get(key) if key in gpus and gpus[key].in_guest else None
        if guest is not None:
            said = f"{said} {_guest_reason(guest)}"
        (v.failed if kind != "device" and guest is None else v.warned).append(said)
        v.devices.append(f"{what} (bottleneck at {p.limited_at})")
        lines.append(e.raw.strip())
    if lines:
        v.evidence.append(Evidence("kernel-log", "\n".join(lines[:8])))
    if not limited:
        v.healthy.append("no 'available PCIe bandwidth, limited by' line in the kernel log")
