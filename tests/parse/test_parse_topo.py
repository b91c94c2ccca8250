"""parse_topo on real ``nvidia-smi topo -m`` / ``topo -p2p n`` captures (tests/fixtures/corpus)."""

from pathlib import Path

import pytest

from preflight.parse import ParseError
from preflight.parse.topo import GpuAffinity, parse_topo

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"


def load(name: str) -> str:
    return (CORPUS / name).read_text()


def test_dgx_h100_truncated_report_keeps_what_is_there():
    topo = parse_topo(load("topo/dgx-h100-8gpu-12nic-nv18-drv580-truncated-by-report.txt"))
    assert topo.kind == "topology"
    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topo.nics == tuple(f"NIC{i}" for i in range(12))
    assert all(
        topo.nvlink_count(a, b) == 18 for a in topo.gpus for b in topo.gpus if a != b
    )
    assert topo.link("GPU0", "NIC0") == "PXB"
    assert topo.link("NIC1", "NIC2") == "PIX"  # the dual-port card
    # NIC6 has no row (cut by the report), but GPU4's row holds the same cell.
    assert topo.link("NIC6", "GPU4") == "PXB"
    assert topo.link("NIC6", "NIC7") is None
    assert topo.affinity_of("GPU4") == GpuAffinity("GPU4", "56-111,168-223", "1", None)
    assert topo.affinity_of("GPU0").cpu_affinity == "0-55,112-167"
    assert topo.nic_legend == ()
    assert any("NIC6, NIC7, NIC8, NIC9, NIC10, NIC11" in n for n in topo.notes)
    assert any("Legend" in n for n in topo.notes)


@pytest.mark.parametrize(
    "name, cpus",
    [
        ("topo/h100-1gpu-vm-drv590-ansi-header.txt", "0-19"),
        ("topo/l40s-1gpu-drv595-ansi-header.txt", "0-7"),
        ("h200-vm/topo.txt", "0-15"),
    ],
)
def test_one_gpu_vm_with_ansi_header(name, cpus):
    topo = parse_topo(load(name))
    assert topo.gpus == ("GPU0",)
    assert topo.nics == ()
    assert topo.link("GPU0", "GPU0") == "X"
    assert topo.nvlink_count("GPU0", "GPU0") == 0
    # The empty field before GPU NUMA ID must not shift N/A into the wrong column.
    assert topo.affinity == (GpuAffinity("GPU0", cpus, "0", None),)
    assert ("NV#", "Connection traversing a bonded set of # NVLinks") in topo.legend
    assert len(topo.legend) == 7
    assert topo.notes == ()


def test_glued_affinity_paste_is_recovered_and_noted():
    topo = parse_topo(
        load("topo/nv18-8gpu-10nic-topo-glued-affinity-columns-paste-artifact.txt")
    )
    # No header: 8 GPU columns from the NV18 run (GPU7's row was trimmed), 10 NICs.
    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topo.nics == tuple(f"NIC{i}" for i in range(10))
    assert [row.name for row in topo.rows] == [f"GPU{i}" for i in range(7)]
    assert topo.link("GPU7", "GPU0") == "NV18"  # from GPU0's row
    assert topo.link("GPU6", "NIC6") == "PIX"
    assert topo.link("GPU6", "NIC7") == "SYS"
    # "0-55,112-167 0N/A": NUMA 0 glued to GPU NUMA ID N/A.
    assert topo.affinity_of("GPU0") == GpuAffinity("GPU0", "0-55,112-167", "0", None)
    # "56-111,168-2231": NUMA 1 glued to the CPU list.
    assert topo.affinity_of("GPU4") == GpuAffinity("GPU4", "56-111,168-223", "1", None)
    assert topo.affinity_of("GPU7") is None
    notes = " | ".join(topo.notes)
    assert "header row missing" in notes
    assert "'0N/A'" in notes
    assert "'56-111,168-2231'" in notes and "ambiguous" in notes
    assert "GPU7" in notes


def test_v100_hybrid_cube_mesh_with_nic_legend():
    topo = parse_topo(load("topo/v100-sxm2-8gpu-hybrid-cube-mesh-nv1-nv2-4nics-ansi.txt"))
    assert topo.nics == ("NIC0", "NIC1", "NIC2", "NIC3")
    assert topo.nic_legend == tuple((f"NIC{i}", f"mlx5_{i}") for i in range(4))
    assert topo.nic_device("NIC3") == "mlx5_3"
    assert topo.nvlink_count("GPU0", "GPU1") == 1
    assert topo.nvlink_count("GPU0", "GPU3") == 2
    assert topo.link("GPU0", "GPU5") == "SYS"
    assert topo.nvlink_count("GPU0", "GPU5") == 0
    # Every V100-SXM2 has six NVLinks, spread as NV1/NV2 over its neighbours.
    for gpu in topo.gpus:
        assert sum(topo.nvlink_count(gpu, other) for other in topo.gpus) == 6
    assert topo.link("GPU0", "mlx5_0") == "PIX"  # device name resolved through the legend
    assert topo.link("NIC3", "GPU4") == "PIX"  # NIC rows without affinity fields
    assert topo.affinity_of("GPU7") == GpuAffinity("GPU7", "20-39,60-79", "1", None)
    assert topo.notes == ()
    with pytest.raises(KeyError):
        topo.link("GPU0", "mlx5_9")


def test_p2p_matrix_is_recognised():
    topo = parse_topo(load("topo/v100-sxm2-8gpu-topo-p2p-n-nvlink-status.txt"))
    assert topo.kind == "p2p"
    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topo.link("GPU0", "GPU4") == "OK"
    assert topo.link("GPU0", "GPU5") == "NS"
    assert topo.nvlink_count("GPU0", "GPU4") == 0
    assert topo.affinity == ()
    assert ("NS", "Not supported") in topo.legend
    assert topo.notes == ()


@pytest.mark.parametrize("text", ["", "\n", "bash: nvidia-smi: command not found\n"])
def test_not_topo_output_raises(text):
    with pytest.raises(ParseError):
        parse_topo(text)


def test_sizes_come_from_the_cells_not_from_a_row_name():
    # Two lines naming GPU9999999: the matrix holds two cells, so two columns, in no time and no
    # memory to speak of (it once built ten million columns, over 15 minutes).
    import time

    from preflight.parse.topo import parse_topo

    for index in (9_999_999, 99_999_999, 10**300):
        start = time.monotonic()
        topo = parse_topo(f"GPU{index}\tX\tNV18\nGPU1\tNV18\tX\n")
        assert time.monotonic() - start < 1.0
        assert len(topo.columns) == 2
