"""``analyze --history``: the shipped example fleet judged against a past kept in a real store
(both engines). The past is recorded through the store's own path (reports in the
``preflight-report/1`` shape); the present is the example's real captures."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from runs import report
from test_fleet_html import CHROMIUM, FLAGS, console_lines

from preflight.app import cli
from preflight.store import Store, parse
from preflight.store.rows import rows_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet"
HEALTHY = ("gpu001", "gpu002", "gpu003", "gpu004", "gpu005")
WOBBLE = [0.0, 0.2, -0.1, 0.15, -0.2, 0.1, 0.0, -0.15, 0.2, -0.05, 0.1, -0.1]


def _past(store_url: str) -> None:
    """Twelve daily runs ending yesterday. gpu003 ran at ~520 GB/s and fell to ~476 over its last
    two runs (today's real capture says 475); gpu006 had its firmware mismatch diagnosed in three
    separate incidents within the week; gpu007's NVLink check kept changing its mind."""
    now = datetime.now(timezone.utc)
    with Store.open(parse(store_url)) as store:
        for i in range(12):
            day = 12 - i
            nodes = {h: {"busbw": 475 * (1 + WOBBLE[(i + k) % 12] / 100)} for k, h in enumerate(HEALTHY)}
            nodes["gpu003"]["busbw"] = 476.0 if i >= 10 else 520 * (1 + WOBBLE[i] / 100)
            nodes["gpu006"] = ({"fail": ["nic-fw-driver-mismatch"], "causes": ["nic-fw-driver-mismatch"]}
                               if day in (6, 4, 2) else {})
            nodes["gpu007"] = {"fail": ["nvlink"], "causes": ["nvlink-down"]} if day % 2 else {}
            rep = report(f"past-{i:02d}", 0, nodes, checks=("nccl-all-reduce", "nvlink", "nic-fw-driver-mismatch"))
            rep["created"] = (now - timedelta(days=day)).isoformat(timespec="seconds")
            store.record(rows_of(rep, started_fallback=0.0))


def _analyze(tmp_path: Path, capsys, *extra: str) -> dict:
    code = cli.main(["analyze", str(EXAMPLE), "--out", str(tmp_path), "-q", *extra])
    capsys.readouterr()
    assert code == 1
    path = max(tmp_path.glob("*/report.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(path.read_text())


def test_history_findings_name_the_repeat_the_flap_and_the_trend(store_url, tmp_path, capsys):
    _past(store_url)
    rep = _analyze(tmp_path / "with", capsys, "--history", "--db", store_url)
    by = {(f["host"], f["check"]): f for f in rep["findings"] if f["check"].startswith("history-")}
    trend = by[("gpu003", "history-trend")]
    assert trend["status"] == "warn" and trend["symptoms"] == ["history-degrading"]
    assert "all_reduce busbw 8." in trend["summary"] and "below this node's median of its 10 runs" in trend["summary"]
    assert trend["data"]["sigmas"] > 3
    assert by[("gpu001", "history-trend")]["status"] == "pass"
    repeat = by[("gpu006", "history-repeat")]
    assert repeat["status"] == "warn" and "nic-fw-driver-mismatch diagnosed in 3 separate incidents" in repeat["summary"]
    flap = by[("gpu007", "history-flapping")]
    assert flap["status"] == "warn" and flap["summary"].startswith("nvlink changed between fail and pass")
    assert by[("gpu002", "history-flapping")]["status"] == "pass"
    def blamed(cause: str) -> list[str]:  # one diagnosis per distinct action: the hosts of all of them
        assert {d["confidence"] for d in rep["diagnoses"] if d["cause"] == cause} == {"medium"}
        return sorted(h for d in rep["diagnoses"] if d["cause"] == cause for h in d["hosts"])

    assert blamed("node-degrading") == ["gpu003"]
    # gpu007's NVLink failures were diagnosed nvlink-down in six separate streaks: a repeat too.
    assert blamed("repeat-offender") == ["gpu006", "gpu007"]
    # gpu006's mismatch failed every other day and fails today: its check flaps as well.
    assert blamed("flapping") == ["gpu006", "gpu007"]
    # History warns; it does not fail a node that passes today.
    assert rep["hosts"]["gpu003"]["status"] == "warn"
    # report.html's history section reads this: the node's past verdicts and its busbw, today's last.
    past = rep["history"]["gpu003"]
    assert past["figure"] == "busbw_gbs" and past["values"][-3:] == [476.0, 476.0, 475.0]
    assert [s for _, s in past["runs"]] == ["pass"] * 10
    assert "gpu001" not in rep["history"]  # it passed: no history shown
    page = next((tmp_path / "with").glob("*/report.html")).read_text()
    assert '<section id="history">' in page and 'class="spark"' in page and "all_reduce busbw (GB/s)" in page


def test_without_history_no_history_checks(store_url, tmp_path, capsys):
    _past(store_url)
    rep = _analyze(tmp_path, capsys, "--db", store_url)
    assert not [f for f in rep["findings"] if f["check"].startswith("history-")]
    assert rep["hosts"]["gpu003"]["status"] == "pass"


def test_history_of_an_empty_store_skips_with_the_reason(tmp_path, capsys):
    rep = _analyze(tmp_path, capsys, "--history", "--db", f"sqlite:///{tmp_path}/new.sqlite")
    (f,) = [f for f in rep["findings"] if f["host"] == "gpu001" and f["check"] == "history-repeat"]
    assert f["status"] == "skip" and "no history of this node" in f["summary"]


def test_history_needs_a_store(tmp_path, capsys):
    code = cli.main(["analyze", str(EXAMPLE), "--out", str(tmp_path), "-q", "--history", "--no-db"])
    assert code == 2 and "--history reads the results store" in capsys.readouterr().err


@pytest.mark.parametrize("check", ["history-repeat", "history-flapping", "history-trend"])
def test_history_checks_are_listed(check, capsys):
    assert cli.main(["checks"]) == 0
    assert check in capsys.readouterr().out


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_report_html_shows_the_failing_nodes_history_in_chromium(tmp_path, capsys):
    """report.html's History section in Debian's chromium: each node that did not pass, its past
    verdicts and its busbw sparkline, drawn with no console error (the page fetches nothing)."""
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    _past(url)
    _analyze(tmp_path / "r", capsys, "--history", "--db", url)
    page = next((tmp_path / "r").glob("*/report.html"))
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=60)
    assert console_lines(proc.stderr) == []
    dom = proc.stdout
    section = dom[dom.index('<section id="history">'):]
    section = section[:section.index("</section>")]
    assert section.count('<svg class="spark"') >= 1 and 'aria-label="13 readings, last 475"' in section
    assert ">gpu003<" in section and ">gpu006<" in section and ">gpu001<" not in section
