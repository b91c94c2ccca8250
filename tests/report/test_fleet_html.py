"""The fleet page (``preflight history --fleet --html``) from a real store: twelve daily runs of
five nodes recorded through ``rows_of`` and ``Store.record``, in which gpu03's all_reduce busbw
falls by a fifth over the last three runs, gpu02 is diagnosed with the same cause every third
run (four incidents: a repeat offender) and a node named ``<script>x</script>`` fails its ECC
check every other run (flapping). Read back by ``read.fleet`` and ``series.fleet_series``,
rendered by ``render_fleet``, and opened in a real headless Chromium."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from preflight.app.cli import main
from preflight.report.fleet_html import rate_ceiling, render_fleet
from preflight.report.sparkline import sparkline_svg
from preflight.store import Store, parse
from preflight.store.read import Window, fleet
from preflight.store.rows import iso, rows_of
from preflight.store.series import DAY_S, MAX_TRENDS, band, day_of, fleet_series, percentiles

HOSTILE = "<script>x</script>"
NODES = ("gpu01", "gpu02", "gpu03", "gpu04", HOSTILE)
RUNS = 12
# The runs are a day apart at 01:00 UTC and end yesterday: inside `--since 400d`.
START = day_of(time.time()) - RUNS * DAY_S
WINDOW = Window(START - DAY_S, START + RUNS * DAY_S - 1)
CHECKS = [{"id": "nccl-all-reduce"}, {"id": "gpu-xid"}, {"id": "gpu-ecc"}]


def passing_all_reduce(node: str, busbw: float) -> dict:
    return {"host": node, "check": "nccl-all-reduce", "status": "pass", "summary": f"busbw {busbw:.1f} GB/s",
            "symptoms": [], "data": {"busbw_median_gbs": busbw}}


def failing(node: str, check: str, summary: str) -> dict:
    return {"host": node, "check": check, "status": "fail", "summary": summary, "symptoms": [check], "data": {}}


def report(i: int) -> dict:
    """Run ``i`` of the scenario, in the ``preflight-report/1`` shape ``rows.py`` reads."""
    noise = random.Random(i)
    hosts, findings, diagnoses = {}, [], []
    for node in NODES:
        busbw = 380.0 * (1 + noise.gauss(0, 0.004)) * (0.8 if node == "gpu03" and i >= RUNS - 3 else 1.0)
        findings.append(passing_all_reduce(node, busbw))
        bad = False
        if node == "gpu02" and i % 3 == 1:
            findings.append(failing(node, "gpu-xid", "Xid 79 <b>fell off the bus</b>"))
            diagnoses.append({"cause": "gpu-fell-off-bus", "hosts": [node], "confidence": "high",
                              "action": "drain and reseat"})
            bad = True
        if node == HOSTILE and i % 2 == 0:
            findings.append(failing(node, "gpu-ecc", "uncorrectable ECC errors"))
            bad = True
        hosts[node] = {"status": "fail" if bad else "pass", "reachable": True, "profile": "hgx-h200"}
    return {"format": "preflight-report/1", "run_id": f"run-{i:02d}", "created": iso(START + i * DAY_S + 3600),
            "hosts": hosts, "checks": CHECKS, "findings": findings, "diagnoses": diagnoses}


def record_scenario(url: str) -> None:
    with Store.open(parse(url)) as store:
        for i in range(RUNS):
            assert store.record(rows_of(report(i), started_fallback=START + i * DAY_S))


def read_back(url: str) -> tuple[dict, dict]:
    with Store.open(parse(url), create=False) as store:
        result = fleet(store, WINDOW)
        return result, fleet_series(store, WINDOW, result)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    record_scenario(url)
    return url


@pytest.fixture
def page(sqlite_url) -> str:
    return render_fleet(*read_back(sqlite_url))


# ---- the series ----------------------------------------------------------------------------------

def test_the_scenario_is_what_the_page_should_show(sqlite_url):
    result, _ = read_back(sqlite_url)
    assert [(d["node"], d["figure"]) for d in result["degrading"]] == [("gpu03", "busbw_gbs")]
    assert [(r["node"], r["cause"], r["count"]) for r in result["repeat_offenders"]] == [
        ("gpu02", "gpu-fell-off-bus", 4)]
    assert (HOSTILE, "gpu-ecc") in {(r["node"], r["check"]) for r in result["flapping"]}


def test_failure_days_count_every_host_run_and_the_failing_ones(sqlite_url):
    _, series = read_back(sqlite_url)
    days = series["days"]
    assert [d["host_runs"] for d in days] == [len(NODES)] * RUNS
    expected = [(i % 3 == 1) + (i % 2 == 0) for i in range(RUNS)]  # gpu02's and the flapper's failures
    assert [d["failing"] for d in days] == expected
    assert all(d["start"] % DAY_S == 0 for d in days)  # UTC midnights


def test_the_degrading_node_is_plotted_against_the_fleets_band(sqlite_url):
    _, series = read_back(sqlite_url)
    (trend,) = series["trends"]
    assert trend["node"] == "gpu03" and len(trend["readings"]) == RUNS
    times = [t for t, _ in trend["readings"]]
    assert times == sorted(times)
    assert trend["readings"][-1][1] < 0.85 * trend["readings"][0][1]
    figure = series["figures"]["busbw_gbs"]
    assert figure["label"] == "all_reduce busbw" and figure["unit"] == "GB/s"
    assert len(figure["band"]) == RUNS and all(b["nodes"] == len(NODES) for b in figure["band"])
    last = figure["band"][-1]
    assert last["p10"] < last["p50"] < last["p90"]
    # gpu03's fall pulls the fleet's lower edge down (p10 lies 40 % of the way from it to the next node), not its median
    assert last["p10"] < 0.92 * last["p50"] and last["p50"] > 0.98 * 380


def test_the_repeat_offenders_diagnosed_runs(sqlite_url):
    _, series = read_back(sqlite_url)
    (offender,) = series["offenders"]
    assert offender["node"] == "gpu02"
    assert offender["runs"] == [START + i * DAY_S + 3600 for i in range(RUNS) if i % 3 == 1]


def test_percentiles_interpolate_and_a_node_counts_once_a_day():
    assert percentiles([5.0]) == (5.0, 5.0, 5.0)
    assert percentiles([0.0, 10.0]) == pytest.approx((1.0, 5.0, 9.0))
    # gpu01 read three times in the day counts as its median, one node among two.
    day = 10 * DAY_S
    (b,) = band([("gpu01", day + 1, 1.0), ("gpu01", day + 2, 100.0), ("gpu01", day + 3, 2.0),
                 ("gpu02", day + 4, 4.0)])
    assert b["nodes"] == 2 and b["p50"] == pytest.approx(3.0)


def test_no_more_than_the_limit_of_trends_is_read(sqlite_url):
    result, _ = read_back(sqlite_url)
    many = {**result, "degrading": [dict(result["degrading"][0], node=f"n{i}") for i in range(MAX_TRENDS + 5)]}
    with Store.open(parse(sqlite_url), create=False) as store:
        series = fleet_series(store, WINDOW, many)
    assert len(series["trends"]) == MAX_TRENDS
    assert all(t["readings"] == [] for t in series["trends"])  # nodes the store never read
    assert f"the worst {MAX_TRENDS} of {MAX_TRENDS + 5} are plotted" in render_fleet(many, series)


def test_an_empty_store_gives_empty_series_and_a_page_that_says_so(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    with Store.open(parse(url)) as store:
        result = fleet(store, WINDOW)
        series = fleet_series(store, WINDOW, result)
    assert series["days"] == [] and series["trends"] == [] and series["offenders"] == []
    page = render_fleet(result, series)
    assert page.count("none in the window") >= 6  # failure rate, three answers, two rate tables
    assert "<svg" not in page


def test_postgresql_gives_the_same_series_as_sqlite(sqlite_url, pg):
    """The day buckets and percentiles are Python's, so both engines must agree exactly."""
    url = pg.create_database("fleet_series")
    record_scenario(url)
    assert read_back(url) == read_back(sqlite_url)


# ---- the page ------------------------------------------------------------------------------------

def test_the_page_names_the_answers_and_plots_them(page):
    assert "<h1>preflight fleet history</h1>" in page
    offenders = page[page.index('id="offenders"'):page.index('id="flapping"')]
    assert "gpu02" in offenders and "gpu-fell-off-bus" in offenders and "<td class=\"num\">4</td>" in offenders
    degrading = page[page.index('id="degrading"'):page.index('id="rates"')]
    assert '<a href="#trend-0">gpu03</a>' in degrading and "all_reduce busbw (GB/s)" in degrading
    assert re.search(r"-\d\d\.\d %", degrading)  # the change, about -20 %
    assert 'id="trend-0"' in degrading and 'class="band"' in degrading and 'class="median"' in degrading
    assert page.count("<svg") == 1 + 1 + 1 + 1  # failure rate, gpu03's trend and sparkline, gpu02's timeline
    assert 'aria-label="failing host-runs per day"' in page
    rates = page[page.index('id="rates"'):]
    assert "<code>gpu-xid</code>" in rates and "<code>gpu-fell-off-bus</code>" in rates


def test_the_page_is_self_contained(page):
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)=["'](?!#)""", page)  # nothing to fetch; only in-page anchors
    assert "default-src 'none'" in page


def test_a_hostile_node_name_is_escaped(page):
    assert HOSTILE not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page


def test_every_string_from_the_store_is_escaped_in_tables_and_plots():
    bad = '"><img src=x onerror=alert(1)>'
    t0 = 20_000 * DAY_S
    result = {"since": bad, "runs": 1, "host_runs": 1, "nodes": 1, "node_hours": 1.0,
              "repeat_offenders": [{"node": bad, "cause": bad, "count": 3, "first": bad, "last": bad}],
              "flapping": [{"node": bad, "check": bad, "transitions": 3, "runs": 4, "failures": 2}],
              "degrading": [{"node": bad, "figure": bad, "baseline": 2.0, "recent": 1.0, "change_pct": -50.0,
                             "runs": 8, "spread_pct": 1.0, "sigmas": 50.0, "fleet_median": 2.0}],
              "rates": [{"check": bad, "failures": 1, "incidents": 1, "runs": 1, "mtbf_h": 1.0},
                        {"cause": bad, "failures": 1, "incidents": 1, "runs": 0, "mtbf_h": 1.0}]}
    series = {"since": t0, "until": t0 + DAY_S, "days": [{"start": t0, "host_runs": 1, "failing": 1}],
              "figures": {bad: {"label": bad, "unit": bad, "worse": "lower",
                                "band": [{"start": t0, "p10": 1.0, "p50": 2.0, "p90": 3.0, "nodes": 1}]}},
              "trends": [{"node": bad, "figure": bad, "readings": [[t0 + 60, 2.0], [t0 + 120, 1.0]]}],
              "offenders": [{"node": bad, "cause": bad, "runs": [t0 + 60]}], "limits": {}}
    page = render_fleet(result, series)
    assert "<img" not in page and "onerror=alert(1)>" not in page
    assert page.count("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;") >= 10


def test_the_sparkline_scales_to_its_box():
    svg = sparkline_svg([1.0, 3.0, float("nan"), 2.0], width=100, height=20)
    assert 'width="100" height="20"' in svg and 'points="2.0,18.0 50.0,2.0 98.0,10.0"' in svg
    assert '<circle cx="98.0" cy="10.0"' in svg
    assert 'points="2.0,12.0 118.0,12.0"' in sparkline_svg([5.0, 5.0])  # flat: the middle line
    assert "polyline" not in sparkline_svg([]) and 'aria-label="no readings"' in sparkline_svg([])


def test_the_rate_axis_ends_on_a_round_share():
    assert [rate_ceiling(r) for r in (0.0, 0.004, 0.4, 0.9, 1.0)] == [0.01, 0.01, 0.5, 1.0, 1.0]


def test_history_fleet_html_on_the_command_line(sqlite_url, tmp_path, capsys):
    out = tmp_path / "fleet.html"
    assert main(["history", "--fleet", "--since", "400d", "--html", str(out), "--db", sqlite_url]) == 0
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "gpu03" in text and "gpu02" in text
    assert HOSTILE not in text
    assert "gpu03" in capsys.readouterr().out  # the terminal answers come too


# ---- a real browser ------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--enable-logging=stderr", "--v=0"]


def console_lines(stderr: str) -> list[str]:
    # Chromium logs each console message (and CSP refusals, uncaught errors) as ...:CONSOLE...
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_the_page_renders_in_headless_chromium(page, tmp_path):
    """The page in Debian's chromium: a screenshot that is far from blank and shows the plots'
    colours (the node's red line, the band's pale blue), a DOM with the SVGs and tables, no
    console output (no CSP refusal: the page fetches nothing)."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow not installed (comes with matplotlib)")
    path = tmp_path / "fleet.html"
    path.write_text(page)
    shot = tmp_path / "shot.png"
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                             "--window-size=1280,2000", "--dump-dom", path.as_uri()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dom, err = proc.communicate(timeout=60)

    assert console_lines(err) == []
    assert dom.count("<svg") == 4 and dom.count("<table") >= 5 and 'id="trend-0"' in dom

    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2000)
    colours = image.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # text, borders, lines: far from a blank page
    present = {c for _, c in colours}

    def near(rgb: tuple[int, int, int]) -> bool:
        return any(sum(abs(a - b) for a, b in zip(rgb, c, strict=True)) < 12 for c in present)

    assert near((0xb3, 0x26, 0x1e))  # the failure-rate and trend lines
    assert near((218, 230, 248))  # the band: #0b57d0 at 15 % over white
    if os.environ.get("PREFLIGHT_KEEP_SCREENSHOT"):
        shutil.copy(shot, Path(os.environ["PREFLIGHT_KEEP_SCREENSHOT"]))
