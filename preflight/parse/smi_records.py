"""What ``nvidia-smi -q`` says about a node, as records: GPUs with their ECC, row-remapping,
PCIe, fabric and clock-event state (``SmiReport``), and NVML's clock-event reason bits.
``preflight.parse.nvidia_smi`` fills them from either the XML or the text form."""

from __future__ import annotations

from dataclasses import dataclass

# --- NVML clock-event bits (docs/sources.md §4.1) -------------------------------------------------

CLOCK_EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


def reasons_from_bitmask(mask: int) -> frozenset[str]:
    """Reason names set in NVML's clocks-event bitmask. Bits NVML documents without a
    published value (board limit, reliability) come back as ``unknown_bit_0x...`` so they
    are never silently dropped."""
    names = {name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit}
    rest = mask & ~sum(CLOCK_EVENT_BITS.values())
    names.update(f"unknown_bit_{1 << n:#x}" for n in range(rest.bit_length()) if rest >> n & 1)
    return frozenset(names)


# --- Records -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EccCounters:
    """One ECC counter bucket (volatile = since driver load, aggregate = lifetime).

    ``correctable``/``uncorrectable`` are SRAM + DRAM. Drivers 58x+ split SRAM uncorrectable
    into parity and SEC-DED; ``sram_uncorrectable`` is then their sum."""

    correctable: int | None = None
    uncorrectable: int | None = None
    sram_correctable: int | None = None
    sram_uncorrectable: int | None = None
    sram_uncorrectable_parity: int | None = None
    sram_uncorrectable_secded: int | None = None
    dram_correctable: int | None = None
    dram_uncorrectable: int | None = None


@dataclass(frozen=True)
class EccCounts:
    volatile: EccCounters | None = None
    aggregate: EccCounters | None = None
    sram_threshold_exceeded: bool | None = None
    # (source, count) for l2, sm, microcontroller, pcie, other, as printed by drivers 58x+.
    aggregate_uncorrectable_sram_sources: tuple[tuple[str, int], ...] = ()
    channel_repair_pending: bool | None = None
    tpc_repair_pending: bool | None = None
    unrepairable_memory: bool | None = None


@dataclass(frozen=True)
class RemapHistogram:
    """Banks by how many spare rows they have left ("Bank Remap Availability Histogram")."""

    max: int | None = None
    high: int | None = None
    partial: int | None = None
    low: int | None = None
    none: int | None = None


@dataclass(frozen=True)
class RemappedRows:
    correctable: int | None = None
    uncorrectable: int | None = None
    correctable_inactive: int | None = None
    uncorrectable_inactive: int | None = None
    pending: bool | None = None
    failure: bool | None = None
    histogram: RemapHistogram | None = None


@dataclass(frozen=True)
class RetiredPages:
    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class PcieLink:
    """``gen_max`` is what nvidia-smi calls "Max": the best generation this GPU in this slot
    can reach; ``gen_device_max`` and ``gen_host_max`` are the two sides of it."""

    gen_current: int | None = None
    gen_max: int | None = None
    gen_device_current: int | None = None
    gen_device_max: int | None = None
    gen_host_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None
    replays: int | None = None


@dataclass(frozen=True)
class FabricInfo:
    state: str | None = None
    status: str | None = None
    clique_id: str | None = None
    cluster_uuid: str | None = None
    health_summary: str | None = None


@dataclass(frozen=True)
class GpuInfo:
    index: int | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    board_part_number: str | None = None  # what a vendor (RMA) case asks for beside the serial
    persistence_mode: bool | None = None
    mig_mode: bool | None = None
    ecc_mode: bool | None = None
    ecc: EccCounts | None = None
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    pcie: PcieLink | None = None
    fabric: FabricInfo | None = None
    # "GPU Reset Status" is a section of two Yes/No lines (deprecated in 59x drivers).
    reset_required: bool | None = None
    drain_and_reset_recommended: bool | None = None
    recovery_action: str | None = None
    clocks_event_reasons: frozenset[str] = frozenset()
    clocks_event_reasons_known: frozenset[str] = frozenset()
    clocks_event_counters_us: tuple[tuple[str, int], ...] = ()
    temperature_c: int | None = None
    memory_temperature_c: int | None = None
    temp_slowdown_c: int | None = None
    temp_shutdown_c: int | None = None
    temp_max_operating_c: int | None = None
    temp_limit_margin_c: int | None = None
    slowdown_margin_c: int | None = None
    shutdown_margin_c: int | None = None
    max_operating_margin_c: int | None = None
    power_draw_w: float | None = None
    power_draw_instant_w: float | None = None
    power_limit_w: float | None = None
    default_power_limit_w: float | None = None
    max_power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    utilization_gpu_pct: int | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    performance_state: str | None = None
    virtualization_mode: str | None = None  # "None" (bare metal), "Pass-Through", "VGPU", "Host VGPU", ...
    # Fields whose value held bytes that are not text (preflight.parse.garbled): left None.
    unreadable: tuple[str, ...] = ()

    @property
    def in_guest(self) -> bool:
        """Whether the GPU is seen from inside a virtual machine (passed through, or a vGPU):
        NVML's NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH / _VGPU (docs/sources.md §9)."""
        return (self.virtualization_mode or "").replace("-", "").replace(" ", "").lower() in ("passthrough", "vgpu")


@dataclass(frozen=True)
class SmiReport:
    timestamp: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    attached_gpus: int | None = None
    gpus: tuple[GpuInfo, ...] = ()
    notes: tuple[str, ...] = ()
    # Report fields (driver_version, cuda_version, ...) whose value held bytes that are not text.
    unreadable: tuple[str, ...] = ()
    # Set when the output ends (or breaks) before its last GPU was shown: what was read, and
    # what was not. Such a report judges the GPUs it holds and passes none it lacks.
    cut: str | None = None
    # Set when the output is whole but does not say it lists every GPU of the node: no "Attached
    # GPUs" line (an excerpt), or fewer GPUs than that line counts with nothing cut or unreachable
    # (a selection, ``nvidia-smi -q -i 0``, or a pasted excerpt). Its GPUs are records; how many
    # GPUs the node has is not evidence from it (preflight.judge.census). None: a whole list.
    partial: str | None = None
    # With ``partial``: whether it is a whole output that lists fewer GPUs than its header counts
    # (each GPU's section whole), which a command that asked for every GPU (no ``-i``) can only
    # print when it stopped early (text) or left GPUs out (XML): see ``asked_for_every_gpu``.
    selection: bool = False

    @property
    def counts_gpus(self) -> bool:
        """Whether the number of GPUs listed is the node's: the output is neither cut nor partial."""
        return self.cut is None and self.partial is None
