"""parse_lspci / pcie_gen on real ``lspci -vvv`` excerpts (tests/fixtures/corpus/lspci)."""

from pathlib import Path

import pytest

from preflight.parse import ParseError
from preflight.parse.lspci import nvidia_gpus, parse_lspci, pcie_gen

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
CX7 = "lspci/cx7-gen5-x16-lnkcap-lnksta-ok-grep.txt"
CX5 = "lspci/cx5-socket-direct-lnksta-speed-unknown-old-pciutils.txt"
QUADRO = "lspci/quadro-rtx8000-on-pi-lnksta-5gt-x1-downgraded-aer.txt"


def load(name: str) -> str:
    return (CORPUS / name).read_text()


def test_cx7_gen5_x16_healthy_grep_excerpt():
    (dev,) = parse_lspci(load(CX7))
    assert (dev.bdf, dev.description) == (None, None)  # grep'd: device unknown
    assert (dev.cap_speed_gts, dev.cap_width) == (32.0, 16)
    assert (dev.sta_speed_gts, dev.sta_width) == (32.0, 16)
    assert (dev.speed_downgraded, dev.width_downgraded, dev.downgraded) == (False, False, False)
    assert pcie_gen(dev.sta_speed_gts) == 5
    assert dev.notes == ()  # LnkCap2/LnkSta2 are not read as LnkCap/LnkSta


def test_speed_unknown_from_old_pciutils():
    (dev,) = parse_lspci(load(CX5))
    assert (dev.cap_speed_gts, dev.sta_speed_gts) == (None, None)
    assert (dev.cap_width, dev.sta_width) == (8, 8)
    assert (dev.speed_downgraded, dev.width_downgraded) == (None, False)
    assert dev.downgraded is None
    assert sum("Speed unknown" in note for note in dev.notes) == 2


def test_quadro_downgraded_annotation_without_lnkcap():
    (dev,) = parse_lspci(load(QUADRO))
    assert (dev.sta_speed_gts, dev.sta_width) == (5.0, 1)
    assert (dev.cap_speed_gts, dev.cap_width) == (None, None)
    assert (dev.speed_downgraded, dev.width_downgraded, dev.downgraded) == (True, True, True)
    assert any("no LnkCap" in note for note in dev.notes)


def test_device_header_gives_bdf_and_description():
    # Synthetic: the real CX-7 excerpt under the header lspci prints for that card; the BDF
    # and model are the ones its provenance records (MANIFEST.tsv).
    header = "0000:05:00.0 Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n"
    (dev,) = parse_lspci(header + load(CX7))
    assert dev.bdf == "0000:05:00.0"
    assert dev.description == "Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]"
    assert dev.sta_width == 16


def test_concatenated_excerpts_split_into_devices():
    devices = parse_lspci(load(CX7) + load(QUADRO))
    assert [(d.sta_speed_gts, d.sta_width) for d in devices] == [(32.0, 16), (5.0, 1)]
    assert [d.downgraded for d in devices] == [False, True]


def test_unannotated_status_is_compared_with_capability():
    # Synthetic: the CX-7 excerpt with LnkSta changed to the older unannotated form at Gen4 x8.
    text = load(CX7).replace("Speed 32GT/s (ok), Width x16 (ok)", "Speed 16GT/s, Width x8")
    (dev,) = parse_lspci(text)
    assert (dev.sta_speed_gts, dev.sta_width) == (16.0, 8)
    assert (dev.speed_downgraded, dev.width_downgraded) == (True, True)


@pytest.mark.parametrize(
    "speed, gen", [(2.5, 1), (5, 2), (8, 3), (16, 4), (32, 5), (64, 6)]
)
def test_pcie_gen(speed, gen):
    assert pcie_gen(speed) == gen


def test_pcie_gen_rejects_non_pcie_speed():
    with pytest.raises(ValueError):
        pcie_gen(10)


@pytest.mark.parametrize("text", ["", "bash: lspci: command not found\n"])
def test_not_lspci_output_raises(text):
    with pytest.raises(ParseError):
        parse_lspci(text)


@pytest.mark.parametrize("name", ["b300-2gpu-lspci-grep-nvidia-device-3182.txt",
                                  "b300-2gpu-lspci-nn-grep-10de-3182.txt"])
def test_gpu_device_id_from_an_unnamed_or_nn_header(name):
    # lspci prints "Device 3182" when its pci.ids predates the B300, "[10de:3182]" with -nn.
    devices = parse_lspci((CORPUS / "lspci" / name).read_text())
    gpus = nvidia_gpus(devices)
    assert [(d.bdf, d.vendor_id, d.device_id) for d in gpus] == [("04:00.0", 0x10DE, 0x3182),
                                                                   ("05:00.0", 0x10DE, 0x3182)]
    assert {d.device_class for d in gpus} == {"3D controller"}


def test_a_named_device_or_a_nic_is_not_given_an_id_or_counted_as_a_gpu():
    text = (CORPUS / "lspci" / "cx7-gen5-x16-lnkcap-lnksta-ok-grep.txt").read_text()
    named = "0000:05:00.0 Ethernet controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n" + text
    [nic] = parse_lspci(named)
    assert (nic.vendor_id, nic.device_id, nic.device_class) == (0x15B3, None, "Ethernet controller")
    assert nvidia_gpus((nic,)) == ()


def test_a_named_nn_header_gives_the_pci_ids_product_and_the_id():
    # hwloc#653: "GA100 [A100 SXM4 40GB] [10de:20b0]": the name is pci.ids', the id the device's.
    [gpu] = nvidia_gpus(parse_lspci((CORPUS / "lspci" / "a100-sxm4-40gb-lspci-vvv-nn-header-excerpt.txt").read_text()))
    assert (gpu.bdf, gpu.device_id, gpu.product) == ("da:00.0", 0x20B0, "A100 SXM4 40GB")
