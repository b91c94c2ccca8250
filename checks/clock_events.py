"""Clock-event reasons as a static run finds them (check ``clock-events``).

A static run reads the GPUs as they are, usually idle. Some reasons are settings or load and say
nothing wrong: Idle, Applications Clocks Setting, SW Power Cap, Sync Boost, Display Clock Setting.
The others are a fault whatever the load, and at idle they cannot be the workload's doing
(NVIDIA's NVML and DCGM reference, docs/sources.md §4.6):

- HW Power Brake Slowdown: an external power-brake input is asserted, e.g. by the system's power
  supply; the clocks fall by half or more. FAIL ``power-capping``, with the power delivery and
  the chassis as the place to look.
- HW Thermal Slowdown, SW Thermal Slowdown: the GPU is too hot for its clocks. FAIL
  ``thermal-throttling``.
- HW Slowdown alone (neither of the above set): temperature, a power brake or a power-draw fast
  trigger, but NVIDIA also notes it "may be reported during PState or clock change", so one
  reading WARNs ``power-capping`` and asks for a second one.

The reasons, the SM clock and the P-state of each GPU named are the evidence. Not applicable
(SKIP): no GPU reports its reasons (old drivers, excerpts without that section).
"""

from __future__ import annotations

from preflight.check import fail, host_check, ok, skip, warn
from preflight.model import Evidence

THERMAL = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown"})
BRAKE = "hw_power_brake_slowdown"
HW = "hw_slowdown"


@host_check("clock-events", facts=["smi", "smi_probe"],
            summary="no hardware or thermal clock-event reason active (HW slowdown, power brake, thermal)")
def clock_events(host):
    gpus = [g for g in host.smi.gpus if g.clocks_event_reasons_known or g.clocks_event_reasons]
    if not gpus:
        return skip("no GPU reports its clock-event reasons (driver or excerpt without that section)")
    brake = [g for g in gpus if BRAKE in g.clocks_event_reasons]
    thermal = [g for g in gpus if g.clocks_event_reasons & THERMAL]
    hw_only = [g for g in gpus if HW in g.clocks_event_reasons and g not in brake and g not in thermal]
    out = []
    if brake:
        out.append(fail(f"HW power brake slowdown active on {_names(brake)}: the clocks are held by an external "
                        "power-brake signal" + _idle(brake), symptoms=["power-capping"],
                        evidence=[_evidence(host, brake)], data={"gpus": [g.pci_bus_id for g in brake]},
                        action="Check the node's power supplies and their redundancy, the chassis power "
                               "budget and the BMC's power-capping settings (the brake is asserted outside "
                               "the GPU); then re-run preflight"))
    if thermal:
        out.append(fail(f"thermal slowdown active on {_names(thermal)}" + _idle(thermal),
                        symptoms=["thermal-throttling"], evidence=[_evidence(host, thermal)],
                        data={"gpus": [g.pci_bus_id for g in thermal]}))
    if hw_only:
        out.append(warn(f"HW slowdown active on {_names(hw_only)} (neither power brake nor thermal): a "
                        "power-draw trigger, or a reading taken during a P-state change", symptoms=["power-capping"],
                        evidence=[_evidence(host, hw_only)], data={"gpus": [g.pci_bus_id for g in hw_only]},
                        action="Read the reasons again (nvidia-smi -q -d PERFORMANCE); if HW Slowdown stays, "
                               "check power delivery and cooling as for a power brake"))
    if out:
        return out
    seen = sorted({r for g in gpus for r in g.clocks_event_reasons})
    return ok(f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: no hardware or thermal clock event"
              + (f" (active: {', '.join(seen)})" if seen else ""))


def _names(gpus) -> str:
    return ", ".join(f"GPU {g.index if g.index is not None else g.pci_bus_id}" for g in gpus)


def _idle(gpus) -> str:
    idle = [g for g in gpus if g.utilization_gpu_pct == 0 or "gpu_idle" in g.clocks_event_reasons]
    return "; at idle, so not the workload's doing" if idle and len(idle) == len(gpus) else ""


def _evidence(host, gpus) -> Evidence:
    return Evidence(host.smi_probe, "\n".join(
        f"GPU {g.index if g.index is not None else g.pci_bus_id}: {', '.join(sorted(g.clocks_event_reasons))}; "
        f"SM {g.sm_clock_mhz if g.sm_clock_mhz is not None else '?'} MHz"
        + (f" of {g.max_sm_clock_mhz}" if g.max_sm_clock_mhz else "")
        + (f", {g.performance_state}" if g.performance_state else "") for g in gpus))
