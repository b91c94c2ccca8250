"""checks/pcie_link.py on real nvidia-smi, lspci and kernel-log captures. The lspci corpus files
are grep'd excerpts without their device line; where a test needs the device, it puts back the
line its MANIFEST provenance names. Other variants change one value of a real capture."""

import sys
from pathlib import Path

import pytest
from ctx import make_host, result, run_check
from derived import h200_node_xml, with_gpu_values

from preflight.model import Status

CHECK = "pcie-link"
CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
A10G_XML = (CORPUS / "smi-q" / "a10g-drv515-q-x-dtd-v11-throttle-names.txt").read_text()
H100_TEXT = (CORPUS / "smi-q" / "h100-80gb-hbm3-drv590-under-load.txt").read_text()
A100_XML = (CORPUS / "smi-q" / "a100-sxm4-80gb-drv535-q-x-dtd-v12.txt").read_text()
LIMITED = (CORPUS / "kernel-log" / "h100-dmesg-pcie-bandwidth-limited-by-gen4-switch.txt").read_text()
MLX5_PROBE = (CORPUS / "kernel-log" / "mlx5-cx4lx-handle-hca-cap-failed-probe-error-22.txt").read_text()
H200_DMESG = "\n".join(line for line in (CORPUS / "h200-vm" / "probe.log").read_text().splitlines()
                       if line.startswith("["))
# Device lines put back at the address and model the MANIFEST gives for each lspci excerpt
# (CX-7 at 0000:05:00.0, pci.ids name "MT2910 Family [ConnectX-7]"; CX-5 MT28841 at 17:00.0).
CX7 = ("0000:05:00.0 Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n"
       + (CORPUS / "lspci" / "cx7-gen5-x16-lnkcap-lnksta-ok-grep.txt").read_text())
CX5 = ("0000:17:00.0 Ethernet controller: Mellanox Technologies MT28841\n"
       + (CORPUS / "lspci" / "cx5-socket-direct-lnksta-speed-unknown-old-pciutils.txt").read_text())
QUADRO_EXCERPT = (CORPUS / "lspci" / "quadro-rtx8000-on-pi-lnksta-5gt-x1-downgraded-aer.txt").read_text()


def pcie(probes, profile="generic"):
    return run_check(CHECK, make_host(probes, profile))


def h200(gpu=None, **values):
    xml = h200_node_xml(8)
    return with_gpu_values(xml, gpu, values) if values else xml


def test_address_forms_of_the_same_device_match():
    address_key = sys.modules["preflight_builtin_checks.pcie_link"].address_key  # loaded by tests/ctx.py
    assert {address_key(a) for a in ("00000000:3A:00.0", "0000:3a:00.0", "0000:3a:00", "3a:00.0")} == {"0000:3a:00"}
    assert address_key("GPU6") is None and address_key(None) is None


# ---- nvidia-smi ---------------------------------------------------------------------------

def test_healthy_h200_node_in_p0_passes():
    [f] = pcie({"nvidia-smi-q-x": h200()}, "hgx-h200")
    assert f.status is Status.PASS
    assert f.summary == ("8 GPUs in P0 at their max link (Gen5 x16); unavailable: lspci not collected in this "
                         "bundle; kernel-log not collected in this bundle")


@pytest.mark.parametrize("probe, text, link", [("nvidia-smi-q", H100_TEXT, "Gen5 x16"),
                                               ("nvidia-smi-q-x", A100_XML, "Gen4 x16")])
def test_real_gpus_in_p0_at_full_link_pass(probe, text, link):
    [f] = pcie({probe: text})
    assert f.status is Status.PASS and f.summary.startswith(f"1 GPU in P0 at its max link ({link})")


def test_real_idle_a10g_at_gen1_x8_is_not_a_failure():
    # The A10G sits in P8 at Gen1 x8 of Gen4 x16: healthy, its link lowered for power.
    [f] = pcie({"nvidia-smi-q-x": A10G_XML})
    assert f.status is Status.SKIP
    assert ("GPU0 00000000:00:1E.0 at Gen1 x8 of Gen4 x16 while idle (P8): idle GPUs lower link speed and "
            "width, judged only in P0") in f.summary
    assert f.symptoms == ()


def test_idle_gpu_next_to_a_clean_kernel_log_passes_with_the_idle_link_as_information():
    [f] = pcie({"nvidia-smi-q-x": A10G_XML, "kernel-log": H200_DMESG})
    assert f.status is Status.PASS
    assert f.summary.startswith("no 'available PCIe bandwidth, limited by' line in the kernel log; not judged: "
                                "GPU0 00000000:00:1E.0 at Gen1 x8 of Gen4 x16 while idle (P8)")


def test_gpu_in_p0_at_x8_fails():
    [f] = pcie({"nvidia-smi-q-x": h200(2, current_link_width="8x")}, "hgx-h200")
    assert (f.status, f.symptoms) == (Status.FAIL, ("pcie-link-degraded",))
    assert f.summary.startswith("PCIe link below capability: GPU2 00000000:3A:00.0 in P0 at Gen5 x8 of Gen5 x16 "
                                "(nvidia-smi)")
    assert f.action.startswith("reseat GPU2 00000000:3A:00.0 (and the riser")
    assert "GPU2 00000000:3A:00.0: P0, PCIe Gen5 x8, max Gen5 x16" in f.evidence[0].excerpt


def test_gpu_in_p0_at_a_lower_generation_fails():
    [f] = pcie({"nvidia-smi-q-x": h200(7, current_link_gen="4")})
    assert f.status is Status.FAIL and "GPU7 00000000:DB:00.0 in P0 at Gen4 x16 of Gen5 x16" in f.summary


def test_same_narrow_link_while_idle_is_only_reported():
    [f] = pcie({"nvidia-smi-q-x": h200(2, current_link_width="8x", performance_state="P8")})
    assert f.status is Status.PASS
    assert f.summary.startswith("7 GPUs in P0 at their max link (Gen5 x16); not judged: GPU2 00000000:3A:00.0 "
                                "at Gen5 x8 of Gen5 x16 while idle (P8)")


def test_slot_allowing_less_than_the_gpu_warns():
    [f] = pcie({"nvidia-smi-q-x": h200(0, max_link_gen="4", current_link_gen="4")})
    assert (f.status, f.symptoms) == (Status.WARN, ("pcie-link-degraded",))
    assert "GPU0 00000000:18:00.0: the slot allows Gen4, the GPU supports Gen5" in f.summary


# ---- lspci ----------------------------------------------------------------------------------

def test_connectx7_at_full_link_passes():
    [f] = pcie({"lspci": CX7})
    assert f.status is Status.PASS and f.summary.startswith("1 NIC link at full speed and width (lspci)")


def test_downgraded_nic_fails_even_when_idle():
    # Synthetic: the real CX-7 status line at 16GT/s x8 "(downgraded)".
    text = CX7.replace("Speed 32GT/s (ok), Width x16 (ok)", "Speed 16GT/s (downgraded), Width x8 (downgraded)")
    [f] = pcie({"lspci": text})
    assert f.status is Status.FAIL
    assert "NIC 0000:05:00.0 at 16GT/s x8 of 32GT/s x16 (lspci: downgraded)" in f.summary
    assert f.evidence[0].probe == "lspci" and "MT2910 Family [ConnectX-7]" in f.evidence[0].excerpt


def test_nic_with_speed_unknown_is_not_judged():
    [f] = pcie({"lspci": CX5})
    assert f.status is Status.SKIP
    assert "NIC 0000:17:00.0: lspci cannot tell its link against capability" in f.summary


def test_lspci_excerpt_without_device_line_is_not_attributed():
    [f] = pcie({"lspci": QUADRO_EXCERPT})
    assert f.status is Status.SKIP and "1 link(s) in an lspci excerpt without device addresses" in f.summary


def test_downgraded_gpu_in_lspci_needs_p0_to_count():
    # The Quadro excerpt (x1 downgraded) put under GPU0's address of the H200 node.
    lspci = "0000:18:00.0 3D controller: NVIDIA Corporation Device 2335 (rev a1)\n" + QUADRO_EXCERPT
    [f] = pcie({"nvidia-smi-q-x": h200(0, performance_state="P8"), "lspci": lspci})
    assert f.status is Status.PASS
    assert "GPU 0000:18:00.0 at 5GT/s x1 of its capability per lspci, not known to be busy" in f.summary
    [f] = pcie({"nvidia-smi-q-x": h200(0, current_link_width="1x"), "lspci": lspci})
    # nvidia-smi already failed GPU0; lspci confirms it in the evidence, not as a second item.
    assert f.status is Status.FAIL and f.summary.count("00:18:00.0") == 1
    assert [e.probe for e in f.evidence] == ["nvidia-smi-q-x", "lspci"]


# ---- kernel log -----------------------------------------------------------------------------

def test_kernel_limit_on_unidentified_devices_warns():
    [f] = pcie({"kernel-log": LIMITED})
    assert (f.status, f.symptoms) == (Status.WARN, ("pcie-link-degraded",))
    assert ("device 0000:04:00.0: 252.048 of 504.112 Gb/s, limited by 16 GT/s x16 at 0000:01:00.0 "
            "(capable of 32 GT/s x16; kernel, at boot)") in f.summary
    assert f.evidence[0].excerpt.count("available PCIe bandwidth") == 2


def test_kernel_limit_on_gpus_behind_a_gen4_switch_fails():
    # The H200 node with its first two GPUs at the bus ids of the real H100 dmesg lines.
    xml = h200().replace("00000000:18:00.0", "00000000:04:00.0").replace("00000000:2A:00.0", "00000000:8B:00.0")
    [f] = pcie({"nvidia-smi-q-x": xml, "kernel-log": LIMITED})
    assert f.status is Status.FAIL
    assert "GPU 0000:04:00.0: 252.048 of 504.112 Gb/s, limited by 16 GT/s x16 at 0000:01:00.0" in f.summary
    assert "GPU 0000:8b:00.0" in f.summary and "8 GPUs in P0" not in f.summary
    assert "bottleneck at 0000:87:00.0" in f.action


def test_kernel_limit_on_a_mlx5_nic_fails():
    # Synthetic: the real limit line moved to the NIC the real mlx5 log probes at 0000:03:00.0.
    line = LIMITED.splitlines()[0].replace("0000:04:00.0", "0000:03:00.0")
    [f] = pcie({"kernel-log": MLX5_PROBE + line})
    assert f.status is Status.FAIL and "NIC 0000:03:00.0: 252.048 of 504.112 Gb/s" in f.summary


def test_gpu_enumerating_at_2_5_gts_is_information():
    # Synthetic: the real line as a GPU prints it before its driver raised the link (2.5 GT/s x16).
    line = LIMITED.splitlines()[0].replace("252.048 Gb/s", "32.000 Gb/s").replace("16.0 GT/s", "2.5 GT/s")
    [f] = pcie({"kernel-log": line})
    assert f.status is Status.SKIP
    assert "NVIDIA GPUs enumerate at 2.5 GT/s until their driver raises the link" in f.summary


def test_kernel_width_limit_fails_on_a_gpu():
    # Synthetic: the real line with the limit at x8 of x16 at full speed.
    line = LIMITED.splitlines()[0].replace("16.0 GT/s PCIe x16 link at", "32.0 GT/s PCIe x8 link at")
    xml = h200().replace("00000000:18:00.0", "00000000:04:00.0")
    [f] = pcie({"nvidia-smi-q-x": xml, "kernel-log": line})
    assert f.status is Status.FAIL and "limited by 32 GT/s x8 at 0000:01:00.0" in f.summary


# ---- not applicable, missing ------------------------------------------------------------------

def test_smi_excerpt_without_link_data_skips():
    excerpt = (CORPUS / "smi-q" / "clocks-event-reasons-sw-power-cap-active-excerpt.txt").read_text()
    [f] = pcie({"nvidia-smi-q": excerpt})
    assert f.status is Status.SKIP and f.summary.startswith("no PCIe link could be judged")


def test_no_source_collected_is_not_applicable_and_a_failed_one_is_an_error():
    [f] = pcie({})
    assert f.status is Status.SKIP and f.summary == "not judged: nvidia-smi-q-x not collected in this bundle"
    broken = result("nvidia-smi-q-x", None, exit_code=127, command=("nvidia-smi", "-q", "-x"),
                    stderr="sh: 1: nvidia-smi: not found")
    [f] = pcie({"nvidia-smi-q-x": broken})
    assert (f.status, f.symptoms) == (Status.ERROR, ("tool-missing",))
    assert f.summary == "cannot judge: nvidia-smi is not installed (or not on PATH)"


def test_one_failed_source_does_not_stop_the_others():
    broken = result("lspci", b"", exit_code=1, command=("lspci", "-vvv"), stderr="pcilib: Cannot open /sys/bus/pci")
    [f] = pcie({"nvidia-smi-q-x": h200(), "lspci": broken, "kernel-log": H200_DMESG})
    assert f.status is Status.PASS and "unavailable: lspci -vvv failed with exit code 1" in f.summary


# ---- a GPU inside a virtual machine --------------------------------------------------------

def test_a_vm_gpu_in_p0_at_x8_of_x16_warns_with_the_reason():
    # The real H200 VM capture (Virtualization Mode: Pass-Through) with its link width at 8x:
    # the guest's virtual slot, not a fault the card can be blamed for.
    xml = (CORPUS / "h200-vm" / "smi-q.xml").read_text()
    assert "<virtualization_mode>Pass-Through</virtualization_mode>" in xml
    [f] = pcie({"nvidia-smi-q-x": with_gpu_values(xml, 0, {"current_link_width": "8x"})})
    assert (f.status, f.symptoms) == (Status.WARN, ("pcie-link-degraded",))
    assert "GPU0 00000000:00:06.0 in P0 at Gen5 x8 of Gen5 x16 (nvidia-smi) inside a virtual machine " \
           "(Virtualization Mode: Pass-Through): the link is the guest's virtual slot's" in f.summary


def test_the_same_link_on_bare_metal_still_fails():
    # The derived 8-GPU HGX node prints Virtualization Mode None, as bare-metal captures do.
    xml = h200(2, current_link_width="8x")
    assert "<virtualization_mode>None</virtualization_mode>" in xml
    [f] = pcie({"nvidia-smi-q-x": xml}, "hgx-h200")
    assert f.status is Status.FAIL and "inside a virtual machine" not in f.summary


def test_a_vm_node_of_8_gpus_warns_in_text_too():
    from derived import h200_node_text

    text = h200_node_text(8, vm=True)
    gpu3 = text.index("GPU 00000000:5D:00.0")
    width = text.index("Current", text.index("Link Width", gpu3))
    text = text[:width] + text[width:].replace(": 16x", ": 8x", 1)
    [f] = pcie({"nvidia-smi-q": text}, "hgx-h200")
    assert f.status is Status.WARN and "GPU3 00000000:5D:00.0 in P0 at Gen5 x8 of Gen5 x16" in f.summary
    assert "Pass-Through" in f.summary
