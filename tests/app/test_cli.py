"""The command line end to end on saved bundles and on this machine (no SSH needed)."""

import json
from pathlib import Path

import pytest
from derived import cuda_of, h200_node_xml

from preflight.app.cli import main
from preflight.evidence.bundle import FORMAT


def write_bundle(root: Path, hosts: dict[str, dict[str, object]]) -> Path:
    """hosts: name -> {probe id: text (a clean run) | dict (the probe's .json only)}."""
    (root / "hosts").mkdir(parents=True)
    (root / "bundle.json").write_text(json.dumps({"format": FORMAT, "created": "2026-11-29T10:00:00+00:00",
                                                  "hosts": list(hosts)}))
    for host, probes in hosts.items():
        d = root / "hosts" / host
        d.mkdir()
        for probe, content in probes.items():
            if isinstance(content, dict):
                (d / f"{probe}.json").write_text(json.dumps(content))
            else:
                (d / f"{probe}.txt").write_text(content)
    return root


def fleet(tmp_path):
    return write_bundle(tmp_path / "bundle", {
        "gpu01": {"nvidia-smi-q-x": h200_node_xml(8)},
        "gpu02": {"nvidia-smi-q-x": h200_node_xml(8)},
        "gpu03": {"nvidia-smi-q-x": h200_node_xml(8)},
        "gpu04": {"nvidia-smi-q-x": h200_node_xml(7)},
        "gpu05": {"nvidia-smi-q-x": h200_node_xml(8, driver="570.195.03")},
        "gpu06": {"nvidia-smi-q-x": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": 127,
                                     "stderr": "sh: 1: nvidia-smi: not found"}},
        "gpu07": {"nvidia-smi-q-x": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": None,
                                     "error": "connection refused: [Errno 111] Unable to connect to port 22"}},
    })


def read_report(out: Path) -> dict:
    [report] = out.glob("*/report.json")
    return json.loads(report.read_text())


def test_analyze_names_each_fault_on_its_host(tmp_path, capsys):
    code = main(["analyze", str(fleet(tmp_path)), "--out", str(tmp_path / "out")])
    assert code == 1
    report = read_report(tmp_path / "out")
    assert report["format"] == "preflight-report/1"
    status = {h: v["status"] for h, v in report["hosts"].items()}
    assert status == {"gpu01": "pass", "gpu02": "pass", "gpu03": "pass", "gpu04": "fail",
                      "gpu05": "fail", "gpu06": "error", "gpu07": "error"}
    assert report["hosts"]["gpu07"]["reachable"] is False
    assert report["hosts"]["gpu01"]["profile"] == "hgx-h200"
    causes = {d["cause"]: d["hosts"] for d in report["diagnoses"]}
    assert causes == {"gpu-missing": ["gpu04"], "driver-version-drift": ["gpu05"],
                      "tool-missing": ["gpu06"], "host-unreachable": ["gpu07"]}
    drift = next(d for d in report["diagnoses"] if d["cause"] == "driver-version-drift")
    assert "570.195.03" in drift["action"] and "580.159.04" in drift["action"]
    missing = next(f for f in report["findings"] if f["host"] == "gpu04" and f["check"] == "gpu-inventory")
    assert missing["summary"].startswith("7 of 8 GPUs") and missing["evidence"]
    out = capsys.readouterr().out
    assert "gpu-missing" in out and "gpu04" in out


def test_report_files_are_written_and_consistent(tmp_path):
    main(["analyze", str(fleet(tmp_path)), "--out", str(tmp_path / "out"), "-q"])
    [run] = (tmp_path / "out").iterdir()
    md = (run / "report.md").read_text()
    assert "7 of 8 GPUs visible" in md and "## Diagnoses" in md
    junit = (run / "junit.xml").read_text()
    import xml.etree.ElementTree as ET
    root = ET.fromstring(junit)
    case = root.find("./testsuite[@name='gpu04']/testcase[@name='gpu-inventory']")
    assert case.find("failure").get("message").startswith("7 of 8 GPUs visible")
    assert "cause: gpu-missing" in case.find("failure").get("message")
    # The unreached gpu07 is one error, naming the checks it could not run (issue 34).
    [down] = root.findall("./testsuite[@name='gpu07']/testcase")
    assert down.get("name") == "connectivity" and "gpu-inventory" in down.find("error").text


def test_analyze_accepts_a_run_directory(tmp_path):
    b = fleet(tmp_path / "run")
    assert b.name == "bundle"
    assert main(["analyze", str(b.parent), "--out", str(tmp_path / "out"), "-q"]) == 1


def test_healthy_fleet_exits_zero(tmp_path):
    b = write_bundle(tmp_path / "b", {f"n{i}": {"nvidia-smi-q-x": h200_node_xml(8)} for i in range(3)})
    assert main(["analyze", str(b), "--out", str(tmp_path / "out"), "-q"]) == 0


def test_user_check_plugin_from_checks_dir(tmp_path):
    plugins = tmp_path / "mychecks"
    plugins.mkdir()
    (plugins / "driver_pin.py").write_text(
        "from preflight.plugin import host_check, ok, fail\n"
        "@host_check('driver-pin', probes=['nvidia-smi-q-x'], summary='site pins driver 580')\n"
        "def driver_pin(host):\n"
        "    v = host.smi.driver_version\n"
        "    return ok(v) if v.startswith('580.') else fail(f'driver {v} is not 580', symptoms=['driver-version-drift'])\n"
    )
    b = write_bundle(tmp_path / "b", {"a": {"nvidia-smi-q-x": h200_node_xml(8)},
                                      "b": {"nvidia-smi-q-x": h200_node_xml(8, driver="570.1")}})
    code = main(["analyze", str(b), "--checks-dir", str(plugins), "--checks", "driver-pin",
                 "--out", str(tmp_path / "out"), "-q"])
    assert code == 1
    report = read_report(tmp_path / "out")
    assert [(f["host"], f["status"]) for f in report["findings"] if f["check"] == "driver-pin"] == \
        [("a", "pass"), ("b", "fail")]


@pytest.mark.parametrize("argv, message", [
    (["run", "--hosts", "{hosts}"], "hosts.txt:2: bad host name"),
    (["run", "-H", "ok,bad;name"], "-H:2: bad host name"),
    (["analyze", "{empty}"], "not a bundle"),
    (["analyze", "{bundle}", "--profile", "nope"], "unknown profile 'nope'"),
    (["analyze", "{bundle}", "--checks", "nope"], "unknown check(s): nope"),
    (["run", "--local", "--identity", "/nonexistent/key"], "--identity: /nonexistent/key: no such file"),
])
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(tmp_path, capsys, argv, message):
    (tmp_path / "hosts.txt").write_text("gpu01\n$(reboot)\n")
    (tmp_path / "empty").mkdir()
    b = write_bundle(tmp_path / "b", {"a": {"nvidia-smi-q-x": h200_node_xml(8)}})
    subst = {"{hosts}": str(tmp_path / "hosts.txt"), "{empty}": str(tmp_path / "empty"), "{bundle}": str(b)}
    argv = [subst.get(a, a) for a in argv] + ["--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err.replace("\n", "")
    assert not (tmp_path / "out").exists()


def test_run_local_on_this_machine(tmp_path):
    """The real local path: this CI machine has no GPU, so nvidia-smi is missing -> ERROR."""
    code = main(["run", "--local", "--out", str(tmp_path / "out"), "--run-id", "r1", "-q"])
    run = tmp_path / "out" / "r1"
    report = json.loads((run / "report.json").read_text())
    [host] = report["hosts"]
    bundle = json.loads((run / "bundle" / "bundle.json").read_text())
    assert bundle["format"] == FORMAT and bundle["hosts"] == [host]
    meta = json.loads((run / "bundle" / "hosts" / host / "nvidia-smi-q-x.json").read_text())
    if meta["exit_code"] == 127:
        assert code == 1
        inv = next(f for f in report["findings"] if f["check"] == "gpu-inventory")
        assert inv["status"] == "error" and "tool-missing" in inv["symptoms"]
        assert "nvidia-smi is not installed" in inv["summary"]
    else:  # a machine with a GPU: the probe ran and was saved byte for byte
        assert (run / "bundle" / "hosts" / host / "nvidia-smi-q-x.txt").stat().st_size > 0


def test_a_cuda_version_that_comes_with_the_driver_is_not_a_second_action(tmp_path):
    # Issue 34: a real R570 driver prints CUDA 12.8 (tests/derived.py cuda_of), so a node on another
    # driver differs in both; moving the driver is the one action, both differences the evidence.
    bundle = write_bundle(tmp_path / "bundle", {
        **{f"gpu0{i}": {"nvidia-smi-q-x": h200_node_xml(8)} for i in range(1, 4)},
        "gpu04": {"nvidia-smi-q-x": h200_node_xml(8, driver="570.195.03", cuda=cuda_of("570.195.03"))},
        "gpu05": {"nvidia-smi-q-x": h200_node_xml(8, cuda="12.9")},  # the CUDA version alone differs
    })
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "out"), "-q", "--no-db"]) == 1
    found = {f["host"]: f for f in read_report(tmp_path / "out")["findings"] if f["check"] == "fleet-consistency"}
    assert found["gpu04"]["data"]["action"] == ("move gpu04 to driver 580.159.04 (it runs 570.195.03), then reboot "
                                                "and re-run preflight")
    assert found["gpu04"]["summary"].startswith("driver 570.195.03, the fleet runs 580.159.04; CUDA 12.8, the fleet "
                                                "runs 13.0 [")
    assert found["gpu05"]["data"]["action"] == "move gpu05 to CUDA 13.0 (it runs 12.9), then reboot and re-run preflight"


def test_analyze_and_merge_json_is_report_json_on_stdout_alone(tmp_path, capsysbinary):
    """--json (issue 34): report.json's bytes on stdout and nothing else there; what a person
    reads goes to stderr; the exit code is the command's."""
    bundle = fleet(tmp_path)
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "a"), "--json", "--no-html"]) == 1
    out, err = capsysbinary.readouterr()
    [report] = (tmp_path / "a").glob("*/report.json")
    assert out == report.read_bytes() and json.loads(out)["hosts"]["gpu07"]["reachable"] is False
    assert b"3 pass, 2 fail, 2 errors" in err and b"report in" in err  # the summary, on stderr
    assert main(["merge", str(bundle), "--out", str(tmp_path / "m"), "--run-id", "m", "--json", "-q"]) == 1
    out, err = capsysbinary.readouterr()
    assert out == (tmp_path / "m" / "m" / "report.json").read_bytes()
    assert err.decode().splitlines() == [f"3 pass, 2 fail, 2 errors — report in {tmp_path / 'm' / 'm'}"]
    # Bad input: nothing on stdout.
    assert main(["analyze", str(tmp_path / "nowhere"), "--out", str(tmp_path / "a"), "--json"]) == 2
    assert capsysbinary.readouterr().out == b""
