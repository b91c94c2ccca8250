"""`preflight merge` (preflight/evidence/merge.py): per-node bundles into one, judged as one.

The sources are the shipped example fleet (examples/h200-fleet: real captures of nine
simulated H200 nodes, see its SOURCES.tsv) cut into one bundle per node, as nine
`preflight run --local` runs would leave them: merged back, every host gets the verdict the
whole bundle gives it, and fleet checks (driver drift) see the fleet again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from preflight.app.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet"


def split(dest: Path, hosts: list[str], created: str = "2026-11-29T11:28:06+00:00") -> None:
    """One run directory per host under ``dest``, each `<run>/bundle/` holding that host only."""
    header = json.loads((EXAMPLE / "bundle.json").read_text())
    for host in hosts:
        bundle = dest / f"run-{host}" / "bundle"
        shutil.copytree(EXAMPLE / "hosts" / host, bundle / "hosts" / host)
        (bundle / "bundle.json").write_text(json.dumps({**header, "hosts": [host], "local": True,
                                                        "run_id": f"run-{host}", "created": created}))


def report(out: Path, run_id: str) -> dict:
    return json.loads((out / run_id / "report.json").read_text())


def test_merged_per_node_bundles_judge_as_the_whole_fleet(tmp_path):
    hosts = json.loads((EXAMPLE / "bundle.json").read_text())["hosts"]
    split(tmp_path / "shared", hosts)
    assert main(["analyze", str(EXAMPLE), "--out", str(tmp_path / "a"), "-q", "--no-html"]) == 1
    [whole] = [json.loads(p.read_text()) for p in (tmp_path / "a").glob("*/report.json")]
    assert main(["merge", str(tmp_path / "shared"), "--out", str(tmp_path / "m"), "--run-id", "m", "-q",
                 "--no-html"]) == 1
    merged = report(tmp_path / "m", "m")
    assert merged["hosts"] == whole["hosts"]
    key = lambda f: (f["host"] or "", f["check"], f["status"], f["summary"])  # noqa: E731
    assert sorted(map(key, merged["findings"])) == sorted(map(key, whole["findings"]))
    assert {(d["cause"], tuple(d["hosts"])) for d in merged["diagnoses"]} == {
        (d["cause"], tuple(d["hosts"])) for d in whole["diagnoses"]}
    header = json.loads((tmp_path / "m" / "m" / "bundle" / "bundle.json").read_text())
    assert header["hosts"] == hosts and header["expected_missing"] == []
    assert [s["hosts"] for s in header["merged_from"]] == [[h] for h in hosts]


def test_expected_nodes_without_a_result_are_reported_and_a_rerun_supersedes(tmp_path, capsys):
    split(tmp_path / "shared", ["gpu001", "gpu002"])
    split(tmp_path / "rerun", ["gpu002"], created="2026-11-30T08:00:00+00:00")
    code = main(["merge", str(tmp_path / "shared"), str(tmp_path / "rerun"), "--expect", "gpu[001-004]",
                 "--out", str(tmp_path / "m"), "--run-id", "m", "--no-html"])
    assert code == 1
    assert "merge: no result for 2 expected node(s): gpu[003-004]" in capsys.readouterr().out
    merged = report(tmp_path / "m", "m")
    assert {h: (v["status"], v["reachable"]) for h, v in merged["hosts"].items()} == {
        "gpu001": ("pass", True), "gpu002": ("pass", True), "gpu003": ("error", False), "gpu004": ("error", False)}
    [missing] = [f for f in merged["findings"] if f["host"] == "gpu003" and f["check"] == "connectivity"]
    assert missing["symptoms"] == ["run-incomplete"]
    header = json.loads((tmp_path / "m" / "m" / "bundle" / "bundle.json").read_text())
    assert header["expected_missing"] == ["gpu003", "gpu004"]
    [(newer)] = [s for s in header["merged_from"] if s["hosts"] == ["gpu002"]]
    assert newer["bundle"].endswith("rerun/run-gpu002/bundle")
    assert header["superseded"] == [{"host": "gpu002", "bundle": str((tmp_path / "shared/run-gpu002/bundle").resolve())}]


def test_nothing_to_merge_is_bad_input_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["merge", str(tmp_path / "empty"), "--out", str(tmp_path / "m"), "-q"]) == 2
    assert "empty: no preflight bundle here" in " ".join(capsys.readouterr().err.split())
    split(tmp_path / "shared", ["gpu001"])
    assert main(["merge", str(tmp_path / "shared"), "--expect", "gpu[1-", "--out", str(tmp_path / "m"), "-q"]) == 2
    assert "--expect: 'gpu[1-'" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "m").exists()


def test_analyze_and_merge_judge_the_checks_the_runs_judged(tmp_path):
    """A run names its checks in bundle.json; `analyze` and `merge` judge those unless --checks
    says otherwise, so a --quick run's bundle does not come back with its active checks "not run"."""
    hosts = json.loads((EXAMPLE / "bundle.json").read_text())["hosts"][:2]
    split(tmp_path / "runs", hosts)
    judged = {hosts[0]: ["gpu-inventory", "gpu-memory"], hosts[1]: ["gpu-inventory", "pcie-link"]}
    for host, checks in judged.items():
        header_file = tmp_path / "runs" / f"run-{host}" / "bundle" / "bundle.json"
        header_file.write_text(json.dumps({**json.loads(header_file.read_text()), "checks": checks}))
    run_of = lambda host: str(tmp_path / "runs" / f"run-{host}")  # noqa: E731
    ids = lambda rep: sorted(c["id"] for c in rep["checks"])  # noqa: E731

    main(["analyze", run_of(hosts[0]), "--out", str(tmp_path / "a"), "-q", "--no-html"])
    [alone] = [json.loads(p.read_text()) for p in (tmp_path / "a").glob("*/report.json")]
    assert ids(alone) == ["gpu-inventory", "gpu-memory"]
    main(["analyze", run_of(hosts[0]), "--checks", "pcie-link", "--out", str(tmp_path / "b"), "-q", "--no-html"])
    [asked] = [json.loads(p.read_text()) for p in (tmp_path / "b").glob("*/report.json")]
    assert ids(asked) == ["pcie-link"]

    main(["merge", str(tmp_path / "runs"), "--out", str(tmp_path / "m"), "--run-id", "m", "-q", "--no-html"])
    assert ids(report(tmp_path / "m", "m")) == ["gpu-inventory", "gpu-memory", "pcie-link"]
    assert json.loads((tmp_path / "m" / "m" / "bundle" / "bundle.json").read_text())["checks"] == [
        "gpu-inventory", "gpu-memory", "pcie-link"]
