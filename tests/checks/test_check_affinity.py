"""checks/gpu_nic_affinity.py (gpu-nic-affinity) on real `nvidia-smi topo -m` captures."""

from pathlib import Path

from ctx import make_host, run_check

from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Status

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
TOPO = "nvidia-smi-topo"
DGX_TOPO = "topo/dgx-h100-8gpu-12nic-nv18-drv580-truncated-by-report.txt"


def load(name: str) -> str:
    return (CORPUS / name).read_text()


def affinity(text, profile="hgx-h100"):
    [finding] = run_check("gpu-nic-affinity", make_host({TOPO: text}, profile))
    return finding


def without_gpu0_nic(text: str) -> str:
    """The DGX H100 matrix with GPU0's own NIC (NIC0, PXB) moved across the socket: SYS in
    the GPU0 row and its mirror in the NIC0 row, as when the card sits in another slot."""
    lines = text.splitlines(keepends=True)
    lines[1] = lines[1].replace("NV18\tPXB\tNODE", "NV18\tSYS\tNODE", 1)
    lines[9] = lines[9].replace("NIC0\tPXB", "NIC0\tSYS", 1)
    return "".join(lines)


def test_dgx_h100_every_gpu_has_its_pxb_nic():
    f = affinity(load(DGX_TOPO))
    assert f.status is Status.PASS
    assert f.summary == "8 GPUs each have a NIC within PXB (GPU0 PXB NIC0, GPU1 PXB NIC3, ...)"
    assert f.data["nearest"]["GPU7"] == "PXB NIC11"


def test_pasted_matrix_with_pix_nics_passes_and_names_the_cut_gpu():
    f = affinity(load("topo/nv18-8gpu-10nic-topo-glued-affinity-columns-paste-artifact.txt"), "hgx-h200")
    assert f.status is Status.PASS
    assert f.summary == ("7 GPUs each have a NIC within PXB (GPU0 PIX NIC0, GPU1 PIX NIC1, ...); "
                         "GPU7: no NIC cells in the capture")


def test_gpu_whose_nearest_nic_is_node_warns():
    f = affinity(without_gpu0_nic(load(DGX_TOPO)))
    assert f.status is Status.WARN
    assert f.symptoms == ("gpu-nic-affinity",)
    assert f.summary == ("1 of 8 GPUs have no NIC within PXB: GPU0 nearest NIC NIC1 at NODE "
                         "(NCCL then runs without GPUDirect RDMA)")
    [ev] = f.evidence
    assert ev.probe == TOPO
    assert [line.split()[0] for line in ev.excerpt.splitlines()] == ["GPU0", "GPU0"]
    assert ev.excerpt.splitlines()[1].split()[9] == "SYS"
    [d] = diagnose([f], load_knowledge())
    assert (d.cause, d.title) == ("gpu-nic-affinity", "A GPU has no NIC behind its own PCIe switch")
    assert d.action.startswith("check that every NIC the platform has is present")


def test_no_nic_in_the_matrix_warns():
    f = affinity(load("h200-vm/topo.txt"), "hgx-h200")
    assert f.status is Status.WARN
    assert f.summary == "no NIC in the topology matrix, though the platform pairs each GPU with a NIC at PXB or closer"


def test_platforms_without_a_pairing_are_skipped():
    # The V100 hybrid cube mesh (generic profile) and B300, whose profile names no pairing.
    v100 = load("topo/v100-sxm2-8gpu-hybrid-cube-mesh-nv1-nv2-4nics-ansi.txt")
    for profile in ("generic", "hgx-b300"):
        f = affinity(v100, profile)
        assert f.status is Status.SKIP
        assert f.summary.startswith("no GPU-NIC pairing expected on this platform")


def test_topology_not_collected_is_not_judged():
    [f] = run_check("gpu-nic-affinity", make_host({}, "hgx-h100"))
    assert f.status is Status.SKIP
    assert f.summary == "not judged: nvidia-smi-topo not collected in this bundle"
