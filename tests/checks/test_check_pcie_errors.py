"""checks/pcie_errors.py on real kernel logs (tests/fixtures/corpus/kernel-log, provenance in
MANIFEST.tsv): fatal and failed-recovery errors fail, lost links fail, a stream of corrected
errors warns, and a healthy node's log (a few corrected errors, a non-GPU device the kernel
recovered, a normal driver load) passes."""

import sys
from pathlib import Path

import pytest
from ctx import make_host, result, run_check

from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Status

FIXTURES = Path(__file__).parents[1] / "fixtures"
LOGS = FIXTURES / "corpus" / "kernel-log"


def check(name: str, **probes):
    return run_check("pcie-errors", make_host({"kernel-log": (LOGS / name).read_text(), **probes}))


def test_fatal_completion_timeout_on_a_gpus_port_fails_as_a_failed_recovery():
    # rwth-i6/returnn#1500: the GPU's root port logs SDES + CmpltTO, nvidia "can't recover".
    [f] = check("aer-fatal-cmpltto-root-port-nvidia-cant-recover-dmesg-H.txt")
    assert (f.status, f.symptoms) == (Status.FAIL, ("pcie-recovery-failed",))
    assert "uncorrectable (fatal) AER error at 0000:00:03.0 (GPU 0000:03:00.0, 0000:03:00.1 (snd_hda_intel) " \
           "below it): SDES, CmpltTO" in f.summary
    assert "no error handler in nvidia, snd_hda_intel" in f.summary
    assert f.data["errors"] == ["CmpltTO", "SDES"] and "GPU 0000:03:00.0" in f.action
    assert "AER: device recovery failed" in f.evidence[0].excerpt
    [d] = diagnose([f], load_knowledge())
    assert d.cause == "pcie-recovery-failed" and "drain the node and power-cycle it" in d.action


def test_surprise_removal_with_containment_fails_and_the_failed_recovery_explains_it():
    # linux-kernel hot-plug test: Link Down, Card not present, DPC, Uncorrected (Fatal), recovery failed.
    [f] = check("aer-corrected-then-pciehp-link-down-card-not-present-dpc-fatal-recovery-failed.txt")
    assert f.status is Status.FAIL and f.symptoms == ("pcie-recovery-failed",)
    assert f.summary.startswith("PCIe error recovery failed: link down with an uncorrectable (fatal) error at "
                                "0000:89:02.0: SDES; recovery failed (line 5 [256236.152622])")
    assert "pciehp: Slot(400): Card not present" in f.evidence[0].excerpt


def test_a_burst_of_corrected_errors_warns_with_its_rate():
    # gemfield/gemfield: 19 corrected Data Link Layer errors within 5 ms on a GPU server's root port.
    [f] = check("aer-corrected-burst-root-port-gtx1080ti-gpu-lost.txt")
    assert (f.status, f.symptoms) == (Status.WARN, ("pcie-correctable-errors",))
    assert f.summary.startswith("a stream of corrected PCIe errors: 19 corrected errors at 0000:00:03.0")
    assert f.summary.endswith(": Rollover, Timeout") and f.data["per_port"] == {"0000:00:03.0": 19}


@pytest.mark.parametrize("name, note", [
    # pop-os/pop#3363: three corrected errors: a handful passes, however close together.
    ("aer-corrected-datalink-amd-root-port-syslog.txt", "3 corrected errors at 0000:00:03.1"),
    # archfan/coreboot#2: four corrected errors over 22 s.
    ("aer-corrected-timeout-intel-root-port-low-rate.txt", "4 corrected errors at 0000:00:1c.1 (240 an hour"),
    # linux-pci PTM patch: a non-fatal ACSViol on a root port the kernel recovered; no GPU or NIC.
    ("aer-nonfatal-acsviol-root-port-recovery-successful.txt",
     "uncorrectable (non-fatal) AER error at 0000:00:07.1: ACSViol; recovery successful"),
])
def test_healthy_logs_of_the_same_kind_pass(name, note):
    [f] = check(name)
    assert f.status is Status.PASS and f.symptoms == ()
    assert f.summary.startswith("no uncorrectable PCIe error, failed recovery or lost link in") and note in f.summary


def test_a_gpu_nodes_healthy_boot_passes():
    # The real dmesg of the lent H200 VM: NVIDIA driver load, no PCIe error.
    text = (FIXTURES / "h200-device" / "bundle" / "hosts" / "vm" / "kernel-log.txt").read_text()
    [f] = run_check("pcie-errors", make_host({"kernel-log": text}))
    assert f.status is Status.PASS and f.summary == ("no uncorrectable PCIe error, failed recovery or lost link "
                                                     "in 358 kernel-log lines")


def test_addresses_are_tied_to_gpus_by_lspci_and_to_drivers_by_the_log():
    # A real B300 lspci excerpt (corpus lspci/b300-2gpu-lspci-grep-nvidia-device-3182.txt) and the
    # returnn log, whose "nvidia 0000:03:00.0" lines name the GPU by its driver.
    roles = sys.modules["preflight_builtin_checks._pci_roles"]
    lspci = (FIXTURES / "corpus" / "lspci" / "b300-2gpu-lspci-grep-nvidia-device-3182.txt").read_text()
    text = (LOGS / "aer-fatal-cmpltto-root-port-nvidia-cant-recover-dmesg-H.txt").read_text()
    host = make_host({"kernel-log": text, "lspci": lspci})
    found = roles.roles(host, host.kernel_log)
    assert roles.role_of(found, "0000:04:00.0") == roles.role_of(found, "05:00.0") == "GPU"
    assert roles.role_of(found, "0000:03:00.0") == "GPU" and roles.role_of(found, "0000:00:03.0") == "device"


def test_empty_journal_skips_and_missing_log_is_not_applicable():
    [f] = run_check("pcie-errors", make_host({"kernel-log": "-- No entries --\n"}))
    assert f.status is Status.SKIP
    [f] = run_check("pcie-errors", make_host({}))
    assert f.status is Status.SKIP and "kernel-log not collected" in f.summary
    denied = result("kernel-log", b"", exit_code=1, command=("dmesg",),
                    stderr="dmesg: read kernel buffer failed: Operation not permitted")
    [f] = run_check("pcie-errors", make_host({"kernel-log": denied}))
    assert f.status is Status.ERROR


def test_older_kernel_wording_is_read_the_same():
    # ROCm/legacy-rocm-build#32 (kernel 4.4): "received: id=00e4", "device has no AER-aware driver",
    # "AER: Device recovery failed". The device is an AMD GPU, not one this tool judges: a failed
    # recovery fails the node whatever the device.
    [f] = check("aer-fatal-malformed-tlp-old-kernel-id-format-device-recovery-failed.txt")
    assert (f.status, f.symptoms) == (Status.FAIL, ("pcie-recovery-failed",))
    assert ("uncorrectable (fatal) AER error at 0000:00:1c.4 (0000:06:00.0 (amdgpu), 0000:06:00.1 (snd_hda_intel) "
            "below it): MalfTLP; no error handler in amdgpu, snd_hda_intel") in f.summary


def test_a_contained_error_the_kernel_recovered_on_a_non_gpu_device_passes():
    # linux-pci cover letter (Message-Id 20251015024159.56414-1-xueshuai@linux.alibaba.com): DPC
    # contained an ERR_FATAL from an NVMe, pciehp ignored the link flap, recovery succeeded.
    [f] = check("dpc-err-fatal-received-link-down-up-ignored-recovery-successful.txt")
    assert f.status is Status.PASS
    assert ("DPC containment at 0015:00:00.0 (0015:01:00.0 below it): recovery successful" in f.summary)
