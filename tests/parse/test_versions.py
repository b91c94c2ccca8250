"""Version values, the mlx5 driver identity, and the structure of playbooks/nic_firmware.yaml."""

from pathlib import Path

import pytest
import yaml

from preflight.parse.mlnx import parse_ethtool_i, parse_mlxfwmanager, parse_modinfo, parse_ofed_info
from preflight.parse.versions import Version, driver_release, parse_version

ROOT = Path(__file__).parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures"


def fixture(path: str) -> str:
    return (FIXTURES / path).read_text()


def ethtool(path: str):
    (info,) = parse_ethtool_i(fixture(path))
    return info


# --- Version --------------------------------------------------------------------------------

def test_versions_compare_numerically():
    a, b, c = (parse_version(s) for s in ("28.39.1002", "28.39.5124", "40.44.1036"))
    assert a < b < c and sorted([c, a, b]) == [a, b, c]
    # Text comparison would put 28.9 after 28.10.
    assert parse_version("28.9.1000") < parse_version("28.10.1000")
    assert parse_version("24.10-3.2.5") < parse_version("24.10-3.2.5.0")
    assert parse_version("3.6.0502") == parse_version("3.6.502")


def test_version_keeps_its_spelling_and_major():
    v = parse_version(" 24.10-3.2.5.0 ")
    assert str(v) == "24.10-3.2.5.0" and v.parts == (24, 10, 3, 2, 5, 0) and v.major == 24
    assert v.has_prefix(parse_version("24.10-3.2.5")) and not v.has_prefix(parse_version("24.10-2.1.8"))
    assert str(Version((28, 39, 1002))) == "28.39.1002"


@pytest.mark.parametrize("text", [None, "", "N/A", "...", "3.0-1 (January 2015)", "5.15.0-91-generic",
                                  "28.43.36xx", "MT_0000000838"])
def test_parse_version_refuses_non_versions(text):
    assert parse_version(text) is None


def test_firmware_from_real_captures_orders_across_families():
    fw = [parse_version(ethtool("corpus/driver/ethtool-i-mlx5-cx4lx-fw14.23-inbox-driver.txt").firmware_version),
          parse_version(ethtool("recorded/ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt").firmware_version)]
    assert [str(v) for v in fw] == ["14.23.1020", "28.39.3560"] and fw[0] < fw[1]


# --- driver_release -------------------------------------------------------------------------

OFED_MODINFO = "recorded/modinfo-mlx5_core-mlnx-ofed-24.10-2.1.8-debian12.txt"
INBOX_MODINFO = "recorded/modinfo-mlx5_core-inbox-debian12-6.1.0-31.txt"


def test_ofed_module_confirmed_by_ofed_info_takes_full_release():
    modinfo = parse_modinfo(fixture(OFED_MODINFO))
    # That host installed MLNX_OFED 24.10-2.1.8.0; its ofed_info was not captured, so the real
    # ofed_info line of another host is used with only the version changed to that release.
    ofed = parse_ofed_info(fixture("recorded/ofed-info-s-mlnx-ofed-24.10-3.2.5.0.txt").replace(
        "24.10-3.2.5.0", "24.10-2.1.8.0"))
    rel = driver_release(modinfo, ofed, None)
    assert (rel.flavour, str(rel.ofed), rel.source, rel.raw) == ("mlnx-ofed", "24.10-2.1.8.0", "modinfo", "24.10-2.1.8")
    assert rel.notes == ()


def test_ofed_module_alone_cannot_tell_mlnx_from_doca():
    rel = driver_release(None, None, ethtool("recorded/ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt"))
    assert (rel.flavour, str(rel.ofed), rel.source, rel.kernel) == ("ofed", "23.10-1.1.9", "ethtool", None)


def test_installed_ofed_differing_from_loaded_module_is_noted():
    rel = driver_release(parse_modinfo(fixture(OFED_MODINFO)),
                         parse_ofed_info(fixture("recorded/ofed-info-s-mlnx-ofed-24.10-3.2.5.0.txt")), None)
    assert str(rel.ofed) == "24.10-2.1.8" and rel.flavour == "ofed"
    assert any("24.10-3.2.5.0" in n and "24.10-2.1.8" in n for n in rel.notes)


def test_inbox_from_modinfo_names_the_kernel():
    rel = driver_release(parse_modinfo(fixture(INBOX_MODINFO)), None, None)
    assert (rel.flavour, rel.kernel, rel.ofed, rel.source) == ("inbox", "6.1.0-31-amd64", None, "modinfo")


def test_inbox_ethtool_reports_kernel_release_cut_to_31_chars():
    rel = driver_release(None, None, ethtool("recorded/ethtool-i-mlx5-cx5-inbox-kernel-release-truncated.txt"))
    assert (rel.flavour, rel.kernel, rel.source) == ("inbox", "5.11.0-net-next-alloc_pages_bul", "ethtool")
    assert any("31 characters" in n for n in rel.notes)


def test_old_inbox_driver_version_is_not_a_kernel():
    rel = driver_release(None, None, ethtool("corpus/driver/ethtool-i-mlx5-cx4lx-fw14.23-inbox-driver.txt"))
    assert (rel.flavour, rel.kernel, rel.ofed) == ("inbox", None, None)
    assert any("DRIVER_VERSION" in n for n in rel.notes)


def test_loaded_inbox_wins_over_installed_ofed():
    rel = driver_release(parse_modinfo(fixture(OFED_MODINFO)),
                         parse_ofed_info(fixture("recorded/ofed-info-s-mlnx-ofed-24.10-3.2.5.0.txt")),
                         ethtool("recorded/ethtool-i-mlx5-cx5-inbox-kernel-release-truncated.txt"))
    assert (rel.flavour, rel.source) == ("inbox", "ethtool")
    assert any("installed but not loaded" in n for n in rel.notes)
    assert any("loaded mlx5_core is the inbox driver" in n for n in rel.notes)


def test_non_mlx5_ethtool_is_set_aside():
    rel = driver_release(parse_modinfo(fixture(INBOX_MODINFO)), None,
                         ethtool("corpus/driver/ethtool-i-mlx4-en-connectx2-fw2.7.700.txt"))
    assert (rel.flavour, rel.source) == ("inbox", "modinfo")
    assert any("mlx4_en" in n for n in rel.notes)


def test_ofed_info_alone_ofed_internal_is_doca():
    ofed = parse_ofed_info(fixture("recorded/ofed-info-s-ofed-internal-24.07-0.3.5.0.110.txt"))
    rel = driver_release(None, ofed, None)
    assert (rel.flavour, str(rel.ofed), rel.source) == ("doca-ofed", "24.07-0.3.5.0.110", "ofed_info")
    assert any("installed packages" in n for n in rel.notes)


def test_doca_release_encoded_in_module_version():
    # The real OFED modinfo with its version replaced by the DOCA-OFED version string of
    # docs/sources.md §1.2 (network-operator PR #1681).
    text = fixture(OFED_MODINFO).replace("version:        24.10-2.1.8", "version:        doca3.1.0-25.07-0.9.7.0")
    rel = driver_release(parse_modinfo(text), None, None)
    assert (rel.flavour, str(rel.doca), str(rel.ofed)) == ("doca-ofed", "3.1.0", "25.07-0.9.7.0")


def test_no_evidence_is_unknown():
    rel = driver_release(None, None, None)
    assert (rel.flavour, rel.source, rel.ofed) == ("unknown", "none", None) and rel.notes


# --- playbooks/nic_firmware.yaml ------------------------------------------------------------

@pytest.fixture(scope="module")
def matrix():
    return yaml.safe_load((ROOT / "playbooks" / "nic_firmware.yaml").read_text())


def test_families(matrix):
    assert matrix["format"] == "preflight-nic-firmware/1"
    names = [f["name"] for f in matrix["families"]]
    assert len(names) == len(set(names)) and {"ConnectX-7", "ConnectX-8"} <= set(names)
    for fam in matrix["families"]:
        assert fam["source"]
        assert isinstance(fam["pci_device_id"], int)
        assert fam["hca_type"] == f"MT{fam['pci_device_id']}"
        assert fam["fw_major"] is None or isinstance(fam["fw_major"], int)
    by_name = {f["name"]: f for f in matrix["families"]}
    assert (by_name["ConnectX-7"]["fw_major"], by_name["ConnectX-7"]["pci_device_id"]) == (28, 0x1021)
    assert (by_name["ConnectX-8"]["fw_major"], by_name["ConnectX-8"]["hca_type"]) == (40, "MT4131")


def _release_rows(matrix):
    return [("mlnx_ofed", row) for row in matrix["mlnx_ofed"]] + [("doca", row) for row in matrix["doca"]]


def test_every_release_row_is_sourced_and_its_versions_parse(matrix):
    families = {f["name"]: f for f in matrix["families"]}
    for _, row in _release_rows(matrix):
        assert row["source"] and row["release"], row
        for key in ("ofed", "doca"):
            if row.get(key) is not None:
                assert parse_version(row[key]) is not None, (row["release"], key)
        for family, cell in row["firmware"].items():
            assert family in families, family
            if cell.get("supported") is False:
                assert cell.get("version") is None
            elif cell.get("version") is None:
                assert cell.get("approx") or cell.get("note"), (row["release"], family)
            else:
                version = parse_version(cell["version"])
                assert version is not None and version.major == families[family]["fw_major"]


def test_rows_are_ordered_by_version(matrix):
    ofed = [parse_version(r["ofed"]) for r in matrix["mlnx_ofed"]]
    assert ofed == sorted(ofed) and len(set(ofed)) == len(ofed)
    doca = [parse_version(r["doca"]) for r in matrix["doca"] if r["doca"]]
    assert doca == sorted(doca)
    doca_ofed = [parse_version(r["ofed"]) for r in matrix["doca"] if r["ofed"]]
    assert doca_ofed == sorted(doca_ofed)
    cx7 = [parse_version(r["firmware"]["ConnectX-7"]["version"]) for r in matrix["doca"]
           if r["firmware"].get("ConnectX-7", {}).get("version")]
    assert cx7 == sorted(cx7)


def test_connectx8_is_unsupported_under_mlnx_ofed_and_doca_2_9(matrix):
    for row in matrix["mlnx_ofed"]:
        assert row["firmware"]["ConnectX-8"]["supported"] is False
    for row in matrix["doca"]:
        if row["doca"] and row["doca"].startswith("2.9") and "CX8" not in row["release"]:
            assert row["firmware"]["ConnectX-8"]["supported"] is False
    floor = matrix["floors"][0]
    assert (floor["family"], floor["version"], floor["kind"]) == ("ConnectX-8", "40.45.1020", "no-downgrade")
    for entry in matrix["floors"] + matrix["observed"]:
        assert entry["source"] and parse_version(entry["version"]).major == 40
    assert matrix["pins"] == []


def test_a_real_node_finds_its_release_row(matrix):
    # ofed_info and mlxfwmanager from the same real host: the release row exists, and the
    # ConnectX-7 firmware it runs is of a later minor than the 28.43 that release ships.
    rel = driver_release(None, parse_ofed_info(fixture("recorded/ofed-info-s-mlnx-ofed-24.10-3.2.5.0.txt")), None)
    (row,) = [r for r in matrix["mlnx_ofed"] if parse_version(r["ofed"]) == rel.ofed]
    assert row["firmware"]["ConnectX-7"]["approx"] == "28.43.36xx"
    (dev,) = parse_mlxfwmanager(
        fixture("recorded/mlxfwmanager-query-cx7-device13-fw28.44.1036-no-matching-image.txt")).devices
    assert parse_version(dev.fw_current).parts[:2] == (28, 44)
