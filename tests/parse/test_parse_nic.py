"""ConnectX / mlx5 parsers against real captures (corpus/ibv, corpus/mlxfw, corpus/driver, recorded/)."""

from pathlib import Path

import pytest

from preflight.parse import ParseError
from preflight.parse.ibverbs import (
    IbPort,
    parse_ib_sysfs,
    parse_ibstat,
    parse_ibstatus,
    parse_ibv_devinfo,
)
from preflight.parse.mlnx import (
    parse_ethtool_i,
    parse_mlxfwmanager,
    parse_modinfo,
    parse_ofed_info,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"
CORPUS = FIXTURES / "corpus"
RECORDED = FIXTURES / "recorded"


def corpus(name: str) -> str:
    return (CORPUS / name).read_text()


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def not_found(tool: str) -> str:
    """The real "command not found" capture of ofed_info, with the tool name changed."""
    return recorded("ofed-info-command-not-found.txt").replace("ofed_info", tool)


# --- ibv_devinfo ----------------------------------------------------------------------------

def test_ibv_devinfo_ib_port_down_lid_65535_and_truncated_second_hca():
    inv = parse_ibv_devinfo(corpus("ibv/ibv-devinfo-cx7-ndr-port-down-lid65535.txt"))
    assert inv.source == "ibv_devinfo"
    assert [d.name for d in inv.devices] == ["mlx5_0", "mlx5_1"]
    dev = inv.devices[0]
    assert (dev.fw_ver, dev.board_id, dev.vendor_part_id, dev.hca_type) == (
        "28.39.2048", "MT_0000000838", 4129, "MT4129")
    assert dev.node_guid == "58a2e103002a09b8"
    port = dev.ports[0]
    assert (port.state, port.lid, port.sm_lid, port.active_mtu, port.link_layer) == (
        "DOWN", 65535, 0, 4096, "InfiniBand")
    # The excerpt stops inside mlx5_1 before its port: kept, and flagged as cut short.
    assert inv.devices[1].fw_ver == "28.39.2048" and inv.devices[1].ports == ()
    assert any("mlx5_1" in n and "cut short" in n for n in inv.notes)


def test_ibv_devinfo_raw_tabs_roce_lid_zero():
    inv = parse_ibv_devinfo(corpus("ibv/ibv-devinfo-cx7-roce-fw28.39-raw-tabs.txt"))
    assert [d.name for d in inv.devices] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert {d.fw_ver for d in inv.devices} == {"28.39.2048"}
    assert inv.devices[1].node_guid == "a088c20300e6b170"
    for dev in inv.devices:
        (port,) = dev.ports
        assert (port.state, port.link_layer, port.lid, port.active_mtu) == ("ACTIVE", "Ethernet", 0, 4096)
    assert inv.notes == ()


def test_ibv_devinfo_spaces_and_mixed_generations():
    inv = parse_ibv_devinfo(corpus("ibv/ibv-devinfo-cx7-roce-fw28.42-h100.txt"))
    cx7, cx5 = inv.devices
    assert (cx7.name, cx7.fw_ver, cx7.ports[0].state) == ("mlx5_2", "28.42.1000", "ACTIVE")
    assert (cx5.name, cx5.fw_ver, cx5.hca_type) == ("mlx5_3", "16.35.4030", None)


def test_ibv_devinfo_verbose_port_lines_give_rate_width_speed():
    # ibv_devinfo -v port lines (recorded excerpt, real tabs) spliced into the real port block
    # of a corpus file, after its link_layer line, where -v prints them.
    verbose = recorded("ibv-devinfo-v-port-lines-cx7-dgx-spark.txt")
    extra = "".join("\t\t\t" + line + "\n" for line in verbose.splitlines() if not line.startswith("state:"))
    base = corpus("ibv/ibv-devinfo-cx7-roce-fw28.39-raw-tabs.txt")
    anchor = "\t\t\tlink_layer:\t\tEthernet\n"
    cut = base.index(anchor) + len(anchor)
    text = base[:cut] + extra + base[cut:]
    port = parse_ibv_devinfo(text).devices[0].ports[0]
    assert (port.phys_state, port.width, port.speed, port.rate_gbps) == ("LINKUP", "2X", "NDR", 200.0)


@pytest.mark.parametrize("text", ["", not_found("ibv_devinfo"), corpus("ibv/ibstat-cx7-ndr-400g-active-ib.txt")])
def test_ibv_devinfo_rejects_non_output(text):
    with pytest.raises(ParseError):
        parse_ibv_devinfo(text)


@pytest.mark.parametrize("text", [not_found("ibstat"), corpus("ibv/ibv-devinfo-cx7-roce-fw28.42-h100.txt")])
def test_ibstat_rejects_non_output(text):
    with pytest.raises(ParseError):
        parse_ibstat(text)


# --- ibstat / ibstatus ----------------------------------------------------------------------

def test_ibstat_hdr_disabled_port_and_cx4lx():
    inv = parse_ibstat(corpus("ibv/ibstat-cx6-hdr-one-port-disabled-plus-cx4lx.txt"))
    assert inv.source == "ibstat"
    up, down, cx4 = inv.devices
    assert (up.hca_type, up.vendor_part_id, up.fw_ver, up.node_guid) == (
        "MT4123", 4123, "20.33.1048", "1070fd03008eb580")
    assert up.ports[0] == IbPort(
        number=1, state="ACTIVE", phys_state="LINKUP", rate_gbps=200.0, link_layer="InfiniBand",
        lid=569, sm_lid=393)
    assert (down.ports[0].state, down.ports[0].phys_state, down.ports[0].rate_gbps, down.ports[0].lid) == (
        "DOWN", "DISABLED", 10.0, 65535)
    assert (cx4.name, cx4.hca_type, cx4.fw_ver, cx4.ports[0].state) == ("mlx5_2", "MT4117", "14.32.1010", "ACTIVE")


def test_ibstat_vf_down_while_linkup():
    (dev,) = parse_ibstat(corpus("ibv/ibstat-cx6-mt4124-vf-in-pod-down-linkup-lid65535.txt")).devices
    assert (dev.name, dev.hca_type, dev.fw_ver) == ("mlx5_7", "MT4124", "20.28.4000")
    assert dev.node_guid != dev.sys_image_guid == "043f720300df3e00"
    port = dev.ports[0]
    assert (port.state, port.phys_state, port.lid, port.sm_lid) == ("DOWN", "LINKUP", 65535, 1)


def test_ibstat_tab_indented_cut_after_physical_state():
    inv = parse_ibstat(corpus("ibv/ibstat-cx6dx-mt4125-down-disabled-tabs.txt"))
    (dev,) = inv.devices
    assert (dev.name, dev.hca_type, dev.fw_ver, dev.sys_image_guid) == (
        "mlx5_8", "MT4125", "22.39.1002", "e8ebd303003307de")
    assert (dev.ports[0].state, dev.ports[0].phys_state, dev.ports[0].rate_gbps) == ("DOWN", "DISABLED", None)


def test_ibstat_ndr_400():
    inv = parse_ibstat(corpus("ibv/ibstat-cx7-ndr-400g-active-ib.txt"))
    assert [d.fw_ver for d in inv.devices] == ["28.41.1000", "28.41.1000"]
    port = inv.devices[0].ports[0]
    assert (port.rate_gbps, port.lid, port.sm_lid, port.link_layer) == (400.0, 975, 1165, "InfiniBand")


def test_ibstat_roce_lid_zero_plus_disabled_cx6dx():
    inv = parse_ibstat(corpus("ibv/ibstat-cx7-roce-200g-plus-cx6dx-disabled.txt"))
    assert [d.name for d in inv.devices] == ["mlx5_0", "mlx5_1", "mlx5_10"]
    for dev in inv.devices[:2]:
        port = dev.ports[0]
        assert (dev.fw_ver, port.link_layer, port.lid, port.sm_lid, port.rate_gbps) == (
            "28.39.1002", "Ethernet", 0, 0, 200.0)
    cx6dx = inv.devices[2]
    assert (cx6dx.hca_type, cx6dx.fw_ver, cx6dx.ports[0].phys_state) == ("MT4125", "22.31.1014", "DISABLED")


def test_ibstat_keeps_output_before_ibpanic():
    inv = parse_ibstat(corpus("ibv/ibstat-partial-output-then-ibpanic-stat-failed.txt"))
    (dev,) = inv.devices
    assert dev.name == "mlx5_7"
    assert (dev.ports[0].state, dev.ports[0].rate_gbps, dev.ports[0].lid) == ("ACTIVE", 200.0, 13305)
    # Fields the author redacted as "..." are not read as a GUID or a part id.
    assert dev.node_guid is None and dev.vendor_part_id is None
    assert any("ibpanic" in n and "mlx5_8" in n for n in inv.notes)
    assert any("before the first CA header" in n for n in inv.notes)


def test_ibstatus_roce_with_ib_speed_label():
    text = corpus("ibv/ibstatus-cx-roce-100g-edr-label-ethernet.txt")
    for inv in (parse_ibstatus(text), parse_ibstat(text)):
        assert inv.source == "ibstatus"
        assert [d.name for d in inv.devices] == ["mlx5_0", "mlx5_1"]
        port = inv.devices[0].ports[0]
        assert (port.state, port.phys_state, port.rate_gbps, port.width, port.speed, port.link_layer, port.lid) == (
            "ACTIVE", "LINKUP", 100.0, "4X", "EDR", "Ethernet", 0)


# --- ib-sysfs -------------------------------------------------------------------------------

def _sysfs_from_ibstatus(text: str) -> str:
    """ibstatus is a script that prints sysfs files, so its values are the sysfs values:
    rebuild the ib-sysfs probe's `grep -H` form from the real ibstatus capture."""
    lines, device = [], None
    names = {"state": "state", "phys state": "phys_state", "rate": "rate", "link_layer": "link_layer"}
    for line in text.splitlines():
        if line.startswith("Infiniband device"):
            device = line.split("'")[1]
        elif ":" in line and device:
            key, value = (part.strip() for part in line.split(":", 1))
            if key in names:
                lines.append(f"/sys/class/infiniband/{device}/ports/1/{names[key]}:{value}")
    return "\n".join(lines) + "\n"


def test_ib_sysfs_lines_rebuilt_from_real_ibstatus():
    sysfs = _sysfs_from_ibstatus(corpus("ibv/ibstatus-cx-roce-100g-edr-label-ethernet.txt"))
    # Device files as the probe contract spells them (values from the CX-7 ibstat capture).
    sysfs = ("/sys/class/infiniband/mlx5_0/fw_ver:28.39.1002\n"
             "/sys/class/infiniband/mlx5_0/hca_type:MT4129\n") + sysfs
    inv = parse_ib_sysfs(sysfs)
    assert inv.source == "sysfs"
    dev = inv.devices[0]
    assert (dev.fw_ver, dev.hca_type, dev.vendor_part_id) == ("28.39.1002", "MT4129", 4129)
    port = dev.ports[0]
    assert (port.state, port.phys_state, port.rate_gbps, port.width, port.speed, port.link_layer) == (
        "ACTIVE", "LINKUP", 100.0, "4X", "EDR", "Ethernet")
    assert inv.devices[1].name == "mlx5_1"


def test_ib_sysfs_notes_grep_errors_and_rejects_other_text():
    inv = parse_ib_sysfs("grep: /sys/class/infiniband/*/fw_ver: No such file or directory\n")
    assert inv.devices == () and "No such file" in inv.notes[0]
    with pytest.raises(ParseError):
        parse_ib_sysfs(corpus("ibv/ibstat-cx7-ndr-400g-active-ib.txt"))


# --- ethtool -i -----------------------------------------------------------------------------

def test_ethtool_inbox_mlx5_single_block():
    (info,) = parse_ethtool_i(corpus("driver/ethtool-i-mlx5-cx4lx-fw14.23-inbox-driver.txt"))
    assert (info.iface, info.driver, info.version, info.firmware_version, info.psid, info.bus_info) == (
        None, "mlx5_core", "3.0-1 (January 2015)", "14.23.1020", None, "0000:af:00.0")
    assert info.expansion_rom_version is None


def test_ethtool_mlx4_trailing_space():
    (info,) = parse_ethtool_i(corpus("driver/ethtool-i-mlx4-en-connectx2-fw2.7.700.txt"))
    assert (info.driver, info.version, info.firmware_version) == ("mlx4_en", "4.0-0", "2.7.700")
    assert info.expansion_rom_version is None and info.notes == ()


def test_ethtool_ofed_driver_firmware_token_and_psid():
    (info,) = parse_ethtool_i(recorded("ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt"))
    assert (info.version, info.firmware_version, info.firmware_raw, info.psid) == (
        "23.10-1.1.9", "28.39.3560", "28.39.3560 (MT_0000000838)", "MT_0000000838")


def test_ethtool_concatenated_probe_blocks():
    # The ethtool-i probe's form: two real captures, each headed by "== IFACE ==", plus an
    # interface whose ethtool printed nothing to stdout.
    text = ("== ens4np0 ==\n" + recorded("ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt")
            + "== mlx5p1 ==\n" + recorded("ethtool-i-mlx5-cx5-inbox-kernel-release-truncated.txt")
            + "== ens9 ==\n")
    ofed, inbox, empty = parse_ethtool_i(text)
    assert (ofed.iface, ofed.firmware_version) == ("ens4np0", "28.39.3560")
    assert (inbox.iface, inbox.version, inbox.firmware_version) == (
        "mlx5p1", "5.11.0-net-next-alloc_pages_bul", "16.23.1020")
    assert empty.iface == "ens9" and empty.driver is None and empty.notes


@pytest.mark.parametrize("text", ["", not_found("ethtool"), corpus("mlxfw/cx6lx-flint-query-secure-fw.txt")])
def test_ethtool_rejects_non_output(text):
    with pytest.raises(ParseError):
        parse_ethtool_i(text)


# --- modinfo --------------------------------------------------------------------------------

def test_modinfo_inbox_has_no_version():
    info = parse_modinfo(recorded("modinfo-mlx5_core-inbox-debian12-6.1.0-31.txt"))
    assert info.version is None and info.intree is True and not info.out_of_tree
    assert (info.name, info.kernel_release) == ("mlx5_core", "6.1.0-31-amd64")
    assert info.depends == ("psample", "pci-hyperv-intf", "mlxfw")
    # This kernel's mlx5 already knows ConnectX-7, -8 and -9.
    assert {0x1021, 0x1023, 0x1025} <= set(info.pci_device_ids)
    assert info.notes == ()


def test_modinfo_ofed_build():
    info = parse_modinfo(recorded("modinfo-mlx5_core-mlnx-ofed-24.10-2.1.8-debian12.txt"))
    assert (info.version, info.srcversion, info.intree) == ("24.10-2.1.8", "78352976D87E8F24553D352", None)
    assert info.out_of_tree and info.filename == "/lib/modules/6.1.0-31-amd64/updates/dkms/mlx5_core.ko"
    assert "mlx_compat" in info.depends and info.kernel_release == "6.1.0-31-amd64"


def test_modinfo_rejects_other_output():
    with pytest.raises(ParseError):
        parse_modinfo(corpus("ibv/ibstat-cx7-ndr-400g-active-ib.txt"))


def test_modinfo_other_module_trailing_space_vermagic():
    info = parse_modinfo(corpus("driver/modinfo-nvidia-peermem-drv550-rhel92.txt"))
    assert (info.name, info.version, info.depends) == ("nvidia_peermem", "550.54.15", ("nvidia", "ib_core"))
    assert info.vermagic == "5.14.0-284.11.1.el9_2.x86_64 SMP preempt mod_unload modversions"
    assert info.out_of_tree and info.pci_device_ids == ()


# --- ofed_info -s ---------------------------------------------------------------------------

@pytest.mark.parametrize("name,dist,version", [
    ("ofed-info-s-mlnx-ofed-23.07-0.5.1.2.txt", "MLNX_OFED_LINUX", "23.07-0.5.1.2"),
    ("ofed-info-s-mlnx-ofed-24.10-3.2.5.0.txt", "MLNX_OFED_LINUX", "24.10-3.2.5.0"),
    ("ofed-info-s-ofed-internal-24.07-0.3.5.0.110.txt", "OFED-internal", "24.07-0.3.5.0.110"),
])
def test_ofed_info(name, dist, version):
    info = parse_ofed_info(recorded(name))
    assert (info.distribution, info.version, info.notes) == (dist, version, ())
    assert info.raw == recorded(name).strip()


@pytest.mark.parametrize("text", [recorded("ofed-info-command-not-found.txt"),
                                  corpus("driver/ethtool-i-mlx4-en-connectx2-fw2.7.700.txt")])
def test_ofed_info_rejects_non_output(text):
    with pytest.raises(ParseError):
        parse_ofed_info(text)


def test_plain_ofed_info_reads_its_first_line():
    # `ofed_info` without -s opens with the same release plus the OFED base in parentheses;
    # built from the real -s line (the base spelled as that format does) plus a package list.
    text = recorded("ofed-info-s-mlnx-ofed-24.10-3.2.5.0.txt").replace(
        ":", " (OFED-24.10-3.2.5):\n\nmlnx-ofed-kernel:\n")
    info = parse_ofed_info(text)
    assert (info.distribution, info.version) == ("MLNX_OFED_LINUX", "24.10-3.2.5.0")
    assert "read the first" in info.notes[0]


# --- mlxfwmanager / mlxup / flint -----------------------------------------------------------

def test_mlxup_query_two_cx7_update_required():
    q = parse_mlxfwmanager(corpus("mlxfw/cx7-mcx755106as-hea-mlxup-query-update-required.txt"))
    assert q.source == "mlxfwmanager" and len(q.devices) == 2
    dev = q.devices[0]
    assert (dev.index, dev.device_type, dev.part_number, dev.psid, dev.pci_name) == (
        1, "ConnectX7", "MCX755106AS-HEA_Ax", "MT_0000000834", "/dev/mst/mt4129_pciconf1")
    assert (dev.fw_current, dev.fw_available, dev.status) == ("28.40.1000", "28.43.1014", "Update required")
    assert dev.component("PXE").available is None  # N/A
    assert dev.description.startswith("NVIDIA ConnectX-7 HHHL Adapter Card; 200GbE")
    assert q.devices[1].pci_name == "/dev/mst/mt4129_pciconf0"


def test_mlxfwmanager_device_13_without_banner():
    q = parse_mlxfwmanager(recorded("mlxfwmanager-query-cx7-device13-fw28.44.1036-no-matching-image.txt"))
    (dev,) = q.devices
    assert (dev.index, dev.fw_current, dev.fw_available, dev.status) == (
        13, "28.44.1036", None, "No matching image found")
    assert [c.name for c in dev.components] == ["FW", "PXE", "UEFI"]


def test_mlxfwmanager_fw_running_row_is_the_firmware_in_effect():
    # NVIDIA's operator test recording: a CX6 Dx flashed with 22.45.3608 still running 22.43.1020.
    (dev,) = parse_mlxfwmanager(corpus("mlxfw/cx6dx-mlxfwmanager-fw-running-differs-reset-pending.txt")).devices
    assert [c.name for c in dev.components] == ["FW", "FW (Running)", "PXE", "UEFI"]
    assert (dev.fw_current, dev.fw_running, dev.reset_pending) == ("22.45.3608", "22.43.1020", True)
    assert dev.component("FW (Running)").available is None


def test_fw_running_row_after_clp_still_read():
    # A flint burn on a ConnectX-3 Pro, queried before any reset: the running row comes after CLP.
    (dev,) = parse_mlxfwmanager(corpus("mlxfw/cx3pro-mlxfwmanager-after-flint-burn-fw-running-old.txt")).devices
    assert (dev.fw_current, dev.fw_available, dev.fw_running) == ("2.42.5700", "2.42.5700", "2.42.5016")
    assert dev.reset_pending and dev.status == "Up to date"  # the tool's Status looks at the flash only


def test_without_a_running_row_the_flashed_firmware_is_running():
    q = parse_mlxfwmanager(corpus("mlxfw/cx7-mcx755106as-hea-mlxup-query-update-required.txt"))
    assert [(d.fw_running, d.reset_pending) for d in q.devices] == [("28.40.1000", False)] * 2


def test_mlxfwmanager_two_cx5_and_mlxup_bdf():
    q = parse_mlxfwmanager(recorded("mlxfwmanager-cx5-two-devices-no-matching-image.txt"))
    assert [(d.index, d.fw_current, d.base_guid) for d in q.devices] == [
        (1, "16.28.4000", "506b4b030028505c"), (2, "16.28.4000", "98039b03001eda3c")]
    (cx6lx,) = parse_mlxfwmanager(recorded("mlxup-query-cx6lx-bdf-update-required.txt")).devices
    assert (cx6lx.pci_name, cx6lx.fw_current, cx6lx.fw_available) == ("0002:01:00.0", "26.33.1048", "26.43.1014")


def test_mlxup_xml_matches_text_form():
    q = parse_mlxfwmanager(corpus("mlxfw/cx6lx-mlxup-query-format-xml.txt"))
    assert q.source == "mlxfwmanager-xml"
    (dev,) = q.devices
    (text_dev,) = parse_mlxfwmanager(recorded("mlxup-query-cx6lx-bdf-update-required.txt")).devices
    for attr in ("device_type", "part_number", "psid", "pci_name", "base_mac", "base_guid", "status",
                 "fw_current", "fw_available", "description"):
        assert getattr(dev, attr) == getattr(text_dev, attr), attr
    assert dev.component("UEFI").available == "14.36.0016"


def test_mlxup_xml_cut_short_keeps_nothing_half_read():
    # The real XML capture truncated inside <Versions>: no complete Device, and a note.
    text = corpus("mlxfw/cx6lx-mlxup-query-format-xml.txt")
    q = parse_mlxfwmanager(text[: text.index("<PXE")])
    assert q.devices == () and "ends early" in q.notes[0]


@pytest.mark.parametrize("name", ["cx6lx-flint-query-secure-fw.txt", "cx6lx-mstflint-d-bdf-q.txt"])
def test_flint_query(name):
    q = parse_mlxfwmanager(corpus(f"mlxfw/{name}"))
    (dev,) = q.devices
    assert q.source == "flint"
    assert (dev.fw_current, dev.psid, dev.base_guid, dev.base_mac) == (
        "26.33.1048", "MT_0000000575", "e8ebd3030070cf12", "e8ebd370cf12")
    assert dev.component("UEFI").current == "14.26.17" and dev.component("PXE").current == "3.6.502"


def test_mstflint_error_is_an_answer_not_a_crash():
    q = parse_mlxfwmanager(corpus("mlxfw/mstflint-q-cannot-open-device-mfe-cr-error-connectx2.txt"))
    assert q.devices == () and q.source == "error"
    assert "MFE_CR_ERROR" in q.notes[0]


@pytest.mark.parametrize("text", ["", not_found("mlxfwmanager"),
                                  corpus("driver/ethtool-i-mlx5-cx4lx-fw14.23-inbox-driver.txt")])
def test_mlxfwmanager_rejects_non_output(text):
    with pytest.raises(ParseError):
        parse_mlxfwmanager(text)
