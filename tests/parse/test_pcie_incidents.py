"""preflight/parse/pcie_incidents.py and the PCIe / NVIDIA driver signatures of the kernel-log
parser, on real captures (tests/fixtures/corpus/kernel-log, provenance in MANIFEST.tsv)."""

from pathlib import Path

import pytest

from preflight.parse.kernel_log import parse_kernel_log
from preflight.parse.pcie_incidents import decode, incidents, seconds, severity_class

LOGS = Path(__file__).parents[1] / "fixtures" / "corpus" / "kernel-log"


def parse(name: str):
    return parse_kernel_log((LOGS / name).read_text())


def test_fatal_cmpltto_on_a_gpus_root_port_names_the_gpu_that_cannot_recover():
    # rwth-i6/returnn#1500: dmesg -H, the excerpt begins with the tail of an earlier report.
    log = parse("aer-fatal-cmpltto-root-port-nvidia-cant-recover-dmesg-H.txt")
    tail, fatal = incidents(log.events)
    assert (tail.kind, tail.recovery, tail.unrecoverable) == ("partial", "failed", ("0000:03:00.0", "0000:03:00.1"))
    assert (fatal.kind, fatal.severity, fatal.port, fatal.layer) == ("aer", "fatal", "0000:00:03.0",
                                                                     "Transaction Layer")
    assert fatal.errors == ("SDES", "CmpltTO")  # status 00004020 & ~mask 0: bits 5 and 14, as the kernel printed
    assert fatal.drivers["0000:03:00.0"] == "nvidia" and fatal.pci_ids == {"0000:00:03.0": "8086:6f08"}
    assert fatal.recovery == "failed" and fatal.lines == (4, 5, 6, 9, 10, 12)
    assert log.first_timestamp == "+0.000844"  # dmesg -H prefix is stripped, and is no time of day
    assert seconds(log.first_timestamp) is None


def test_link_down_card_not_present_containment_and_failed_recovery_are_one_incident():
    # linux-kernel, Eric Badger's hot-plug test (Message-ID 20220314162146.GA1439451@ebps).
    corrected, lost = incidents(parse(
        "aer-corrected-then-pciehp-link-down-card-not-present-dpc-fatal-recovery-failed.txt").events)
    assert (corrected.severity, corrected.errors, corrected.layer) == ("corrected", ("RxErr",), "Physical Layer")
    assert (lost.kind, lost.severity, lost.link_lost, lost.recovery) == ("link-down", "fatal", True, "failed")
    assert lost.errors == ("SDES",)  # status 00000020, mask 00100000
    assert lost.lines == (5, 6, 7, 9, 10, 15)


def test_source_id_zero_is_not_taken_for_a_device():
    # pop-os/pop#3363: "received from 0000:00:00.0" while the port 0000:00:03.1 logged the error.
    first = incidents(parse("aer-corrected-datalink-amd-root-port-syslog.txt").events)[0]
    assert first.port == "0000:00:03.1" and first.devices == ("0000:00:03.1",)
    assert first.host == "bubz" and first.errors == ("Timeout",)


def test_non_fatal_error_with_successful_recovery():
    (only,) = incidents(parse("aer-nonfatal-acsviol-root-port-recovery-successful.txt").events)
    assert (only.severity, only.errors, only.recovery) == ("non-fatal", ("ACSViol",), "successful")


def test_healthy_boot_has_no_pcie_incident():
    log = parse_kernel_log((Path(__file__).parents[1] / "fixtures" / "h200-device" / "bundle" / "hosts" / "vm"
                            / "kernel-log.txt").read_text())
    assert incidents(log.events) == ()
    assert log.of_kind("nvidia-driver-load")


@pytest.mark.parametrize("printed, cls", [("Uncorrected (Fatal)", "fatal"), ("Uncorrectable (Non-Fatal)", "non-fatal"),
                                          ("Corrected", "corrected"), ("Correctable", "corrected"), (None, "unknown")])
def test_severity_classes(printed, cls):
    assert severity_class(printed) == cls


def test_decode_uses_the_kernels_tables_and_the_mask():
    assert decode("00001100/00002000", corrected=True) == ("Rollover", "Timeout")
    assert decode("00200000/00000000", corrected=False) == ("ACSViol",)
    assert decode("00000020/00000020", corrected=False) == ()  # masked bits are not printed


def test_seconds_reads_every_stamp_shape():
    assert seconds("16064.882605") == pytest.approx(16064.882605)
    assert seconds("Dec  2 11:54:56") - seconds("Dec  2 11:49:53") == 303
    assert seconds("2026-11-29T10:00:01+00:00") - seconds("2026-11-29T10:00:00+00:00") == 1
    assert seconds("Sun Nov 29 10:00:00 2026") is not None and seconds("garbage") is None


# ---- the NVIDIA driver's Xid-less failure lines ------------------------------------------------

def test_gsp_heartbeat_timeout_is_one_event_per_report():
    log = parse("gsp-rm-heartbeat-timed-out-journalctl-no-hostname.txt")
    [e] = log.of_kind("gsp-heartbeat-timeout")
    assert (e.device, e.line, e.timestamp) == ("GPU0", 3, "Mar 21 21:42:01")  # line 4 folds into it
    assert not log.of_kind("xid")


def test_rminitadapter_failure_keeps_its_code_and_gpu():
    log = parse("rminitadapter-failed-cannot-initialize-gsp-firmware-rtx3090-drv550.txt")
    assert [e.kind for e in log.events] == ["gsp-init-failed", "gpu-init-failed"]
    assert (log.events[1].device, log.events[1].detail) == ("0000:98:00.0", "0x62:0x65:1792")


def test_fsp_boot_failure_is_tied_to_the_gpu_of_the_debug_dump():
    log = parse("fsp-boot-commands-failed-h100-tdx-cvm.txt")
    fsp = log.of_kind("fsp-boot-failed")
    assert [e.line for e in fsp] == [2, 6, 11] and {e.device for e in fsp} == {"0000:01:00"}


def test_unsupported_gpu_in_journalctl_multiline_form():
    [e] = parse("gpu-not-supported-by-open-module-no-gsp-gt1030-journalctl.txt").of_kind("gpu-unsupported")
    assert (e.device, e.line) == ("0000:09:00.0", 2)


def test_cannot_attach_gpu_lines():
    log = parse("cannot-attach-gpu-rminitadapter-failed-cmp40hx.txt")
    assert len(log.of_kind("gpu-attach-failed")) == 4 and len(log.of_kind("gpu-init-failed")) == 5


def test_containment_names_the_source_and_an_ignored_link_flap_is_no_link_down():
    log = parse("dpc-err-fatal-received-link-down-up-ignored-recovery-successful.txt")
    assert not log.of_kind("pcie-link-down")  # "Link Down/Up ignored" is part of DPC's recovery
    (only,) = incidents(log.events)
    assert (only.kind, only.port, only.devices, only.recovery) == (
        "containment", "0015:00:00.0", ("0015:00:00.0", "0015:01:00.0"), "successful")
