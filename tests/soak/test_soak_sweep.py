"""The concurrency sweep (preflight/soak/sweep.py, check soak-sweep) and goodput, on a real vLLM
sweep on the CPU (tests/fixtures/vllm-cpu/sweep-120s; MANIFEST.tsv says how it was recorded):
4 levels of 3 windows of 10 s. Its settled windows (the first of each level left out):

| in flight | output tokens/s | TTFT p99 ms | goodput req/s (ttft:1000 tpot:50) |
| --- | --- | --- | --- |
| 8 | 527.7, 285.9 | 489.5, 404.3 | 4.50, 1.60 |
| 32 | 1073.3, 906.8 | 931.2, 1216.2 | 6.60, 6.70 |
| 128 | 441.7, 1261.2 | 2489.9, 2407.6 | 0, 0 |
| 512 | 793.6, 576.0 | 14912.7, 23586.3 | 0, 0 |
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from preflight.app.cli import main
from preflight.diagnose.engine import load_knowledge
from preflight.model import Status
from preflight.soak import sweep
from preflight.soak.analysis import analyze
from preflight.soak.data import read_soak
from preflight.soak.judge import judge_soak
from preflight.soak.slo import latency
from preflight.soak.slo_spec import parse_slos

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-cpu" / "sweep-120s"


def _rows() -> pd.DataFrame:
    data = read_soak(REAL)
    return data.throughput[data.throughput["host"] == "vm"]


def _copy(tmp_path: Path, hosts: dict[str, float] | None = None, keep=None) -> Path:
    """The recorded soak directory, its host's rows copied to ``hosts`` (name -> factor on the
    tokens/s rows) and filtered by ``keep(frame) -> mask`` when given."""
    out = tmp_path / "soak"
    shutil.copytree(REAL, out)
    thr = pd.read_csv(REAL / "throughput.csv")
    if keep is not None:
        thr = thr[keep(thr)]
    if hosts:
        parts = []
        for host, factor in hosts.items():
            part = thr.assign(host=host)
            tokens = part["metric"] == "output_tokens_per_s"
            part.loc[tokens, "value"] = part.loc[tokens, "value"] * factor
            parts.append(part)
        thr = pd.concat(parts)
        meta = json.loads((out / "soak.json").read_text())
        meta["hosts"] = list(hosts)
        meta["no_telemetry"] = {h: meta["no_telemetry"]["vm"] for h in hosts}
        meta["agents"] = {h: meta["agents"]["vm"] for h in hosts}
        meta["gpus"] = {h: [] for h in hosts}
        (out / "soak.json").write_text(json.dumps(meta))
    thr.to_csv(out / "throughput.csv", index=False)
    return out


def test_levels_are_the_medians_of_each_levels_settled_windows():
    levels = sweep.levels(_rows())
    assert [(lv.concurrency, lv.windows, lv.errors) for lv in levels] == [(8, 2, 0), (32, 2, 0), (128, 2, 0),
                                                                         (512, 2, 0)]
    eight = levels[0]
    assert eight.tokens_per_s == pytest.approx((527.654 + 285.877) / 2, abs=1e-3)
    assert eight.ttft_p99_ms == pytest.approx((489.458 + 404.292) / 2, abs=1e-3)
    assert eight.goodput_per_s == pytest.approx((4.4962 + 1.6016) / 2, abs=1e-3)
    assert [lv.goodput_per_s for lv in levels[2:]] == [0.0, 0.0]


def test_the_knee_is_where_a_step_stops_paying_and_the_level_before_it_is_recommended():
    knee = sweep.find_knee(sweep.levels(_rows()))
    assert (knee.knee, knee.recommended) == (128, 32)
    assert knee.reason.startswith("knee at 128: 32 -> 128 in flight bought -14% output tokens/s for +128% P99 TTFT")
    # The stated thresholds decide: asking for a 20% fall before calling it a knee finds none
    # (the steepest fall here, 128 -> 512, is 19.6%), and the top level is recommended.
    lenient = sweep.find_knee(sweep.levels(_rows()), tokens_growth=-0.2)
    assert (lenient.knee, lenient.recommended) == (None, 512)
    assert lenient.reason.startswith("no knee up to 512")


def test_a_sweep_that_still_scales_has_no_knee():
    # The first two levels only: 8 -> 32 in flight more than doubled tokens/s.
    below = [lv for lv in sweep.levels(_rows()) if lv.concurrency <= 32]
    knee = sweep.find_knee(below)
    assert (knee.knee, knee.recommended) == (None, 32) and "sweep higher" in knee.reason


def test_an_slo_holds_the_recommendation_below_the_knee():
    # TTFT p99 over 1 s in one of the two settled windows at 32: broken past the 5% budget.
    levels = sweep.levels(_rows(), parse_slos(["ttft_p99=1s"]), 0.05)
    assert [lv.slo_broken for lv in levels] == [(), ("ttft_p99=1s",), ("ttft_p99=1s",), ("ttft_p99=1s",)]
    knee = sweep.find_knee(levels)
    assert (knee.knee, knee.recommended) == (128, 8)
    assert knee.reason.endswith("; held to 8: at 32 SLO ttft_p99=1s broken")
    # Broken from the lowest level on: nothing to recommend, and the verdict warns.
    tight = sweep.levels(_rows(), parse_slos(["ttft_p99=100ms"]), 0.05)
    outcome = sweep.sweep("vm", tight, sweep.find_knee(tight))
    assert outcome.status is Status.WARN and outcome.symptoms == ("sweep-no-serving-point",)


def test_the_soak_is_judged_per_level_with_goodput_in_the_report(tmp_path, capsys):
    result = analyze(read_soak(REAL))
    by = {f.check: f for f in result.findings}
    f = by["soak-sweep"]
    assert f.status is Status.PASS and f.summary.startswith("recommended concurrency 32; knee at 128")
    assert "c=32: 990 tok/s, TTFT p50/p99 577/1074 ms, TPOT p50/p99 25/33 ms, 0 errors, goodput 6.65 req/s" in f.summary
    # Throughput rising level by level is the sweep, not a trend to judge; nor is its latency.
    assert by["soak-throughput"].status is Status.SKIP and by["soak-latency"].status is Status.SKIP
    section = result.soak_section()["vm"]
    assert (section["sweep"]["knee"], section["sweep"]["recommended"]) == (128, 32)
    assert [lv["concurrency"] for lv in section["sweep"]["levels"]] == [8, 32, 128, 512]
    # The run's goodput: good requests per second over all windows (311 good of 644 completed).
    assert section["goodput_requests_per_s"] == pytest.approx(311 / 120, rel=0.05)
    # The CLI writes it to report.json and report.md, and the result files in vllm bench serve's shape.
    out = tmp_path / "r"
    assert main(["analyze", str(REAL), "--out", str(out)]) == 0
    report = json.loads(next(out.rglob("report.json")).read_text())
    assert report["soak"]["vm"]["sweep"]["recommended"] == 32
    md = next(out.rglob("report.md")).read_text()
    assert "| 32 | 990 | 577 | 1074 | 25 | 33 | 0 | 6.65 |" in md and "recommended: 32" in md


def test_a_node_whose_curve_is_not_the_fleets_warns(tmp_path):
    soak = _copy(tmp_path, {"vm1": 1.0, "vm2": 1.02, "vm3": 0.8, "vm4": 0.98})
    analysis = judge_soak(soak, load_knowledge())
    sweeps = {f.host: f for f in analysis.findings if f.check == "soak-sweep"}
    assert {h: f.status for h, f in sweeps.items()} == {"vm1": Status.PASS, "vm2": Status.PASS, "vm3": Status.WARN,
                                                      "vm4": Status.PASS}
    assert sweeps["vm3"].symptoms == ("sweep-curve-outlier",)
    assert sweeps["vm3"].summary.startswith("curve unlike the fleet's: at 8 in flight 325.4 tok/s, 19% below")
    assert "sweep-curve-outlier" in [d.cause for d in analysis.diagnoses]


def test_a_fleet_of_like_curves_has_no_outlier(tmp_path):
    soak = _copy(tmp_path, {"vm1": 1.0, "vm2": 1.05, "vm3": 0.95})
    analysis = judge_soak(soak, load_knowledge())
    assert [f.status for f in analysis.findings if f.check == "soak-sweep"] == [Status.PASS] * 3


def test_goodput_beside_throughput_in_a_soak_at_one_concurrency(tmp_path):
    # The 32-in-flight level's windows alone, without their concurrency rows: a plain soak.
    start, end = 1796143652.37, 1796143682.375
    soak = _copy(tmp_path, keep=lambda t: (t["time"] > start) & (t["time"] <= end) & (t["metric"] != "concurrency"))
    data = read_soak(soak)
    v = latency("vm", data.throughput, (), 0.05)
    assert "goodput 6.83 req/s (100% of 6.83 req/s completed); window medians" in v.summary
    assert v.data["goodput_requests_per_s"] == pytest.approx((7.2003 + 6.5964 + 6.6999) / 3, abs=1e-3)


def test_each_levels_result_is_written_in_vllm_bench_serves_shape(tmp_path):
    out = tmp_path / "run"
    judge_soak(REAL, load_knowledge(), plots_dir=out / "plots")
    files = sorted(p.name for p in (out / "vllm-bench").iterdir())
    assert files == ["vm-c128.json", "vm-c32.json", "vm-c512.json", "vm-c8.json"]
    doc = json.loads((out / "vllm-bench" / "vm-c32.json").read_text())
    # The level at 32 in flight as the load generator counted it (soak.json), in vLLM's keys.
    assert (doc["max_concurrency"], doc["completed"], doc["failed"], doc["request_rate"]) == (32, 205, 0, "inf")
    assert doc["request_goodput"] == pytest.approx(doc["request_throughput"])  # every request within both limits
    assert doc["p99_ttft_ms"] == pytest.approx(931.154, abs=1e-3) and doc["total_output_tokens"] == 205 * 128
    assert (out / "plots" / "sweep-vm.png").stat().st_size > 10_000


def test_a_level_with_failed_requests_is_not_recommended():
    rows = _rows().copy()
    assert [lv.slo_broken for lv in sweep.levels(rows, parse_slos(["error_rate=0.1%"]), 0.05)] == [()] * 4
    # Three requests of the last window at 32 in flight failed (its errors row, as the load generator counts them).
    hit = (rows["metric"] == "errors") & (rows["time"].round(3) == 1796143682.375)
    assert hit.sum() == 1
    rows.loc[hit, "value"] = 3
    levels = sweep.levels(rows, parse_slos(["error_rate=0.1%"]), 0.05)
    assert [lv.errors for lv in levels] == [0, 3, 0, 0] and levels[1].slo_broken == ("error_rate=0.1%",)
    knee = sweep.find_knee(levels)
    assert (knee.knee, knee.recommended) == (128, 8) and knee.reason.endswith("at 32 SLO error_rate=0.1% broken")
    # Without the SLO the failed requests alone hold it back.
    knee = sweep.find_knee(sweep.levels(rows))
    assert knee.recommended == 8 and knee.reason.endswith("at 32 3 failed request(s)")
