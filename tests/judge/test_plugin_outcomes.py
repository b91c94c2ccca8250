"""A plugin check that misbehaves is reported as crashed, its file named, and the run goes on
(preflight/judge/outcomes.py): garbage returned, data JSON cannot hold, a host outside the
inventory; a module that calls sys.exit() at import is refused as a bad check module (exit 2,
its file named) instead of ending preflight; a bundle with no host is not a pass."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from derived import h200_node_xml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))
from test_cli import read_report, write_bundle  # noqa: E402

from preflight.app.cli import main  # noqa: E402

PLUGIN = """from preflight.check import fleet_check, host_check, ok, Outcome, Status
@host_check('{id}', probes=['nvidia-smi-q-x'], summary='misbehaves')
def check(host):
{body}
"""


def _run_plugin(tmp_path, body: str, check_id: str = "bad-plugin") -> tuple[int, dict, Path]:
    plugins = tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    source = plugins / "bad_plugin.py"
    source.write_text(PLUGIN.format(id=check_id, body=body))
    bundle = write_bundle(tmp_path / "b", {"a": {"nvidia-smi-q-x": h200_node_xml(8)}})
    out = tmp_path / "out"
    code = main(["analyze", str(bundle), "--checks-dir", str(plugins), "--out", str(out), "-q"])
    return code, read_report(out), source


@pytest.mark.parametrize(("body", "said"), [
    ("    return 'all good'", "returned str 'all good', not an Outcome"),
    ("    return {'status': 'pass'}", "returned dict"),
    ("    return [ok('fine'), 42]", "returned int 42 among its outcomes"),
    ("    return Outcome('pass', 'a str for a status')", "whose status is str 'pass', not a Status"),
    ("    return ok('fine', data={'when': object()})", "put data in its finding that JSON cannot hold"),
    ("    return ok('fine', host='elsewhere')", "blamed host 'elsewhere', which is not in the inventory"),
])
def test_a_host_check_returning_garbage_is_reported_as_crashed(tmp_path, body, said):
    code, report, source = _run_plugin(tmp_path, body)
    assert code == 1
    [f] = [f for f in report["findings"] if f["check"] == "bad-plugin"]
    assert f["status"] == "error" and f["symptoms"] == ["check-crashed"]
    assert said in f["summary"] and str(source) in f["summary"]
    # The run went on: the built-in checks judged the host as usual.
    assert any(f["check"] == "gpu-inventory" and f["status"] == "pass" for f in report["findings"])


def test_a_fleet_check_cannot_blame_a_host_outside_the_inventory(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "blame.py").write_text(
        "from preflight.check import fleet_check, fail\n"
        "@fleet_check('blame-stranger', summary='blames a stranger')\n"
        "def blame(fleet):\n"
        "    return [fail('bad node', host='not-in-inventory', symptoms=['gpu-missing'])]\n")
    bundle = write_bundle(tmp_path / "b", {"a": {"nvidia-smi-q-x": h200_node_xml(8)}})
    code = main(["analyze", str(bundle), "--checks-dir", str(plugins), "--out", str(tmp_path / "out"), "-q"])
    report = read_report(tmp_path / "out")
    [f] = [f for f in report["findings"] if f["check"] == "blame-stranger"]
    assert code == 1 and f["host"] is None and f["status"] == "error"
    assert "not-in-inventory" not in report["hosts"]
    assert not any("not-in-inventory" in d["hosts"] for d in report["diagnoses"])


def test_a_check_module_calling_sys_exit_at_import_is_refused_with_its_file(tmp_path, capsys):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "exits.py").write_text("import sys\nsys.exit(0)\n")
    bundle = write_bundle(tmp_path / "b", {"a": {"nvidia-smi-q-x": h200_node_xml(8)}})
    code = main(["analyze", str(bundle), "--checks-dir", str(plugins), "--out", str(tmp_path / "out"), "-q"])
    assert code == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert str(plugins / "exits.py") in err and "SystemExit: 0" in err
    assert not (tmp_path / "out").exists()


def test_a_bundle_with_no_host_is_not_a_pass(tmp_path):
    bundle = write_bundle(tmp_path / "b", {})
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "out"), "-q"]) == 1
    report = read_report(tmp_path / "out")
    assert report["hosts"] == {}
    assert [(f["check"], f["status"]) for f in report["findings"] if f["status"] != "skip"] == [("connectivity", "error")]
    assert "nothing was checked" in report["findings"][0]["summary"]


def test_report_json_is_strict_json_whatever_a_check_measured(tmp_path):
    # A plugin's figures may be non-finite; report.json must still parse as strict JSON.
    code, _, _ = _run_plugin(tmp_path, "    return ok('odd figures', data={'busbw': float('nan'), 'max': float('inf')})")
    text = next((tmp_path / "out").glob("*/report.json")).read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"report.json holds {c}"))
    [f] = [f for f in doc["findings"] if f["check"] == "bad-plugin"]
    assert f["data"] == {"busbw": None, "max": None}
