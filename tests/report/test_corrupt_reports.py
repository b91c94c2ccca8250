"""Corrupted report.json and run.json: `diff`, `--baseline` and `soak --attach` refuse them with
the file and what is wrong (exit 2), and `diff` never says "Nothing got worse" when hosts are gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preflight.app.cli import main

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "examples" / "h200-fleet.json"
FLEET = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet"


def _report(tmp_path, name: str, doc) -> Path:
    path = tmp_path / name / "report.json"
    path.parent.mkdir()
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _good() -> dict:
    return {"format": "preflight-report/1", **json.loads(GOLDEN.read_text())}


CORRUPT = [
    ("\x00\xff garbage", "not a readable JSON report"),
    ({"format": "preflight-report/1", "hosts": ["gpu001"]}, "field 'hosts' must be an object"),
    ({"format": "preflight-report/1", "hosts": {"gpu001": "pass"}}, "hosts.gpu001: 'status' must be one of"),
    ({"format": "preflight-report/1", "hosts": {}, "findings": ["x"]}, "field 'findings' must be a list of objects"),
    ({"format": "preflight-report/1", "hosts": {}, "findings": [{"check": "xid", "status": "great"}]},
     "findings[0]: needs"),
    ({"format": "preflight-report/1", "hosts": {}, "diagnoses": [{"hosts": "gpu001"}]}, "diagnoses[0]: 'hosts'"),
]


@pytest.mark.parametrize(("doc", "said"), CORRUPT)
def test_diff_refuses_a_corrupted_report(tmp_path, capsys, doc, said):
    bad = _report(tmp_path, "bad", doc if isinstance(doc, (str, dict)) else doc)
    if isinstance(doc, str):
        bad.write_bytes(doc.encode("latin-1"))
    good = _report(tmp_path, "good", _good())
    assert main(["diff", str(good), str(bad)]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert str(bad) in err and said in err


@pytest.mark.parametrize(("doc", "said"), CORRUPT[:3])
def test_baseline_refuses_a_corrupted_report_before_anything_is_written(tmp_path, capsys, doc, said):
    bad = _report(tmp_path, "bad", doc)
    if isinstance(doc, str):
        bad.write_bytes(doc.encode("latin-1"))
    assert main(["analyze", str(FLEET), "--baseline", str(bad), "--out", str(tmp_path / "out"), "-q"]) == 2
    assert f"--baseline: {bad}" in capsys.readouterr().err.replace("\n", "")
    assert not (tmp_path / "out").exists()


def test_diff_says_something_got_worse_when_every_host_is_gone(tmp_path, capsys):
    old = _report(tmp_path, "old", _good())
    new = _report(tmp_path, "new", {**_good(), "hosts": {}, "findings": [], "diagnoses": []})
    assert main(["diff", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "Something got worse." in out and "Nothing got worse" not in out
    assert "- gpu001: PASS -> - (gone)" in out


@pytest.mark.parametrize(("doc", "said"), [
    ("{not json", "not JSON"),
    ("[]", "not a JSON object"),
    ({"format": "preflight-soak-run/1"}, "field 'ssh' missing"),
])
def test_attach_refuses_a_corrupted_run_json(tmp_path, capsys, doc, said):
    run = tmp_path / "out" / "r1" / "soak"
    run.mkdir(parents=True)
    (run / "run.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    assert main(["soak", "--attach", "r1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert str(run / "run.json") in err and said in err
