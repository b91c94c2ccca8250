"""`preflight baseline` end to end: known-good runs -> a site profile -> `analyze --profile-file`
FAILs the slow node and PASSes the good one; bad input exits 2 naming the file and field, with
nothing written.

The runs are bundles of real captures (tests/fixtures/baseline/MANIFEST.tsv): an 8 x MI350X
node's single-process all_reduce (367.51 GB/s at 8 GiB), the same node under mpirun (289.27
GB/s), and the 8 x A100 capture of the corpus. A capture replayed in several runs stands for a
known-good node run again: the samples agree exactly, so the 5 % floor draws the lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_cli import write_bundle

from preflight.app.cli import main
from preflight.collect.nccl import PROBE_ID

FIXTURES = Path(__file__).parents[1] / "fixtures" / "baseline"
FAST = (FIXTURES / "mi350x-8gpu-allreduce-g8-single-process.txt").read_text()
SLOW = (FIXTURES / "mi350x-8gpu-allreduce-mpirun-np8-g1.txt").read_text()
A100 = (FIXTURES.parent / "corpus" / "nccl-tests" / "a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt").read_text()
FAILED = (Path(__file__).parents[1] / "fixtures" / "corpus" / "nccl-tests"
          / "jean-zay-nccl-warn-socket-connect-refused.txt").read_text()


def run_dir(root: Path, name: str, hosts: dict[str, str]) -> Path:
    """A run directory as `preflight run` leaves it: RUN/bundle/ with each host's all_reduce."""
    write_bundle(root / name / "bundle", {h: {PROBE_ID: text} for h, text in hosts.items()})
    header = root / name / "bundle" / "bundle.json"
    header.write_text(json.dumps({**json.loads(header.read_text()), "run_id": name}))
    return root / name


def report(out: Path) -> dict:
    [path] = out.glob("*/report.json")
    return json.loads(path.read_text())


def statuses(rep: dict, check: str) -> dict:
    return {f["host"]: f["status"] for f in rep["findings"] if f["check"] == check}


def test_baseline_from_runs_then_analyze_fails_the_slow_node(tmp_path, capsys):
    runs = [run_dir(tmp_path, f"good-{i}", {"mi01": FAST}) for i in range(3)]
    site = tmp_path / "site.yaml"
    assert main(["baseline", *map(str, runs), "--out", str(site)]) == 0
    assert "median 367.51 over 3 samples, warn below 349.135, fail below 330.759" in capsys.readouterr().out
    data = yaml.safe_load(site.read_text())
    assert data["id"] == "generic"  # the runs had no nvidia-smi: the profile they were judged under
    assert data["nccl"]["all_reduce_busbw_gbs"] == 367.51
    assert [r["run_id"] for r in data["baseline"]["runs"]] == ["good-0", "good-1", "good-2"]
    assert data["baseline"]["gpu_model"] == "AMD Instinct MI350X"

    fleet = run_dir(tmp_path, "fleet", {"mi01": FAST, "mi02": SLOW})
    # Without the site profile nothing judges the figure: both pass.
    assert main(["analyze", str(fleet), "--out", str(tmp_path / "before"), "--quiet"]) == 0
    assert statuses(report(tmp_path / "before"), "nccl-all-reduce") == {"mi01": "pass", "mi02": "pass"}
    # With it, the slow node fails on the site's own line and is diagnosed.
    code = main(["analyze", str(fleet), "--profile-file", str(site), "--out", str(tmp_path / "after"), "--quiet"])
    assert code == 1
    rep = report(tmp_path / "after")
    assert statuses(rep, "nccl-all-reduce") == {"mi01": "pass", "mi02": "fail"}
    assert {h: v["status"] for h, v in rep["hosts"].items()} == {"mi01": "pass", "mi02": "fail"}
    assert {d["cause"]: d["hosts"] for d in rep["diagnoses"]} == {"nccl-low-bandwidth": ["mi02"]}
    # The generic profile it replaced also takes other GPUs: an A100 node is not held against it.
    other = run_dir(tmp_path, "other", {"a100": A100})
    assert main(["analyze", str(other), "--profile-file", str(site), "--out", str(tmp_path / "other-out"), "-q"]) == 0
    [f] = [f for f in report(tmp_path / "other-out")["findings"] if f["check"] == "nccl-all-reduce"]
    assert f["status"] == "pass" and "is for AMD Instinct MI350X: not judged" in f["summary"]


def test_from_fleet_takes_every_node_of_one_run_as_a_sample(tmp_path, capsys):
    run = run_dir(tmp_path, "fleet-run", {f"mi0{i}": FAST for i in range(1, 5)})
    assert main(["baseline", str(run), "--from-fleet"]) == 0  # no --out: the YAML goes to stdout
    data = yaml.safe_load(capsys.readouterr().out)
    fig = data["baseline"]["figures"]["nccl.all_reduce_busbw_gbs"]
    assert [s["host"] for s in fig["samples"]] == ["mi01", "mi02", "mi03", "mi04"]
    assert data["baseline"]["from_fleet"] is True and data["baseline"]["runs"][0]["hosts"] == 4


def _refused(tmp_path, capsys, argv: list[str], *words: str) -> None:
    out = tmp_path / "site.yaml"
    assert main(["baseline", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for w in words:
        assert w in err, err
    assert not out.exists()


def test_a_run_whose_node_failed_is_refused_naming_its_file(tmp_path, capsys):
    runs = [run_dir(tmp_path, "good-0", {"mi01": FAST}), run_dir(tmp_path, "good-1", {"mi01": FAST}),
            run_dir(tmp_path, "bad", {"mi01": FAST, "mi02": FAILED})]
    _refused(tmp_path, capsys, list(map(str, runs)),
             f"{runs[2]}/bundle/hosts/mi02/nccl-all-reduce.txt", "nccl-all-reduce is FAIL, not PASS")


def test_a_fleet_run_with_a_node_below_its_peers_is_refused(tmp_path, capsys):
    run = run_dir(tmp_path, "fleet", {"mi01": FAST, "mi02": FAST, "mi03": FAST, "mi04": FAST, "mi05": SLOW})
    _refused(tmp_path, capsys, [str(run), "--from-fleet"],
             "hosts/mi05/nccl-all-reduce.txt", "nccl-fleet-relative is WARN, not PASS")


def test_mixed_platforms_are_refused(tmp_path, capsys):
    runs = [run_dir(tmp_path, f"r{i}", {"n1": text}) for i, text in enumerate((FAST, FAST, A100))]
    _refused(tmp_path, capsys, list(map(str, runs)),
             "r2/bundle/hosts/n1/nccl-all-reduce.txt: GPU model 'A100-SXM4-40GB'", "'AMD Instinct MI350X'",
             "one baseline is for one platform")


@pytest.mark.parametrize("argv, words", [
    (["two"], "2 run(s), one sample each"),
    (["two", "--from-fleet"], "2 host(s) with --from-fleet"),
])
def test_too_few_samples_are_refused(tmp_path, capsys, argv, words):
    runs = [str(run_dir(tmp_path, f"r{i}", {"mi01": FAST})) for i in range(2)]
    _refused(tmp_path, capsys, runs + argv[1:], words, "at least 3 samples")


def test_a_host_without_the_figure_is_refused(tmp_path, capsys):
    good = [str(run_dir(tmp_path, f"r{i}", {"mi01": FAST})) for i in range(2)]
    write_bundle(tmp_path / "static" / "bundle", {"mi01": {"lspci": ""}})  # a --quick run: no all_reduce
    _refused(tmp_path, capsys, [*good, str(tmp_path / "static")],
             "static/bundle/hosts/mi01/nccl-all-reduce.txt: nccl-all-reduce is SKIP, not PASS", "not run")


def test_a_missing_or_repeated_run_is_refused(tmp_path, capsys):
    run = run_dir(tmp_path, "r0", {"mi01": FAST})
    _refused(tmp_path, capsys, [str(tmp_path / "nowhere")], "nowhere: no such run directory or bundle")
    (tmp_path / "empty").mkdir()
    _refused(tmp_path, capsys, [str(tmp_path / "empty")], "empty: not a bundle (no bundle.json)")
    _refused(tmp_path, capsys, [str(run), str(run / "bundle"), str(run)], "the same run as", "each run counts once")


def test_out_in_a_missing_directory_is_refused(tmp_path, capsys):
    runs = [str(run_dir(tmp_path, f"r{i}", {"mi01": FAST})) for i in range(3)]
    assert main(["baseline", *runs, "--out", str(tmp_path / "no" / "site.yaml")]) == 2
    assert "--out: " in capsys.readouterr().err


def test_explain_shows_the_relative_cause(capsys):
    assert main(["explain", "nccl-below-fleet-median"]) == 0
    text = capsys.readouterr().out
    assert "relative" in text and "preflight baseline" in text
