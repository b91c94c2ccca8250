"""``history --fleet``'s precision on a store whose drains were made by the real code that makes
them, on both engines: the lifecycle's real controller over the store (a reset retested and
resumed; a retest that fails twice and escalates; a drain without a scheduler that a person
clears through ``preflight lifecycle NODE --clear``), and the healthcheck's real rule
(``healthcheck.decide`` on node states read from real ``scontrol show node -o`` captures, its
events recorded as ``cmd_healthcheck`` records them). The readings are recorded from reports by
``rows_of``, as every command records its run. The definitions' tables: tests/judge/test_precision.py;
the real ``drain``/``resume`` commands on a real Slurm cluster: tests/e2e/test_e2e_drain.py."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from runs import T0, report
from test_fleet_html import CHROMIUM, FLAGS, console_lines
from test_store_speed import fetched

from preflight.app import healthcheck
from preflight.app.cli import main
from preflight.lifecycle import controller
from preflight.lifecycle.effects import ForAPerson
from preflight.lifecycle.machine import Action, Scheduler
from preflight.lifecycle.policy import load
from preflight.parse.slurm import parse_show_node
from preflight.report.fleet_html import render_fleet
from preflight.store import Store, parse
from preflight.store import precision as reads
from preflight.store.read import Window, fleet
from preflight.store.rows import rows_of
from preflight.store.series import fleet_series

POLICY, SHIPPED = load()
TIMINGS = {**SHIPPED, "breaker_fraction": 1.0}  # a small fleet: the shipped 10 % would allow one drain in it
SLURM = Path(__file__).parents[1] / "fixtures" / "slurm"
UNDRAINED = parse_show_node((SLURM / "scontrol-show-node-not-found.txt").read_text())[0]["n1"]
IDLE = Scheduler(busy=False, drained=False, reason=None, ours=False)
OURS = Scheduler(busy=False, drained=True, reason="preflight: drained", ours=True)
ECC = {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]}
NVLINK = {"fail": ["nvlink"], "causes": ["nvlink-down"]}
THERMAL = {"fail": ["clock-events"], "causes": ["thermal-throttling"]}
# The scenario's 20 days end now, so that a person's --clear (stamped with the clock) lies in them.
BASE = (time.time() - T0.timestamp()) / 86400 - 20


def day(d: float) -> float:
    return rows_of(report("x", BASE + d, {}), started_fallback=0).run.started


def record(store: Store, run_id: str, d: float, nodes: dict, kind: str = "run") -> None:
    store.record(rows_of(report(run_id, BASE + d, nodes, kind=kind), started_fallback=0.0))


class Hands:
    """The lifecycle's effects with a way onto the node: each retest is a run recorded into the
    store, failing or passing as the scenario says."""

    acts = True

    def __init__(self, store: Store, days: list[float], result: dict):
        self.store, self.days, self.result = store, days, result

    def can(self, action: Action) -> bool:
        return True

    def view(self, node: str) -> Scheduler:
        return OURS

    def __call__(self, action: Action) -> str | None:
        if action.kind == "retest":
            record(self.store, action.detail["run"], self.days.pop(0), {action.node: self.result})
        return None


def healthcheck_run(store: Store, node: str, d: float, verdict: dict, drained_by_us: str | None = None) -> None:
    """One healthcheck of ``node``: its run recorded, then what its rule does to the node's Slurm
    state, recorded as cmd_healthcheck records it (a minute after the run began)."""
    run_id = f"healthcheck-{node}-{d:g}"
    record(store, run_id, d, {node: verdict}, kind="healthcheck")
    state = UNDRAINED
    if drained_by_us:
        line = (SLURM / "scontrol-show-node-drained.txt").read_text()
        state = parse_show_node(line.replace("Reason=someone else: bad fan", f"Reason={drained_by_us}"))[0]["n2"]
    status = "fail" if verdict.get("fail") else "pass"
    action = healthcheck.decide(status, (verdict.get("causes") or [None])[0], run_id, state)
    event = healthcheck.event_of(action, node, run_id)
    if event:
        with Store.open(store.url) as again:
            again.add_event(event["node"], event["kind"], event["actor"], event["reason"], event["run_id"],
                            at=day(d) + 60)


def build(url: str) -> None:
    with Store.open(parse(url)) as store:
        # a1: an ECC error drains at once; the next pass resets the idle node, retests and resumes it.
        record(store, "r1", 1.0, {"a1": ECC, "a2": ECC})
        controller.run_pass(store, POLICY, TIMINGS, day(1.001), Hands(store, [], {}), "test", nodes=["a1", "a2"],
                            scheduler={"a1": IDLE, "a2": IDLE})
        controller.run_pass(store, POLICY, TIMINGS, day(1.02), Hands(store, [1.03], {}), "test", nodes=["a1"],
                            scheduler={"a1": OURS})
        # a2: its retest fails with its cause: the reset's outcome is `returned`, and with no step left
        # a person decides (the second pass finds it escalated already).
        hands = Hands(store, [1.03, 1.05], ECC)
        for d in (1.02, 1.04):
            controller.run_pass(store, POLICY, TIMINGS, day(d), hands, "test", nodes=["a2"], scheduler={"a2": OURS})
        # c1: a fault only a person can fix, under a lifecycle without a scheduler; a person clears it.
        record(store, "r2", 1.5, {"c1": THERMAL})
        record(store, "r3", 1.51, {"c1": THERMAL})
        for d in (1.501, 1.511):
            controller.run_pass(store, POLICY, TIMINGS, day(d), ForAPerson(), "test", nodes=["c1"])
        # h1: two failing healthchecks before Slurm was asked, then drained; passes, resumed; stays well.
        healthcheck_run(store, "h1", 2.0, NVLINK, drained_by_us="someone else: bad fan")  # not ours: left alone
        healthcheck_run(store, "h1", 2.1, NVLINK)
        healthcheck_run(store, "h1", 2.5, {}, drained_by_us="preflight: nvlink-down healthcheck-h1-2.1")
        # h2: drained, resumed, drained again two days later for the same cause (returned), still drained.
        healthcheck_run(store, "h2", 2.0, NVLINK)
        healthcheck_run(store, "h2", 3.0, {}, drained_by_us="preflight: nvlink-down healthcheck-h2-2")
        healthcheck_run(store, "h2", 5.0, NVLINK)
        # h3: drained, failing again while drained (a second drain event), then resumed.
        healthcheck_run(store, "h3", 3.0, NVLINK)
        healthcheck_run(store, "h3", 3.1, NVLINK, drained_by_us="preflight: nvlink-down healthcheck-h3-3")
        healthcheck_run(store, "h3", 4.0, {}, drained_by_us="preflight: nvlink-down healthcheck-h3-3.1")
        # h4: resumed two days before the end: its week is not over.
        healthcheck_run(store, "h4", 17.5, NVLINK)
        healthcheck_run(store, "h4", 18.0, {}, drained_by_us="preflight: nvlink-down healthcheck-h4-17.5")
        # h5: resumed, then a run diagnoses its cause again (no drain: Slurm was not asked).
        healthcheck_run(store, "h5", 6.0, NVLINK)
        healthcheck_run(store, "h5", 6.5, {}, drained_by_us="preflight: nvlink-down healthcheck-h5-6")
        record(store, "r4", 9.0, {"h5": NVLINK})
        # h6: a healthcheck drains on its reading, and the lifecycle's next pass drains it on that same
        # reading (one reading acted on twice: no new evidence); the next healthcheck passes and resumes it.
        healthcheck_run(store, "h6", 7.0, ECC)
        controller.run_pass(store, POLICY, TIMINGS, day(7.01), Hands(store, [], {}), "test", nodes=["h6"],
                            scheduler={"h6": OURS})
        healthcheck_run(store, "h6", 7.5, {}, drained_by_us="preflight: gpu-ecc-uncorrectable healthcheck-h6-7")
        record(store, "r9", 19.9, {n: {} for n in ("a1", "h1", "h3", "h4", "h5", "w1")})
    assert main(["lifecycle", "c1", "--clear", "--reason", "fans replaced", "--db", url]) == 0


_databases = itertools.count()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def built(request, tmp_path_factory) -> str:
    """The scenario's store on each engine, built once for the tests that read it."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('drains') / 'store.sqlite'}"
    else:
        url = request.getfixturevalue("pg").create_database(f"precision{next(_databases)}")
    build(url)
    return url


def test_each_drain_made_by_real_code_is_judged_by_the_definitions(built):
    with Store.open(parse(built), create=False) as store:
        end = reads.latest(store)
        p = fleet(store, Window(day(0), end))["precision"]
        firsts = {n: v for n, v in store.rows("SELECT host, MIN(started) FROM pf_host_results GROUP BY host")}
    by = {c["cause"]: c for c in p["causes"]}
    assert set(by) == {"gpu-ecc-uncorrectable", "thermal-throttling", "nvlink-down"}
    ecc, thermal, nvlink = by["gpu-ecc-uncorrectable"], by["thermal-throttling"], by["nvlink-down"]
    # a1 cleared by its reset, a2's reset returned; h6 drained twice on one reading, resumed with no
    # step: unconfirmed.
    assert (ecc["drains"], ecc["confirmed"], ecc["unconfirmed"]) == (3, 2, 1)
    assert {k: ecc["confirmed_by"][k] for k in ("step", "escalated", "retest_failed", "returned")} == {
        "step": 1, "escalated": 0, "retest_failed": 0, "returned": 1}
    assert ecc["to_drain"]["n"] == 3 and ecc["to_drain"]["p50_s"] == pytest.approx(0.001 * 86400, abs=1)
    assert ecc["to_resume"]["n"] == 2 and ecc["to_resume"]["p50_s"] == pytest.approx(0.019 * 86400, abs=1)
    # c1: drained for a person (no scheduler), then cleared by one.
    assert (thermal["drains"], thermal["cleared"], thermal["confirmed"]) == (1, 1, 0)
    # nvlink-down: h1 unconfirmed; h2's first returned, its second open; h3 failed again while drained;
    # h4 pending; h5 returned through a reading alone.
    assert {k: nvlink[k] for k in ("drains", "confirmed", "unconfirmed", "open", "pending", "cleared")} == {
        "drains": 6, "confirmed": 3, "unconfirmed": 1, "open": 1, "pending": 1, "cleared": 0}
    assert nvlink["confirmed_by"] == {"escalated": 0, "retest_failed": 1, "step": 0, "returned": 2}
    assert nvlink["precision"] == 0.75
    # h1's first failing reading was the healthcheck of day 2.0, whose drain Slurm's state prevented.
    assert nvlink["to_drain"]["p90_s"] == pytest.approx(0.1 * 86400 + 60, abs=1)
    assert nvlink["to_drain"]["p50_s"] == pytest.approx(60, abs=1)
    # The fleet: every node from its first reading to the window's end.
    assert p["drains"] == 10 and p["confirmed"] == 5 and p["unconfirmed"] == 2
    node_days = sum(end - first for first in firsts.values()) / 86400
    assert p["node_days"] == pytest.approx(node_days, abs=1e-3)
    assert p["unconfirmed_per_100_node_days"] == pytest.approx(200 / node_days, abs=1e-3)


def test_the_window_counts_the_drains_that_began_in_it(built):
    """From day 2.05 on: a1's, a2's, c1's and the healthchecks' drains of day 2.0 began before it;
    h1's drain of day 2.1 and the later ones (five of nvlink-down, h6's) are the window's. A drain open when the window starts
    is continued, not counted (h2's resume on day 3 ends one that began before)."""
    with Store.open(parse(built), create=False) as store:
        p = fleet(store, Window(day(2.05), reads.latest(store)))["precision"]
    assert p["drains"] == 6 and [c["cause"] for c in p["causes"]] == ["nvlink-down", "gpu-ecc-uncorrectable"]


def test_a_shorter_look_ahead_on_the_command_line(built, capsys):
    """--returns-within 1d: h2's and h5's causes came back two and more days after their resumes,
    too late to confirm them; h4's day is over."""
    assert main(["history", "--fleet", "--since", "30d", "--json", "--returns-within", "1d", "--db", built]) == 0
    p = json.loads(capsys.readouterr().out)["precision"]
    nvlink = next(c for c in p["causes"] if c["cause"] == "nvlink-down")
    assert (nvlink["unconfirmed"], nvlink["pending"], nvlink["confirmed_by"]["returned"]) == (4, 0, 0)
    assert p["returns_within_s"] == 86400
    # The keys docs/store.md's contract names, no more, no fewer.
    drains = {"drains", "confirmed", "unconfirmed", "pending", "open", "cleared", "confirmed_by", "precision",
              "to_drain", "to_resume"}
    assert set(p) == drains | {"returns_within_s", "node_days", "unconfirmed_per_100_node_days", "causes"}
    assert all(set(c) == drains | {"cause"} for c in p["causes"])
    assert set(p["to_drain"]) == set(p["to_resume"]) == {"n", "p50_s", "p90_s"}
    assert set(p["confirmed_by"]) == {"escalated", "retest_failed", "step", "returned"}
    assert main(["history", "--fleet", "--since", "30d", "--db", built]) == 0
    text = capsys.readouterr().out
    assert "precision of the drains (unconfirmed: resumed with no step and the cause away 7 d):" in text
    assert "10 drain(s): 5 confirmed (0 escalated, 1 retest failed, 1 after a step, 3 returned), 2 unconfirmed" in text
    assert "cause nvlink-down: 6 drain(s)" in text


def test_a_fleet_without_drains_says_so(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with Store.open(parse(url)) as store:
        record(store, "r1", 19.0, {"n1": {}, "n2": NVLINK})
    assert main(["history", "--fleet", "--since", "30d", "--db", url]) == 0
    assert "precision of the drains: no drain by preflight began in the window" in capsys.readouterr().out
    assert main(["history", "--fleet", "--since", "30d", "--json", "--db", url]) == 0
    p = json.loads(capsys.readouterr().out)["precision"]
    assert (p["drains"], p["precision"], p["causes"], p["to_drain"]["p50_s"]) == (0, None, [], None)
    assert p["unconfirmed_per_100_node_days"] == 0.0 and p["node_days"] > 1.9  # two nodes, a day or more each


@pytest.mark.parametrize("value", ["0d", "week", "1y", "99999d"])
def test_a_look_ahead_that_is_no_length_of_time_is_bad_usage(value, tmp_path, capsys):
    assert main(["history", "--fleet", "--returns-within", value, "--db", f"sqlite:///{tmp_path}/s.sqlite"]) == 2
    assert f"--returns-within: {value!r} is not a length of time above zero" in capsys.readouterr().err
    assert not (tmp_path / "s.sqlite").exists()


def test_the_healthcheck_records_what_it_did():
    drained = healthcheck.event_of(healthcheck.Action("drain", "preflight: xid hc-1", "failed"), "n1", "hc-1")
    assert drained == {"node": "n1", "kind": "drain", "actor": "healthcheck", "reason": "preflight: xid hc-1",
                       "run_id": "hc-1"}
    assert healthcheck.event_of(healthcheck.Action("none", why="healthy"), "n1", "hc-2") is None


# ---- the fleet page ------------------------------------------------------------------------------

def precision_page(url: str) -> str:
    with Store.open(parse(url), create=False) as store:
        window = Window(day(0), reads.latest(store))
        result = fleet(store, window)
        return render_fleet(result, fleet_series(store, window, result))


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('page') / 'drains.sqlite'}"
    build(url)
    return precision_page(url)


def test_the_fleet_page_has_the_precision_table(page):
    section = page[page.index('<section id="precision">'):]
    section = section[:section.index("</section>")]
    assert '<a href="#precision">Precision</a>' in page
    rows = re.findall(r"<tr>(.*?)</tr>", section)
    cells = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r) for r in rows]
    assert cells[0][:9] == ["cause", "drains", "confirmed", "because", "unconfirmed", "pending", "open", "cleared",
                            "precision"]
    fleet_row = cells[1]
    assert fleet_row[:3] == ["<b>fleet</b>", "10", "5"]
    assert fleet_row[3] == '<span class="muted">1 retest failed, 1 after a step, 3 returned</span>'
    assert fleet_row[4:9] == ["2", "1", "1", "1", "71.4%"]
    nvlink = next(c for c in cells[2:] if c[0] == "<code>nvlink-down</code>")
    assert nvlink[1] == "6" and nvlink[8] == "75.0%" and nvlink[9] == "60 s" and nvlink[10] == "2.4 h"
    assert "unconfirmed drains per 100 node-days" in section


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_the_precision_table_renders_in_headless_chromium(page, tmp_path):
    path = tmp_path / "fleet.html"
    path.write_text(page)
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", path.as_uri()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dom, err = proc.communicate(timeout=60)
    assert console_lines(err) == []
    section = dom[dom.index('<section id="precision">'):]
    assert section.index("</table>") > section.index("<code>nvlink-down</code>") > 0
    assert "<code>gpu-ecc-uncorrectable</code>" in section and "<code>thermal-throttling</code>" in section


def test_the_precision_reads_follow_the_drains_not_the_runs(store_url, monkeypatch):
    """120 daily runs of four nodes, one drained and resumed in the last month: over 30 days and
    over all 120 the precision reads the same rows (the passing runs are never fetched)."""
    with Store.open(parse(store_url)) as store:
        for d in range(120):
            nodes = {f"gpu{i:02d}": {} for i in range(4)}
            if d == 100:
                nodes["gpu02"] = NVLINK
            record(store, f"d{d:03d}", d - 100, nodes)
            if d in (100, 101):
                healthcheck_run(store, "gpu02", d - 100 + 0.5, NVLINK if d == 100 else {},
                                drained_by_us=None if d == 100 else "preflight: nvlink-down healthcheck-gpu02-0.5")
        end = reads.latest(store)
        sizes = fetched(store, monkeypatch)
        month = reads.precision(store, end - 30 * 86400, end)
        read_month = sum(sizes)
        sizes.clear()
        year = reads.precision(store, 0, end)
        read_year = sum(sizes)
    assert month["drains"] == year["drains"] == 1 and month["unconfirmed"] == 1
    assert read_year <= read_month, (read_month, read_year)


def test_a_hostile_cause_from_a_drain_reason_is_shown_as_data(tmp_path, capsys):
    """A drain reason is whatever the event holds: its cause word reaches the page escaped and the
    terminal as its escapes."""
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    bad = "<img\x1b[31m>"
    with Store.open(parse(url)) as store:
        record(store, "r1", 18.0, {"n1": NVLINK})
        store.add_event("n1", "drain", "test", f"preflight: {bad} r1", "r1", at=day(18.0) + 60)
    assert main(["history", "--fleet", "--since", "30d", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "cause <img\\x1b[31m>: 1 drain(s)" in out
    with Store.open(parse(url), create=False) as store:
        window = Window(day(0), reads.latest(store))
        result = fleet(store, window)
        html = render_fleet(result, fleet_series(store, window, result))
    assert "<img" not in html and "<code>&lt;img\x1b[31m&gt;</code>" in html
