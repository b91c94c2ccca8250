"""Kernel log parser and Xid catalog, tested on the recorded kernel logs in the corpus."""

from pathlib import Path

import pytest
import yaml

from preflight.parse import ParseError
from preflight.parse.kernel_log import KernelLog, parse_kernel_log

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "corpus"
KERNEL_LOGS = sorted((CORPUS / "kernel-log").glob("*.txt"))


def parse(name: str) -> KernelLog:
    return parse_kernel_log((CORPUS / "kernel-log" / name).read_text())


def kinds(log: KernelLog) -> list[str]:
    return [e.kind for e in log.events]


# --- NVIDIA GPU -----------------------------------------------------------------------------

def test_xid63_row_remapper_without_any_prefix():
    (event,) = parse("a100-xid63-row-remapper-pending.txt").events
    assert (event.kind, event.code, event.device, event.pid) == ("xid", 63, "0000:10:1c", 1896)
    assert event.process is None  # this driver line has pid= but no name=
    assert event.detail == "Row Remapper: New row marked for remapping, reset gpu to activate."
    assert event.timestamp is None and event.host is None and event.line == 1


def test_xid94_channel_only_message():
    (event,) = parse("h100-xid94-contained-ecc-ch-only.txt").events
    assert (event.code, event.device, event.pid, event.process) == (94, "0000:0f:00", 2503421, "python3")
    assert event.detail == "Ch 00000008"
    assert event.timestamp == "2397166.983093"
    assert event.message.startswith("NVRM: Xid")


def test_xid145_nvlink5_link_and_severity():
    (event,) = parse("xid145-rlw-rxpipe-nonfatal-nvlink5-single-line.txt").events
    assert (event.code, event.device, event.link, event.severity) == (145, "0018:01:00", 13, "Nonfatal")
    assert event.detail.startswith("RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2")


def test_xid45_caused_by_previous_xid_behind_journald_kernel_tag():
    log = parse("xid45-caused-by-previous-xid149-xid145-drv590.txt")
    assert kinds(log) == ["xid"] * 7
    assert {e.code for e in log.events} == {45}
    first = log.events[0]
    assert (first.device, first.caused_by, first.pid, first.process) == ("0000:dc:00", 149, 1818990, "python3")
    assert first.message.startswith("NVRM: Xid")  # "kernel: " stripped
    assert sorted({(e.device, e.caused_by) for e in log.events}) == [
        ("0000:97:00", 145), ("0000:ba:00", 145), ("0000:dc:00", 149), ("0000:ed:00", 145)]


def test_gsp_rpc_history_dump_is_one_event_and_table_rows_are_not_events():
    log = parse("gsp-timeout-rpc-history-table-gpu6.txt")
    (event,) = log.events
    assert (event.kind, event.device, event.line, event.timestamp) == ("gsp-rpc-dump", "GPU6", 3, "84.738339")


def test_talos_prefix_gsp_coredump_trace_folds_into_one_event():
    log = parse("talos-dmesg-prefix-nvrm-gsp-coredump-trace.txt")
    (event,) = log.events
    assert (event.kind, event.line, event.driver) == ("gsp-coredump", 1, "NVRM")
    assert event.host == "192.168.11.119"
    assert event.timestamp == "2026-04-22T21:27:51.291660856Z"
    assert event.message == "NVRM: kflcnCoreDumpNondestructive_IMPL: TRACE: 08 = 0x0000000004d4b1a0"


def test_healthy_h200_dmesg_tail_has_only_the_driver_load():
    # The dmesg tail captured in the H200 VM probe log (the only "[" lines in that file).
    probe = (CORPUS / "h200-vm" / "probe.log").read_text().splitlines()
    log = parse_kernel_log("\n".join(line for line in probe if line.startswith("[")))
    assert log.line_count == 5
    (event,) = log.events
    assert (event.kind, event.version, event.detail) == ("nvidia-driver-load", "580.159.04", "Open Kernel Module")


def test_fallen_off_bus_three_line_message_takes_the_gpu_from_the_first_line():
    # Synthetic: the xid94 file's timestamp and GPU with its Xid text replaced by the driver's
    # three-line fallen-off-the-bus message (format string of nv.c in open-gpu-kernel-modules).
    real = (CORPUS / "kernel-log" / "h100-xid94-contained-ecc-ch-only.txt").read_text().strip()
    stamp = real.split("NVRM:")[0]
    text = "\n".join([
        real,
        stamp + "NVRM: The NVIDIA GPU 0000:0f:00.0",
        stamp + "NVRM: (PCI ID: 10de:2330) installed in this system has",
        stamp + "NVRM: fallen off the bus and is not responding to commands.",
    ])
    log = parse_kernel_log(text)
    assert kinds(log) == ["xid", "gpu-fallen-off-bus"]
    fallen = log.events[1]
    assert (fallen.device, fallen.line, fallen.timestamp) == ("0000:0f:00.0", 4, "2397166.983093")


def test_xid154_recovery_action():
    # Synthetic: the xid145 file's GPU with the Xid 154 text quoted in docs/sources.md §5.1.
    real = (CORPUS / "kernel-log" / "xid145-rlw-rxpipe-nonfatal-nvlink5-single-line.txt").read_text()
    text = real.split("145,")[0] + "154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    (event,) = parse_kernel_log(text).events
    assert (event.code, event.device, event.recovery_action) == (154, "0018:01:00", "GPU Reset Required")


# --- NVSwitch -------------------------------------------------------------------------------

def test_sxid_12028_nonfatal_link():
    (event,) = parse("nvswitch-sxid-12028-nonfatal-egress-priv-error.txt").events
    assert (event.kind, event.code, event.device, event.driver) == ("sxid", 12028, "0000:85:00.0", "nvidia-nvswitch2")
    assert (event.severity, event.link) == ("Non-fatal", 61)
    assert event.detail == "Non-fatal, Link 61 egress non-posted PRIV error (First)"


def test_sxid_22013_three_lines_per_error_and_driver_version():
    log = parse("h100-cc-nvswitch-sxid-22013-minion-dlreq.txt")
    assert kinds(log) == ["nvidia-driver-load"] + ["sxid"] * 8
    assert log.events[0].version == "570.195.03"
    sxids = log.of_kind("sxid")
    assert {(e.code, e.device, e.driver) for e in sxids} == {(22013, "0000:04:00.0", "nvidia-nvswitch3")}
    described = [e for e in sxids if e.severity is not None]
    assert [(e.line, e.severity, e.link) for e in described] == [
        (3, "Non-fatal", 44), (6, "Non-fatal", 45), (9, "Non-fatal", 46)]
    assert sxids[0].detail.startswith("Data {0x0000002b")


# --- mlx5 -----------------------------------------------------------------------------------

def test_mlx5_probe_failure_and_firmware_version():
    log = parse("mlx5-cx4lx-handle-hca-cap-failed-probe-error-22.txt")
    assert [(e.line, e.kind, e.code) for e in log.events] == [
        (2, "mlx5-fw-version", None),
        (4, "mlx5-probe-failed", None),
        (5, "mlx5-probe-failed", -22),
        (6, "mlx5-probe-failed", -22),
    ]
    assert log.events[0].version == "14.32.1010"
    assert {e.device for e in log.events} == {"0000:03:00.0"}
    assert log.events[3].driver == "mlx5_core"


def test_mlx5_health_compromised_dump():
    log = parse("mlx5-health-compromised-irisc-not-responding-cx6-fw20.txt")
    assert [(e.line, e.kind) for e in log.events] == [
        (2, "mlx5-health-compromised"), (10, "mlx5-fw-version"), (13, "mlx5-fw-syndrome")]
    assert {e.device for e in log.events} == {"0000:5e:00.0"}
    assert log.events[1].version == "20.26.4012"  # not the "raw fw_ver 0x141a0fac" line
    syndrome = log.events[2]
    assert (syndrome.code, syndrome.detail) == (7, "irisc not responding")


def test_mlx5_slot_power_lines():
    (event,) = parse("mlx5-pcie-event-insufficient-power-27w-dmesg-T.txt").events
    assert (event.kind, event.device, event.detail, event.host) == (
        "mlx5-pcie-power-insufficient", "0000:5c:00.0", "27W", "ny2g1r12hh2")
    log = parse("mlx5-cx6-ocp3-x4-slot-insufficient-power-25w.txt")
    assert [(e.line, e.kind, e.detail) for e in log.of_kind("mlx5-pcie-power-insufficient")] == [(7, _P, "25W")]
    # The info-level siblings and a plain "Port module event" are no events.
    for name in ("mlx5-cx6-ocp3-x16-slot-sufficient-power-75w.txt", "mlx5-slot-power-capability-not-advertised.txt"):
        assert not parse(name).of_kind("mlx5-pcie-power-insufficient", "mlx5-module-error")


_P = "mlx5-pcie-power-insufficient"


def test_mlx5_port_module_error():
    (event,) = parse("mlx5-port-module-error-high-temperature.txt").events
    assert (event.kind, event.code, event.detail) == ("mlx5-module-error", 0, "High Temperature")


def test_module_symbol_mismatch_ofed_vs_inbox():
    log = parse("mlx5-vdpa-disagrees-about-version-of-symbol-ofed-inbox-mismatch.txt")
    assert kinds(log) == ["module-symbol-mismatch"] * 6
    assert {e.driver for e in log.events} == {"mlx5_vdpa"}
    assert [e.detail for e in log.events[::2]] == ["mlx5_db_free", "mlx5_flow_table_id", "mlx5_query_nic_vport_mtu"]
    assert [e.code for e in log.events] == [None, -22] * 3


# --- PCIe and platform ----------------------------------------------------------------------

def test_pcie_bandwidth_limited_by_gen4_switch():
    log = parse("h100-dmesg-pcie-bandwidth-limited-by-gen4-switch.txt")
    first, second = log.of_kind("pcie-bandwidth-limited")
    assert (first.device, first.driver, first.line) == ("0000:04:00.0", "pci", 1)
    assert (first.pcie.limited_at, first.pcie.speed_gts, first.pcie.width) == ("0000:01:00.0", 16.0, 16)
    assert (first.pcie.capable_speed_gts, first.pcie.capable_width) == (32.0, 16)
    assert (first.pcie.available_gbps, first.pcie.capable_gbps) == (252.048, 504.112)
    assert (second.device, second.pcie.limited_at, second.line) == ("0000:8b:00.0", "0000:87:00.0", 3)
    assert log.notes == ("line 2: '[...]' marks an elided part; the log is an excerpt",)


def test_ghes_record_folds_its_lines_and_edac_ue():
    log = parse("ghes-apei-pcie-error-recoverable-with-edac-ue.txt")
    assert kinds(log) == ["edac-ue", "ghes", "mce"]
    edac, ghes, mce = log.events
    assert (edac.driver, edac.device, edac.detail) == ("EDAC MC3", "CPU_SrcID#1_MC#1_Chan#2_DIMM#0", "memory read error")
    # device_id 0000:5e:00.0 from line 10; the later "vendor_id: 0x144d, device_id: 0xa808" is a PCI ID
    assert (ghes.line, ghes.severity, ghes.detail, ghes.device) == (2, "recoverable", "PCIe error", "0000:5e:00.0")
    assert (mce.line, mce.detail) == (11, "Machine check events logged")


# --- prefixes, odd input ----------------------------------------------------------------------

XID94 = (CORPUS / "kernel-log" / "h100-xid94-contained-ecc-ch-only.txt").read_text().strip()
XID94_MESSAGE = XID94.split("] ", 1)[1]


@pytest.mark.parametrize(("prefix", "host", "timestamp"), [
    ("", None, None),
    ("[Sun Nov 29 10:00:00 2026] ", None, "Sun Nov 29 10:00:00 2026"),
    ("Nov 29 10:00:00 gpu017 kernel: ", "gpu017", "Nov 29 10:00:00"),
    ("2026-11-29T10:00:00+0000 gpu017 kernel: ", "gpu017", "2026-11-29T10:00:00+0000"),
    ("2026-11-29T10:00:00,123456+00:00 ", None, "2026-11-29T10:00:00,123456+00:00"),
    ("Nov 29 10:00:00 gpu017 kernel: [2397166.983093] ", "gpu017", "Nov 29 10:00:00"),
    ("gpu017: [2397166.983093] ", "gpu017", "2397166.983093"),
    ("gpu017: kernel: ", "gpu017", None),
    ("kern  :warn  : [2397166.983093] ", None, "2397166.983093"),
    ("<4>[2397166.983093] ", None, "2397166.983093"),
])
def test_prefix_styles_on_the_xid94_line(prefix, host, timestamp):
    # Synthetic: the real xid94 message behind each prefix style the probe may return.
    (event,) = parse_kernel_log(prefix + XID94_MESSAGE).events
    assert (event.code, event.device, event.host, event.timestamp) == (94, "0000:0f:00", host, timestamp)
    assert event.message == XID94_MESSAGE


@pytest.mark.parametrize("name", [p.name for p in KERNEL_LOGS])
def test_truncated_input_never_raises(name):
    text = (CORPUS / "kernel-log" / name).read_text()
    try:
        log = parse_kernel_log(text[: len(text) // 2])
    except ParseError:
        # Half of a one-line capture without a prefix is no kernel log any more; refusing it
        # (a clear error, not a crash) is the designed answer.
        assert "\n" not in text.strip()
        return
    assert len(log.events) <= len(parse(name).events)


def test_not_a_kernel_log():
    with pytest.raises(ParseError):
        parse_kernel_log("")
    with pytest.raises(ParseError):
        parse_kernel_log(" \n\n")
    # A real shell error from the H200 probe log, standing in for a missing dmesg.
    probe = (CORPUS / "h200-vm" / "probe.log").read_text().splitlines()
    error = next(line for line in probe if line.endswith("command not found"))
    with pytest.raises(ParseError):
        parse_kernel_log(error + "\n")


# --- Xid catalog ----------------------------------------------------------------------------

CATALOG = yaml.safe_load((ROOT / "playbooks" / "xid.yaml").read_text())
CONTRACT_CAUSES = {"gpu-fallen-off-bus", "gpu-ecc-uncorrectable", "gpu-row-remap", "nvlink-errors", "nvlink-down"}
REQUIRED_XIDS = {13, 31, 32, 43, 45, 46, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 110, 119,
                 120, 121, 136, 140, *range(144, 151), 143, 154, 155, 156, 158}


def test_catalog_entries_are_complete():
    assert CATALOG["format"] == "preflight-xid-catalog/1"
    xids = CATALOG["xids"]
    assert REQUIRED_XIDS <= set(xids)
    for xid, entry in xids.items():
        for field in ("mnemonic", "meaning", "action", "investigate", "severity", "cause", "source"):
            assert entry.get(field), (xid, field)
        assert entry["severity"] in {"fatal", "error", "info"}, xid
        assert entry["action"] in CATALOG["actions"], xid
        assert entry["cause"] in CONTRACT_CAUSES | set(CATALOG["causes"]), xid
    assert all(a["meaning"] and a["source"] for a in CATALOG["actions"].values())


def test_catalog_maps_the_contract_causes():
    xids = CATALOG["xids"]
    assert xids[79]["cause"] == "gpu-fallen-off-bus" and xids[79]["action"] == "RESTART_BM"
    assert {x for x, e in xids.items() if e["cause"] == "gpu-ecc-uncorrectable"} == {48, 94, 95, 140}
    assert {x for x, e in xids.items() if e["cause"] == "gpu-row-remap"} == {63, 64}
    assert {x for x, e in xids.items() if e["cause"] == "nvlink-errors"} == {74, *range(144, 151)}
    assert xids[145]["mnemonic"] == "NVLINK_RLW_ERROR"


def test_every_xid_in_the_corpus_is_in_the_catalog():
    seen = set()
    for path in KERNEL_LOGS:
        for event in parse_kernel_log(path.read_text()).of_kind("xid"):
            seen |= {event.code, event.caused_by} - {None}
    assert seen == {45, 63, 94, 145, 149}
    assert seen <= set(CATALOG["xids"])


def test_the_needle_shortcut_changes_no_reading_of_any_real_log():
    """Each signature's needle (preflight/parse/regex_needle.py) only skips work that could not
    change the reading: the regex searches of a line without it, and (once a line has shown the
    text is a kernel log) every line that holds no needle at all. Every real log in the corpus
    reads the same with the needles emptied, which turns both shortcuts off."""
    import dataclasses

    import preflight.parse.kernel_log as kl

    logs = sorted((CORPUS / "kernel-log").glob("*.txt")) + sorted(ROOT.glob("tests/fixtures/*/bundle/hosts/*/kernel-log.txt")) \
        + sorted(ROOT.glob("examples/*/hosts/*/kernel-log.txt"))
    assert len(logs) >= 25
    with_needles = [_read_or_error(kl.parse_kernel_log, p) for p in logs]
    saved = kl.SIGNATURES
    try:
        kl.SIGNATURES = tuple(dataclasses.replace(s, needle="") for s in saved)
        assert kl._candidate_lines(["a", "b"]) is None  # every line read
        without = [_read_or_error(kl.parse_kernel_log, p) for p in logs]
    finally:
        kl.SIGNATURES = saved
    assert with_needles == without
    assert sum(len(r.events) for r in with_needles if not isinstance(r, str)) > 50


def _read_or_error(parse, path):
    try:
        return parse(path.read_text(errors="replace"))
    except ParseError as exc:
        return f"ParseError: {exc}"


def test_a_needle_is_text_every_match_contains():
    import re

    from preflight.parse.regex_needle import needle

    assert needle(re.compile(r"NVRM: Xid \((?:PCI:)?(?P<device>\S+)\): (?P<code>\d+)")) == "NVRM: Xid ("
    assert needle(re.compile(r"(?:fatal|nonfatal) error")) == " error"  # not inside the alternatives
    assert needle(re.compile(r"(?:The NVIDIA )?GPU")) == "GPU"  # not inside an optional part
    assert needle(re.compile(r"(?i)fallen off")) == ""  # case-insensitive: no shortcut
    assert needle(re.compile(r"(?i:fatal) error")) == " error"


def test_the_prefix_alternation_picks_the_prefix_the_ordered_tries_pick():
    """_match_prefix tries the log prefixes as one alternation; on every step of every line of
    every real log it returns what trying them one by one, in order, returns."""
    import preflight.parse.kernel_log as kl

    def one_by_one(text, after_timestamp):
        for pattern in kl._PREFIXES:
            match = pattern.match(text)
            if match:
                return match
        return kl._SYSLOG_HOST.match(text) if after_timestamp else None

    logs = sorted((CORPUS / "kernel-log").glob("*.txt")) + sorted(ROOT.glob("examples/*/hosts/*/kernel-log.txt"))
    steps = 0
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            text, after = line.strip(), False
            for _ in range(6):
                got, want = kl._match_prefix(text, after), one_by_one(text, after)
                assert (got and (got.re.pattern, got.span(), got.groupdict())) == \
                    (want and (want.re.pattern, want.span(), want.groupdict())), (path.name, text)
                steps += 1
                if not want:
                    break
                after = after or bool(want.groupdict().get("ts"))
                text = text[want.end():]
    assert steps > 2000


def test_the_lines_found_by_searching_the_whole_log_are_the_lines_holding_a_needle():
    """_candidate_lines searches the joined log once per needle; on every real log (and on lines
    split by \\r, form feeds and a needle at the very end) it finds exactly the lines that a
    line-by-line test finds."""
    import preflight.parse.kernel_log as kl

    needles = {s.needle for s in kl.SIGNATURES} | set(kl._SPECIAL_NEEDLES)
    texts = [p.read_text(errors="replace") for p in sorted((CORPUS / "kernel-log").glob("*.txt"))]
    texts.append("NVRM: Xid (PCI:0000:1b:00): 79\r\nplain\x0cmlx5_core \n\nend with NVRM: Xid (")
    hits = 0
    for text in texts:
        lines = text.splitlines()
        want = {n for n, line in enumerate(lines, start=1) if any(needle in line for needle in needles)}
        assert kl._candidate_lines(lines) == want
        hits += len(want)
    assert hits > 100
