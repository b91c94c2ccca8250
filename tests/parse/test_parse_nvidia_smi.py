"""nvidia-smi -q / -q -x parsers against the real captures in tests/fixtures/corpus
(provenance in tests/fixtures/corpus/MANIFEST.tsv). Values asserted were read off the files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from preflight.parse import ParseError
from preflight.parse.nvidia_smi import asked_for_every_gpu, parse_smi_text, parse_smi_xml
from preflight.parse.smi_records import (
    CLOCK_EVENT_BITS,
    EccCounters,
    PcieLink,
    RemapHistogram,
    RetiredPages,
    reasons_from_bitmask,
)

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
ALL_REASONS = frozenset(CLOCK_EVENT_BITS)


def read(name: str) -> str:
    return (CORPUS / name).read_text()


def only_gpu(report):
    assert len(report.gpus) == 1
    return report.gpus[0]


# --- XML -----------------------------------------------------------------------------------


def test_xml_v13_h200_vm():
    report = parse_smi_xml(read("h200-vm/smi-q.xml"))
    assert (report.timestamp, report.driver_version, report.cuda_version, report.attached_gpus) == (
        "Sun Nov 29 09:23:34 2026",
        "580.159.04",
        "13.0",
        1,
    )
    assert report.notes == ()
    gpu = only_gpu(report)
    assert (gpu.index, gpu.pci_bus_id, gpu.name) == (0, "00000000:00:06.0", "NVIDIA H200")
    assert gpu.uuid == "GPU-88c58391-6001-919c-8431-20f011c20563"
    assert (gpu.serial, gpu.vbios_version) == ("1654524013443", "96.00.A5.00.1A")
    assert (gpu.persistence_mode, gpu.mig_mode, gpu.ecc_mode) == (True, False, True)
    assert gpu.recovery_action == "None"
    assert gpu.reset_required is None  # v13 prints GPU Recovery Action instead
    assert gpu.clocks_event_reasons == {"gpu_idle"}
    assert gpu.clocks_event_reasons_known == ALL_REASONS
    assert dict(gpu.clocks_event_counters_us) == {
        "sw_power_cap": 0,
        "sync_boost": 0,
        "sw_thermal_slowdown": 0,
        "hw_thermal_slowdown": 0,
        "hw_power_brake_slowdown": 0,
    }
    # Hopper prints T.Limit margins, not absolute thresholds.
    assert (gpu.temperature_c, gpu.memory_temperature_c) == (44, 43)
    assert (gpu.temp_limit_margin_c, gpu.slowdown_margin_c, gpu.shutdown_margin_c) == (43, -2, -8)
    assert gpu.max_operating_margin_c == 0
    assert (gpu.temp_slowdown_c, gpu.temp_shutdown_c, gpu.temp_max_operating_c) == (None, None, None)
    assert (gpu.power_draw_w, gpu.power_draw_instant_w) == (119.81, 80.20)
    assert (gpu.power_limit_w, gpu.default_power_limit_w, gpu.max_power_limit_w) == (700.0, 700.0, 700.0)
    assert (gpu.sm_clock_mhz, gpu.memory_clock_mhz, gpu.max_sm_clock_mhz) == (450, 3201, 1980)
    assert (gpu.utilization_gpu_pct, gpu.memory_total_mib, gpu.memory_used_mib) == (0, 143771, 0)
    assert gpu.performance_state == "P0"
    assert gpu.pcie == PcieLink(
        gen_current=5, gen_max=5, gen_device_current=5, gen_device_max=5, gen_host_max=None,
        width_current=16, width_max=16, replays=0,
    )
    assert gpu.ecc.volatile == EccCounters(0, 0, 0, 0, 0, 0, 0, 0)
    assert gpu.ecc.aggregate.uncorrectable == 0
    assert gpu.ecc.sram_threshold_exceeded is False
    assert dict(gpu.ecc.aggregate_uncorrectable_sram_sources) == {
        "l2": 0, "sm": 0, "microcontroller": 0, "pcie": 0, "other": 0,
    }
    assert (gpu.ecc.channel_repair_pending, gpu.ecc.tpc_repair_pending, gpu.ecc.unrepairable_memory) == (
        False, False, False,
    )
    rows = gpu.remapped_rows
    assert (rows.correctable, rows.uncorrectable, rows.pending, rows.failure) == (0, 0, False, False)
    assert (rows.correctable_inactive, rows.uncorrectable_inactive) == (0, 0)
    assert rows.histogram == RemapHistogram(max=3072, high=0, partial=0, low=0, none=0)
    assert gpu.retired_pages is None  # every retired-pages value is N/A on Hopper
    assert gpu.fabric is None  # single GPU in a VM: all fabric values N/A


def test_xml_v12_a100_mig_reset_status_and_absolute_thresholds():
    report = parse_smi_xml(read("smi-q/a100-sxm4-80gb-drv535-q-x-dtd-v12.txt"))
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == ("535.54.03", "12.2", 4)
    # The capture kept one <gpu> of the four the header counts.
    assert report.notes == ("Attached GPUs says 4 but the output lists 1",)
    gpu = only_gpu(report)
    assert (gpu.pci_bus_id, gpu.name, gpu.mig_mode, gpu.persistence_mode) == (
        "00000000:01:00.0", "NVIDIA A100-SXM4-80GB", True, False,
    )
    # MIG devices carry their own fb_memory_usage; the GPU's own one must win.
    assert (gpu.memory_total_mib, gpu.memory_used_mib) == (81920, 50)
    assert (gpu.reset_required, gpu.drain_and_reset_recommended) == (False, False)
    assert gpu.clocks_event_reasons == frozenset()
    assert gpu.clocks_event_reasons_known == ALL_REASONS
    assert gpu.clocks_event_counters_us == ()  # v12 has no counters block
    assert (gpu.temp_shutdown_c, gpu.temp_slowdown_c, gpu.temp_max_operating_c) == (92, 89, 85)
    assert gpu.temp_limit_margin_c is None
    assert (gpu.temperature_c, gpu.memory_temperature_c) == (27, 44)
    assert (gpu.power_draw_w, gpu.power_limit_w) == (67.03, 500.0)
    assert gpu.utilization_gpu_pct is None  # N/A with MIG enabled
    assert gpu.remapped_rows is None  # <remapped_rows>N/A</remapped_rows>
    assert gpu.ecc.volatile == EccCounters(0, 0, 0, 0, None, None, 0, 0)
    assert gpu.fabric is None
    assert gpu.pcie.gen_host_max == 4


def test_xml_v11_a10g_throttle_names_and_old_power_readings():
    gpu = only_gpu(parse_smi_xml(read("smi-q/a10g-drv515-q-x-dtd-v11-throttle-names.txt")))
    assert (gpu.name, gpu.pci_bus_id) == ("NVIDIA A10G", "00000000:00:1E.0")
    assert gpu.clocks_event_reasons == {"gpu_idle"}
    assert gpu.clocks_event_reasons_known == ALL_REASONS
    # <power_readings>: enforced_power_limit is the limit in force.
    assert (gpu.power_draw_w, gpu.power_limit_w, gpu.max_power_limit_w) == (25.58, 300.0, 300.0)
    assert gpu.mig_mode is None
    # Idle A10G trains its link down: Gen1 x8 of Gen4 x16.
    link = gpu.pcie
    assert (link.gen_current, link.gen_max, link.width_current, link.width_max) == (1, 4, 8, 16)
    assert link.gen_device_max is None
    assert gpu.remapped_rows.histogram.max == 192
    assert gpu.memory_temperature_c is None
    assert (gpu.temp_slowdown_c, gpu.temp_shutdown_c) == (95, 98)
    assert gpu.performance_state == "P8"


def test_xml_v13_tabs_rtx4000_counters_and_ecc_disabled():
    report = parse_smi_xml(read("smi-q/rtx4000-sff-ada-drv595-q-x-dtd-v13-tabs.txt"))
    assert (report.driver_version, report.cuda_version) == ("595.84", "13.2")
    gpu = only_gpu(report)
    assert gpu.name == "NVIDIA RTX 4000 SFF Ada Generation"
    assert dict(gpu.clocks_event_counters_us)["sw_power_cap"] == 4251825415
    assert gpu.ecc_mode is False
    # ECC off: every counter N/A, but the repair flags are still printed.
    ecc = gpu.ecc
    assert (ecc.volatile, ecc.aggregate, ecc.aggregate_uncorrectable_sram_sources) == (None, None, ())
    assert (ecc.channel_repair_pending, ecc.tpc_repair_pending) == (False, False)
    assert ecc.unrepairable_memory is None
    assert (gpu.temp_limit_margin_c, gpu.shutdown_margin_c, gpu.slowdown_margin_c) == (49, -7, -2)
    # "Requested functionality has been deprecated" reads as not available, silently.
    assert report.notes == ()
    assert (gpu.power_draw_w, gpu.power_draw_instant_w, gpu.power_limit_w) == (8.81, 8.44, 70.0)


# --- Text ----------------------------------------------------------------------------------


def test_text_h100_under_load_fabric_and_margins():
    report = parse_smi_text(read("smi-q/h100-80gb-hbm3-drv590-under-load.txt"))
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == ("590.48.01", "13.1", 1)
    assert report.notes == ()
    gpu = only_gpu(report)
    assert (gpu.index, gpu.pci_bus_id, gpu.name) == (0, "00000000:00:09.0", "NVIDIA H100 80GB HBM3")
    assert gpu.clocks_event_reasons == frozenset()
    assert gpu.clocks_event_reasons_known == ALL_REASONS
    assert len(gpu.clocks_event_counters_us) == 5
    assert (gpu.temperature_c, gpu.temp_limit_margin_c, gpu.slowdown_margin_c, gpu.shutdown_margin_c) == (
        59, 26, -2, -8,
    )
    assert (gpu.power_draw_w, gpu.power_draw_instant_w, gpu.power_limit_w) == (629.45, 588.39, 700.0)
    assert (gpu.sm_clock_mhz, gpu.max_sm_clock_mhz, gpu.memory_clock_mhz) == (1980, 1980, 2619)
    assert (gpu.utilization_gpu_pct, gpu.memory_used_mib) == (100, 19818)
    assert gpu.pcie.replays == 9
    assert gpu.fabric.state == "Completed" and gpu.fabric.status == "Success"
    assert (gpu.fabric.clique_id, gpu.fabric.health_summary) == ("0", None)
    assert gpu.fabric.cluster_uuid == "00000000-0000-0000-0000-000000000000"
    assert gpu.remapped_rows.histogram.max == 2560
    assert gpu.ecc.aggregate == EccCounters(0, 0, 0, 0, 0, 0, 0, 0)


def test_text_excerpt_remapped_rows_pending_with_dram_correctable():
    report = parse_smi_text(read("smi-q/a100-sxm4-80gb-drv510-remapped-rows-pending-excerpt.txt"))
    assert (report.driver_version, report.attached_gpus) == ("510.73.08", 8)
    assert report.notes == ("Attached GPUs says 8 but the output lists 1",)
    gpu = only_gpu(report)
    assert (gpu.index, gpu.pci_bus_id, gpu.name) == (0, "00000000:10:1C.0", "NVIDIA A100-SXM4-80GB")
    assert gpu.ecc.volatile == EccCounters(
        correctable=177, uncorrectable=0, sram_correctable=0, sram_uncorrectable=0,
        dram_correctable=177, dram_uncorrectable=0,
    )
    assert gpu.ecc.aggregate.dram_correctable == 177
    rows = gpu.remapped_rows
    assert (rows.correctable, rows.uncorrectable, rows.pending, rows.failure) == (1, 0, True, False)
    assert rows.histogram == RemapHistogram(max=639, high=1, partial=0, low=0, none=0)
    assert gpu.retired_pages is None
    assert gpu.temperature_c is None  # elided by "[...]"


def test_text_excerpt_sw_power_cap_active():
    report = parse_smi_text(read("smi-q/clocks-event-reasons-sw-power-cap-active-excerpt.txt"))
    gpu = only_gpu(report)
    assert (gpu.index, gpu.pci_bus_id, report.driver_version) == (None, None, None)
    assert gpu.clocks_event_reasons == {"sw_power_cap"}
    assert gpu.clocks_event_reasons_known == ALL_REASONS
    assert report.notes == ("no 'GPU <bus id>' header: an excerpt of one GPU, index unknown",)


def test_text_2018_throttle_names_narrow_padding():
    gpu = only_gpu(parse_smi_text(read("smi-q/clocks-throttle-reasons-2018-narrow-label-padding-grep.txt")))
    assert gpu.clocks_event_reasons == {"gpu_idle"}
    # No Display Clock Setting line: "not reported" differs from "not active".
    assert gpu.clocks_event_reasons_known == ALL_REASONS - {"display_clock_setting"}


def test_text_counters_excerpt_rtx5070():
    text = read("smi-q/rtx5070-clocks-event-reasons-counters-sw-power-capping-nonzero.txt")
    gpu = only_gpu(parse_smi_text(text))
    assert gpu.clocks_event_reasons == frozenset()
    assert gpu.clocks_event_counters_us == (
        ("hw_power_brake_slowdown", 0),
        ("hw_thermal_slowdown", 0),
        ("sw_power_cap", 613738145),
        ("sw_thermal_slowdown", 0),
        ("sync_boost", 0),
    )
    assert (gpu.memory_total_mib, gpu.memory_used_mib, gpu.performance_state) == (12227, 1731, "P0")
    # PCI lines came without their "PCI" parent, so no link is claimed.
    assert gpu.pcie is None


def test_text_deindented_v100_hw_power_brake_matches_bitmask():
    gpu = only_gpu(parse_smi_text(read("smi-q/v100-sxm2-32gb-dell-c4130-hw-power-brake-excerpt.txt")))
    assert gpu.clocks_event_reasons == {"hw_slowdown", "hw_power_brake_slowdown"}
    assert gpu.clocks_event_reasons == reasons_from_bitmask(0x8 | 0x80)
    assert "hw_thermal_slowdown" in gpu.clocks_event_reasons_known  # nested under HW Slowdown
    assert (gpu.sm_clock_mhz, gpu.memory_clock_mhz) == (382, 877)


def test_h200_text_and_xml_agree():
    """Same VM, same second (h200-vm/probe.log). Power draw and SM clock were sampled a moment
    apart (113.00 W / 420 MHz in text, 119.81 W / 450 MHz in XML); everything else is equal."""
    text = parse_smi_text(read("h200-vm/smi-q.txt"))
    xml = parse_smi_xml(read("h200-vm/smi-q.xml"))
    moving = dict(power_draw_w=None, power_draw_instant_w=None, sm_clock_mhz=None)
    steady = [[dataclasses.replace(g, **moving) for g in r.gpus] for r in (text, xml)]
    assert steady[0] == steady[1]
    assert dataclasses.replace(text, gpus=()) == dataclasses.replace(xml, gpus=())
    assert (text.gpus[0].sm_clock_mhz, xml.gpus[0].sm_clock_mhz) == (420, 450)
    assert hash(text) != hash(xml)  # frozen all the way down, so hashable


# --- Variants built from real files ----------------------------------------------------------


def test_text_two_gpus():
    # The h200 capture with its GPU block repeated under a second bus id.
    original = read("h200-vm/smi-q.txt")
    header, block = original.split("GPU 00000000:00:06.0\n", 1)
    second = block.replace("00000000:00:06.0", "00000000:00:07.0").replace("44 C", "51 C")
    text = header.replace("Attached GPUs                                          : 1", "Attached GPUs : 2")
    report = parse_smi_text(f"{text}GPU 00000000:00:06.0\n{block}GPU 00000000:00:07.0\n{second}")
    assert [(g.index, g.pci_bus_id, g.temperature_c) for g in report.gpus] == [
        (0, "00000000:00:06.0", 44),
        (1, "00000000:00:07.0", 51),
    ]
    assert report.attached_gpus == 2 and report.notes == ()


def test_xml_two_gpus():
    # The h200 capture with its <gpu> element repeated under a second id.
    original = read("h200-vm/smi-q.xml")
    start, end = original.index("\t<gpu id="), original.index("</gpu>") + len("</gpu>")
    second = original[start:end].replace("00000000:00:06.0", "00000000:00:07.0")
    report = parse_smi_xml(original[:end] + "\n" + second + original[end:])
    assert [(g.index, g.pci_bus_id) for g in report.gpus] == [
        (0, "00000000:00:06.0"),
        (1, "00000000:00:07.0"),
    ]
    assert report.notes == ("Attached GPUs says 1 but the output lists 2",)


def test_xml_truncated_keeps_what_was_read():
    # The h200 capture cut inside "<gpu_temp>44 C</gpu_temp>".
    original = read("h200-vm/smi-q.xml")
    report = parse_smi_xml(original[: original.index("<gpu_temp>") + len("<gpu_temp>4")])
    gpu = only_gpu(report)
    assert gpu.name == "NVIDIA H200" and gpu.remapped_rows.histogram.max == 3072
    assert gpu.temperature_c is None  # never closed, so not trusted
    assert gpu.clocks_event_reasons == {"gpu_idle"}
    assert len(report.notes) == 1 and report.notes[0].startswith("XML truncated or malformed")


@pytest.mark.parametrize("capture", ["h200-vm/smi-q.xml", "smi-q/a100-sxm4-80gb-drv535-q-x-dtd-v12.txt",
                                     "smi-q/a10g-drv515-q-x-dtd-v11-throttle-names.txt"])
def test_xml_cut_inside_or_before_its_gpu_says_what_was_not_read(capture):
    # Real captures cut inside the <gpu> section (after its product name) and just before it.
    original = read(capture)
    whole = parse_smi_xml(original)
    attached = whole.attached_gpus  # the A100 capture is one GPU of a 4-GPU node's output
    assert whole.cut is None  # whole: nothing said
    inside = parse_smi_xml(original[: original.index("</product_name>") + 40])
    assert len(inside.gpus) == 1 and inside.gpus[0].name == whole.gpus[0].name and inside.attached_gpus == attached
    assert f"0 GPU section(s) read whole; GPU {whole.gpus[0].pci_bus_id} only in part (its section was cut)" in inside.cut
    before = parse_smi_xml(original[: original.index("<gpu id=")])
    assert before.gpus == () and before.attached_gpus == attached
    assert f"{attached} of the {attached} GPUs its header counts never shown" in before.cut


def test_xml_with_text_after_its_end_is_whole_not_cut():
    # The real capture with a line a wrapper printed after nvidia-smi finished.
    report = parse_smi_xml(read("h200-vm/smi-q.xml") + "\nsh: 1: warning: job control turned off\n")
    assert report.cut is None and len(report.gpus) == 1 and report.gpus[0].name == "NVIDIA H200"


def test_xml_cut_in_its_header_says_the_gpu_count_never_came():
    original = read("h200-vm/smi-q.xml")
    report = parse_smi_xml(original[: original.index("<attached_gpus>") + len("<attached_gpus>")])
    assert report.gpus == () and report.attached_gpus is None
    assert report.cut.endswith("the header's GPU count (attached_gpus) never came")


def test_text_excerpt_with_elisions_is_no_cut():
    # The real A100 excerpt: one GPU of the 8 its header counts, its author's "[...]" in between.
    report = parse_smi_text(read("smi-q/a100-sxm4-80gb-drv510-remapped-rows-pending-excerpt.txt"))
    assert report.attached_gpus == 8 and len(report.gpus) == 1 and report.cut is None


def test_text_truncated_keeps_what_was_read():
    # The h100 capture cut halfway through its Temperature section.
    original = read("smi-q/h100-80gb-hbm3-drv590-under-load.txt")
    gpu = only_gpu(parse_smi_text(original[: original.index("        GPU Shutdown T.Limit Temp")]))
    assert (gpu.temperature_c, gpu.temp_limit_margin_c, gpu.shutdown_margin_c) == (59, 26, None)
    assert gpu.power_draw_w is None and gpu.fabric is None
    assert gpu.remapped_rows.histogram.max == 2560


def test_retired_pages_counts_and_pending():
    # The h200 captures with the N/A retired-pages values replaced by a V100-style count and
    # a pending retirement.
    text = read("h200-vm/smi-q.txt")
    for label, value in (("Single Bit ECC", "2"), ("Double Bit ECC", "0"), ("Pending Page Blacklist", "Yes")):
        text = text.replace(f"{label:<47}: N/A", f"{label:<47}: {value}")
    retired = parse_smi_text(text).gpus[0].retired_pages
    assert retired == RetiredPages(single_bit=2, double_bit=0, pending=True)
    xml = read("h200-vm/smi-q.xml")
    xml = xml.replace("<retired_count>N/A</retired_count>", "<retired_count>0</retired_count>")
    xml = xml.replace("<pending_retirement>N/A<", "<pending_retirement>No<")
    assert parse_smi_xml(xml).gpus[0].retired_pages == RetiredPages(single_bit=0, double_bit=0, pending=False)


def test_unreadable_value_is_noted_not_raised():
    # The h200 text with its temperature replaced by an error string.
    text = read("h200-vm/smi-q.txt").replace("GPU Current Temp                               : 44 C",
                                             "GPU Current Temp                               : Unknown Error")
    report = parse_smi_text(text)
    assert report.gpus[0].temperature_c is None
    assert report.notes == ("GPU 00000000:00:06.0: temperature_c unreadable: 'Unknown Error'",)


@pytest.mark.parametrize("parse", [parse_smi_text, parse_smi_xml])
@pytest.mark.parametrize("text", ["", "  \n", "bash: nvidia-smi: command not found\n"])
def test_not_smi_output_raises(parse, text):
    with pytest.raises(ParseError):
        parse(text)


def test_xml_parser_rejects_text_form_and_other_xml():
    with pytest.raises(ParseError):
        parse_smi_xml(read("h200-vm/smi-q.txt"))
    with pytest.raises(ParseError):
        parse_smi_xml("<html><body>502</body></html>")


# --- Bitmask ---------------------------------------------------------------------------------


def test_reasons_from_bitmask():
    assert reasons_from_bitmask(0) == frozenset()
    assert reasons_from_bitmask(0x4) == {"sw_power_cap"}  # the h200 burn's steady state
    assert reasons_from_bitmask(0x1FF) == ALL_REASONS
    assert reasons_from_bitmask(0x200 | 0x1) == {"gpu_idle", "unknown_bit_0x200"}
    assert CLOCK_EVENT_BITS["display_clock_setting"] == 0x100


def test_the_path_index_finds_what_element_find_finds_in_every_real_xml():
    """parse_smi_xml looks fields up in one index per GPU (_path_index) instead of calling
    find() per field: on every real -q -x capture each field's path gives the same element."""
    import xml.etree.ElementTree as ET

    from preflight.parse import smi_fields, smi_xml

    root_dir = Path(__file__).resolve().parents[2]
    files = [p for p in sorted(root_dir.glob("tests/fixtures/**/*.txt")) + sorted(root_dir.glob("examples/**/*.txt"))
             if p.stat().st_size < 4_000_000 and "<nvidia_smi_log" in p.read_text(errors="replace")[:4000]]
    checked = 0
    for path in files:
        try:
            root = ET.fromstring(path.read_text(errors="replace"))
        except ET.ParseError:
            continue  # cut captures go through the incremental reader; same lookup afterwards
        for gpu in root.findall("gpu"):
            index = smi_xml._path_index(gpu)
            for field in smi_fields.GPU_FIELDS:
                for xml_path in field.xml:
                    assert index.get(xml_path) is gpu.find(xml_path), (path.name, xml_path)
                    checked += 1
    assert len(files) >= 5 and checked > 1000


# --- The <supported_clocks> sections dropped before parsing --------------------------------


def _real_xml_captures() -> list[str]:
    """Every distinct ``nvidia-smi -q -x`` capture in the fixtures and examples."""
    root_dir = Path(__file__).resolve().parents[2]
    paths = sorted(root_dir.glob("tests/fixtures/**/*")) + sorted(root_dir.glob("examples/**/*"))
    texts = [p.read_text(errors="replace") for p in paths if p.is_file() and p.stat().st_size < 4_000_000]
    return sorted({t for t in texts if "<nvidia_smi_log" in t[:4000]})


def _outcome(text: str):
    try:
        return parse_smi_xml(text)
    except ParseError as exc:
        return f"ParseError: {exc}"


def _variants(text: str) -> list[str]:
    """The capture whole, cut at regular points and at the edges of its first and last
    <supported_clocks> section, and damaged inside one (a NUL byte, an entity, a second
    capture spliced in where the first was cut)."""
    cuts = set(range(0, len(text), max(1, len(text) // 20)))
    for tag in ("<supported_clocks>", "</supported_clocks>"):
        for at in {text.find(tag), text.rfind(tag)} - {-1}:
            cuts.update((at, at + 1, at + len(tag) - 1, at + len(tag), at + len(tag) + 40))
    variants = [text] + [text[:n] for n in sorted(cuts)]
    middle = text.find("<supported_clocks>")
    if middle != -1:
        middle = text.find("</", middle)
        variants += [text[:middle] + insert + text[middle:] for insert in ("\x00", "&bogus;", "&amp;")]
        variants.append(text[:middle] + text)
    return variants


def test_dropping_the_supported_clocks_changes_no_report(monkeypatch):
    """parse_smi_xml leaves the <supported_clocks> sections (over half of an H200's XML) out of
    the parse. Every real capture, whole, cut or damaged, reads exactly as it does parsed as
    it came: the same SmiReport, or the same ParseError."""
    from preflight.parse import smi_xml

    captures = _real_xml_captures()
    texts = [variant for text in captures for variant in _variants(text)]
    pruned = [_outcome(t) for t in texts]
    monkeypatch.setattr(smi_xml, "_without_unread_sections", lambda text: text)
    as_it_came = [_outcome(t) for t in texts]
    assert len(captures) >= 5 and sum("<supported_clocks>" in t for t in captures) >= 5
    for text, got, expected in zip(texts, pruned, as_it_came, strict=True):
        assert got == expected, (len(text), text[-80:])
    # cut: reports that say so (or errors, cut before the root element)
    assert sum(isinstance(o, str) or o.cut is not None for o in as_it_came) > 10
    assert sum(bool(o.notes) for o in as_it_came if not isinstance(o, str)) > 10  # cut after


# ---- Does the output say it lists every GPU? (issue 33) ------------------------------------------
# Only "Attached GPUs : N" (<attached_gpus>) says how many GPUs the node has; an output without it,
# or one listing fewer with none said to be unreachable, holds GPU records but no count.

H800_Q_I0 = "smi-q/h800-8gpu-drv525-q-i0-one-of-8.txt"  # real `nvidia-smi -q -i 0` of an 8-GPU node


def headerless_h100_excerpt() -> str:
    """The real H100 -q (smi-q/h100-80gb-hbm3-drv590-under-load.txt) from line 10 on: its GPU's
    sections, cut at the boundary below the report header (banner, Timestamp, Driver and CUDA
    Version, "Attached GPUs : 1") and the "GPU 00000000:00:09.0" line that heads them, as a paste
    of one GPU's sections keeps them."""
    lines = read("smi-q/h100-80gb-hbm3-drv590-under-load.txt").splitlines(keepends=True)
    assert lines[8].startswith("GPU 00000000:00:09.0") and lines[9].lstrip().startswith("Product Name")
    return "".join(lines[9:])


def test_a_real_q_i0_of_an_8_gpu_node_is_a_selection_not_a_cut():
    report = parse_smi_text(read(H800_Q_I0))
    assert report.attached_gpus == 8 and [g.name for g in report.gpus] == ["NVIDIA H800"]
    assert report.cut is None and report.selection and not report.counts_gpus
    assert report.partial == ("nvidia-smi -q output lists 1 of the 8 GPUs its 'Attached GPUs' line counts, each "
                              "section whole: a selection of GPUs (nvidia-smi -q -i), not the node's list")
    # The same text from a command that asked for every GPU stopped between two GPUs: a cut.
    asked = asked_for_every_gpu(report, xml=False)
    assert asked.partial is None and asked.cut.startswith("nvidia-smi -q output lists 1 GPU section(s) of the 8")


def test_an_excerpt_without_the_attached_gpus_line_counts_nothing():
    report = parse_smi_text(headerless_h100_excerpt())
    assert [g.name for g in report.gpus] == ["NVIDIA H100 80GB HBM3"] and report.gpus[0].fabric.state == "Completed"
    assert report.attached_gpus is None and report.cut is None and not report.counts_gpus
    assert report.partial.startswith("nvidia-smi -q output without its 'Attached GPUs' line and no 'GPU <bus id>' "
                                     "header: an excerpt")
    # A real paste of two sections (Clocks Throttle Reasons, Clocks) has no count either.
    assert not parse_smi_text(read("smi-q/v100-sxm2-32gb-dell-c4130-hw-power-brake-excerpt.txt")).counts_gpus


def test_an_elided_excerpt_and_a_one_gpu_xml_of_four_count_nothing():
    excerpt = parse_smi_text(read("smi-q/a100-sxm4-80gb-drv510-remapped-rows-pending-excerpt.txt"))
    assert excerpt.partial.endswith("with lines left out: a pasted excerpt") and not excerpt.selection
    xml = parse_smi_xml(read("smi-q/a100-sxm4-80gb-drv535-q-x-dtd-v12.txt"))
    assert xml.partial.startswith("nvidia-smi -q -x output lists 1 of the 4 GPUs its <attached_gpus> counts")
    assert xml.selection and not xml.counts_gpus
    # From the probe's own `nvidia-smi -q -x`, a whole document that left GPUs out counts what it shows.
    assert asked_for_every_gpu(xml, xml=True).counts_gpus


@pytest.mark.parametrize("name", ["h200-vm/smi-q.txt", "h200-vm/smi-q.xml", "smi-q/h100-80gb-hbm3-drv590-under-load.txt",
                                  "smi-q/a10g-drv515-q-x-dtd-v11-throttle-names.txt"])
def test_a_whole_output_counts_its_gpus(name):
    report = (parse_smi_xml if name.endswith(".xml") or "-q-x-" in name else parse_smi_text)(read(name))
    assert report.counts_gpus and report.partial is None and len(report.gpus) == report.attached_gpus == 1
