"""``preflight lifecycle NODE --rma``: what a vendor case needs, read from the store and the
node's saved bundle (the shipped example: real captures, gpu006's NIC firmware older than its
driver with mlx5 command timeouts in the kernel log)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from preflight.app import cli
from preflight.parse.nvidia_smi import parse_smi_text, parse_smi_xml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "h200-fleet"
CORPUS = ROOT / "tests" / "fixtures" / "corpus"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_rma_summary_names_the_parts_the_firmware_and_the_fault_lines(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/s.sqlite"
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--no-html", "--db", db)
    code, out, _ = run(capsys, "lifecycle", "gpu006", "--rma", "--since", "3650d", "--json", "--db", db)
    assert code == 0
    s = json.loads(out)
    hw = s["hardware"]
    gpu0 = hw["gpus"][0]
    # As nvidia-smi -q -x printed them on the H200 the example's captures come from.
    assert (gpu0["serial"], gpu0["board_part_number"], gpu0["vbios"]) == ("1654524013443", "692-2G520-0282-001",
                                                                           "96.00.A5.00.1A")
    assert len(hw["gpus"]) == 8 and hw["driver"] == "580.159.04"
    assert hw["nics"][0] == {"device": "mlx5_0", "firmware": "28.45.1020", "psid": "MT_0000000838",
                             "hca_type": "MT4129", "node_guid": hw["nics"][0]["node_guid"]}
    assert any("ACCESS_REG(0x805) No done completion" in line for line in hw["kernel_log"])
    assert hw["missing"] == ["DCGM diag: dcgmi-diag not collected in this bundle"]
    (incident,) = s["incidents"]
    assert incident["causes"] == ["nic-fw-driver-mismatch"]
    mismatch = next(f for f in incident["findings"] if f["check"] == "nic-fw-driver-mismatch")
    assert "older than the 28.46.1006" in mismatch["summary"] and mismatch["evidence"]
    code, out, _ = run(capsys, "lifecycle", "gpu006", "--rma", "--since", "3650d", "--db", db)
    assert out.startswith("# RMA summary: gpu006") and "PSID MT_0000000838" in out


def test_without_its_bundle_the_summary_says_what_is_missing(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/s.sqlite"
    bundle = tmp_path / "b"
    shutil.copytree(EXAMPLE, bundle)
    run(capsys, "analyze", str(bundle), "--out", str(tmp_path / "r"), "-q", "--no-html", "--db", db)
    shutil.rmtree(bundle)
    code, out, _ = run(capsys, "lifecycle", "gpu006", "--rma", "--since", "3650d", "--json", "--db", db)
    s = json.loads(out)
    assert code == 0 and s["hardware"] == {"missing": ["no saved bundle of this node is where its runs were recorded"]}
    assert s["incidents"][0]["causes"] == ["nic-fw-driver-mismatch"]  # the store still has the verdicts


def test_an_unknown_node_exits_2(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/s.sqlite"
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--no-html", "--db", db)
    code, _, err = run(capsys, "lifecycle", "gpu666", "--rma", "--db", db)
    assert code == 2 and "'gpu666': no run of the store" in err


def test_the_board_part_number_is_read_from_both_forms():
    xml = parse_smi_xml((CORPUS / "h200-vm" / "smi-q.xml").read_text())
    assert xml.gpus[0].board_part_number == "692-2G520-0282-001"
    text = parse_smi_text((CORPUS / "h200-vm" / "smi-q.txt").read_text())
    assert text.gpus[0].board_part_number == "692-2G520-0282-001"
    h100 = parse_smi_text((CORPUS / "smi-q" / "h100-80gb-hbm3-drv590-under-load.txt").read_text())
    assert h100.gpus[0].board_part_number == "692-2G520-0200-000"
