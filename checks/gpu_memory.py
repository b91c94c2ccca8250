"""GPU memory health from NVML's counters in ``nvidia-smi -q`` (check ``gpu-memory``).

Judged per GPU, reported per kind of fault with every GPU that has it:

- ECC uncorrectable, *volatile* (since the driver loaded or the GPU was last reset) > 0 ->
  FAIL ``gpu-ecc-uncorrectable``: memory that lost data since boot is a current fault. The
  *aggregate* (lifetime, kept in the InfoROM) count is history: an old error the row remapper
  or page retirement already dealt with. It is reported in the summary, not judged; its current
  consequences are what the remapper flags below say.
- ``SRAM Threshold Exceeded: Yes`` -> FAIL ``gpu-ecc-uncorrectable``: NVIDIA's WORKFLOW_XID_48
  sends a GPU with this flag to field diagnostics (docs/sources.md §5.2).
- Row remapping (Ampere and newer): ``Remapping Failure Occurred: Yes`` or a bank with no spare
  rows left (histogram ``None`` > 0, so its next error cannot be remapped) -> FAIL
  ``gpu-row-remap`` with an RMA action. ``Pending: Yes`` -> FAIL ``gpu-row-remap`` with a reset
  action: the repair takes effect only at the next GPU reset, and DCGM's diagnostic (the
  software plugin's pending-row-remap check) fails a GPU in that state and skips its later
  tests (DCGM_FR_PENDING_ROW_REMAP, severity "Drain and reset GPU"; docs/sources.md §5.3).
  NVIDIA's memory error management guide lets unaffected work keep running with the flag set,
  which is why a serving node is not torn down by it; a node under acceptance is reset first.
- Page retirement (pre-Ampere): pages pending retirement -> FAIL ``gpu-row-remap`` for the same
  reason (DCGM's software plugin fails DCGM_FR_PENDING_PAGE_RETIREMENTS; the retirement takes
  effect at the next reset or reboot).

Correctable counts are shown, not judged: correcting them is what ECC is for, and no source
in docs/sources.md gives a rate that should worry. Not applicable (SKIP): no GPU reports ECC, row
remapping or page retirement (GeForce boards, excerpts of other sections).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from preflight.check import Outcome, fail, host_check, ok, skip
from preflight.model import Evidence


@dataclass(frozen=True)
class _Fault:
    """One kind of memory fault; the outcome lists every GPU that has it."""

    verdict: Callable[..., Outcome]  # fail (every memory fault an acceptance run can see fails)
    symptom: str
    what: str  # "uncorrectable ECC errors since the driver loaded"
    action: str


UNCORRECTABLE = _Fault(fail, "gpu-ecc-uncorrectable", "uncorrectable ECC errors since the driver loaded",
                       "drain the node, reset the GPU (nvidia-smi -r -i <index>) and re-run preflight: volatile "
                       "uncorrectable ECC must read 0 and no remap stay pending; if errors return, run field "
                       "diagnostics and RMA the GPU")
SRAM_THRESHOLD = _Fault(fail, "gpu-ecc-uncorrectable", "SRAM uncorrectable-error threshold exceeded",
                        "drain the node and run NVIDIA field diagnostics on the GPU (WORKFLOW_XID_48: the "
                        "SRAM threshold flag is set); RMA it if they fail")
REMAP_FAILED = _Fault(fail, "gpu-row-remap", "row remapping failed",
                      "drain the node and RMA the GPU: a row remapping failed, so bad memory stays in use")
NO_SPARE_ROWS = _Fault(fail, "gpu-row-remap", "memory banks without a spare row left",
                       "drain the node and RMA the GPU: a bank has no spare rows, so its next memory error "
                       "cannot be remapped")
REMAP_PENDING = _Fault(fail, "gpu-row-remap", "row remapping pending",
                       "drain the node and reset the GPU (nvidia-smi -r -i <index>) or reboot to activate the "
                       "remap, then re-run preflight: Pending must read No")
RETIRE_PENDING = _Fault(fail, "gpu-row-remap", "retired pages pending",
                        "drain the node and reset the GPU (nvidia-smi -r -i <index>) or reboot so the pages "
                        "are retired, then re-run preflight")
FAULTS = (UNCORRECTABLE, SRAM_THRESHOLD, REMAP_FAILED, NO_SPARE_ROWS, REMAP_PENDING, RETIRE_PENDING)


@host_check("gpu-memory", facts=["smi", "smi_probe"],
            summary="ECC uncorrectable errors since boot, row remapping pending/failed, retired pages pending")
def gpu_memory(host):
    gpus = [g for g in host.smi.gpus if g.ecc or g.remapped_rows or g.retired_pages]
    if not gpus:
        return skip("no GPU reports ECC, row remapping or page retirement")
    found: dict[_Fault, list[tuple[object, str]]] = {}
    for gpu in gpus:
        for fault, detail in faults_of(gpu):
            found.setdefault(fault, []).append((gpu, detail))
    if not found:
        return ok(f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: no uncorrectable ECC error since the "
                  f"driver loaded, no row remap pending or failed{_history(gpus)}")
    out = []
    history = _history(gpus)  # told once, on the first (most severe) outcome
    for fault in FAULTS:
        if fault not in found:
            continue
        hits = found[fault]
        names = ", ".join(f"{gpu_label(g)} ({detail})" for g, detail in hits)
        lines = "\n".join(f"{gpu_label(g)}: {detail}" for g, detail in hits)
        summary, history = f"{fault.what} on {len(hits)} of {len(gpus)} GPUs: {names}{history}", ""
        out.append(fault.verdict(summary,
                                 symptoms=[fault.symptom], evidence=[Evidence(host.smi_probe, lines)],
                                 data={"gpus": [g.pci_bus_id for g, _ in hits]},
                                 action=_with_index(fault.action, [g for g, _ in hits])))
    return out


def faults_of(gpu) -> list[tuple[_Fault, str]]:
    """(fault, what nvidia-smi said) for every memory fault of one GPU."""
    out = []
    ecc, rows, pages = gpu.ecc, gpu.remapped_rows, gpu.retired_pages
    volatile = ecc.volatile if ecc else None
    if volatile and volatile.uncorrectable:
        out.append((UNCORRECTABLE, f"volatile uncorrectable {volatile.uncorrectable}: "
                                   f"DRAM {volatile.dram_uncorrectable or 0}, SRAM {volatile.sram_uncorrectable or 0}"))
    if ecc and ecc.sram_threshold_exceeded:
        out.append((SRAM_THRESHOLD, "SRAM Threshold Exceeded: Yes"))
    if rows and rows.failure:
        out.append((REMAP_FAILED, "Remapping Failure Occurred: Yes"))
    if rows and rows.histogram and rows.histogram.none:
        out.append((NO_SPARE_ROWS, f"Bank Remap Availability Histogram None: {rows.histogram.none} bank(s)"))
    if rows and rows.pending:
        out.append((REMAP_PENDING, f"Remapped Rows Pending: Yes; rows remapped for correctable errors "
                                   f"{rows.correctable}, for uncorrectable {rows.uncorrectable}"))
    if pages and pages.pending:
        out.append((RETIRE_PENDING, "retired pages pending"))
    return out


def gpu_label(gpu) -> str:
    index = f"GPU{gpu.index}" if gpu.index is not None else "GPU"
    return f"{index} {gpu.pci_bus_id}" if gpu.pci_bus_id else index


def _with_index(action: str, gpus: list) -> str:
    """The action with the GPU index filled in; nvidia-smi -r takes one GPU per call."""
    indices = [str(g.index) for g in gpus if g.index is not None]
    if "<index>" not in action or not indices:
        return action
    if len(indices) == 1:
        return action.replace("<index>", indices[0])
    return action.replace("<index>", "N") + f" (N = {', '.join(indices)}, one call each)"


def _history(gpus) -> str:
    """Lifetime uncorrectable, correctable and remapped-row counts: shown, not judged (see above)."""
    parts = []
    for g in gpus:
        aggregate = g.ecc.aggregate if g.ecc else None
        volatile = g.ecc.volatile if g.ecc else None
        seen = []
        if aggregate and aggregate.uncorrectable:
            seen.append(f"{aggregate.uncorrectable} uncorrectable in its lifetime")
        if volatile and volatile.correctable:
            seen.append(f"{volatile.correctable} correctable since boot")
        if g.remapped_rows and (g.remapped_rows.correctable or g.remapped_rows.uncorrectable):
            seen.append(f"{(g.remapped_rows.correctable or 0) + (g.remapped_rows.uncorrectable or 0)} rows remapped")
        if seen:
            parts.append(f"{gpu_label(g)}: {', '.join(seen)}")
    return f" (counts not judged: {'; '.join(parts)})" if parts else ""
