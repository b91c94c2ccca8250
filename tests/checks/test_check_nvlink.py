"""checks/nvlink.py (nvlink) and checks/nvlink_errors.py (nvlink-errors) on real captures.

8-GPU `nvlink --status` texts are the real 1-GPU captures repeated per GPU (tests/derived.py);
each fault is one edit of that text, named in the test.
"""

import re
from pathlib import Path

import pytest
from captures import B300_NVLINK, H100_P5_NVLINK
from ctx import make_host, result, run_check
from derived import ALL_LINKS_INACTIVE, H100_NVLINK, links_unretrievable, node_nvlink_status, set_link

from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Status

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
STATUS, TOPO, ERRORS = "nvidia-smi-nvlink-status", "nvidia-smi-topo", "nvidia-smi-nvlink-errors"
DGX_TOPO = "topo/dgx-h100-8gpu-12nic-nv18-drv580-truncated-by-report.txt"
ERRORS_ZERO = "nvlink/h100-nvlink-e-error-counters-zero-excerpt.txt"


def load(name: str) -> str:
    return (CORPUS / name).read_text()


def nvlink(probes, profile="hgx-h100"):
    [finding] = run_check("nvlink", make_host(probes, profile))
    return finding


def errors(probes, profile="hgx-h100"):
    [finding] = run_check("nvlink-errors", make_host(probes, profile))
    return finding


# ---- nvlink: healthy ---------------------------------------------------------------------------

def test_hgx_h100_all_links_and_nv18_pairs_pass():
    f = nvlink({STATUS: node_nvlink_status(capture=H100_NVLINK), TOPO: load(DGX_TOPO)})
    assert f.status is Status.PASS
    assert f.summary == "8 GPUs x 18 links active at 26.562 GB/s; NV18 between all 28 GPU pairs"
    assert f.symptoms == ()


def test_hgx_h200_status_alone_passes_and_says_topology_was_not_read():
    f = nvlink({STATUS: node_nvlink_status()}, "hgx-h200")
    assert f.status is Status.PASS
    assert f.summary.startswith("8 GPUs x 18 links active at 26.562 GB/s")
    assert "topology not checked (nvidia-smi-topo not collected in this bundle)" in f.summary


def test_topology_alone_from_a_pasted_headerless_matrix_passes():
    # The paste lost its header and its GPU7 row; GPU7's pairs are read from the other rows.
    f = nvlink({TOPO: load("topo/nv18-8gpu-10nic-topo-glued-affinity-columns-paste-artifact.txt")})
    assert f.status is Status.PASS
    assert f.summary.startswith("NV18 between all 28 GPU pairs; link status not checked")


def test_b300_pass_warns_that_links_do_not_prove_the_fabric():
    # The H200 capture with its speed set to NVLink5's, as a B300 prints it (docs/sources.md §2).
    status = node_nvlink_status().replace("26.562 GB/s", "53.125 GB/s")
    f = nvlink({STATUS: status}, "hgx-b300")
    assert f.status is Status.PASS
    assert "18 links active at 53.125 GB/s" in f.summary
    assert "active links alone do not prove the fabric usable" in f.summary


# ---- nvlink: faults ---------------------------------------------------------------------------

def test_one_inactive_link_fails_with_the_link_and_its_gpu():
    status = set_link(node_nvlink_status(), gpu=3, link=7, value="<inactive>")
    f = nvlink({STATUS: status, TOPO: load(DGX_TOPO)}, "hgx-h200")
    assert f.status is Status.FAIL
    assert f.symptoms == ("nvlink-down",)
    assert f.summary == "GPU3: 1 of 18 links inactive (link 7)"
    [ev] = f.evidence
    assert ev.probe == STATUS
    assert ev.excerpt == ("GPU 3: NVIDIA H200 (UUID: GPU-88c58391-6001-919c-8431-20f011c20003)\n"
                          "Link 7: <inactive>")
    assert "reset the GPU (nvidia-smi -r) -> reboot" in f.action


def test_every_link_of_a_gpu_inactive_fails():
    status = node_nvlink_status()
    for link in range(18):
        status = set_link(status, gpu=0, link=link, value="<inactive>")
    f = nvlink({STATUS: status}, "hgx-h200")
    assert f.status is Status.FAIL
    assert f.summary.startswith("GPU0: 18 of 18 links inactive (link 0, 1, 2,")


def test_nvml_all_links_inactive_on_the_gpus_of_the_xid45_incident():
    # open-gpu-kernel-modules#1150: four GPUs logged Xid 45 after Xid 145/149, and nvidia-smi
    # nvlink said their links were all inActive. Their bus ids are the upper half of the board.
    log = load("kernel-log/xid45-caused-by-previous-xid149-xid145-drv590.txt")
    buses = sorted(set(re.findall(r"PCI:0000:(\w\w):00", log)))
    assert buses == ["97", "ba", "dc", "ed"]
    dead = range(8 - len(buses), 8)
    f = nvlink({STATUS: links_unretrievable(node_nvlink_status(), dead)}, "hgx-h200")
    assert f.status is Status.FAIL
    assert f.summary.startswith(
        f"all links inactive on 4 of 8 GPUs (GPU4, GPU5, GPU6, GPU7): {ALL_LINKS_INACTIVE!r}")
    assert f.evidence[0].excerpt.count(ALL_LINKS_INACTIVE) == 4


def test_missing_links_and_a_slow_link_fail():
    status = set_link(node_nvlink_status(), gpu=5, link=17, value=None)
    status = set_link(status, gpu=2, link=4, value="13.281 GB/s")
    f = nvlink({STATUS: status}, "hgx-h200")
    assert f.status is Status.FAIL
    assert "GPU2: 1 of 18 links at 13.281 GB/s, below 26.562 (link 4)" in f.summary
    assert "GPU5: 17 of 18 links listed" in f.summary
    assert f.data["problems"] == ["GPU2: 1 of 18 links at 13.281 GB/s, below 26.562 (link 4)",
                                  "GPU5: 17 of 18 links listed"]


def test_topology_pair_below_nv18_fails_with_its_rows_as_evidence():
    # GPU0-GPU1 at NV17 (one bonded link lost) in the real DGX H100 matrix, both directions.
    topo = load(DGX_TOPO).splitlines(keepends=True)
    topo[1] = topo[1].replace("X \tNV18", "X \tNV17", 1)
    topo[2] = topo[2].replace("GPU1\tNV18", "GPU1\tNV17", 1)
    f = nvlink({STATUS: node_nvlink_status(capture=H100_NVLINK), TOPO: "".join(topo)})
    assert f.status is Status.FAIL
    assert f.summary == "topology: 1 of 28 GPU pairs below NV18 (GPU0-GPU1 NV17)"
    [ev] = f.evidence
    assert ev.probe == TOPO
    # The header row (it starts with GPU0 once stripped), then the rows of the two GPUs.
    assert [line.split()[0] for line in ev.excerpt.splitlines()] == ["GPU0", "GPU0", "GPU1"]
    assert "CPU Affinity" in ev.excerpt.splitlines()[0]


def test_nvlink_down_diagnosis_uses_the_finding_action():
    status = set_link(node_nvlink_status(), gpu=3, link=7, value="<inactive>")
    findings = run_check("nvlink", make_host({STATUS: status}, "hgx-h200"))
    [d] = diagnose(findings, load_knowledge())
    assert (d.cause, d.hosts, d.confidence) == ("nvlink-down", ("node1",), "high")
    assert d.action.startswith("drain the node, then reset the GPU")


# ---- nvlink: not applicable and missing evidence ----------------------------------------------

# One GPU judged as an 8-GPU HGX board (the profile given) is not "not applicable": the skip says
# the board has 8 and leaves the count to gpu-inventory (issue 33); without a profile figure a lone
# GPU is not applicable.

def test_one_gpu_vm_that_printed_nothing_is_skipped():
    f = nvlink({STATUS: load("h200-vm/nvlink-status.txt"), TOPO: load("h200-vm/topo.txt")}, "hgx-h200")
    assert f.status is Status.SKIP
    assert f.summary == ("1 GPU listed where a NVIDIA HGX H200 8-GPU has 8 (gpu-inventory judges the count): "
                         "NVLink not judged")
    assert nvlink({STATUS: load("h200-vm/nvlink-status.txt"), TOPO: load("h200-vm/topo.txt")},
                  "generic").summary.startswith("no NVLink expectation for this platform")


@pytest.mark.parametrize("name", ["nvlink/h200-1gpu-drv590-nvlink-s.txt", "nvlink/h100-1gpu-vm-drv590-nvlink-s.txt"])
def test_one_gpu_with_its_18_links_is_skipped_not_judged(name):
    assert nvlink({STATUS: load(name)}, "generic").summary == "1 GPU: NVLink not applicable"
    # Against the HGX board's figures its 18 links are read, but one GPU passes nothing of the board.
    f = nvlink({STATUS: load(name)})
    assert f.status is Status.SKIP
    assert f.summary.startswith("1 GPUs x 18 links active at 26.562 GB/s; 1 GPU listed where a NVIDIA HGX H100 "
                                "8-GPU has 8")
    assert f.summary.endswith("the board's other GPUs not shown, so not judged")


def test_one_gpu_of_a_board_with_a_link_down_fails():
    f = nvlink({STATUS: set_link(load("nvlink/h100-1gpu-vm-drv590-nvlink-s.txt"), gpu=0, link=5, value="<inactive>")})
    assert f.status is Status.FAIL and f.summary.startswith("GPU0: 1 of 18 links inactive (link 5)")


@pytest.mark.parametrize("topo", ["topo/h100-1gpu-vm-drv590-ansi-header.txt", "topo/l40s-1gpu-drv595-ansi-header.txt"])
def test_one_gpu_topology_is_skipped(topo):
    f = nvlink({TOPO: load(topo)})
    assert f.status is Status.SKIP and "not applicable" not in f.summary
    assert f.summary.startswith("1 GPU listed where a NVIDIA HGX H100 8-GPU has 8")
    assert nvlink({TOPO: load(topo)}, "generic").status is Status.SKIP


def test_mig_mode_is_skipped_with_nvidia_smi_words():
    f = nvlink({STATUS: load("nvlink/h100-mig-mode-drv590-nvlink-s-unsupported.txt")})
    assert f.status is Status.SKIP
    assert f.summary == ("MIG mode: nvidia-smi cannot query NVLink "
                         "(Nvlink queries are not supported for Devices in MIG mode)")


def test_gpu_without_nvlink_is_skipped():
    f = nvlink({STATUS: load("nvlink/l40s-drv595-nvlink-s-not-supported.txt")})
    assert f.status is Status.SKIP
    assert f.summary == "NVIDIA L40S has no NVLink (Device does not have or support Nvlink)"


def test_v100_hybrid_cube_mesh_has_no_profile_so_its_part_sets_the_link_count():
    # Healthy: all 6 links of every V100-SXM2 up; the NV1/NV2/SYS mix is by design and the
    # generic profile holds it to no NV# figure; the part (playbooks/nvlink_parts.yaml) to 6 links.
    f = nvlink({STATUS: load("nvlink/v100-sxm2-8gpu-nvlink-s-6-links.txt"),
                TOPO: load("topo/v100-sxm2-8gpu-hybrid-cube-mesh-nv1-nv2-4nics-ansi.txt")}, "generic")
    assert f.status is Status.PASS
    assert f.summary.startswith("8 GPUs x 6 links active [the V100 SXM2/SXM3 (NVLink2) has 6 links per GPU, "
                                "from its form factor")
    assert "speed and topology not judged" in f.summary


def test_generic_profile_without_link_status_is_skipped():
    f = nvlink({TOPO: load("topo/v100-sxm2-8gpu-hybrid-cube-mesh-nv1-nv2-4nics-ansi.txt")}, "generic")
    assert f.status is Status.SKIP
    assert f.summary == "no NVLink expectation for this platform: test"


def test_generic_profile_fails_an_sxm_gpu_with_links_inactive_beside_active_ones():
    # Azure/azhpc-diagnostics#73: a V100-SXM2 with links 3 and 5 down, the rest up.
    f = nvlink({STATUS: load("nvlink/v100-sxm2-gpu3-2-of-6-links-inactive-excerpt.txt")}, "generic")
    assert f.status is Status.FAIL and f.symptoms == ("nvlink-down",)
    assert f.summary.startswith("GPU3 (Tesla V100-SXM2-32GB): 2 of 6 links inactive (link 3, 5) "
                                "while its other links are up")
    assert "a pasted excerpt" in f.summary
    assert f.evidence[0].excerpt.splitlines() == ["GPU 3: Tesla V100-SXM2-32GB (UUID: ...)",
                                                  "Link 3: <inactive>", "Link 5: <inactive>"]


def test_generic_profile_fails_a_gpu_with_fewer_links_up_than_its_peers():
    # The real 8-GPU V100-SXM2 capture with one link of GPU 6 down (one edit, as above).
    f = nvlink({STATUS: set_link(load("nvlink/v100-sxm2-8gpu-nvlink-s-6-links.txt"), 6, 2, "<inactive>")},
               "generic")
    assert f.status is Status.FAIL and "GPU6" in f.summary and "link 2" in f.summary


@pytest.mark.parametrize("name, seen", [
    ("nvlink/h100-pcie-gpu0-bridged-12-active-5-inactive-excerpt.txt", "GPU0 5 of 17 links inactive"),
    ("nvlink/rtx-a6000-3gpu-bridged-pair-plus-unbridged-all-inactive.txt", "GPU2 all links inactive"),
])
def test_generic_profile_never_fails_pcie_cards_for_links_without_a_bridge(name, seen):
    # H100 PCIe uses 12 of 18 links (Azure/azurehpc-health-checks#162); an RTX A6000 with no
    # bridge fitted reports all links inactive beside a bridged pair.
    f = nvlink({STATUS: load(name)}, "generic")
    assert f.status is Status.SKIP and f.symptoms == ()
    assert seen in f.summary and "bridges fitted" in f.summary


def test_p2p_matrix_in_the_topology_probe_is_not_judged_as_topology():
    f = nvlink({TOPO: load("topo/v100-sxm2-8gpu-topo-p2p-n-nvlink-status.txt")})
    assert f.status is Status.SKIP
    assert "holds a P2P matrix, not topo -m" in f.summary


def test_both_probes_not_collected_is_not_judged():
    f = nvlink({})
    assert f.status is Status.SKIP
    assert f.summary == "not judged: nvidia-smi-nvlink-status not collected in this bundle"


def test_empty_status_without_a_topology_is_an_error():
    # The 1-GPU VM's empty --status says nothing by itself: without topo -m the GPU count is unknown.
    f = nvlink({STATUS: load("h200-vm/nvlink-status.txt")}, "hgx-h200")
    assert f.status is Status.ERROR
    assert f.summary == ("cannot judge: nvidia-smi nvlink --status listed no GPU and the topology is missing "
                         "(nvidia-smi-topo not collected in this bundle)")


def test_nvidia_smi_not_installed_is_an_error_with_tool_missing():
    missing = result(STATUS, "", exit_code=127, stderr="sh: 1: nvidia-smi: not found",
                     command=("nvidia-smi", "nvlink", "--status"))
    f = nvlink({STATUS: missing})
    assert f.status is Status.ERROR
    assert f.symptoms == ("tool-missing",)


def test_dcgmi_output_in_the_status_probe_is_unreadable():
    f = nvlink({STATUS: load("nvlink/dcgmi-nvlink-link-status-all-down-2gpu.txt")})
    assert f.status is Status.ERROR
    assert f.symptoms == ("probe-unreadable",)
    assert "dcgmi nvlink --link-status" in f.summary


# ---- nvlink-errors -----------------------------------------------------------------------------

def test_zero_counters_pass():
    f = errors({ERRORS: load(ERRORS_ZERO)})
    assert f.status is Status.PASS
    assert f.summary == "all NVLink error counters zero (3 links on 1 GPU)"


def test_replay_errors_warn():
    text = load(ERRORS_ZERO).replace("Link 1: Replay Errors: 0", "Link 1: Replay Errors: 12")
    f = errors({ERRORS: text}, "generic")  # counters are judged on any platform
    assert f.status is Status.WARN
    assert f.symptoms == ("nvlink-errors",)
    assert f.summary == "NVLink errors corrected by replay: GPU0 link 1 replay 12 (counted since driver load)"
    assert f.evidence[0].excerpt == ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-abcdefab-cdef-abdc-abcd-abababababab)\n"
                                     "Link 1: Replay Errors: 12")
    assert "rise under load" in f.action


def test_recovery_errors_fail():
    # 505 recovery events: the count marin-community/marin#9086 saw on a link before it died.
    text = load(ERRORS_ZERO).replace("Link 17: Recovery Errors: 0", "Link 17: Recovery Errors: 505")
    text = text.replace("Link 0: CRC Errors: 0", "Link 0: CRC Errors: 3")
    f = errors({ERRORS: text})
    assert f.status is Status.FAIL
    assert f.summary == "NVLink recovery errors: GPU0 link 17 recovery 505, GPU0 link 0 crc 3"
    assert f.data["recovery"] == ["GPU0 link 17 recovery 505"]
    assert f.data["corrected"] == ["GPU0 link 0 crc 3"]


@pytest.mark.parametrize("name, why", [
    ("h200-vm/nvlink-status.txt", "empty output: nvidia-smi listed no GPU"),
    ("nvlink/h100-mig-mode-drv590-nvlink-s-unsupported.txt", "not supported for Devices in MIG mode"),
    ("nvlink/l40s-drv595-nvlink-s-not-supported.txt", "Device does not have or support Nvlink"),
])
def test_nothing_counted_is_skipped(name, why):
    # The VM printed nothing for --status; -e prints the same nothing (and the same messages).
    f = errors({ERRORS: load(name)})
    assert f.status is Status.SKIP
    assert why in f.summary


def test_throughput_counters_in_the_errors_probe_are_unreadable():
    f = errors({ERRORS: load("nvlink/v100-sxm2-8gpu-nvlink-gt-d-throughput-kib.txt")})
    assert f.status is Status.ERROR
    assert f.symptoms == ("probe-unreadable",)


def test_errors_probe_not_collected_is_not_judged():
    f = errors({})
    assert (f.status, f.summary) == (Status.SKIP, "not judged: nvidia-smi-nvlink-errors not collected in this bundle")


def test_sxm_gpus_with_every_link_inactive_fail_without_a_profile():
    # The real 8-GPU V100-SXM2 capture with every GPU's link lines replaced by NVML's
    # all-links-inactive line (as the real RTX A6000 capture prints it): an SXM module has NVLink,
    # so this is a dead fabric, not "no NVLink expectation".
    text = load("nvlink/v100-sxm2-8gpu-nvlink-s-6-links.txt")
    message = load("nvlink/rtx-a6000-3gpu-bridged-pair-plus-unbridged-all-inactive.txt").splitlines()[-1]
    blocks = re.split(r"(?m)^(?=GPU \d+:)", text)
    dead = "".join(b.splitlines(keepends=True)[0] + message + "\n" for b in blocks if b)
    f = nvlink({STATUS: dead}, "generic")
    assert f.status is Status.FAIL and f.symptoms == ("nvlink-down",)
    assert f.summary.startswith("GPU0 (Tesla V100-SXM2-32GB): all links inactive (NVML: Unable to retrieve")
    assert "the V100 SXM2/SXM3 (NVLink2) has 6 links per GPU, from its form factor" in f.summary


def test_an_sxm_gpu_listing_fewer_links_than_its_part_fails_without_a_profile():
    # The real V100-SXM2 capture with GPU 4's links 4 and 5 lines gone (a GPU that lost two links
    # lists fewer).
    text = set_link(set_link(load("nvlink/v100-sxm2-8gpu-nvlink-s-6-links.txt"), 4, 4, None), 4, 5, None)
    f = nvlink({STATUS: text}, "generic")
    assert f.status is Status.FAIL and "GPU4 (Tesla V100-SXM2-32GB): 4 of 6 links listed" in f.summary


@pytest.mark.parametrize("name, family, links", [
    ("Tesla V100-SXM2-32GB", "V100", 6), ("NVIDIA A100-SXM4-80GB", "A100", 12), ("NVIDIA A800-SXM4-80GB", "A800", None),
    ("NVIDIA H100 80GB HBM3", "H100", 18), ("NVIDIA H200", "H200", 18), ("NVIDIA H800", "H800", 8),
    ("NVIDIA B200", "B200", 18), ("NVIDIA B300 SXM6 AC", "B300", 18),
])
def test_sxm_parts_and_their_link_counts(name, family, links):
    # Product names as nvidia-smi prints them in the corpus captures (and, for H800, a public capture).
    from preflight.knowledge.nvlink_parts import part_of

    part = part_of(name)
    assert part.family.startswith(family) and part.links_per_gpu == links


@pytest.mark.parametrize("name", ["NVIDIA A100-PCIE-40GB", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL",
                                  "NVIDIA H800 PCIe", "NVIDIA L40S", "NVIDIA RTX A6000"])
def test_pcie_cards_are_no_sxm_part(name):
    from preflight.knowledge.nvlink_parts import part_of

    assert part_of(name) is None


# ---- the part from any evidence (issue 33) -----------------------------------------------------
# Without a platform profile, a GPU's part (playbooks/nvlink_parts.yaml) is the expectation. It is
# learnt from the link listing's own header, else from any other probe naming the node's GPUs
# (checks/_nvlink_part.py); one GPU whose links are down is judged by it.

H100_1GPU = "nvlink/h100-1gpu-vm-drv590-nvlink-s.txt"


def test_an_sxm_part_with_all_links_inactive_named_only_by_the_link_listing_fails():
    # The real 1-GPU H100 listing with its link lines in place of NVML's all-inactive message
    # (open-gpu-kernel-modules#1150; tests/derived.py says what is assumed of its place).
    status = links_unretrievable(load(H100_1GPU), [0])
    f = nvlink({STATUS: status}, "generic")
    assert f.status is Status.FAIL and f.symptoms == ("nvlink-down",), f.summary
    assert f.summary.startswith(f"GPU0 (NVIDIA H100 80GB HBM3): all links inactive ({ALL_LINKS_INACTIVE})")
    assert "[the H100 SXM5 (NVLink4) has 18 links per GPU, from its form factor;" in f.summary
    assert f.data["part_named_by"] == STATUS
    # nvidia-smi -q naming the same GPU changes nothing.
    both = nvlink({STATUS: status, "nvidia-smi-q": load("smi-q/h100-80gb-hbm3-drv590-under-load.txt")}, "generic")
    assert both.status is Status.FAIL and both.summary == f.summary


def test_the_link_listings_own_name_wins_over_another_probes_and_the_verdict_says_so():
    # Two real captures of different nodes in one bundle: a V100-SXM2 listing with links 3 and 5
    # down, and lspci of an A100 SXM4 node. The listing's header names the GPU whose links it shows.
    f = nvlink({STATUS: load("nvlink/v100-sxm2-gpu3-2-of-6-links-inactive-excerpt.txt"),
                "lspci": load("lspci/a100-sxm4-40gb-lspci-vvv-nn-header-excerpt.txt")}, "generic")
    assert f.status is Status.FAIL
    assert "the V100 SXM2/SXM3 (NVLink2) has 6 links per GPU, from its form factor; judged so although lspci " \
           "names 'A100 SXM4 40GB'" in f.summary


def test_a_healthy_8_gpu_sxm_listing_without_a_profile_passes_by_its_part():
    f = nvlink({STATUS: H100_P5_NVLINK}, "generic")
    assert f.status is Status.PASS and f.summary.startswith("8 GPUs x 18 links active [the H100 SXM5")


def test_a_b300_listing_without_a_profile_is_held_to_its_part():
    # The real XE9780 listing (7 x NVIDIA B300 SXM6 AC, 18 links each): healthy by its part; the same
    # with GPU 2's links all inactive is a fault, not "a dead fabric cannot be told" (issue 33).
    f = nvlink({STATUS: B300_NVLINK}, "generic")
    assert f.status is Status.PASS and f.summary.startswith("7 GPUs x 18 links active [the B300 SXM6 (NVLink5)")
    dead = nvlink({STATUS: links_unretrievable(B300_NVLINK, [2])}, "generic")
    assert dead.status is Status.FAIL and dead.summary.startswith("GPU2 (NVIDIA B300 SXM6 AC): all links inactive")
