"""NIC checks (issue 3) on real captures and on scenarios derived from them (tests/derived.py):
nic-fw-driver-mismatch, nic-fw-inconsistent, nic-fw-fleet-consistency, ib-port-down,
ib-link-degraded, mlx5-kernel-log, and a fleet analysed end to end."""

import json
import re
from pathlib import Path

import pytest
from ctx import make_host, result, run_check, run_fleet_check
from derived import (
    MLX5_CMD_TIMEOUT_DMESG,
    cx8_ibstat,
    doca_ethtool,
    doca_ofed_info,
    nic_pcie_limited_dmesg,
)

from preflight.diagnose.analysis import analyze
from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.diagnose.explain import explain
from preflight.evidence.bundle import FORMAT, read_bundle
from preflight.judge.loader import load_checks, select
from preflight.knowledge.profiles import load_profiles
from preflight.report import json_report

FIXTURES = Path(__file__).parents[1] / "fixtures"


def fixture(path: str) -> str:
    return (FIXTURES / path).read_text()


def corpus(path: str) -> str:
    return fixture(f"corpus/{path}")


def recorded(path: str) -> str:
    return fixture(f"recorded/{path}")


MLNX_24_10_3 = "ofed-info-s-mlnx-ofed-24.10-3.2.5.0.txt"


def b300(fw="40.46.1006", odd=None, polling=(), name="node1", **probes):
    """A ConnectX-8 node on DOCA-OFED 3.1.0 (derived), on the hgx-b300 profile; `probes` add or replace outputs."""
    base = {"ibstat": cx8_ibstat(8, fw, odd, polling), "ethtool-i": doca_ethtool(fw), "ofed-info": doca_ofed_info()}
    return make_host({**base, **probes}, profile="hgx-b300", name=name)


def one(findings, status=None):
    assert len(findings) == 1, [(f.status, f.summary) for f in findings]
    if status:
        assert findings[0].status.value == status, findings[0].summary
    return findings[0]


def excerpt_of_hgx(findings):
    """The findings on a capture of fewer NICs than the HGX profile's 8 (an excerpt of a node's
    output, or a smaller node), less the FAIL that says so, which must be there."""
    short = [f for f in findings if f.symptoms == ("nic-missing",)]
    assert len(short) == 1 and short[0].status.value == "fail" and ", the NVIDIA HGX" in short[0].summary, findings
    return [f for f in findings if f not in short]


def by_status(findings):
    return {f.status.value: f for f in findings}


def probes_of(finding):
    return [e.probe for e in finding.evidence]


# --- nic-fw-driver-mismatch ---------------------------------------------------------------------

def test_cx8_on_doca31_with_the_firmware_it_ships_passes():
    f = one(run_check("nic-fw-driver-mismatch", b300()), "pass")
    assert f.summary.startswith("8 x ConnectX-8 (mlx5_0, mlx5_1, mlx5_2, mlx5_3, ...): firmware 40.46.1006 is the "
                                "40.46.1006 that DOCA 3.1.0 ships")
    assert "driver: DOCA-OFED 25.07-0.9.7, read from ethtool" in f.summary
    assert probes_of(f) == ["ibstat", "ibstat"] and "Firmware version: 40.46.1006" in f.evidence[0].excerpt


def test_cx8_firmware_older_than_doca31_ships_fails_with_the_update_action():
    f = one(run_check("nic-fw-driver-mismatch", b300("40.44.1036")), "fail")
    assert f.symptoms == ("nic-fw-driver-mismatch",)
    assert "firmware 40.44.1036 is older than the 40.46.1006 that DOCA 3.1.0 ships" in f.summary
    assert "below 40.45.1020: once updated it cannot be downgraded" in f.summary
    assert f.action == ("update NIC firmware to 40.46.1006 with mlxfwmanager -u (or the OEM package), "
                                "reboot, re-run nccl all_reduce")
    assert probes_of(f) == ["ibstat", "ibstat", "ethtool-i", "ofed-info"]
    assert "version: 25.07-0.9.7" in f.evidence[2].excerpt and "OFED-internal-25.07-0.9.7" in f.evidence[3].excerpt


def test_cx8_under_mlnx_ofed_fails():
    host = make_host({"ibstat": cx8_ibstat(2), "ofed-info": recorded(MLNX_24_10_3)}, profile="hgx-b300")
    f = one(run_check("nic-fw-driver-mismatch", host), "fail")
    assert "MLNX_OFED 24.10-3.2.5.0 LTS does not support ConnectX-8" in f.summary
    assert "needs DOCA-OFED" in f.action and "read from ofed_info" in f.summary


def test_real_host_ofed_and_mlxfwmanager_newer_firmware_warns():
    # ofed_info -s and mlxfwmanager --query of one real host; no RDMA listing was captured, so the
    # firmware comes from mlxfwmanager.
    host = make_host({"ofed-info": recorded(MLNX_24_10_3),
                      "mlxfwmanager": recorded("mlxfwmanager-query-cx7-device13-fw28.44.1036-no-matching-image.txt")},
                     profile="hgx-h100")
    f = one(run_check("nic-fw-driver-mismatch", host), "warn")
    assert f.symptoms == ("nic-fw-newer-than-driver",)
    assert f.summary.startswith("1 x ConnectX-7 (/dev/mst/mt4129_pciconf0): firmware 28.44.1036 is newer than the "
                                "28.43.36xx that MLNX_OFED 24.10-3.2.5.0 LTS ships")
    assert f.data["source"] == "mlxfwmanager" and "FW             28.44.1036" in f.evidence[0].excerpt
    assert f.action.startswith("move the driver to DOCA 2.10.0, which ships 28.44.1036")


def test_real_ethtool_alone_judges_its_own_firmware():
    host = make_host({"ethtool-i": recorded("ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt")}, profile="hgx-h100")
    f = one(run_check("nic-fw-driver-mismatch", host), "warn")
    # A bare `ethtool -i` block (no `== IFACE ==` header): the NIC is named by its bus address.
    assert f.summary.startswith("1 x ConnectX-7 (0000:e6:00.0): firmware 28.39.3560 is newer than the 28.39.2048 "
                                "that MLNX_OFED 23.10-1.1.9.0 LTS ships")
    assert "[driver: OFED 23.10-1.1.9, read from ethtool]" in f.summary and f.data["source"] == "ethtool-i"


def test_driver_read_past_a_missing_ofed_info_and_another_modules_modinfo():
    # ofed_info absent (the real shell error, as a probe that exited 127), and a modinfo that is
    # nvidia-peermem's, not mlx5_core's: the real ethtool -i still names the driver.
    host = make_host({"ethtool-i": recorded("ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt"),
                      "ofed-info": result("ofed-info", recorded("ofed-info-command-not-found.txt"), 127),
                      "mlx5-modinfo": corpus("driver/modinfo-nvidia-peermem-drv550-rhel92.txt")}, profile="hgx-h100")
    f = one(run_check("nic-fw-driver-mismatch", host), "warn")
    assert "[driver: OFED 23.10-1.1.9, read from ethtool]" in f.summary and "550.54.15" not in f.summary
    assert probes_of(f) == ["ethtool-i", "ethtool-i"]
    assert "firmware-version: 28.39.3560 (MT_0000000838)" in f.evidence[0].excerpt
    # With ethtool gone too, the peermem modinfo alone is no mlx5 evidence.
    host = make_host({"ibstat": corpus("ibv/ibstat-cx7-ndr-400g-active-ib.txt"),
                      "mlx5-modinfo": corpus("driver/modinfo-nvidia-peermem-drv550-rhel92.txt")}, profile="hgx-h100")
    assert "no mlx5 driver evidence" in one(run_check("nic-fw-driver-mismatch", host), "warn").summary


def test_inbox_driver_cannot_be_judged_by_the_matrix():
    host = make_host({"ibstat": corpus("ibv/ibstat-cx7-ndr-400g-active-ib.txt"),
                      "mlx5-modinfo": recorded("modinfo-mlx5_core-inbox-debian12-6.1.0-31.txt")}, profile="hgx-h100")
    f = one(run_check("nic-fw-driver-mismatch", host), "warn")
    assert f.symptoms == ("nic-fw-unverified",)
    assert "2 x ConnectX-7 (mlx5_0, mlx5_1): inbox mlx5_core (kernel 6.1.0-31-amd64): the matrix lists MLNX_OFED " \
           "and DOCA releases only" in f.summary
    assert "mlx5-modinfo" in probes_of(f) and "nic.policy_file" in f.action


@pytest.mark.parametrize("capture, bdf, firmware, note", [
    ("corpus/driver/ethtool-i-mlx5-cx4lx-fw14.23-inbox-driver.txt", "0000:af:00.0", "14.x", "old in-tree DRIVER_VERSION"),
    ("recorded/ethtool-i-mlx5-cx5-inbox-kernel-release-truncated.txt", "0000:03:00.0", "16.x", "31 characters long"),
])
def test_unknown_adapters_warn(capture, bdf, firmware, note):
    f = one(run_check("nic-fw-driver-mismatch", make_host({"ethtool-i": fixture(capture)})), "warn")
    assert f"1 x unknown adapter ({bdf}): adapter not in the NIC firmware matrix (firmware {firmware})" in f.summary
    assert note in f.summary
    assert f.symptoms == ("nic-fw-unverified",) and "ethtool-i" in probes_of(f)


def test_release_the_matrix_does_not_list_warns():
    host = make_host({"ibv-devinfo": corpus("ibv/ibv-devinfo-cx7-roce-fw28.39-raw-tabs.txt"),
                      "ofed-info": recorded("ofed-info-s-mlnx-ofed-23.07-0.5.1.2.txt")}, profile="hgx-h100")
    f = one(run_check("nic-fw-driver-mismatch", host), "warn")
    assert "3 x ConnectX-7 (mlx5_0, mlx5_1, mlx5_2): MLNX_OFED 23.07-0.5.1.2 is not in the NIC firmware matrix" \
        in f.summary
    assert f.evidence[0].excerpt == "hca_id:\tmlx5_0\nfw_ver:\t\t\t\t28.39.2048\nvendor_part_id:\t\t\t4129"


def test_mixed_generations_one_older_one_unknown():
    host = make_host({"ibv-devinfo": corpus("ibv/ibv-devinfo-cx7-roce-fw28.42-h100.txt"),
                      "ofed-info": recorded(MLNX_24_10_3)}, profile="hgx-h100")
    found = by_status(run_check("nic-fw-driver-mismatch", host))
    assert set(found) == {"fail", "warn"}
    assert "1 x ConnectX-7 (mlx5_2): firmware 28.42.1000 is older than the 28.43.36xx" in found["fail"].summary
    assert "1 x unknown adapter (mlx5_3): adapter not in the NIC firmware matrix (firmware 16.x)" in found["warn"].summary


def test_redacted_firmware_is_not_a_version():
    host = make_host({"ibstat": corpus("ibv/ibstat-partial-output-then-ibpanic-stat-failed.txt"),
                      "ethtool-i": doca_ethtool()}, profile="hgx-h100")
    f = one(run_check("nic-fw-driver-mismatch", host), "warn")
    assert f.summary.startswith("1 x unknown adapter (mlx5_7): adapter not in the NIC firmware matrix "
                                "(hca_type ..., firmware '...')")


def test_firmware_query_captures():
    # Each corpus query alone: no driver evidence at all, so nothing can be decided.
    for capture, family in [("mlxfw/cx6lx-mlxup-query-format-xml.txt", "ConnectX-6 Lx"),
                            ("mlxfw/cx6lx-flint-query-secure-fw.txt", "ConnectX-6 Lx"),
                            ("mlxfw/cx6lx-mstflint-d-bdf-q.txt", "ConnectX-6 Lx")]:
        f = one(run_check("nic-fw-driver-mismatch", make_host({"mlxfwmanager": corpus(capture)})), "warn")
        assert f"1 x {family}" in f.summary and "no mlx5 driver evidence" in f.summary
        assert probes_of(f)[0] == "mlxfwmanager" and "26.33.1048" in f.evidence[0].excerpt
    # The real mlxup query of two ConnectX-7 on 28.40.1000, on a node running MLNX_OFED 24.10-3.2.5.0.
    host = make_host({"mlxfwmanager": corpus("mlxfw/cx7-mcx755106as-hea-mlxup-query-update-required.txt"),
                      "ofed-info": recorded(MLNX_24_10_3)}, profile="hgx-h100")
    f = one(run_check("nic-fw-driver-mismatch", host), "fail")
    assert f.summary.startswith("2 x ConnectX-7 (/dev/mst/mt4129_pciconf1, /dev/mst/mt4129_pciconf0): firmware "
                                "28.40.1000 is older than the 28.43.36xx")
    cx6lx = make_host({"mlxfwmanager": recorded("mlxup-query-cx6lx-bdf-update-required.txt"),
                       "ofed-info": recorded(MLNX_24_10_3)})
    f = one(run_check("nic-fw-driver-mismatch", cx6lx), "warn")
    assert "1 x ConnectX-6 Lx (0002:01:00.0): MLNX_OFED 24.10-3.2.5.0 LTS lists no ConnectX-6 Lx firmware" in f.summary
    cx5 = make_host({"mlxfwmanager": recorded("mlxfwmanager-cx5-two-devices-no-matching-image.txt")})
    f = one(run_check("nic-fw-driver-mismatch", cx5), "warn")
    assert f.summary.startswith("2 x unknown adapter (/dev/mst/mt4119_pciconf1, /dev/mst/mt4119_pciconf0): adapter "
                                "not in the NIC firmware matrix (type ConnectX5, firmware 16.x)")


CX6DX_PENDING = "mlxfw/cx6dx-mlxfwmanager-fw-running-differs-reset-pending.txt"
CX3PRO_PENDING = "mlxfw/cx3pro-mlxfwmanager-after-flint-burn-fw-running-old.txt"
CX6DX_PLAIN = "mlxfw/cx6dx-mlxfwmanager-fw-22.29.2002-no-running-row.txt"


def test_flashed_but_not_running_firmware_fails_as_reset_pending():
    # NVIDIA's own recording: flashed 22.45.3608, the NIC still runs 22.43.1020.
    host = make_host({"mlxfwmanager": corpus(CX6DX_PENDING), "ofed-info": recorded(MLNX_24_10_3)})
    pending, pair = run_check("nic-fw-driver-mismatch", host)
    assert (pending.status.value, pending.symptoms) == ("fail", ("nic-firmware-reset-pending",))
    assert pending.summary == ("new NIC firmware flashed, reset pending on 1 of 1 NICs: 03:00.0 (ConnectX6DX): "
                               "flashed 22.45.3608, running 22.43.1020")
    assert pending.action.startswith("load the flashed firmware: mlxfwreset -d 03:00.0 reset;")
    assert "FW (Running)   22.43.1020" in pending.evidence[0].excerpt
    # The pair is judged on what runs, and says what waits on the flash.
    assert pair.data["firmware"] == "22.43.1020"
    assert "22.45.3608 is flashed and waits for a reset (nic-firmware-reset-pending)" in pair.summary


def test_reset_pending_after_a_flint_burn_is_seen_whatever_the_adapter():
    found = run_check("nic-fw-driver-mismatch", make_host({"mlxfwmanager": corpus(CX3PRO_PENDING)}))
    assert found[0].status.value == "fail" and "flashed 2.42.5700, running 2.42.5016" in found[0].summary


@pytest.mark.parametrize("capture", [CX6DX_PLAIN, "mlxfw/cx7-mcx755106as-hea-mlxup-query-update-required.txt",
                                     "mlxfw/cx6lx-mlxup-query-format-xml.txt"])
def test_no_running_row_means_no_reset_pending(capture):
    found = run_check("nic-fw-driver-mismatch", make_host({"mlxfwmanager": corpus(capture)}))
    assert all("nic-firmware-reset-pending" not in f.symptoms for f in found)


def test_reset_pending_diagnoses_its_own_cause_and_explain_shows_it():
    found = run_check("nic-fw-driver-mismatch", make_host({"mlxfwmanager": corpus(CX6DX_PENDING)}))
    causes = {d.cause: d for d in diagnose(found, load_knowledge())}
    assert "nic-firmware-reset-pending" in causes
    assert "mlxfwreset" in explain("nic-firmware-reset-pending", load_knowledge())


def test_tool_error_lists_no_nic():
    host = make_host({"mlxfwmanager": corpus("mlxfw/mstflint-q-cannot-open-device-mfe-cr-error-connectx2.txt")})
    assert one(run_check("nic-fw-driver-mismatch", host), "skip").summary.startswith("no ConnectX NIC listed")


def test_missing_evidence_skips_unless_a_tool_failed_where_nics_are_expected():
    # Nothing collected at all: no GPU model either, so the generic profile says nothing about
    # NICs; still a skip, for want of evidence (checks/_nic.py).
    f = one(run_check("nic-fw-driver-mismatch", make_host({})), "skip")
    assert f.summary == "not judged: ibv-devinfo not collected in this bundle"
    f = one(run_check("nic-fw-driver-mismatch", make_host({}, profile="hgx-b300")), "skip")
    assert f.summary == "not judged: ibv-devinfo not collected in this bundle"
    missing = result("ibv-devinfo", "", 127, stderr="sh: 1: ibv_devinfo: not found", command=("ibv_devinfo", "-v"))
    f = one(run_check("nic-fw-driver-mismatch", make_host({"ibv-devinfo": missing}, profile="hgx-b300")), "error")
    assert f.symptoms == ("tool-missing",) and "ibv_devinfo is not installed" in f.summary


def _garbled_ibv_devinfo() -> str:
    # The port block of a real capture with every hca_id header cut away: not ibv_devinfo output.
    text = corpus("ibv/ibv-devinfo-cx7-roce-fw28.39-raw-tabs.txt")
    return text[text.index("\t\tport:"):text.index("hca_id:\tmlx5_1")]


def test_garbled_ibv_devinfo_falls_back_to_ibstat_and_says_so():
    host = make_host({"ibv-devinfo": _garbled_ibv_devinfo(), "ibstat": corpus("ibv/ibstat-cx7-ndr-400g-active-ib.txt")},
                     profile="hgx-h100")
    found = excerpt_of_hgx(run_check("ib-port-down", host))
    assert [f.status.value for f in found] == ["warn"]
    assert "ibv-devinfo: unreadable output (ibv_devinfo: no 'hca_id:' line); read ibstat instead" in found[0].summary
    f = one(run_check("nic-fw-driver-mismatch", host), "warn")
    assert f.data["source"] == "ibstat"


def test_garbled_ibv_devinfo_alone_is_an_error():
    f = one(run_check("nic-fw-driver-mismatch", make_host({"ibv-devinfo": _garbled_ibv_devinfo()}, profile="hgx-h100")),
            "error")
    assert f.symptoms == ("probe-unreadable",) and probes_of(f) == ["ibv-devinfo"]
    assert "unreadable output" in f.summary


def test_broken_policy_file_is_an_error_not_a_crash(tmp_path):
    from preflight.knowledge.profiles import Profile

    (tmp_path / "policy.yaml").write_text("pins: [\n")
    host = b300()
    host.profile = Profile("site", "site", {"nic": {"policy_file": "policy.yaml"}}, str(tmp_path / "site.yaml"))
    f = one(run_check("nic-fw-driver-mismatch", host), "error")
    assert "NIC firmware policy of profile site" in f.summary and "invalid YAML" in f.summary


def test_site_pin_from_the_profile_policy_file(tmp_path):
    from preflight.knowledge.profiles import Profile

    (tmp_path / "policy.yaml").write_text('pins:\n  - {family: ConnectX-8, version: "40.47.1026"}\n')
    host = b300()
    host.profile = Profile("site", "site", {"nic": {"family": "ConnectX-8", "policy_file": "policy.yaml"}},
                           str(tmp_path / "site.yaml"))
    f = one(run_check("nic-fw-driver-mismatch", host), "fail")
    assert "firmware 40.46.1006 is not the site's pinned 40.47.1026" in f.summary
    assert f.action.startswith("flash ConnectX-8 firmware 40.47.1026 with mlxfwmanager -u")


# --- nic-fw-inconsistent / nic-fw-fleet-consistency --------------------------------------------

def test_one_nic_on_another_firmware_within_a_node():
    f = one(run_check("nic-fw-inconsistent", b300(odd={3: "40.44.1036"})), "fail")
    assert f.summary.startswith("ConnectX-8 NICs on 2 firmware versions: 7 on 40.46.1006 (mlx5_0, mlx5_1, mlx5_2, "
                                "mlx5_4, mlx5_5, mlx5_6, mlx5_7), 1 on 40.44.1036 (mlx5_3) (from ibstat)")
    assert f.symptoms == ("nic-fw-inconsistent",)
    assert f.action.startswith("flash mlx5_3 (ConnectX-8) to 40.46.1006 (what DOCA 3.1.0 ships)")
    assert "Firmware version: 40.44.1036" in f.evidence[1].excerpt


@pytest.mark.parametrize("probe, capture, summary", [
    ("ibstat", "corpus/ibv/ibstat-cx7-roce-200g-plus-cx6dx-disabled.txt",
     "2 x ConnectX-7 on 28.39.1002; 1 x ConnectX-6 Dx on 22.31.1014 (from ibstat)"),
    ("ibstat", "corpus/ibv/ibstat-cx6-hdr-one-port-disabled-plus-cx4lx.txt",
     "2 x ConnectX-6 on 20.33.1048; 1 x MT4117 on 14.32.1010 (from ibstat)"),
    ("mlxfwmanager", "corpus/mlxfw/cx7-mcx755106as-hea-mlxup-query-update-required.txt",
     "2 x ConnectX-7 on 28.40.1000 (from mlxfwmanager)"),
])
def test_different_models_are_not_compared(probe, capture, summary):
    f = one(run_check("nic-fw-inconsistent", make_host({probe: fixture(capture)})), "pass")
    assert f.summary == f"one firmware per model: {summary}" and probes_of(f) == [probe]


def test_consistency_compares_the_running_firmware():
    # One node runs 22.43.1020 (22.45.3608 flashed), another 22.29.2002: they differ as run.
    pending = make_host({"mlxfwmanager": corpus(CX6DX_PENDING)}, name="a")
    plain = make_host({"mlxfwmanager": corpus(CX6DX_PLAIN)}, name="b")
    f = one(run_check("nic-fw-inconsistent", pending), "pass")
    assert f.summary == "one firmware per model: 1 x ConnectX-6 Dx on 22.43.1020 (from mlxfwmanager)"
    found = run_fleet_check("nic-fw-fleet-consistency", [pending, plain])
    assert found[0].summary.startswith("ConnectX-6 Dx on 22.43.1020, no version has a majority")


def test_inconsistency_check_skips_without_nics():
    assert one(run_check("nic-fw-inconsistent", make_host({})), "skip")
    assert one(run_check("nic-fw-inconsistent", make_host({}, profile="hgx-b300")), "skip").summary.startswith(
        "not judged")


def test_fleet_names_the_host_on_another_firmware():
    hosts = [b300(name=f"gpu0{i}") for i in range(1, 4)] + [b300("40.47.1026", name="gpu04")]
    found = {f.host: f for f in run_fleet_check("nic-fw-fleet-consistency", hosts)}
    assert {h: f.status.value for h, f in found.items()} == {"gpu01": "pass", "gpu02": "pass", "gpu03": "pass",
                                                             "gpu04": "fail"}
    odd = found["gpu04"]
    assert odd.summary == ("ConnectX-8 on 40.47.1026, the fleet runs 40.46.1006 "
                           "[ConnectX-8: 3 hosts on 40.46.1006, 1 on 40.47.1026 (gpu04)]")
    assert odd.symptoms == ("nic-fw-inconsistent",) and probes_of(odd) == ["ibstat"]
    assert odd.action.startswith("bring gpu04's ConnectX-8 NICs to 40.46.1006 as on the other hosts")


def test_fleet_without_a_majority_names_every_host_and_one_host_is_no_fleet():
    found = run_fleet_check("nic-fw-fleet-consistency", [b300(name="a"), b300("40.47.1026", name="b")])
    assert [f.status.value for f in found] == ["fail", "fail"]
    assert found[0].summary == ("ConnectX-8 on 40.46.1006, no version has a majority "
                                "[ConnectX-8: 1 host on 40.46.1006 (a), 1 on 40.47.1026 (b)]")
    assert run_fleet_check("nic-fw-fleet-consistency", [b300(name="a"), make_host({}, name="b")]) == []


# --- ib-port-down / ib-link-degraded -------------------------------------------------------------

def test_healthy_cx8_node_ports_and_rate():
    host = b300()
    f = one(run_check("ib-port-down", host), "pass")
    assert f.summary == "8 port(s) on 8 device(s) ACTIVE/LinkUp (from ibstat)"
    f = one(run_check("ib-link-degraded", host), "pass")
    assert f.summary == "8 port(s) at >= 800 Gb/s (from ibstat)" and probes_of(f) == ["ibstat"]


def test_polling_port_fails():
    f = one(run_check("ib-port-down", b300(polling=(5,))), "fail")
    assert f.summary == ("1 ConnectX-8 port(s) down: mlx5_5 port 1 DOWN/Polling: no link partner (cable, transceiver "
                         "or switch port), InfiniBand (from ibstat)")
    assert f.symptoms == ("ib-port-down",)
    assert f.evidence[0].probe == "ibstat" and "Physical state: Polling" in f.evidence[0].excerpt
    assert f.evidence[0].excerpt.startswith("CA 'mlx5_5'")


def test_ib_port_down_without_lid_on_real_ibv_devinfo():
    host = make_host({"ibv-devinfo": corpus("ibv/ibv-devinfo-cx7-ndr-port-down-lid65535.txt")}, profile="hgx-h100")
    found = by_status(run_check("ib-port-down", host))
    assert found["fail"].summary == ("1 ConnectX-7 port(s) down: mlx5_0 port 1 DOWN with lid 65535: no subnet manager "
                                     "has assigned a LID, InfiniBand (from ibv-devinfo)")
    assert found["fail"].evidence[0].excerpt == (
        "hca_id: mlx5_0\nstate:                  PORT_DOWN (1)\nsm_lid:                 0\n"
        "port_lid:               65535\nlink_layer:             InfiniBand")
    # The capture ends inside mlx5_1: that port was not seen, which is said, not passed.
    assert "mlx5_1: no port listed" in found["warn"].summary and found["warn"].symptoms == ("probe-unreadable",)


def test_vf_linkup_but_down_means_no_subnet_manager():
    host = make_host({"ibstat": corpus("ibv/ibstat-cx6-mt4124-vf-in-pod-down-linkup-lid65535.txt")})
    f = one(run_check("ib-port-down", host), "warn")
    assert f.summary == ("1 port(s) down (the profile names no fabric NIC): mlx5_7 port 1 DOWN/LinkUp with lid 65535: "
                         "no subnet manager has configured it, InfiniBand (from ibstat)")


@pytest.mark.parametrize("capture, down", [
    ("ibstat-cx6-hdr-one-port-disabled-plus-cx4lx.txt", "mlx5_1 port 1 DOWN/Disabled"),
    ("ibstat-cx7-roce-200g-plus-cx6dx-disabled.txt", "mlx5_10 port 1 DOWN/Disabled"),
])
def test_disabled_port_of_another_adapter_warns(capture, down):
    f = one(excerpt_of_hgx(run_check("ib-port-down", make_host({"ibstat": corpus(f"ibv/{capture}")},
                                                                profile="hgx-h100"))), "warn")
    assert f.summary.startswith(f"1 port(s) down (not the platform's ConnectX-7): {down}: port switched off")


def test_tab_indented_ibstat_cut_after_physical_state():
    f = one(run_check("ib-port-down", make_host({"ibstat": corpus("ibv/ibstat-cx6dx-mt4125-down-disabled-tabs.txt")})),
            "warn")
    assert "mlx5_8 port 1 DOWN/Disabled" in f.summary and "Physical state: Disabled" in f.evidence[0].excerpt


def test_ibpanic_mid_output_warns_that_devices_were_not_seen():
    f = one(run_check("ib-port-down", make_host({"ibstat": corpus("ibv/ibstat-partial-output-then-ibpanic-stat-failed.txt")})),
            "warn")
    assert "ibstat stopped or warned: ibpanic" in f.summary and "stat of IB device 'mlx5_8' failed" in f.summary
    assert f.evidence[0].probe == "ibstat" and "ibpanic" in f.evidence[0].excerpt


def test_roce_ports_at_200_below_the_400_of_hgx_h100():
    host = make_host({"ibstat": corpus("ibv/ibstat-cx7-roce-200g-plus-cx6dx-disabled.txt")}, profile="hgx-h100")
    f = one(run_check("ib-link-degraded", host), "fail")
    assert f.summary == ("2 ConnectX-7 port(s) below 400 Gb/s: mlx5_0 port 1 at 200 Gb/s (Ethernet); "
                         "mlx5_1 port 1 at 200 Gb/s (Ethernet) (from ibstat)")
    assert f.symptoms == ("ib-link-degraded",) and "Rate: 200" in f.evidence[0].excerpt


def test_ndr_400_passes_and_a_cut_port_is_not_passed():
    host = make_host({"ibstat": corpus("ibv/ibstat-cx7-ndr-400g-active-ib.txt")}, profile="hgx-h100")
    # Both ports are up, but two NICs are not the HGX board's eight: no pass.
    assert excerpt_of_hgx(run_check("ib-port-down", host)) == []
    f = one(run_check("ib-link-degraded", host), "warn")
    assert f.summary.startswith("rate not reported for mlx5_1 port 1 (from ibstat")


def test_ibv_devinfo_verbose_port_at_2x_is_degraded():
    # ibv_devinfo -v port lines (recorded, DGX Spark: 2X at 100 Gbps NDR) spliced into the real port
    # block of a corpus file after its link_layer line, where -v prints them.
    verbose = "".join(f"\t\t\t{line}\n" for line in recorded("ibv-devinfo-v-port-lines-cx7-dgx-spark.txt").splitlines()
                      if not line.startswith("state:"))
    text = corpus("ibv/ibv-devinfo-cx7-roce-fw28.42-h100.txt").replace("Ethernet\n", "Ethernet\n" + verbose, 1)
    f = one(run_check("ib-link-degraded", make_host({"ibv-devinfo": text}, profile="hgx-h100")), "fail")
    assert f.summary == "1 ConnectX-7 port(s) below 400 Gb/s: mlx5_2 port 1 at 200 Gb/s (2X NDR Ethernet) (from ibv-devinfo)"
    assert "active_width:\t\t2X (16)" in f.evidence[0].excerpt


def test_other_adapters_are_not_rate_judged_and_generic_is_skipped():
    # ConnectX-6 ports at 200 are another adapter's, not judged on an H100; the ConnectX-4 Lx
    # (MT4117, unknown to the matrix) is active with its rate cut off by the capture: said, not passed.
    host = make_host({"ibstat": corpus("ibv/ibstat-cx6-hdr-one-port-disabled-plus-cx4lx.txt")}, profile="hgx-h100")
    f = one(run_check("ib-link-degraded", host), "warn")
    assert f.summary.startswith("rate not reported for mlx5_2 port 1 (from ibstat")
    only_cx6 = corpus("ibv/ibstat-cx6-hdr-one-port-disabled-plus-cx4lx.txt").split("CA 'mlx5_2'")[0]
    host = make_host({"ibstat": only_cx6}, profile="hgx-h100")
    assert one(run_check("ib-link-degraded", host), "skip").summary.startswith("no active ConnectX-7 port to judge")
    generic = make_host({"ibstat": corpus("ibv/ibstat-cx6-hdr-one-port-disabled-plus-cx4lx.txt")})
    assert one(run_check("ib-link-degraded", generic), "skip").summary.startswith("no NIC rate expected")


def _sysfs_from_ibstatus(text: str) -> str:
    # ibstatus prints the sysfs port files of each port; the ib-sysfs probe greps the same files
    # (`path:value`), so its lines are rebuilt here from the real capture's values.
    lines, where = [], None
    for line in text.splitlines():
        head = re.match(r"Infiniband device '(\S+)' port (\d+) status:", line)
        if head:
            where = f"/sys/class/infiniband/{head.group(1)}/ports/{head.group(2)}"
            continue
        kv = re.match(r"\s+(state|phys state|rate|link_layer):\s+(.*)", line)
        if kv and where:
            lines.append(f"{where}/{kv.group(1).replace(' ', '_')}:{kv.group(2)}")
    return "\n".join(lines) + "\n"


def test_ibstatus_and_sysfs_sources():
    text = corpus("ibv/ibstatus-cx-roce-100g-edr-label-ethernet.txt")
    f = one(run_check("ib-port-down", make_host({"ibstat": text})), "pass")
    assert f.summary == "2 port(s) on 2 device(s) ACTIVE/LinkUp (from ibstat)"
    sysfs = make_host({"ib-sysfs": _sysfs_from_ibstatus(text)})
    assert one(run_check("ib-port-down", sysfs), "pass").summary == "2 port(s) on 2 device(s) ACTIVE/LinkUp (from ib-sysfs)"
    assert sysfs.device_excerpt("ib-sysfs", "mlx5_1", "state").excerpt == (
        "/sys/class/infiniband/mlx5_1/ports/1/state:4: ACTIVE\n/sys/class/infiniband/mlx5_1/ports/1/phys_state:5: LinkUp")


def test_no_rdma_device_where_the_platform_has_nics():
    # What ibv_devinfo does on a node without devices (rdma-core libibverbs/examples/devinfo.c):
    # "No IB devices found" on stderr, exit status 255.
    none = result("ibv-devinfo", "", 255, stderr="No IB devices found\n", command=("ibv_devinfo", "-v"))
    f = one(run_check("ib-port-down", make_host({"ibv-devinfo": none}, profile="hgx-b300")), "fail")
    assert f.summary == ("no RDMA device on a NVIDIA HGX B300 8-GPU node, which has ConnectX-8 "
                         "(ibv_devinfo: No IB devices found)")
    assert f.symptoms == ("nic-missing",) and "lspci -d 15b3:" in f.action
    assert one(run_check("ib-link-degraded", make_host({"ibv-devinfo": none}, profile="hgx-b300")), "skip")
    assert one(run_check("ib-port-down", make_host({"ibv-devinfo": none})), "skip").summary.startswith("no RDMA device")
    assert one(run_check("ib-port-down", make_host({})), "skip")
    assert one(run_check("ib-port-down", make_host({}, profile="hgx-h100")), "skip").summary.startswith("not judged")


# --- mlx5-kernel-log -------------------------------------------------------------------------

def test_health_compromised_and_irisc_not_responding():
    host = make_host({"kernel-log": corpus("kernel-log/mlx5-health-compromised-irisc-not-responding-cx6-fw20.txt")})
    f = one(run_check("mlx5-kernel-log", host), "fail")
    assert f.symptoms == ("mlx5-fw-syndrome", "mlx5-health-compromised")
    assert f.summary == ("NIC firmware stopped answering the driver: 0000:5e:00.0: health compromised (firmware "
                         "stopped its health counter); 0000:5e:00.0: health syndrome 0x7: irisc not responding "
                         "(2 log lines) [0000:5e:00.0 fw 20.26.4012]")
    assert f.evidence[0].probe == "kernel-log" and "reached miss count" in f.evidence[0].excerpt


def test_command_timeouts_take_the_firmware_verdicts_action():
    f = one(run_check("mlx5-kernel-log", make_host({"kernel-log": MLX5_CMD_TIMEOUT_DMESG})), "fail")
    assert f.summary.startswith("NIC firmware stopped answering the driver: 0000:56:00.0: command ACCESS_REG(0x805) "
                                "timed out (2 log lines)")
    assert f.action.startswith("compare the firmware with the driver")
    older = b300("40.44.1036", **{"kernel-log": MLX5_CMD_TIMEOUT_DMESG})
    f = one(run_check("mlx5-kernel-log", older), "fail")
    assert f.action.startswith("update NIC firmware to 40.46.1006 with mlxfwmanager -u")


def test_probe_failure():
    host = make_host({"kernel-log": corpus("kernel-log/mlx5-cx4lx-handle-hca-cap-failed-probe-error-22.txt")})
    f = one(run_check("mlx5-kernel-log", host), "fail")
    assert f.symptoms == ("nic-probe-failed",)
    assert f.summary == ("mlx5 could not bring a NIC up: 0000:03:00.0: probe failed: mlx5_core 0000:03:00.0: "
                         "handle_hca_cap failed; 0000:03:00.0: probe failed (error -22) (3 log lines)")


def test_module_symbol_mismatch():
    text = corpus("kernel-log/mlx5-vdpa-disagrees-about-version-of-symbol-ofed-inbox-mismatch.txt")
    f = one(run_check("mlx5-kernel-log", make_host({"kernel-log": text})), "warn")
    assert f.symptoms == ("rdma-module-mismatch",) and "mlx5_vdpa refused: symbol mlx5_db_free" in f.summary
    # The same lines with mlx5_ib, a module on the RDMA path, as the one refused: a failure.
    f = one(run_check("mlx5-kernel-log", make_host({"kernel-log": text.replace("mlx5_vdpa", "mlx5_ib")})), "fail")
    assert "mlx5_ib refused" in f.summary


def test_nic_pcie_link_below_capability():
    f = one(run_check("mlx5-kernel-log", make_host({"kernel-log": nic_pcie_limited_dmesg()})), "fail")
    assert f.symptoms == ("pcie-link-degraded",)
    assert f.summary == ("NIC PCIe link below its capability: 0000:04:00.0: 126.024 Gb/s available, limited by 16 GT/s "
                         "x8 at 0000:01:00.0 (capable of 504.112 Gb/s at 32 GT/s x16) (1 log line)")


def test_gpu_pcie_lines_are_left_to_the_gpu_check_unless_the_address_is_a_nic():
    text = corpus("kernel-log/h100-dmesg-pcie-bandwidth-limited-by-gen4-switch.txt")
    f = one(run_check("mlx5-kernel-log", make_host({"kernel-log": text})), "pass")
    assert f.summary.startswith("no mlx5 firmware, probe, module or NIC PCIe trouble in 3 log lines")
    assert "elided part" in f.summary
    # The same log on a node whose mlx5 netdev sits at 0000:8b:00.0 (the real ethtool -i with its
    # bus-info changed): that line is a NIC's.
    nic = recorded("ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt").replace("0000:e6:00.0", "0000:8b:00.0")
    f = one(run_check("mlx5-kernel-log", make_host({"kernel-log": text, "ethtool-i": nic})), "fail")
    assert "0000:8b:00.0: 252.048 Gb/s available" in f.summary and "0000:04:00.0" not in f.summary


def mlx5_log(name):
    return run_check("mlx5-kernel-log", make_host({"kernel-log": corpus(f"kernel-log/{name}")}))


@pytest.mark.parametrize("name, device, watts", [
    ("mlx5-pcie-event-insufficient-power-27w-dmesg-T.txt", "0000:5c:00.0", "27W"),
    ("mlx5-cx6-ocp3-x4-slot-insufficient-power-25w.txt", "0000:04:00.0", "25W"),
])
def test_insufficient_slot_power_warns(name, device, watts):
    found = {tuple(f.symptoms): f for f in mlx5_log(name)}
    f = found[("nic-power-insufficient",)]
    assert f.status.value == "warn"
    assert f.summary.startswith(f"PCIe slot power below what the NIC needs: {device}: the PCIe slot advertises {watts}")
    assert "Detected insufficient power on the PCIe slot" in f.evidence[0].excerpt
    assert "SlotPowerLimit" in f.action


@pytest.mark.parametrize("name", ["mlx5-cx6-ocp3-x16-slot-sufficient-power-75w.txt",
                                  "mlx5-slot-power-capability-not-advertised.txt"])
def test_info_level_slot_power_lines_are_not_flagged(name):
    # The same card in a full-power slot (its x16 link still trains at 8 GT/s, which is flagged
    # as PCIe), and a node whose slots do not advertise their power at all.
    found = mlx5_log(name)
    assert all(f.symptoms != ("nic-power-insufficient",) for f in found)
    assert all("nic-module-error" not in f.symptoms for f in found)
    if name.startswith("mlx5-slot"):
        assert one(found, "pass")


def test_port_module_high_temperature_fails_with_an_airflow_action():
    f = one(mlx5_log("mlx5-port-module-error-high-temperature.txt"), "fail")
    assert f.symptoms == ("nic-module-error",)
    assert f.summary == "NIC port module errors: a NIC the line does not name: port module 0: High Temperature (1 log line)"
    assert f.action.startswith("the module or cable in the named cage is overheating")
    assert f.data["modules"] == [0]


def test_slot_power_and_module_causes_are_explained():
    kb = load_knowledge()
    for cause in ("nic-power-insufficient", "nic-module-error"):
        assert cause in kb.causes and explain(cause, kb)
    [d] = diagnose(mlx5_log("mlx5-port-module-error-high-temperature.txt"), kb)
    assert d.cause == "nic-module-error"


def test_clean_log_passes_and_a_missing_log_is_an_error():
    f = one(run_check("mlx5-kernel-log", make_host({"kernel-log": corpus("kernel-log/a100-xid63-row-remapper-pending.txt")})),
            "pass")
    assert f.summary.startswith("no mlx5 firmware, probe, module or NIC PCIe trouble")
    assert one(run_check("mlx5-kernel-log", make_host({})), "skip").summary == \
        "not judged: kernel-log not collected in this bundle"
    dmesg_denied = result("kernel-log", "", 126, stderr="neither dmesg nor journalctl -k is readable",
                          command=("sh", "-c", "dmesg"))
    f = one(run_check("mlx5-kernel-log", make_host({"kernel-log": dmesg_denied})), "error")
    assert f.symptoms == ("tool-missing",)


# --- a fleet end to end --------------------------------------------------------------------

MINE = "nic-fw-driver-mismatch,nic-fw-inconsistent,nic-fw-fleet-consistency,ib-port-down,ib-link-degraded,mlx5-kernel-log"


def _write_bundle(root: Path, hosts: dict[str, dict[str, str]]) -> Path:
    (root / "hosts").mkdir(parents=True)
    (root / "bundle.json").write_text(json.dumps({"format": FORMAT, "created": "2026-11-29T10:00:00+00:00",
                                                  "hosts": list(hosts)}))
    for host, probes in hosts.items():
        (root / "hosts" / host).mkdir()
        for probe, text in probes.items():
            (root / "hosts" / host / f"{probe}.txt").write_text(text)
    return root


def _node(fw="40.46.1006", ofed="25.07-0.9.7", polling=(), log=None):
    clean = corpus("kernel-log/h100-dmesg-pcie-bandwidth-limited-by-gen4-switch.txt")  # GPU lines only
    return {"ibstat": cx8_ibstat(8, fw, None, polling), "ethtool-i": doca_ethtool(fw, ofed),
            "ofed-info": doca_ofed_info(ofed), "kernel-log": log or clean}


def test_fleet_end_to_end_names_exactly_the_faults(tmp_path):
    bundle = _write_bundle(tmp_path / "bundle", {
        "gpu01": _node(), "gpu02": _node(),
        "gpu03": _node("40.44.1036", log=MLX5_CMD_TIMEOUT_DMESG),     # older than DOCA 3.1 ships, and timeouts
        "gpu04": _node(polling=(2,)),                                   # one port Polling
        "gpu05": _node("40.47.1026", ofed="25.10-1.2.8"),               # DOCA 3.2's pair, unlike the fleet
    })
    # What `preflight analyze BUNDLE --profile hgx-b300 --checks ...` does, short of the terminal.
    checks = select(load_checks(use_entry_points=False), MINE.split(","))
    analysis = analyze(read_bundle(bundle), checks, load_profiles(), load_knowledge(), "hgx-b300")
    assert analysis.failed
    report = json.loads(json_report.render(analysis))
    bad = sorted((f["host"], f["check"], f["status"]) for f in report["findings"]
                 if f["status"] not in ("pass", "skip") and f["check"] in MINE.split(","))
    assert bad == [("gpu03", "mlx5-kernel-log", "fail"), ("gpu03", "nic-fw-driver-mismatch", "fail"),
                   ("gpu03", "nic-fw-fleet-consistency", "fail"), ("gpu04", "ib-port-down", "fail"),
                   ("gpu05", "nic-fw-fleet-consistency", "fail")]
    assert {h: v["status"] for h, v in report["hosts"].items()} == {
        "gpu01": "pass", "gpu02": "pass", "gpu03": "fail", "gpu04": "fail", "gpu05": "fail"}
    for f in report["findings"]:
        if f["status"] == "fail":
            assert f["evidence"] and all(e["probe"] and e["excerpt"] for e in f["evidence"]), f
    diagnoses = {(d["cause"], tuple(d["hosts"])): d for d in report["diagnoses"]}
    mismatch = diagnoses[("nic-fw-driver-mismatch", ("gpu03",))]
    assert mismatch["confidence"] == "high" and set(mismatch["symptoms"]) == {
        "nic-fw-driver-mismatch", "mlx5-cmd-timeout", "nic-fw-inconsistent"}
    assert mismatch["action"] == ("update NIC firmware to 40.46.1006 with mlxfwmanager -u (or the OEM package), "
                                  "reboot, re-run nccl all_reduce")
    assert ("nic-fw-unresponsive", ("gpu03",)) not in diagnoses  # explained by the mismatch
    assert diagnoses[("ib-port-down", ("gpu04",))]["confidence"] == "high"
    # Each odd host gets its own action: bring it to the fleet's 40.46.1006.
    assert diagnoses[("nic-fw-inconsistent", ("gpu05",))]["action"].startswith(
        "bring gpu05's ConnectX-8 NICs to 40.46.1006 as on the other hosts")
    # gpu03's firmware differs from the fleet's because it is older than its driver expects:
    # one root cause, so the inconsistency is explained by the mismatch, not reported again.
    assert ("nic-fw-inconsistent", ("gpu03",)) not in diagnoses
    assert {cause for cause, _ in diagnoses} == {"nic-fw-driver-mismatch", "nic-fw-inconsistent", "ib-port-down"}


def _ibpanic_as_recorded():
    # The real ibpanic capture (corpus MANIFEST: leptonai/gpud#752) as a node records it: the CA
    # listing on stdout, ibpanic's line on stderr (ibpanic writes there) and exit code 255.
    text = corpus("ibv/ibstat-partial-output-then-ibpanic-stat-failed.txt")
    cut = text.index("ibpanic:")
    return result("ibstat", text[:cut], exit_code=255, stderr=text[cut:], command=("ibstat",))


def test_ibstat_that_fails_part_way_keeps_the_ports_it_listed_and_says_it_failed():
    host = make_host({"ibstat": _ibpanic_as_recorded()})
    assert [d.name for d in host.ib.devices] == ["mlx5_7"] and host.ib.devices[0].ports[0].state == "ACTIVE"
    f = one(run_check("ib-port-down", host), "warn")
    assert "ibstat exited with code 255 after listing mlx5_7" in f.summary
    assert "stat of IB device 'mlx5_8' failed" in f.summary and "probe-truncated" in f.symptoms
    # A check that judged the listed NIC passes nothing about the ones never listed.
    f = one(run_check("nic-fw-inconsistent", host), "error")
    assert f.summary.startswith("judged only what the output showed before it broke off")


def test_ibstat_that_fails_before_any_device_is_still_a_failed_probe():
    failed = result("ibstat", "", exit_code=255, stderr="ibpanic: [1] main: stat of IB device 'mlx5_0' failed",
                    command=("ibstat",))
    f = one(run_check("ib-port-down", make_host({"ibstat": failed})), "error")
    assert f.symptoms == ("probe-failed",) and "exit code 255" in f.summary
