"""PCIe AER errors, containment, surprise removal and failed recovery in the kernel log (check ``pcie-errors``).

Input is the ``kernel-log`` probe as ``preflight/parse/kernel_log.py`` reads it, grouped into
incidents by ``preflight/parse/pcie_incidents.py``; nvidia-smi and lspci, where collected, say
which addresses are GPUs, NICs and NVSwitches (``_pci_roles.py``), as does the driver that
printed a line (``nvidia``, ``mlx5_core``).

What the kernel's AER guide says the classes mean (Documentation/PCI/pcieaer-howto.rst):
correctable errors "pose no impacts on the functionality of the interface"; uncorrectable ones
make a transaction (non-fatal) or the link itself (fatal) unreliable, and the kernel resets the
port above to recover. A device whose driver has no error handler "won't be recovered"; the
NVIDIA GPU driver registers none (NVIDIA/open-gpu-kernel-modules#1229), so after an
uncorrectable error on its link a GPU is gone until the node is power-cycled, as after Xid 79
(NVIDIA's Xid catalog: RESTART_BM).

Verdicts, per incident:

- recovery failed (``AER: device recovery failed``), whatever the device -> FAIL
  ``pcie-recovery-failed``: a device below that port is unusable until a reset or power cycle.
- an uncorrectable (fatal or non-fatal) error, a containment (DPC) or a lost link (pciehp
  ``Link Down`` / ``Card not present``) that names a GPU, NIC or NVSwitch -> FAIL
  (``pcie-uncorrectable-error``, or ``pcie-link-lost`` when the link went down). The same on
  another device (an NVMe, a chipset port) -> FAIL too unless the kernel printed ``device recovery
  successful`` for it, which is reported and passes: the device came back and is not an
  accelerator this tool judges.
- corrected errors, by rate: per port, the count over the log's span (its first and last
  timestamps; at least ``MIN_SPAN_S``, so a burst within a millisecond is not divided by zero).
  ``CORRECTED_MIN`` or more errors at ``CORRECTED_PER_HOUR`` or faster -> WARN
  ``pcie-correctable-errors``; a handful (fewer than ``CORRECTED_MIN``), or a slower trickle, is
  reported and passes. The kernel ratelimits correctable messages (10 per 5 s per device), so a
  flood reads as at least that count. A log without timestamps gives no rate: then the count
  alone decides.
"""

from __future__ import annotations

from preflight.check import fail, host_check, ok, skip, warn
from preflight.model import Evidence
from preflight.parse.pcie_incidents import PcieIncident, incidents, seconds

from ._pci_roles import DEVICE, role_of, roles

PROBE = "kernel-log"
EVIDENCE_LINES = 8
# Corrected errors: WARN at one a minute on average (60 an hour) once there are at least 10.
# Project choice: correctable errors are fixed by the link itself (pcieaer-howto.rst), and
# Meta's GCM health checks report them as informational only (facebookresearch/gcm pcie-aer:
# "Only corrected PCIe AER errors (hardware auto-recovered)" exits OK), so a few never warn; a
# sustained stream means a marginal link (riser, retimer, seating) replaying traffic, worth a
# look before it turns uncorrectable. One a minute is far above a healthy link's handful at
# boot and far below the 7,200 an hour the kernel's ratelimit lets through per device.
CORRECTED_PER_HOUR = 60.0
CORRECTED_MIN = 10
MIN_SPAN_S = 60.0
EMPTY_JOURNAL = "journalctl reported no entries"


@host_check("pcie-errors", facts=["kernel_log", "smi", "lspci"],
            summary="PCIe AER errors, containment, surprise removal and failed recovery in the kernel log")
def pcie_errors(host):
    log = host.kernel_log
    found = incidents(log.events)
    if not log.events and EMPTY_JOURNAL in log.notes:
        return skip("the kernel log is empty (journalctl: no entries): no PCIe error history to judge")
    known = roles(host, log)
    lines = host.text(PROBE).splitlines()
    failed: dict[str, list[PcieIncident]] = {}
    passed: list[str] = []
    corrected: dict[str, list[PcieIncident]] = {}
    for incident in found:
        cause = _cause(incident, known)
        if cause:
            failed.setdefault(cause, []).append(incident)
        elif incident.severity == "corrected":
            corrected.setdefault(incident.port or "unknown port", []).append(incident)
        else:
            passed.append(_describe(incident, known))
    out = [_failure(cause, items, known, lines) for cause, items in failed.items()]
    hours = _span_hours(log)
    stream = {port: items for port, items in corrected.items() if _is_stream(len(items), hours)}
    if stream:
        out.append(_corrected_warning(stream, hours, known, lines, log.notes))
    notes = [f"{len(items)} corrected error{'s' if len(items) != 1 else ''} at {port} "
             f"({_rate(len(items), hours)})" for port, items in corrected.items() if port not in stream]
    notes += passed
    if out:
        return out
    summary = f"no uncorrectable PCIe error, failed recovery or lost link in {log.line_count} kernel-log lines"
    return ok(summary + (f"; {'; '.join(notes)}" if notes else ""), data={"incidents": len(found)})


def _cause(incident: PcieIncident, known: dict[str, str]) -> str | None:
    """The cause an incident fails the node with, or None when it passes (corrected errors, or
    an uncorrectable error on a non-accelerator the kernel recovered)."""
    if incident.recovery == "failed":
        return "pcie-recovery-failed"
    if incident.severity == "corrected" and not incident.link_lost:
        return None
    # "can't recover" is printed only for an uncorrectable error, whatever the log kept of it.
    serious = incident.uncorrectable or incident.link_lost or bool(incident.unrecoverable)
    accelerator = any(role_of(known, d) != DEVICE for d in incident.devices)
    if not serious or (not accelerator and incident.recovery == "successful"):
        return None
    return "pcie-link-lost" if incident.link_lost else "pcie-uncorrectable-error"


def _name(known: dict[str, str], bdf: str, drivers: dict[str, str] | None = None) -> str:
    """'GPU 0000:03:00.0'; another function of the same card that another driver owns keeps
    its driver's name ('0000:03:00.1 (snd_hda_intel)'), not the card's role."""
    role, driver = role_of(known, bdf), (drivers or {}).get(bdf)
    if driver and driver not in _ROLE_DRIVERS.get(role, (driver,)):
        return f"{bdf} ({driver})"
    return f"{role} {bdf}" if role != DEVICE else bdf


_ROLE_DRIVERS = {"GPU": ("nvidia",), "NIC": ("mlx5_core",), "NVSwitch": ("nvidia-nvswitch",), DEVICE: ("pcieport",)}


def _describe(incident: PcieIncident, known: dict[str, str]) -> str:
    what = {"aer": "AER error", "link-down": "link down", "card-removed": "card not present (surprise removal)",
            "containment": "DPC containment", "partial": "AER report (its start is not in the log)"}[incident.kind]
    severity = {"fatal": "uncorrectable (fatal) ", "non-fatal": "uncorrectable (non-fatal) ",
                "corrected": "corrected "}.get(incident.severity, "")
    if incident.kind != "aer" and severity:
        what = f"{what} with an {severity}error"
    else:
        what = f"{severity}{what}"
    port = incident.port
    below = [_name(known, d, incident.drivers) for d in incident.devices if d != port]
    where = f"at {_name(known, port, incident.drivers)}" if port else "at an unnamed port"
    if below:
        where += f" ({', '.join(below)} below it)"
    parts = [f"{what} {where}"]
    if incident.errors:
        parts.append(", ".join(incident.errors))
    if incident.unrecoverable:
        drivers = sorted({incident.drivers.get(d, "?") for d in incident.unrecoverable})
        parts.append(f"no error handler in {', '.join(drivers)} for {', '.join(incident.unrecoverable)} "
                     "(\"can't recover\")")
    if incident.recovery:
        parts.append(f"recovery {incident.recovery}")
    stamp = f" [{incident.timestamp}]" if incident.timestamp else ""
    return ": ".join(parts[:1]) + (f": {'; '.join(parts[1:])}" if parts[1:] else "") + f" (line {incident.line}{stamp})"


_ACTIONS = {
    "pcie-recovery-failed": "drain the node and power-cycle it (a GPU without a PCIe error handler comes back only "
                            "then); reseat the device named, its riser and cable; if it recurs, open an RMA case",
    "pcie-uncorrectable-error": "drain the node; power-cycle it and re-run preflight; reseat the device and its "
                                "riser; if the error recurs on the same link, replace the riser/cable or RMA it",
    "pcie-link-lost": "drain the node; check the device is seated and powered (riser, power cable), power-cycle and "
                      "re-run preflight; if the link drops again, RMA the device or the baseboard",
}
_TITLES = {"pcie-recovery-failed": "PCIe error recovery failed",
           "pcie-uncorrectable-error": "uncorrectable PCIe error",
           "pcie-link-lost": "PCIe link lost (link down, surprise removal or containment)"}


def _failure(cause: str, items: list[PcieIncident], known: dict[str, str], lines: list[str]):
    described = [_describe(i, known) for i in items[:4]]
    more = f"; and {len(items) - 4} more" if len(items) > 4 else ""
    devices = list(dict.fromkeys(d for i in items for d in i.devices))
    drivers = {d: name for i in items for d, name in i.drivers.items()}
    data = {"incidents": len(items), "devices": devices,
            "errors": sorted({e for i in items for e in i.errors})}
    return fail(f"{_TITLES[cause]}: {'; '.join(described)}{more}", symptoms=[cause],
                evidence=[_evidence(items, lines)], data=data,
                action=f"{', '.join(_name(known, d, drivers) for d in devices[:4])}: {_ACTIONS[cause]}")


def _corrected_warning(stream: dict[str, list[PcieIncident]], hours: float | None, known, lines, notes):
    parts = []
    for port, items in stream.items():
        names = sorted({e for i in items for e in i.errors})
        below = sorted({_name(known, d) for i in items for d in i.devices if d != port})
        parts.append(f"{len(items)} corrected errors at {_name(known, port)}"
                     + (f" ({', '.join(below)})" if below else "")
                     + f", {_rate(len(items), hours)}" + (f": {', '.join(names)}" if names else ""))
    limited = any("rate-limited" in n for n in notes)
    return warn("a stream of corrected PCIe errors: " + "; ".join(parts)
                + ("; the kernel rate-limited messages, so the counts are lower bounds" if limited else ""),
                symptoms=["pcie-correctable-errors"],
                evidence=[_evidence([i for items in stream.values() for i in items], lines)],
                data={"per_port": {port: len(items) for port, items in stream.items()},
                      "span_hours": round(hours, 3) if hours is not None else None},
                action="watch whether the rate holds (dmesg | grep -c 'AER: Corrected'); reseat the device and "
                       "its riser at the next service window; an uncorrectable error on the same link fails the node")


def _span_hours(log) -> float | None:
    first, last = seconds(log.first_timestamp), seconds(log.last_timestamp)
    if first is None or last is None or last < first:
        return None
    return (last - first) / 3600


def _per_hour(count: int, hours: float) -> float:
    return count / max(hours, MIN_SPAN_S / 3600)


def _is_stream(count: int, hours: float | None) -> bool:
    if count < CORRECTED_MIN:
        return False  # a handful, however close together
    return hours is None or _per_hour(count, hours) >= CORRECTED_PER_HOUR


def _rate(count: int, hours: float | None) -> str:
    if hours is None:
        return "the log's timestamps give no time span"
    span = f"{hours:.2f} h" if hours >= 1 else f"{hours * 3600:.3g} s"
    return f"{_per_hour(count, hours):,.0f} an hour over {span} of log"


def _evidence(items: list[PcieIncident], lines: list[str]) -> Evidence:
    numbers = sorted({n for i in items for n in i.lines})
    shown = [lines[n - 1].strip() for n in numbers[:EVIDENCE_LINES] if n <= len(lines)]
    if len(numbers) > EVIDENCE_LINES:
        shown.append(f"... and {len(numbers) - EVIDENCE_LINES} more lines")
    return Evidence(PROBE, "\n".join(shown))
