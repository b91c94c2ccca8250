"""`preflight diff OLD NEW` and `--baseline RUN`: what got worse or better between two runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from derived import h200_node_xml, with_gpu_values
from test_check_nccl import A100, judge, probe_output, scale_a100_busbw
from test_cli import write_bundle
from test_report_html import golden_analysis, golden_hosts

from preflight.app.cli import main
from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Analysis, HostVerdict
from preflight.report import json_report
from preflight.report.diff import (
    FigureChange,
    ReportError,
    diff_reports,
    load_report,
    render,
)


def after_maintenance() -> dict:
    """The fixed bundle after a window: gpu04 shows its 8 GPUs again, gpu08 answers SSH, and
    gpu03 came back with persistence off on GPU 0."""
    hosts = golden_hosts()
    hosts["gpu04"] = {"nvidia-smi-q-x": h200_node_xml(8)}
    hosts["gpu08"] = {"nvidia-smi-q-x": h200_node_xml(8)}
    hosts["gpu03"] = {"nvidia-smi-q-x": with_gpu_values(h200_node_xml(8), 0, {"persistence_mode": "Disabled"})}
    return hosts


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("diff")
    before = json_report.to_dict(golden_analysis(tmp, run_id="before"))
    after = json_report.to_dict(golden_analysis(tmp, after_maintenance(), run_id="after"))
    return before, after


def test_hosts_that_got_better_and_worse(runs):
    d = diff_reports(*runs)
    assert (d.old_run, d.new_run) == ("before", "after")
    moved = {c.host: (c.old, c.new, c.direction) for c in d.hosts if c.direction != "same"}
    assert moved == {"gpu03": ("pass", "warn", "worse"), "gpu04": ("fail", "pass", "better"),
                     "gpu08": ("error", "pass", "better")}
    assert d.worse


def test_checks_changes_with_figures_worst_first(runs):
    d = diff_reports(*runs)
    first = d.checks[0]
    assert (first.where, first.old, first.new, first.direction) == ("gpu03 persistence-mode", "pass", "warn", "worse")
    assert first.new_summary == "persistence mode off on 1 of 8 GPUs (GPU0 00000000:18:00.0)"
    inv = next(c for c in d.checks if c.where == "gpu04 gpu-inventory")
    assert inv.direction == "better"
    # gpu-inventory's data: 7 GPUs before, 8 after.
    assert [f.text() for f in inv.figures] == ["gpu_count 7 -> 8 (+14.3%)"]
    assert next(c for c in d.checks if c.where == "gpu08 connectivity").direction == "better"
    assert not [c for c in d.checks if c.host in ("gpu01", "gpu02")]  # unchanged hosts are not listed


def test_causes_that_appeared_and_went_away(runs):
    d = diff_reports(*runs)
    assert {(c.cause, c.host, c.appeared) for c in d.causes} == {
        ("persistence-mode-off", "gpu03", True), ("gpu-missing", "gpu04", False),
        ("host-unreachable", "gpu08", False)}


def test_render_reads_like_the_maintenance_window_summary(runs):
    text = render(diff_reports(*runs))
    assert text.startswith("# preflight diff: before -> after\n")
    assert "- gpu04: FAIL -> PASS (better)" in text and "- 5 hosts unchanged" in text
    assert "- new: persistence-mode-off on gpu03" in text and "- resolved: gpu-missing on gpu04" in text
    assert "- gpu04 gpu-inventory: FAIL -> PASS (better) gpu_count 7 -> 8 (+14.3%)" in text
    assert text.rstrip().endswith("Something got worse.")


def nccl_report(factor: float, run_id: str) -> dict:
    """One host's nccl-all-reduce judged on the real A100 capture (3 repetitions), busbw scaled by
    `factor` (test_check_nccl's derivation), as report.json holds it."""
    text = A100 if factor == 1 else scale_a100_busbw(A100, factor)
    finding = judge(probe_output([(text, 0, 30)] * 3))
    finding = type(finding)(finding.check, "gpu017", finding.status, finding.summary, finding.symptoms,
                            finding.evidence, finding.data)
    analysis = Analysis({"gpu017": HostVerdict(finding.status.value, True, "site-a100", "test")}, [finding],
                        diagnose([finding], load_knowledge()), [], {"run_id": run_id})
    return json.loads(json_report.render(analysis))


def test_busbw_after_a_firmware_upgrade():
    d = diff_reports(nccl_report(0.77, "before-fw"), nccl_report(1, "after-fw"))
    [c] = d.checks
    assert (c.where, c.old, c.new, c.direction) == ("gpu017 nccl-all-reduce", "warn", "pass", "better")
    assert "busbw_median 181.2 -> 235.3 GB/s (+29.9%)" in [f.text() for f in c.figures]
    assert not d.worse
    assert [(x.cause, x.appeared) for x in d.causes] == [("nccl-low-bandwidth", False)]
    back = diff_reports(nccl_report(1, "a"), nccl_report(0.77, "b"))
    assert back.worse and back.checks[0].direction == "worse"


def test_figures_noise_units_and_zero():
    def report(**data):
        return {"format": "preflight-report/1", "hosts": {"h": {"status": "pass"}},
                "findings": [{"host": "h", "check": "c", "status": "pass", "summary": "", "data": data}],
                "soak": {"h": {"max_temperature_c": data.get("t", 66.0)}}}

    d = diff_reports(report(busbw_gbs=471.0, wrong=0, cv=0.020, t=66.0),
                     report(busbw_gbs=472.0, wrong=1, cv=0.031, t=89.0))
    figures = {(c.check, f.name): f.text() for c in d.checks for f in c.figures}
    assert ("c", "busbw_gbs") not in figures  # 0.2%: noise between two runs
    assert figures[("c", "wrong")] == "wrong 0 -> 1"
    assert figures[("c", "cv")] == "cv 0.02 -> 0.031 (+55.0%)"
    assert figures[("soak", "max_temperature_c")] == "max_temperature 66 -> 89 °C (+34.8%)"
    assert FigureChange("sm_clock_mhz", 1980, 1440).text() == "sm_clock 1980 -> 1440 MHz (-27.3%)"


def test_identical_runs_have_nothing_to_say(runs):
    d = diff_reports(runs[0], runs[0])
    assert d.checks == () and d.causes == () and not d.worse
    assert "No check changed its verdict or figures." in render(d) and "- all 8 hosts unchanged" in render(d)


def test_load_report_refuses_what_is_not_a_report(tmp_path):
    with pytest.raises(ReportError, match="no such file"):
        load_report(tmp_path)
    (tmp_path / "report.json").write_text('{"format": "preflight-bundle/1"}')
    with pytest.raises(ReportError, match="not a preflight-report/1 report"):
        load_report(tmp_path)
    (tmp_path / "report.json").write_text("{")
    with pytest.raises(ReportError, match="not a readable JSON report"):
        load_report(tmp_path / "report.json")


def test_cli_diff_and_baseline(tmp_path, capsys):
    three = ("gpu02", "gpu03", "gpu04")  # enough for a better, a worse and an unchanged host
    before = write_bundle(tmp_path / "before", {h: v for h, v in golden_hosts().items() if h in three})
    after = write_bundle(tmp_path / "after", {h: v for h, v in after_maintenance().items() if h in three})
    checks = ["--checks", "gpu-inventory,persistence-mode,fleet-consistency"]
    main(["analyze", str(before), "--out", str(tmp_path / "r1"), "-q", *checks])
    [old_run] = (tmp_path / "r1").iterdir()
    main(["analyze", str(after), "--out", str(tmp_path / "r2"), "-q", *checks, "--baseline", str(old_run)])
    [new_run] = (tmp_path / "r2").iterdir()
    diff_md = (new_run / "diff.md").read_text()
    assert "- gpu04 gpu-inventory: FAIL -> PASS (better) gpu_count 7 -> 8 (+14.3%)" in diff_md
    capsys.readouterr()
    assert main(["diff", str(old_run), str(new_run)]) == 1  # gpu03 got worse
    assert capsys.readouterr().out == diff_md
    assert main(["diff", str(new_run), str(new_run / "report.json")]) == 0
    assert main(["analyze", str(after), "--out", str(tmp_path / "r3"), "-q", "--baseline", str(tmp_path)]) == 2
    assert "--baseline:" in capsys.readouterr().err and not (tmp_path / "r3").exists()
    assert main(["diff", str(old_run), str(tmp_path / "nope")]) == 2


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fleet_and_soak(tmp_path_factory):
    """The reports of the two real examples: the H200 fleet bundle and the H200 soak."""
    out = tmp_path_factory.mktemp("kinds")
    assert main(["analyze", str(REPO / "examples" / "h200-fleet"), "--out", str(out / "fleet"), "-q", "--no-html"]) \
        in (0, 1)
    assert main(["analyze", str(REPO / "examples" / "h200-soak"), "--out", str(out / "soak"), "-q", "--no-html"]) == 0
    [fleet] = (out / "fleet").glob("*/report.json")
    [soak] = (out / "soak").glob("*/report.json")
    return fleet, soak


def test_a_fleet_run_and_a_soak_are_not_compared(fleet_and_soak, capsys):
    """Issue 26: `diff` listed every check of each as new or gone, as if one run had changed."""
    fleet, soak = fleet_and_soak
    assert main(["diff", str(fleet), str(soak)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{fleet} is a fleet run" in err and f"{soak} is a soak" in err and "they share no check" in err
    assert main(["diff", str(soak), str(fleet)]) == 2
    assert main(["diff", str(soak), str(soak)]) == 0 and main(["diff", str(fleet), str(fleet)]) == 0


def test_a_soak_is_not_the_baseline_of_a_fleet_run(fleet_and_soak, capsys, tmp_path):
    fleet, soak = fleet_and_soak
    out = tmp_path / "out"
    assert main(["analyze", str(REPO / "examples" / "h200-fleet"), "--baseline", str(soak), "--out", str(out),
                 "-q"]) == 2
    assert "--baseline: " in capsys.readouterr().err and not out.exists()
    assert main(["analyze", str(REPO / "examples" / "h200-soak"), "--baseline", str(fleet), "--out", str(out),
                 "-q"]) == 2
    assert main(["analyze", str(REPO / "examples" / "h200-soak"), "--baseline", str(soak), "--out", str(out),
                 "-q", "--no-html"]) == 0


def test_a_host_that_stops_answering_is_one_change_not_one_per_check(runs, tmp_path):
    """gpu01 passes, then refuses SSH: the diff says so once (its host verdict and its
    connectivity), not once per check that did not run; a report written before issue 34, with
    an ERROR for each of those checks, reads the same."""
    before, _ = runs
    hosts = golden_hosts()
    hosts["gpu01"] = hosts["gpu08"]
    down = json_report.to_dict(golden_analysis(tmp_path, hosts, run_id="down"))
    assert [f["check"] for f in down["findings"] if f["host"] == "gpu01"] == ["connectivity"]
    d = diff_reports(before, down)
    assert [(c.where, c.direction) for c in d.checks if c.host == "gpu01"] == [("gpu01 connectivity", "worse")]
    assert d.worse
    # The same report in the earlier shape: one ERROR finding per host check of gpu01 besides.
    older = json.loads(json.dumps(down))
    older["findings"] += [{"host": "gpu01", "check": c, "status": "error", "summary": "not checked: host unreachable",
                           "symptoms": [], "evidence": []} for c in ("gpu-inventory", "persistence-mode")]
    assert diff_reports(before, older).checks == d.checks
    assert diff_reports(older, down).checks == ()
    # Back again and passing: its connectivity is better, its passing checks are not "new".
    back = diff_reports(down, before)
    assert [(c.where, c.direction) for c in back.checks if c.host == "gpu01"] == [("gpu01 connectivity", "better")]
