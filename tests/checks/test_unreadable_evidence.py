"""Evidence that cannot be read is ERROR "unreadable", never a PASS and never a hardware FAIL.

Inputs are the outputs of examples/h200-fleet's gpu001 (real captures or documented edits of
them, examples/h200-fleet/SOURCES.tsv), damaged as a corrupt bundle would be: random bytes or
another tool's output as the kernel log, the all_reduce output with its result rows removed,
the nvidia-smi XML cut mid-file (a truncation of the capture, made here).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from ctx import make_host, result, run_check

from preflight.model import Status

NODE = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet" / "hosts" / "gpu001"
ETHTOOL = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "ethtool-i-mlx5-cx5-inbox-kernel-release-truncated.txt"


def _out(probe: str) -> str:
    return (NODE / f"{probe}.txt").read_text()


def _node(**replaced: str | bytes) -> dict:
    probes = {p: _out(p) for p in ("nvidia-smi-q-x", "nvidia-smi-q", "lspci", "kernel-log", "ibstat", "ibv-devinfo",
                                   "ib-sysfs", "mlx5-modinfo", "ofed-info", "nccl-all-reduce", "ethtool-i")}
    probes.update({k.replace("_", "-"): v for k, v in replaced.items()})
    return probes


def _status(check: str, probes: dict) -> tuple[Status, str]:
    [f] = run_check(check, make_host(probes, "hgx-h200"))
    return f.status, f.summary


def test_the_real_node_passes_these_checks_to_begin_with():
    for check in ("xid", "pcie-link", "pcie-errors", "nccl-all-reduce", "gpu-inventory"):
        assert _status(check, _node())[0] is Status.PASS, check


def test_random_bytes_as_the_kernel_log_are_unreadable_not_healthy():
    noise = random.Random(18).randbytes(4096)
    for check in ("xid", "mlx5-kernel-log", "pcie-link", "pcie-errors"):
        status, summary = _status(check, _node(kernel_log=noise))
        assert status is Status.ERROR, (check, summary)
        assert "not a kernel log" in summary, check


def test_another_tools_output_as_the_kernel_log_is_unreadable():
    status, summary = _status("xid", _node(kernel_log=ETHTOOL.read_text()))
    assert status is Status.ERROR and "kernel-log: unreadable output (not a kernel log" in summary


def test_all_reduce_output_with_headers_but_no_result_rows_is_unreadable():
    rows = re.compile(r"^\s+\d+\s+\d+\s+\w+\s+\w+")
    text = "\n".join(line for line in _out("nccl-all-reduce").split("\n") if not rows.match(line))
    assert "Avg bus bandwidth" in text
    [f] = run_check("nccl-all-reduce", make_host(_node(nccl_all_reduce=text), "hgx-h200"))
    assert f.status is Status.ERROR and "probe-unreadable" in f.symptoms
    assert f.summary.startswith("unreadable output: 3 of 3 repetitions")
    assert not {"nccl-hang", "nccl-failed"} & set(f.symptoms)


def _cut_xml() -> str:
    xml = _out("nvidia-smi-q-x")
    second_gpu = xml.find("<gpu id", xml.find("<gpu id") + 1)
    return xml[: second_gpu + 500]


def test_an_xml_cut_mid_file_with_no_other_count_is_an_error_not_missing_gpus():
    probes = _node(nvidia_smi_q_x=_cut_xml())
    del probes["nvidia-smi-q"]
    [f] = run_check("gpu-inventory", make_host(probes, "hgx-h200"))
    assert f.status is Status.ERROR and "gpu-missing" not in f.symptoms and "probe-truncated" in f.symptoms
    assert "1 GPU section(s) read whole; GPU 00000000:2A:00.0 only in part" in f.summary
    assert "6 of the 8 GPUs its header counts never shown" in f.summary


def test_an_xml_cut_mid_file_falls_back_to_the_text_report_and_says_so():
    [f] = run_check("gpu-inventory", make_host(_node(nvidia_smi_q_x=_cut_xml()), "hgx-h200"))
    assert f.status is Status.WARN and f.summary.startswith("8 x NVIDIA H200")
    assert "probe-truncated" in f.symptoms and "read nvidia-smi -q instead" in f.summary


def _cuts() -> dict[str, str]:
    # gpu001's 8-GPU XML (tests/derived.py from the real H200 capture) cut where a dying
    # nvidia-smi or a cut capture leaves it: after GPU 2 of 8, inside GPU 0, before any <gpu>.
    xml = _out("nvidia-smi-q-x")
    starts = [m.start() for m in re.finditer("<gpu id=", xml)]
    return {"after GPU 2 of 8": xml[:starts[2]], "inside GPU 0": xml[:xml.index("</product_name>") + 40],
            "before the first GPU": xml[:starts[0]]}


CUT_NEVER_SHOWN = {"after GPU 2 of 8": "6 of the 8", "inside GPU 0": "7 of the 8", "before the first GPU": "8 of the 8"}


@pytest.mark.parametrize("where", sorted(CUT_NEVER_SHOWN))
def test_a_cut_xml_never_passes_the_gpus_it_did_not_show(where):
    # Other probes (nvlink --status, topo -m, lspci) count 8: no gpu-missing, no PASS either.
    probes = {**_node(nvidia_smi_q_x=_cuts()[where]), **{p: _out(p) for p in ("nvidia-smi-nvlink-status",
                                                                            "nvidia-smi-topo")}}
    del probes["nvidia-smi-q"]
    host = make_host(probes, "hgx-h200")
    [inventory] = run_check("gpu-inventory", host)
    assert inventory.status is Status.ERROR and inventory.symptoms == ("probe-truncated",)
    assert f"{CUT_NEVER_SHOWN[where]} GPUs its header counts never shown" in inventory.summary
    assert "8 x NVIDIA H200 (counted by nvidia-smi nvlink --status" in inventory.summary
    for check in ("gpu-memory", "gpu-reset", "persistence-mode", "clock-events", "pcie-link"):
        for f in run_check(check, host):
            assert f.status is not Status.PASS and f.status is not Status.SKIP, (check, f.summary)
            assert "probe-truncated" in f.symptoms, check


def test_a_header_with_no_gpu_is_not_gpu_missing_when_other_probes_show_them():
    xml = _out("nvidia-smi-q-x")
    probes = {"nvidia-smi-q-x": xml[:xml.index("<attached_gpus>")], "lspci": _out("lspci"),
              "nvidia-smi-nvlink-status": _out("nvidia-smi-nvlink-status")}
    [f] = run_check("gpu-inventory", make_host(probes, "hgx-h200"))
    assert f.status is Status.ERROR and "gpu-missing" not in f.symptoms
    assert "attached_gpus) never came" in f.summary


def test_a_cut_xml_still_fails_on_what_it_did_show():
    # GPU 0 of the cut output has a pending row remap: that FAIL stands, with the cut named.
    from derived import with_gpu_values

    xml = with_gpu_values(_out("nvidia-smi-q-x"), 0, {"remapped_row_pending": "Yes"})
    cut = xml[:[m.start() for m in re.finditer("<gpu id=", xml)][2]]
    [f] = run_check("gpu-memory", make_host({"nvidia-smi-q-x": cut}, "hgx-h200"))
    assert f.status is Status.FAIL and "probe-truncated" in f.symptoms and "6 of the 8" in f.summary


def test_missing_gpu_evidence_does_not_turn_garbled_nic_evidence_into_a_skip():
    # nvidia-smi hung: no GPU model, so the generic profile; the RDMA tools printed garbage.
    hung = result("nvidia-smi-q-x", b"", exit_code=124, timed_out=True, command=("nvidia-smi", "-q", "-x"))
    garbage = "\x00\x17 not an ibstat at all \x01\n"
    probes = {"nvidia-smi-q-x": hung, "ibstat": garbage, "ibv-devinfo": garbage, "ib-sysfs": garbage}
    [f] = run_check("ib-port-down", make_host(probes, "generic"))
    assert f.status is Status.ERROR and "unreadable output" in f.summary
    # The rate has nothing to be compared with on the generic profile: that skip is honest.
    [f] = run_check("ib-link-degraded", make_host(probes, "generic"))
    assert f.status is Status.SKIP and f.summary.startswith("no NIC rate expected")


def test_nor_into_a_skip_of_the_nic_firmware_checks():
    hung = result("nvidia-smi-q-x", b"", exit_code=124, timed_out=True, command=("nvidia-smi", "-q", "-x"))
    garbage = "\x00\x17 not an ibstat at all \x01\n"
    probes = {"nvidia-smi-q-x": hung, "ibstat": garbage, "ibv-devinfo": garbage, "ib-sysfs": garbage}
    for check in ("nic-fw-driver-mismatch", "nic-fw-inconsistent"):
        [f] = run_check(check, make_host(probes, "generic"))
        assert f.status is Status.ERROR, (check, f.summary)


def test_a_node_without_nics_on_the_generic_profile_still_skips():
    # GPUs read (one H200: generic), and no RDMA tool installed: nothing is wrong.
    one_gpu = (Path(__file__).resolve().parents[1] / "fixtures" / "corpus" / "h200-vm" / "smi-q.xml").read_text()
    missing = result("ibstat", b"", exit_code=127, command=("ibstat",))
    [f] = run_check("ib-port-down", make_host({"nvidia-smi-q-x": one_gpu, "ibstat": missing}, "generic"))
    assert f.status is Status.SKIP and "expects no NIC" in f.summary


def test_more_gpus_than_the_platform_has_is_a_finding():
    from derived import h200_node_xml

    # The 8-GPU node (tests/derived.py, from the real H200 capture) with its last GPU listed
    # once more under a ninth bus id, as a board of another platform would show.
    xml = h200_node_xml(8)
    last = xml[xml.rindex("\t<gpu id="): xml.rindex("</gpu>") + len("</gpu>")]
    ninth = re.sub(r"00000000:[0-9A-F]{2}:00\.0", "00000000:EE:00.0", last)
    xml = xml.replace(last, last + "\n" + ninth).replace("<attached_gpus>8<", "<attached_gpus>9<")
    [f] = run_check("gpu-inventory", make_host({"nvidia-smi-q-x": xml}, "hgx-h200"))
    assert f.status is Status.WARN and f.symptoms == ("gpu-count-unexpected",)
    assert f.summary.startswith("9 GPUs visible, more than the 8 of a NVIDIA HGX H200 8-GPU")


def _devinfo_damaged(header: bytes) -> bytes:
    # gpu001's 8-NIC ibv_devinfo with invalid UTF-8 bytes in mlx5_3's section header.
    raw = (NODE / "ibv-devinfo.txt").read_bytes()
    assert raw.count(b"hca_id: mlx5_3\n") == 1
    return raw.replace(b"hca_id: mlx5_3\n", header)


@pytest.mark.parametrize("header", [b"hca_\xffid: mlx5_3\n", b"hca_id\xc3 mlx5_3\n", b"hca_id: mlx5_\xfe3\n"])
def test_a_nic_block_with_undecodable_bytes_is_not_dropped(header):
    host = make_host({"ibv-devinfo": _devinfo_damaged(header)}, "hgx-h200")
    assert len(host.ib.devices) == 8
    found = run_check("ib-port-down", host)
    assert [f.status for f in found] == [Status.WARN], [f.summary for f in found]
    assert "bytes that are not text" in found[0].summary and found[0].symptoms == ("probe-unreadable",)
    assert "7 port(s)" not in found[0].summary


def test_a_node_listing_fewer_nics_than_its_profile_fails():
    # gpu001's ibv_devinfo with mlx5_3's block removed: 7 healthy ports are no pass of 8 NICs.
    text = _out("ibv-devinfo")
    text = text[:text.index("hca_id: mlx5_3")] + text[text.index("hca_id: mlx5_4"):]
    [f] = run_check("ib-port-down", make_host({"ibv-devinfo": text}, "hgx-h200"))
    assert f.status is Status.FAIL and f.symptoms == ("nic-missing",)
    assert f.summary.startswith("7 ConnectX-7 NIC(s) listed, the NVIDIA HGX H200 8-GPU has 8 (from ibv-devinfo")


def _fleet(bad: dict) -> list:
    # Three copies of gpu001 as recorded, and one with the damaged outputs in ``bad``.
    good = {p: _out(p) for p in ("nvidia-smi-q", "ibv-devinfo")}
    return [make_host(good, "hgx-h200", name=f"gpu00{i}") for i in (1, 2, 3)] + \
        [make_host({**good, **bad}, "hgx-h200", name="gpu004")]


def test_a_nul_byte_in_the_driver_version_is_unreadable_not_drift():
    from ctx import run_fleet_check

    text = _out("nvidia-smi-q")
    line = re.search(r"Driver Version\s+: 580.159.04\n", text).group()
    hosts = _fleet({"nvidia-smi-q": text.replace(line, line.replace("04\n", "04\x00\n"))})
    by_host = {f.host: f for f in run_fleet_check("fleet-consistency", hosts)}
    assert by_host["gpu004"].status is Status.WARN and by_host["gpu004"].symptoms == ("probe-unreadable",)
    assert by_host["gpu004"].summary.startswith("driver unreadable (nvidia-smi's report header)")
    assert all(by_host[h].status is Status.PASS for h in ("gpu001", "gpu002", "gpu003"))


def test_a_control_byte_in_a_vbios_version_is_unreadable_not_drift():
    from ctx import run_fleet_check

    text = _out("nvidia-smi-q")
    vbios = re.search(r"VBIOS Version\s+: (\S+)", text).group(1)
    hosts = _fleet({"nvidia-smi-q": text.replace(vbios, vbios[:4] + "\x1b" + vbios[4:], 1)})
    by_host = {f.host: f for f in run_fleet_check("vbios-consistency", hosts)}
    assert by_host["gpu004"].status is Status.WARN and by_host["gpu004"].summary.startswith("VBIOS unreadable (GPU ")
    assert "vbios-drift" not in by_host["gpu004"].symptoms


def test_a_nul_byte_in_a_nic_firmware_string_is_unreadable_not_a_mismatch():
    from ctx import run_fleet_check

    text = _out("ibv-devinfo")
    damaged = text.replace("28.46.1006", "28.46.1006\x00", 1)
    host = make_host({"ibv-devinfo": damaged}, "hgx-h200")
    found = {f.status: f for f in run_check("nic-fw-inconsistent", host)}
    assert Status.FAIL not in found
    assert found[Status.WARN].summary.startswith("firmware unreadable, not compared: mlx5_0: fw_ver unreadable")
    assert found[Status.WARN].symptoms == ("probe-unreadable",)
    fleet = run_fleet_check("nic-fw-fleet-consistency", _fleet({"ibv-devinfo": damaged}))
    assert all(f.status is not Status.FAIL for f in fleet)


SMI_PROBES = {"nvidia-smi-q-x": ("-q", "-x"), "nvidia-smi-q": ("-q",), "nvidia-smi-topo": ("topo", "-m"),
              "nvidia-smi-nvlink-status": ("nvlink", "--status"), "nvidia-smi-nvlink-errors": ("nvlink", "-e")}


def _smi_answers(failed: dict[str, int]) -> dict:
    # gpu001's nvidia-smi outputs as a run records them; the probes in ``failed`` exited with that
    # code and printed only the loader's complaint, as a node whose driver library went missing does.
    out = {}
    for probe, args in SMI_PROBES.items():
        if probe in failed:
            out[probe] = result(probe, b"", exit_code=failed[probe], command=("nvidia-smi", *args),
                                stderr="nvidia-smi: error while loading shared libraries: libnvidia-ml.so.1: "
                                       "cannot open shared object file: No such file or directory")
        else:
            out[probe] = result(probe, _out(probe), command=("nvidia-smi", *args))
    return out


def test_exit_127_of_one_probe_is_not_a_missing_tool_when_the_tool_answered_others():
    probes = _smi_answers({"nvidia-smi-q-x": 127, "nvidia-smi-q": 127})
    [f] = run_check("gpu-memory", make_host(probes, "hgx-h200"))
    assert f.status is Status.ERROR and f.symptoms == ("probe-failed",), f.summary
    assert "not installed" not in f.summary
    assert "nvidia-smi -q -x exited 127 although nvidia-smi answered 3 other probe(s) on this host" in f.summary


def test_exit_127_of_every_probe_of_a_tool_is_still_a_missing_tool():
    probes = _smi_answers(dict.fromkeys(SMI_PROBES, 127))
    [f] = run_check("gpu-memory", make_host(probes, "hgx-h200"))
    assert f.status is Status.ERROR and f.symptoms == ("tool-missing",)
    assert "nvidia-smi is not installed" in f.summary


def _text_cut_after_gpu_2() -> str:
    # gpu001's 8-GPU text report (tests/derived.py, from the real H200 capture) cut before GPU 3.
    text = _out("nvidia-smi-q")
    return text[:text.index("GPU 00000000:3A:00.0")]


def test_a_text_report_cut_short_is_not_gpu_missing_and_passes_no_gpu():
    # The probe's own command asked for every GPU (no -i), so a listing that stops between two
    # GPUs broke off; a pasted file with no command could be a selection (test_census.py).
    cut = result("nvidia-smi-q", _text_cut_after_gpu_2(), command=("nvidia-smi", "-q"))
    probes = {"nvidia-smi-q": cut, "nvidia-smi-nvlink-status": _out("nvidia-smi-nvlink-status")}
    host = make_host(probes, "hgx-h200")
    [f] = run_check("gpu-inventory", host)
    assert f.status is Status.ERROR and f.symptoms == ("probe-truncated",), f.summary
    assert "lists 2 GPU section(s) of the 8 its header counts" in f.summary
    [f] = run_check("gpu-memory", host)
    assert f.status is Status.ERROR and "probe-truncated" in f.symptoms


def test_a_text_report_that_names_a_gpu_it_cannot_reach_is_a_missing_gpu_not_a_cut():
    # The line nvidia-smi prints for a GPU fallen off the bus (NVIDIA/open-gpu-kernel-modules#387),
    # after the two GPUs the report lists; the header still counts 8.
    text = _text_cut_after_gpu_2() + "Unable to determine the device handle for GPU 0000:3A:00.0: Unknown Error\n"
    [f] = run_check("gpu-inventory", make_host({"nvidia-smi-q": text}, "hgx-h200"))
    assert f.status is Status.FAIL and f.symptoms == ("gpu-missing",), f.summary
