"""Serving SLOs and latency drift (preflight/soak/slo.py, check soak-latency) on a real vLLM soak
on the CPU (tests/fixtures/vllm-cpu/soak-90s, MANIFEST.tsv says how it was recorded): its 9
windows' TTFT p99 were 299, 353, 570, 491, 543, 645, 332, 816 and 1403 ms."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from preflight.app.cli import main
from preflight.diagnose.engine import load_knowledge
from preflight.model import Status
from preflight.soak.data import read_soak
from preflight.soak.figures import Thresholds
from preflight.soak.judge import judge_soak
from preflight.soak.slo import latency
from preflight.soak.slo_spec import parse_slos

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-cpu" / "soak-90s"


def _verdict(*slos: str, budget: float = 0.05):
    data = read_soak(REAL)
    return latency("vm", data.throughput[data.throughput["host"] == "vm"], parse_slos(slos), budget)


def test_without_slos_the_percentiles_are_stated_and_the_drift_warns():
    v = _verdict()
    assert v.status is Status.WARN and v.symptoms == ("latency-drift",)
    assert v.summary.startswith("TTFT p99 rose from 326 to 1110 ms (x3.4) while output tokens/s held (1238 -> 1537): "
                                "requests queue, or the node slows (no GPU clocks to tell which)")
    assert "window medians: TTFT p50 173 / p99 543 ms, TPOT p50 8 / p99 13 ms over 9 windows" in v.summary


def test_an_slo_broken_in_more_windows_than_the_budget_fails_with_the_worst_windows():
    v = _verdict("ttft_p99=800ms", "error_rate=0.1%")
    assert v.status is Status.FAIL and v.symptoms == ("slo-violated", "latency-drift")
    assert "ttft_p99=800ms broken in 2 of 9 windows (22%; allowed 5%), worst 1403 ms at +1.3 min" in v.summary
    assert [e.excerpt for e in v.evidence] == ["1796137963.539,vm,ttft_p99_ms,1403.13",
                                               "1796137953.507,vm,ttft_p99_ms,816.23"]
    assert v.data["slos"]["error_rate=0.1%"] == {"windows": 9, "broken": 0, "share": 0.0}
    # Within a budget that allows two windows in nine, the same SLO only warns.
    assert _verdict("ttft_p99=800ms", budget=0.25).status is Status.WARN


def test_slos_that_hold_say_so():
    v = _verdict("ttft_p99=1.5s", "tpot_p99=50ms")
    assert v.status is Status.WARN and v.symptoms == ("latency-drift",)  # the drift is still there
    assert v.data["slos"]["ttft_p99=1.5s"]["broken"] == 0 and v.data["slos"]["tpot_p99=50ms"]["broken"] == 0


def test_the_diagnosis_and_the_command_line(tmp_path, capsys):
    analysis = judge_soak(REAL, load_knowledge(), thresholds=Thresholds(slos=parse_slos(["ttft_p99=800ms"])))
    assert {d.cause for d in analysis.diagnoses} == {"slo-violated", "latency-drift"}
    assert main(["analyze", str(REAL), "--slo", "ttft_p99=800ms", "--out", str(tmp_path / "a"), "-q",
                 "--no-html"]) == 1
    [report] = (tmp_path / "a").glob("*/report.json")
    latency_finding = next(f for f in json.loads(report.read_text())["findings"] if f["check"] == "soak-latency")
    assert latency_finding["status"] == "fail"
    assert main(["analyze", str(REAL), "--slo", "ttft_p99=soon", "--out", str(tmp_path / "b"), "-q"]) == 2
    assert "--slo 'ttft_p99=soon'" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()  # refused before anything was written


def _drift_on_gpu_telemetry(clock_factor: float):
    """The recorded CPU soak's 9 serving windows (their drift) laid over 90 s of the real H200
    burn's telemetry (tests/soak_scenarios.py), its SM clock scaled by ``clock_factor`` over the
    last 30 s: the same drift, with and without the GPUs slowing under it."""
    import sys

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import soak_scenarios as S

    from preflight.soak.figures import DEFAULT_THRESHOLDS

    tele, _ = S.steady_frames(minutes=1.5, gpus=1, every=10)
    data = read_soak(REAL)
    rows = data.throughput[data.throughput["host"] == "vm"].copy()
    times = np.sort(rows["time"].unique())
    t0 = float(tele["time"].min())
    rows["time"] = rows["time"].map({t: t0 + 10.0 * (i + 1) for i, t in enumerate(times)})
    late = tele["time"] > t0 + 60
    tele.loc[late, "sm_clock_mhz"] *= clock_factor
    return latency("vm", rows, (), 0.05, tele, DEFAULT_THRESHOLDS)


def test_a_latency_drift_with_steady_clocks_is_the_servers():
    v = _drift_on_gpu_telemetry(1.0)
    assert v.symptoms == ("latency-drift",)
    # The real samples' clocks vary a little (1448 and 1440 MHz medians of the two quarters).
    assert "with steady clocks (loaded SM clock 1448 MHz at first, 1440 MHz at the end, -0.5%) the server queues " \
           "requests, not the GPUs" in v.summary


def test_a_latency_drift_with_falling_clocks_is_the_gpus():
    v = _drift_on_gpu_telemetry(0.8)
    assert v.symptoms == ("latency-drift",)
    assert "the GPUs slowed (loaded SM clock 1448 MHz at first, 1152 MHz at the end, -20.4%" in v.summary


def _failing(tmp_path: Path, per_window: int = 2) -> Path:
    """The real soak with ``per_window`` failed requests in each of its 9 windows (its `errors`
    rows, all 0 in the capture, rewritten; ~96 requests ended per window, so 2 is ~2 %)."""
    soak = tmp_path / "failing"
    shutil.copytree(REAL, soak)
    path = soak / "throughput.csv"
    lines = path.read_text().splitlines(keepends=True)
    rewritten = [ln.replace(",errors,0,", f",errors,{per_window},") for ln in lines]
    assert sum(a != b for a, b in zip(lines, rewritten, strict=True)) == 9
    path.write_text("".join(rewritten))
    return soak


def test_failed_requests_are_a_finding_without_an_slo(tmp_path):
    """Issue 26: 2 % of the requests failing, with no --slo given, passed the latency check with no word."""
    data = read_soak(_failing(tmp_path))
    v = latency("vm", data.throughput[data.throughput["host"] == "vm"], (), 0.05)
    assert v.status is Status.FAIL and "slo-violated" in v.symptoms
    # The capture's windows are 10 s long: a window's rate is its 2 errors over the requests it
    # completed (requests_per_s x 10 s) plus those 2.
    rps = data.throughput[data.throughput["metric"] == "requests_per_s"]["value"]
    worst, total = 2 / (rps.min() * 10 + 2), 18 / ((rps * 10).sum() + 18)
    assert (f"error_rate=0.1% (default) broken in 9 of 9 windows (100%; allowed 5%), worst {worst:.2%} at +") \
        in v.summary and "(no --slo error_rate= given: the default error budget)" in v.summary
    assert f"18 request(s) failed or timed out ({total:.2%} of those that ended; error_rate 0.10% per window " \
           "allowed, the default error budget, --slo error_rate= sets another)" in v.summary
    assert v.data["error_budget"] == {"error_rate": 0.001, "default": True}


def test_the_default_error_budget_is_replaced_by_the_users(tmp_path):
    data = read_soak(_failing(tmp_path))
    rows = data.throughput[data.throughput["host"] == "vm"]
    v = latency("vm", rows, parse_slos(["error_rate=5%"]), 0.05)
    assert "slo-violated" not in v.symptoms and "error_budget" not in v.data
    assert "error_rate 5.00% per window allowed, --slo" in v.summary
    assert v.data["slos"] == {"error_rate=5%": {"windows": 9, "broken": 0, "share": 0.0}}


def test_a_soak_whose_requests_all_succeed_says_so_and_keeps_its_verdict():
    v = _verdict()
    assert v.status is Status.WARN and v.symptoms == ("latency-drift",)
    assert "0 request(s) failed or timed out (0.00% of those that ended" in v.summary
    assert "every SLO held" not in v.summary  # none was asked for


def test_failed_requests_fail_the_soak_on_the_command_line(tmp_path):
    soak = _failing(tmp_path)
    assert main(["analyze", str(soak), "--out", str(tmp_path / "a"), "-q", "--no-html"]) == 1
    [report] = (tmp_path / "a").glob("*/report.json")
    finding = next(f for f in json.loads(report.read_text())["findings"] if f["check"] == "soak-latency")
    assert finding["status"] == "fail" and "error_rate=0.1% (default)" in finding["summary"]
    main(["analyze", str(soak), "--slo", "error_rate=5%", "--out", str(tmp_path / "b"), "-q", "--no-html"])
    [report] = (tmp_path / "b").glob("*/report.json")
    finding = next(f for f in json.loads(report.read_text())["findings"] if f["check"] == "soak-latency")
    assert "slo-violated" not in finding["symptoms"], finding
