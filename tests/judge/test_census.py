"""The GPU census: count and model from whichever evidence holds them (real captures only)."""


from captures import B300_LSPCI, B300_NVLINK, B300_TOPO, CORPUS
from ctx import make_host
from derived import h200_node_xml

from preflight.judge.census import gpu_census
from preflight.knowledge.profiles import detect, load_profiles
from preflight.parse.lspci import parse_lspci
from preflight.parse.nvlink import parse_nvlink_status
from preflight.parse.topo import parse_topo

V100_EXCERPT = (CORPUS / "nvlink" / "v100-sxm2-gpu3-2-of-6-links-inactive-excerpt.txt").read_text()
PROFILES = load_profiles()


def test_nvlink_status_names_and_counts_without_nvidia_smi_q():
    census = gpu_census(None, parse_nvlink_status(B300_NVLINK), parse_topo(B300_TOPO), None)
    assert (census.count, census.count_probe) == (7, "nvidia-smi-nvlink-status")
    assert (census.model, census.model_probe) == ("NVIDIA B300 SXM6 AC", "nvidia-smi-nvlink-status")
    assert census.counted("nvidia-smi-topo") == 7 and census.disagreements() == []


def test_topo_alone_counts_but_names_nothing():
    census = gpu_census(None, None, parse_topo(B300_TOPO), None)
    assert (census.count, census.count_probe, census.models) == (7, "nvidia-smi-topo", ())


def test_lspci_names_by_device_id_and_counts_only_without_a_driver_view():
    census = gpu_census(None, None, None, parse_lspci(B300_LSPCI))
    assert (census.count, census.count_probe, census.pci_device_ids) == (2, "lspci", (0x3182, 0x3182))
    with_topo = gpu_census(None, None, parse_topo(B300_TOPO), parse_lspci(B300_LSPCI))
    assert with_topo.count_probe == "nvidia-smi-topo"
    assert with_topo.disagreements() == ["lspci shows 2"]


def test_an_excerpt_names_the_model_but_does_not_count():
    census = gpu_census(None, parse_nvlink_status(V100_EXCERPT), None, None)
    assert census.count is None and census.model == "Tesla V100-SXM2-32GB"


def test_nvidia_smi_q_comes_first():
    host = make_host({"nvidia-smi-q-x": h200_node_xml(8), "nvidia-smi-topo": B300_TOPO})
    census = host.gpu_census
    assert (census.count, census.count_probe, census.model) == (8, "nvidia-smi-q-x", "NVIDIA H200")
    assert census.disagreements() == ["nvidia-smi topo -m shows 7"]


def test_the_platform_is_detected_from_nvlink_names_and_says_so():
    p = detect(PROFILES, ["NVIDIA B300 SXM6 AC"] * 7, source="nvidia-smi nvlink --status")
    assert p.id == "hgx-b300"
    assert p.why == "detected from GPU model 'NVIDIA B300 SXM6 AC' in nvidia-smi nvlink --status"
    assert detect(PROFILES, ["NVIDIA H100 80GB HBM3"] * 8).id == "hgx-h100"


def test_the_platform_is_detected_from_pci_device_ids():
    p = detect(PROFILES, [], pci_device_ids=(0x3182, 0x3182))
    assert p.id == "hgx-b300" and "PCI device id 0x3182" in p.why and "lspci" in p.why
    assert detect(PROFILES, [], pci_device_ids=(0x3182,)).generic  # one GPU is not the board
    assert detect(PROFILES, [], pci_device_ids=(0x20B0, 0x20B0)).generic  # A100: no profile


def test_lspci_product_names_are_used_when_no_nvidia_smi_view_names_the_gpus():
    a100 = (CORPUS / "lspci" / "a100-sxm4-40gb-lspci-vvv-nn-header-excerpt.txt").read_text()
    census = gpu_census(None, None, None, parse_lspci(a100))
    assert (census.model, census.model_probe, census.pci_device_ids) == ("A100 SXM4 40GB", "lspci", (0x20B0,))
    host = make_host({"lspci": a100})
    assert host.gpu_census.model_probe == "lspci"
    assert detect(PROFILES, list(census.models), source="lspci").why == \
        "no profile matches 'A100 SXM4 40GB' in lspci: generic checks only"


def test_dcgmi_discovery_names_and_counts_where_no_nvidia_smi_view_is_there():
    from preflight.parse.dcgm import parse_dcgmi_discovery
    found = parse_dcgmi_discovery((CORPUS / "dcgm" / "v100-dcgmi-discovery-l-8gpus-0cpus.txt").read_text())
    census = gpu_census(None, None, None, None, found)
    assert (census.count, census.count_probe) == (8, "dcgmi-discovery")
    assert (census.model, census.model_probe) == ("Tesla V100-SXM2-32GB", "dcgmi-discovery")
    # Below nvlink --status (a driver view listing the links), above lspci, for the names.
    with_nvlink = gpu_census(None, parse_nvlink_status(V100_EXCERPT), None, None, found)
    assert with_nvlink.model_probe == "nvidia-smi-nvlink-status" and with_nvlink.count_probe == "dcgmi-discovery"
    assert [p for p, _ in with_nvlink.names] == ["nvidia-smi-nvlink-status", "dcgmi-discovery"]
    assert with_nvlink.uncounted == ("nvidia-smi nvlink --status lists 1 GPU(s) with lines elided: a pasted excerpt",)


def test_min_gpus_is_held_to_the_count_not_to_the_names_of_an_excerpt():
    # One H100 named (an excerpt of -q) on a node that counts 8: the HGX H100 profile, said so.
    chosen = detect(PROFILES, ["NVIDIA H100 80GB HBM3"], gpu_count=8)
    assert chosen.id == "hgx-h100" and chosen.why == "detected from GPU model 'NVIDIA H100 80GB HBM3', 8 GPUs on the node"
    assert detect(PROFILES, ["NVIDIA H100 80GB HBM3"]).id == "generic"


def test_a_cut_report_counts_nothing_but_its_header_says_the_platform():
    # The 8-GPU H200 text -q (tests/derived.py, from the real capture) as the probe's own command
    # left it when it stopped after GPU 1: no count, but "Attached GPUs : 8" names the board.
    from derived import h200_node_text

    from preflight.parse.nvidia_smi import asked_for_every_gpu, parse_smi_text
    text = h200_node_text(8)
    third = text.index("GPU 00000000:", text.index("GPU 00000000:", text.index("GPU 00000000:") + 1) + 1)
    report = asked_for_every_gpu(parse_smi_text(text[:third]), xml=False)
    assert report.cut and len(report.gpus) == 2
    census = gpu_census(("nvidia-smi-q", report), None, None, None)
    assert (census.count, census.attached, census.uncounted) == (None, 8, ())
    assert detect(PROFILES, list(census.models), gpu_count=census.attached).id == "hgx-h200"
