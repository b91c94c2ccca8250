"""The field table of ``nvidia-smi -q``: one row per GPU value, its XML path and text label path
side by side (``GPU_FIELDS``), the report header's (``REPORT_FIELDS``), and the clock-event reason and
counter names of both forms. Adding a field means adding one row."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from preflight.parse.smi_values import to_bool, to_float, to_int, to_str


@dataclass(frozen=True)
class Field:
    name: str  # "ecc.volatile.dram_uncorrectable": the prefix picks the sub-record
    convert: Callable[[str], object]
    xml: tuple[str, ...]  # alternative element paths below <gpu>, first present wins
    text: tuple[str, ...]  # alternative label paths below "GPU <bus id>"


def _paths(prefixes: str, leaves: str) -> tuple[str, ...]:
    """Every ``prefix/leaf`` of two ``|``-separated lists of alternatives, in order."""
    return tuple(
        "/".join(filter(None, (prefix, leaf)))
        for prefix in prefixes.split("|")
        for leaf in filter(None, leaves.split("|"))
    )


def _section(xml: str, text: str, rows: Iterable[tuple[str, Callable[[str], object], str, str]]):
    """Fields of one output section: (name, converter, XML leaf, text label) rows below the
    section's XML path and text label path (``|`` separates alternatives everywhere)."""
    return tuple(Field(name, conv, _paths(xml, x), _paths(text, t)) for name, conv, x, t in rows)


_S, _I, _F, _B = to_str, to_int, to_float, to_bool

GPU_FIELDS: tuple[Field, ...] = (
    *_section("", "", [
        ("name", _S, "product_name", "Product Name"),
        ("uuid", _S, "uuid", "GPU UUID"),
        ("serial", _S, "serial", "Serial Number"),
        ("vbios_version", _S, "vbios_version", "VBIOS Version"),
        ("board_part_number", _S, "board_part_number", "Board Part Number"),
        ("pci_bus_id", _S, "pci/pci_bus_id", "PCI/Bus Id"),
        ("persistence_mode", _B, "persistence_mode", "Persistence Mode"),
        ("mig_mode", _B, "mig_mode/current_mig", "MIG Mode/Current"),
        ("ecc_mode", _B, "ecc_mode/current_ecc", "ECC Mode/Current"),
        ("recovery_action", _S, "gpu_recovery_action", "GPU Recovery Action"),
        ("performance_state", _S, "performance_state", "Performance State"),
        # NVML's nvmlGpuVirtualizationMode_t as nvidia-smi prints it: None (bare metal),
        # Pass-Through / VGPU (a guest), Host VGPU / Host VSGA (the hypervisor).
        ("virtualization_mode", _S, "gpu_virtualization_mode/virtualization_mode",
         "GPU Virtualization Mode/Virtualization Mode"),
        ("sm_clock_mhz", _I, "clocks/sm_clock", "Clocks/SM"),
        ("memory_clock_mhz", _I, "clocks/mem_clock", "Clocks/Memory"),
        ("max_sm_clock_mhz", _I, "max_clocks/sm_clock", "Max Clocks/SM"),
        ("utilization_gpu_pct", _I, "utilization/gpu_util", "Utilization/GPU"),
        ("memory_total_mib", _I, "fb_memory_usage/total", "FB Memory Usage/Total"),
        ("memory_used_mib", _I, "fb_memory_usage/used", "FB Memory Usage/Used"),
    ]),
    *_section("gpu_reset_status", "GPU Reset Status", [
        ("reset_required", _B, "reset_required", "Reset Required"),
        ("drain_and_reset_recommended", _B, "drain_and_reset_recommended", "Drain and Reset Recommended"),
    ]),
    *_section("temperature", "Temperature", [
        ("temperature_c", _I, "gpu_temp", "GPU Current Temp|Gpu"),
        ("memory_temperature_c", _I, "memory_temp", "Memory Current Temp"),
        ("temp_shutdown_c", _I, "gpu_temp_max_threshold", "GPU Shutdown Temp"),
        ("temp_slowdown_c", _I, "gpu_temp_slow_threshold", "GPU Slowdown Temp"),
        ("temp_max_operating_c", _I, "gpu_temp_max_gpu_threshold", "GPU Max Operating Temp"),
        ("temp_limit_margin_c", _I, "gpu_temp_tlimit", "GPU T.Limit Temp"),
        ("shutdown_margin_c", _I, "gpu_temp_max_tlimit_threshold", "GPU Shutdown T.Limit Temp"),
        ("slowdown_margin_c", _I, "gpu_temp_slow_tlimit_threshold", "GPU Slowdown T.Limit Temp"),
        ("max_operating_margin_c", _I, "gpu_temp_max_gpu_tlimit_threshold", "GPU Max Operating T.Limit Temp"),
    ]),
    # "GPU Power Readings" since 535, "Power Readings" before (with "Enforced Power Limit").
    *_section("gpu_power_readings|power_readings", "GPU Power Readings|Power Readings", [
        ("power_draw_w", _F, "power_draw|average_power_draw", "Power Draw|Average Power Draw"),
        ("power_draw_instant_w", _F, "instant_power_draw", "Instantaneous Power Draw"),
        ("power_limit_w", _F, "current_power_limit|enforced_power_limit",
         "Current Power Limit|Enforced Power Limit"),
        ("default_power_limit_w", _F, "default_power_limit", "Default Power Limit"),
        ("max_power_limit_w", _F, "max_power_limit", "Max Power Limit"),
    ]),
    *_section("pci/pci_gpu_link_info", "PCI/GPU Link Info", [
        ("pcie.gen_current", _I, "pcie_gen/current_link_gen", "PCIe Generation/Current"),
        ("pcie.gen_max", _I, "pcie_gen/max_link_gen", "PCIe Generation/Max"),
        ("pcie.gen_device_current", _I, "pcie_gen/device_current_link_gen", "PCIe Generation/Device Current"),
        ("pcie.gen_device_max", _I, "pcie_gen/max_device_link_gen", "PCIe Generation/Device Max"),
        ("pcie.gen_host_max", _I, "pcie_gen/max_host_link_gen", "PCIe Generation/Host Max"),
        ("pcie.width_current", _I, "link_widths/current_link_width", "Link Width/Current"),
        ("pcie.width_max", _I, "link_widths/max_link_width", "Link Width/Max"),
    ]),
    *_section("pci", "PCI", [("pcie.replays", _I, "replay_counter", "Replays Since Reset")]),
    *_section("ecc_errors", "ECC Errors", [
        *(
            (f"ecc.{bucket}.{tag}", _I, f"{bucket}/{tag}", f"{bucket}/{label}")
            for bucket in ("volatile", "aggregate")
            for tag, label in (
                ("sram_correctable", "SRAM Correctable"),
                ("sram_uncorrectable", "SRAM Uncorrectable"),
                ("sram_uncorrectable_parity", "SRAM Uncorrectable Parity"),
                ("sram_uncorrectable_secded", "SRAM Uncorrectable SEC-DED"),
                ("dram_correctable", "DRAM Correctable"),
                ("dram_uncorrectable", "DRAM Uncorrectable"),
            )
        ),
        ("ecc.sram_threshold_exceeded", _B, "aggregate/sram_threshold_exceeded",
         "Aggregate/SRAM Threshold Exceeded"),
        ("ecc.channel_repair_pending", _B, "channel_repair_pending", "Channel Repair Pending"),
        ("ecc.tpc_repair_pending", _B, "tpc_repair_pending", "TPC Repair Pending"),
        ("ecc.unrepairable_memory", _B, "unrepairable_memory", "Unrepairable Memory"),
    ]),
    *_section("ecc_errors/aggregate_uncorrectable_sram_sources",
              "ECC Errors/Aggregate Uncorrectable SRAM Sources", [
        (f"ecc.sram_source.{source}", _I, f"sram_{source}", f"SRAM {source}")
        for source in ("l2", "sm", "microcontroller", "pcie", "other")
    ]),
    # Row remapping (Ampere+); the whole section is a bare "N/A" on older boards.
    *_section("remapped_rows", "Remapped Rows", [
        ("remap.correctable", _I, "remapped_row_corr", "Correctable Error"),
        ("remap.uncorrectable", _I, "remapped_row_unc", "Uncorrectable Error"),
        ("remap.correctable_inactive", _I, "remapped_row_corr_inactive", "Inactive Correctable Error"),
        ("remap.uncorrectable_inactive", _I, "remapped_row_unc_inactive", "Inactive Uncorrectable Error"),
        ("remap.pending", _B, "remapped_row_pending", "Pending"),
        ("remap.failure", _B, "remapped_row_failure", "Remapping Failure Occurred"),
        *(
            (f"remap.histogram.{level}", _I, f"row_remapper_histogram/row_remapper_histogram_{level}",
             f"Bank Remap Availability Histogram/{level}")
            for level in ("max", "high", "partial", "low", "none")
        ),
    ]),
    # Page retirement (pre-Ampere; N/A on Ampere+). Old text drivers say just "Pending".
    *_section("retired_pages", "Retired Pages", [
        ("retired.single_bit", _I, "multiple_single_bit_retirement/retired_count", "Single Bit ECC"),
        ("retired.double_bit", _I, "double_bit_retirement/retired_count", "Double Bit ECC"),
        # Two pending flags in XML, one in text; RetiredPages.pending is true if either is.
        ("retired_pending.blacklist", _B, "pending_blacklist", "Pending Page Blacklist|Pending"),
        ("retired_pending.retirement", _B, "pending_retirement", ""),
    ]),
    # NVSwitch fabric (all N/A off NVSwitch systems).
    *_section("fabric", "Fabric", [
        ("fabric.state", _S, "state", "State"),
        ("fabric.status", _S, "status", "Status"),
        ("fabric.clique_id", _S, "cliqueId", "CliqueId"),
        ("fabric.cluster_uuid", _S, "clusterUuid", "ClusterUUID"),
        ("fabric.health_summary", _S, "health/summary", "Health/Summary"),
    ]),
)

REPORT_FIELDS: tuple[Field, ...] = _section("", "", [
    ("timestamp", _S, "timestamp", "Timestamp"),
    ("driver_version", _S, "driver_version", "Driver Version"),
    ("cuda_version", _S, "cuda_version", "CUDA Version"),
    ("attached_gpus", _I, "attached_gpus", "Attached GPUs"),
])

# Clock-event reason labels to NVML's names. XML element suffixes already are NVML's names
# except the display clock one; anything else is snake_cased from the label.
TEXT_REASONS = {
    "idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clock_setting",
}
XML_REASONS = {"display_clocks_setting": "display_clock_setting"}
# Counters carry the name of the reason they time.
TEXT_COUNTERS = {
    "sw power capping": "sw_power_cap",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power braking": "hw_power_brake_slowdown",
}
XML_COUNTERS = {
    "sw_power_cap": "sw_power_cap",
    "sync_boost": "sync_boost",
    "sw_therm_slowdown": "sw_thermal_slowdown",
    "hw_therm_slowdown": "hw_thermal_slowdown",
    "hw_power_brake": "hw_power_brake_slowdown",
}


def snake(label: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", label.casefold()).strip("_")
