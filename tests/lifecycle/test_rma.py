"""``preflight lifecycle NODE --rma``: what a vendor case needs, read from the store and the
node's saved bundle (the shipped example: real captures, gpu006's NIC firmware older than its
driver with mlx5 command timeouts in the kernel log)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from test_controller import ECC, OURS, Hands, at, record

from preflight.app import cli
from preflight.collect.local import LocalNode
from preflight.lifecycle import capture, controller, effects
from preflight.lifecycle.policy import load
from preflight.parse.nvidia_smi import parse_smi_text, parse_smi_xml
from preflight.store import Store, parse

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


def test_the_rma_summary_lists_each_step_its_evidence_and_its_outcomes(tmp_path, capsys):
    """A reset the retest cleared, its evidence kept first, and the cause's return a day later:
    the summary lists the reset once, with the capture of this machine (a real node without a GPU:
    no nvidia-bug-report.sh, so the fallback set) and its outcomes, cleared then returned."""
    policy, timings = load()
    db = f"sqlite:///{tmp_path}/s.sqlite"
    with Store.open(parse(db)) as store:
        record(store, "r1", 1.0, {"n1": ECC})
        hands = Hands(store, [1.03], {})
        local = effects.SlurmEffects({"n1": LocalNode("n1")}, evidence=tmp_path / "out",
                                     limits=capture.Limits(60, 1 << 20))
        hands.capture = local.capture
        idle = effects.Scheduler(busy=False, drained=False, reason=None, ours=False)
        controller.run_pass(store, policy, timings, at(1.001), hands, "test", scheduler={"n1": idle})
        p = controller.run_pass(store, policy, timings, at(1.02), hands, "test", scheduler={"n1": OURS})
        [cap] = [c for o in p.outcomes for c in o.captures]
        record(store, "r2", 2.0, {"n1": ECC})
        controller.run_pass(store, policy, timings, at(2.001), hands, "test", scheduler={"n1": idle})
    assert cap["step"] == "reset" and cap["source"] == "fallback" and cap["step_at"] == at(1.02)
    assert cap["outcome"] in ("complete", "partial", "failed") and Path(cap["directory"]).is_dir()
    assert json.loads((Path(cap["directory"]) / "capture.json").read_text())["parts"][0]["argv"][0] == \
        "nvidia-bug-report.sh"
    code, out, _ = run(capsys, "lifecycle", "n1", "--rma", "--since", "3650d", "--json", "--db", db)
    s = json.loads(out)
    [step] = s["steps"]
    assert code == 0 and step["step"] == "reset" and step["outcome"] == "returned"
    # The step's own event (its capture comes first, at the same time) gives its reason.
    assert step["reason"] == "preflight: remediating gpu-ecc-uncorrectable r1: reset"
    assert [(o["outcome"], o["reading"]) for o in step["outcomes"]] == [("cleared", hands.calls[2].detail["run"]),
                                                                       ("returned", "r2")]
    assert step["evidence"] == {k: cap[k] for k in ("outcome", "why", "directory", "bytes", "seconds", "source")}
    code, out, _ = run(capsys, "lifecycle", "n1", "--rma", "--since", "3650d", "--db", db)
    assert "## Remediation steps (1)" in out
    line = out.split("## Remediation steps (1)\n\n")[1].splitlines()
    assert line[0].endswith(f": cleared ({hands.calls[2].detail['run']}), then returned (r2)")
    assert line[1].startswith(f"  - evidence kept before it: {cap['outcome']}, {cap['bytes']} bytes in ")
