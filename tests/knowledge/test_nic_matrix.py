"""preflight/knowledge/nic_matrix.py: adapter identification, release lookup and the firmware verdict,
on the parsed real captures of corpus/ibv, corpus/mlxfw, corpus/driver and recorded/."""

from pathlib import Path

import pytest

from preflight.knowledge.nic_matrix import (
    NEWER,
    OK,
    OLDER,
    PIN_MISMATCH,
    UNDECIDED,
    UNSUPPORTED,
    FirmwareCell,
    NicMatrixError,
    identify,
    judge,
    load_matrix,
    merge,
    nics_from_ethtool,
    nics_from_fwquery,
    nics_from_ib,
    releases_for,
)
from preflight.parse.ibverbs import parse_ibstat, parse_ibv_devinfo
from preflight.parse.mlnx import (
    parse_ethtool_i,
    parse_mlxfwmanager,
    parse_modinfo,
    parse_ofed_info,
)
from preflight.parse.versions import driver_release, parse_version

FIXTURES = Path(__file__).parents[1] / "fixtures"
MATRIX = load_matrix()


def fixture(path: str) -> str:
    return (FIXTURES / path).read_text()


def ofed(path: str):
    return driver_release(None, parse_ofed_info(fixture(path)), None)


def ethtool(path: str):
    return driver_release(None, None, parse_ethtool_i(fixture(path))[0])


MLNX_24_10_3 = "recorded/ofed-info-s-mlnx-ofed-24.10-3.2.5.0.txt"
# A DOCA 3.1.0 driver as its module reports it (docs/sources.md §1.2 form), read by the real parser.
DOCA_31 = driver_release(parse_modinfo(fixture("recorded/modinfo-mlx5_core-mlnx-ofed-24.10-2.1.8-debian12.txt")
                                       .replace("24.10-2.1.8", "doca3.1.0-25.07-0.9.7.0")), None, None)


def family_named(name: str):
    return next(f for f in MATRIX.families if f.name == name)


CX7, CX8 = family_named("ConnectX-7"), family_named("ConnectX-8")


# --- loading ------------------------------------------------------------------------------------

def test_builtin_matrix_loads_typed():
    assert {"ConnectX-7", "ConnectX-8", "BlueField-3"} <= {f.name for f in MATRIX.families}
    names = [r.name for r in MATRIX.releases]
    assert names[0] == "MLNX_OFED 23.10-0.5.5.0" and "DOCA 3.1.0" in names and MATRIX.pins == ()
    doca31 = next(r for r in MATRIX.releases if r.name == "DOCA 3.1.0")
    assert (str(doca31.ofed), str(doca31.firmware["ConnectX-8"].version)) == ("25.07-0.9.7.0", "40.46.1006")
    (floor,) = MATRIX.floors
    assert (floor.family, str(floor.version)) == ("ConnectX-8", "40.45.1020")


def test_approx_cell_spans_its_range():
    cell = FirmwareCell(None, approx="28.43.36xx")
    assert [str(v) for v in cell.bounds] == ["28.43.3600", "28.43.3699"] and cell.text == "28.43.36xx"
    assert FirmwareCell(None, supported=False).bounds is None


# --- identification on real captures ------------------------------------------------------------

def test_identify_from_ibstat_hca_types_and_firmware_major():
    inv = parse_ibstat(fixture("corpus/ibv/ibstat-cx6-hdr-one-port-disabled-plus-cx4lx.txt"))
    nics = nics_from_ib(MATRIX, inv, "ibstat")
    got = [(n.name, n.family.name if n.family else None, n.how) for n in nics]
    assert got == [("mlx5_0", "ConnectX-6", "hca_type MT4123"), ("mlx5_1", "ConnectX-6", "hca_type MT4123"),
                   ("mlx5_2", None, "hca_type MT4117, firmware 14.x")]


def test_virtual_function_falls_back_to_firmware_major():
    (dev,) = parse_ibstat(fixture("corpus/ibv/ibstat-cx6-mt4124-vf-in-pod-down-linkup-lid65535.txt")).devices
    fam, how = identify(MATRIX, hca_type=dev.hca_type, firmware=dev.fw_ver)
    assert (fam.name, how) == ("ConnectX-6", "firmware major 20")


def test_identify_from_ibv_devinfo_part_id():
    inv = parse_ibv_devinfo(fixture("corpus/ibv/ibv-devinfo-cx7-roce-fw28.42-h100.txt"))
    nic = nics_from_ib(MATRIX, inv, "ibv-devinfo")[0]
    assert (nic.name, nic.family.name, nic.how, nic.firmware) == ("mlx5_2", "ConnectX-7", "hca_type MT4129", "28.42.1000")
    assert identify(MATRIX, pci_device_id=0x1023)[0] is CX8


def test_identify_from_firmware_query_tools():
    mlxup = nics_from_fwquery(MATRIX, parse_mlxfwmanager(fixture("corpus/mlxfw/cx7-mcx755106as-hea-mlxup-query-update-required.txt")))
    assert [(n.name, n.family.name, n.how, n.firmware) for n in mlxup] == [
        ("/dev/mst/mt4129_pciconf1", "ConnectX-7", "device type ConnectX7", "28.40.1000"),
        ("/dev/mst/mt4129_pciconf0", "ConnectX-7", "device type ConnectX7", "28.40.1000")]
    (xml,) = nics_from_fwquery(MATRIX, parse_mlxfwmanager(fixture("corpus/mlxfw/cx6lx-mlxup-query-format-xml.txt")))
    assert (xml.family.name, xml.bdf, xml.firmware) == ("ConnectX-6 Lx", "0002:01:00.0", "26.33.1048")
    for flint in ("corpus/mlxfw/cx6lx-flint-query-secure-fw.txt", "corpus/mlxfw/cx6lx-mstflint-d-bdf-q.txt"):
        (nic,) = nics_from_fwquery(MATRIX, parse_mlxfwmanager(fixture(flint)))
        assert (nic.family.name, nic.how, nic.name) == ("ConnectX-6 Lx", "firmware major 26", "device 1")
    (cx5, _) = nics_from_fwquery(MATRIX, parse_mlxfwmanager(fixture("recorded/mlxfwmanager-cx5-two-devices-no-matching-image.txt")))
    assert cx5.family is None and cx5.how == "type ConnectX5, firmware 16.x"
    # The tool could not open the card: an answer with no NIC in it, not an error.
    assert nics_from_fwquery(MATRIX, parse_mlxfwmanager(fixture("corpus/mlxfw/mstflint-q-cannot-open-device-mfe-cr-error-connectx2.txt"))) == ()


def test_ethtool_keeps_mlx5_netdevs_only():
    mlx4 = parse_ethtool_i(fixture("corpus/driver/ethtool-i-mlx4-en-connectx2-fw2.7.700.txt"))
    assert nics_from_ethtool(MATRIX, mlx4) == ()
    (cx7,) = nics_from_ethtool(MATRIX, parse_ethtool_i(fixture("recorded/ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt")))
    assert (cx7.family.name, cx7.firmware, cx7.bdf) == ("ConnectX-7", "28.39.3560", "0000:e6:00.0")


# --- which release a driver is ------------------------------------------------------------------

def test_release_rows_for_real_driver_strings():
    assert [r.name for r in releases_for(MATRIX, ethtool("recorded/ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt"))] == [
        "MLNX_OFED 23.10-1.1.9.0 LTS"]
    assert [r.name for r in releases_for(MATRIX, ofed(MLNX_24_10_3))] == ["MLNX_OFED 24.10-3.2.5.0 LTS"]
    assert [r.name for r in releases_for(MATRIX, DOCA_31)] == ["DOCA 3.1.0"]
    # Real releases the matrix does not list, and the inbox driver, find no row.
    assert releases_for(MATRIX, ofed("recorded/ofed-info-s-mlnx-ofed-23.07-0.5.1.2.txt")) == ()
    assert releases_for(MATRIX, ofed("recorded/ofed-info-s-ofed-internal-24.07-0.3.5.0.110.txt")) == ()
    inbox = driver_release(parse_modinfo(fixture("recorded/modinfo-mlx5_core-inbox-debian12-6.1.0-31.txt")), None, None)
    assert releases_for(MATRIX, inbox) == ()


# --- the verdict ----------------------------------------------------------------------------

def test_ofed_with_the_newer_firmware_of_its_own_capture_warns():
    # One real `ethtool -i`: MLNX_OFED 23.10-1.1.9 driving firmware 28.39.3560; the release ships 28.39.2048.
    info = parse_ethtool_i(fixture("recorded/ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt"))[0]
    v = judge(MATRIX, driver_release(None, None, info), CX7, info.firmware_version)
    assert (v.level, v.expected, v.release) == (NEWER, "28.39.2048", "MLNX_OFED 23.10-1.1.9.0 LTS")
    assert "not tested" in v.reason and "move the driver to a release tested with 28.39.3560" in v.action


def test_firmware_newer_than_an_approximate_release_names_the_release_that_ships_it():
    # ofed_info and mlxfwmanager of the same real host: MLNX_OFED 24.10-3.2.5.0 (28.43.36xx) with 28.44.1036.
    (dev,) = parse_mlxfwmanager(fixture("recorded/mlxfwmanager-query-cx7-device13-fw28.44.1036-no-matching-image.txt")).devices
    v = judge(MATRIX, ofed(MLNX_24_10_3), CX7, dev.fw_current)
    assert (v.level, v.expected) == (NEWER, "28.43.36xx")
    assert v.action.startswith("move the driver to DOCA 2.10.0, which ships 28.44.1036")
    # 28.43.3608, the firmware the capture's author was told pairs with that release, is inside the range.
    assert judge(MATRIX, ofed(MLNX_24_10_3), CX7, "28.43.3608").level == OK


def test_older_firmware_fails_with_the_update_action():
    inv = parse_ibv_devinfo(fixture("corpus/ibv/ibv-devinfo-cx7-ndr-port-down-lid65535.txt"))
    v = judge(MATRIX, ofed(MLNX_24_10_3), CX7, inv.devices[0].fw_ver)
    assert (v.level, v.expected) == (OLDER, "28.43.36xx")
    assert v.reason == ("firmware 28.39.2048 is older than the 28.43.36xx that MLNX_OFED 24.10-3.2.5.0 LTS ships "
                        "(MLNX_OFED 24.10-3.2.5.0)")


def test_connectx8_on_doca_3_1():
    old = judge(MATRIX, DOCA_31, CX8, "40.44.1036")
    assert (old.level, old.expected, old.release) == (OLDER, "40.46.1006", "DOCA 3.1.0")
    assert old.action == ("update NIC firmware to 40.46.1006 with mlxfwmanager -u (or the OEM package), reboot, "
                          "re-run nccl all_reduce")
    assert any("below 40.45.1020" in n and "cannot be downgraded" in n for n in old.notes)
    assert old.source.startswith("docs.nvidia.com/doca/archive/3-1-0/General+Support")
    good = judge(MATRIX, DOCA_31, CX8, "40.46.1006")
    assert (good.level, good.notes, good.action) == (OK, (), None)
    # 40.49.1118 was seen on a live system; DOCA 3.3.0 ships 40.48.1000 "and above".
    doca33 = driver_release(None, parse_ofed_info("OFED-internal-26.01-1.0.0.1:\n"), None)
    seen = judge(MATRIX, doca33, CX8, "40.49.1118")
    assert seen.level == NEWER
    assert seen.notes == ("40.49.1118 has been seen on a live system, but no listed release ships it",)


def test_connectx8_under_mlnx_ofed_is_unsupported():
    v = judge(MATRIX, ofed(MLNX_24_10_3), CX8, "40.46.1006")
    assert (v.level, v.release) == (UNSUPPORTED, "MLNX_OFED 24.10-3.2.5.0 LTS")
    assert "needs DOCA-OFED (DOCA 2.10.0 or later ships its firmware) or the inbox driver" in v.action


def test_newer_firmware_past_the_floor_cannot_be_flashed_back():
    # DOCA 2.10.0 ships 40.44.1036; a card already on 40.46.1006 cannot go below 40.45.1020.
    doca210 = driver_release(None, parse_ofed_info(fixture(MLNX_24_10_3).replace(
        "MLNX_OFED_LINUX-24.10-3.2.5.0", "OFED-internal-25.01-0.6.0.0")), None)
    v = judge(MATRIX, doca210, CX8, "40.46.1006")
    assert (v.level, v.expected, v.release) == (NEWER, "40.44.1036", "DOCA 2.10.0")
    assert "move the driver to DOCA 3.1.0, which ships 40.46.1006" in v.action
    assert "flashing back to 40.44.1036 is not possible" in v.action


@pytest.mark.parametrize("driver, family, firmware, reason", [
    (driver_release(parse_modinfo(fixture("recorded/modinfo-mlx5_core-inbox-debian12-6.1.0-31.txt")), None, None),
     "ConnectX-7", "28.41.1000", "inbox mlx5_core (kernel 6.1.0-31-amd64): the matrix lists MLNX_OFED and DOCA"),
    (ofed("recorded/ofed-info-s-mlnx-ofed-23.07-0.5.1.2.txt"), "ConnectX-7", "28.41.1000",
     "MLNX_OFED 23.07-0.5.1.2 is not in the NIC firmware matrix"),
    (driver_release(parse_modinfo(fixture("recorded/modinfo-mlx5_core-mlnx-ofed-24.10-2.1.8-debian12.txt")), None, None),
     "ConnectX-7", "28.43.2026", "OFED 24.10-2.1.8 is not in the NIC firmware matrix"),
    (driver_release(None, None, None), "ConnectX-7", "28.41.1000", "no mlx5 driver evidence"),
    (DOCA_31, "ConnectX-6 Dx", "22.39.1002", "DOCA 3.1.0 lists no ConnectX-6 Dx firmware"),
    # ibstat of the ibpanic capture redacts the firmware as "...".
    (DOCA_31, "ConnectX-7", "...", "firmware version '...' is not a version"),
])
def test_undecidable_cases_say_why(driver, family, firmware, reason):
    v = judge(MATRIX, driver, family_named(family), firmware)
    assert v.level == UNDECIDED and reason in v.reason and v.action


def test_unknown_adapter_and_the_two_doca_2_9_builds():
    assert judge(MATRIX, DOCA_31, None, "16.35.4030", "firmware 16.x").reason == \
        "adapter not in the NIC firmware matrix (firmware 16.x)"
    assert identify(MATRIX, hca_type="...", firmware="...") == (None, "hca_type ..., firmware '...'")
    doca290 = driver_release(parse_modinfo(fixture("recorded/modinfo-mlx5_core-mlnx-ofed-24.10-2.1.8-debian12.txt")
                                           .replace("24.10-2.1.8", "doca2.9.0-24.10-1.1.4.0")), None, None)
    # DOCA 2.9.0 has an LTS and a _CX8 build of one version and no OFED named for either.
    assert judge(MATRIX, doca290, CX7, "28.43.1014").level == OK
    cx8 = judge(MATRIX, doca290, CX8, "40.44.1036")
    assert cx8.level == UNDECIDED and cx8.reason == "DOCA 2.9.0_CX8 supports ConnectX-8 but the source gives no firmware version"


# --- a site policy ------------------------------------------------------------------------------

def test_policy_pin_overrides_the_release(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text('pins:\n  - {family: ConnectX-8, version: "40.46.1006", reason: "validated with our switches"}\n')
    matrix = load_matrix(str(policy))
    doca210 = driver_release(None, parse_ofed_info("OFED-internal-25.01-0.6.0.0:\n"), None)
    ok = judge(matrix, doca210, CX8, "40.46.1006")
    assert ok.level == OK and "pinned" in ok.reason and "validated with our switches" in ok.reason
    off = judge(matrix, doca210, CX8, "40.47.1026")
    assert off.level == PIN_MISMATCH and "flash ConnectX-8 firmware 40.46.1006" in off.action
    assert off.source == f"site policy {policy}"
    # A pin never makes an unsupported driver acceptable.
    assert judge(matrix, ofed(MLNX_24_10_3), CX8, "40.46.1006").level == UNSUPPORTED


def test_policy_adds_and_replaces_rows():
    base = {"mlnx_ofed": [{"release": "A", "ofed": "1.0-1.0.0.0"}], "pins": [], "floors": [{"family": "X"}]}
    policy = {"mlnx_ofed": [{"release": "A", "ofed": "1.0-2.0.0.0"}, {"release": "B", "ofed": "2.0-1.0.0.0"}],
              "floors": [{"family": "Y"}]}
    merged = merge(base, policy)
    assert [r["ofed"] for r in merged["mlnx_ofed"]] == ["1.0-2.0.0.0", "2.0-1.0.0.0"]
    assert [f["family"] for f in merged["floors"]] == ["X", "Y"]


@pytest.mark.parametrize("text, message", [
    ("pins: [\n", "invalid YAML"),
    ('pins:\n  - {family: ConnectX-99, version: "1.2.3"}\n', "unknown adapter family 'ConnectX-99'"),
    ('pins:\n  - {family: ConnectX-8, version: "40.46.x"}\n', "'40.46.x' is not a version"),
    ("- just a list\n", "expected a mapping"),
])
def test_bad_policy_files_are_refused(tmp_path, text, message):
    policy = tmp_path / "bad.yaml"
    policy.write_text(text)
    with pytest.raises(NicMatrixError, match=message):
        load_matrix(str(policy))


def test_versions_compare_as_numbers_in_verdicts():
    # 28.9.x < 28.39.x numerically, though "28.9" > "28.39" as text.
    assert parse_version("28.9.1000") < parse_version("28.39.2048")
    assert judge(MATRIX, ofed(MLNX_24_10_3), CX7, "28.9.1000").level == OLDER
