"""The soak's RDMA counters (preflight/soak/ib.py, checks/soak.py ``soak-ib-counters``) on readings
built from the real mlx5 sysfs capture (tests/fixtures/corpus/ibcounters, provenance in
MANIFEST.tsv): its saturated counters at 0, as they read after a clear, and each test's growth or
state change set in the readings it names (constructed for the test, named in each test). The
readings are in the agent's ib-counters.txt form (preflight/node/ib_snapshots.py ``block``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import soak_scenarios as S

from preflight.app.cli import main
from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Finding, Status
from preflight.node.ib_snapshots import block
from preflight.parse import ParseError
from preflight.parse.ib_counters import parse_ib_series
from preflight.soak import ib
from preflight.soak.data import SoakDataError, SoakMeta, write_soak
from preflight.soak.judge import judge_soak
from preflight.soak.plots import error_growth

CAPTURE = (Path(__file__).parents[1] / "fixtures" / "corpus" / "ibcounters"
           / "mlx5-sysfs-counters-saturated-link-downed-xmit-discards-gpud943.txt").read_text().splitlines()
CLEARED = ("link_downed", "port_xmit_discards", "excessive_buffer_overrun_errors")
PORT = "/sys/class/infiniband/mlx5_1/ports/1"
T0 = 1764600000.0
KB = load_knowledge()


def reading(state: str = "ACTIVE", phys: str = "LINKUP", **values: int) -> list[str]:
    """The capture's lines, its saturated counters at 0, ``values`` set, and the port's state."""
    lines = []
    for line in CAPTURE:
        path, _, value = line.rpartition(":")
        name = path.rsplit("/", 1)[-1]
        lines.append(f"{path}:{values.get(name, 0 if name in CLEARED else value)}")
    state_no = {"ACTIVE": 4, "DOWN": 1, "INIT": 2}[state]
    phys_no = {"LINKUP": 5, "POLLING": 2, "DISABLED": 3}[phys]
    return lines + [f"{PORT}/state:{state_no}: {state}", f"{PORT}/phys_state:{phys_no}: {phys}",
                    f"{PORT}/link_layer:InfiniBand"]


def series(*readings: list[str], every_s: float = 300.0, host: str = "gpu01") -> str:
    phases = ["before"] + ["during"] * (len(readings) - 2) + ["after"]
    return "".join(block(host, T0 + i * every_s, phase, lines)
                   for i, (phase, lines) in enumerate(zip(phases, readings, strict=True)))


def judge(text: str, host: str = "gpu01"):
    return ib.ib_counters(host, parse_ib_series(text).of(host))


def test_counters_that_do_not_move_pass():
    o = judge(series(*[reading()] * 4))
    assert o.status is Status.PASS
    assert o.summary.startswith("1 active port(s), 4 readings over 15.0 min: no error counter grew")
    assert "port_rcv_switch_relay_errors" not in o.summary  # not an error counter the rules judge
    assert o.data["grew"] == {} and o.data["flaps"] == [] and o.data["readings"] == 4


def test_growth_is_judged_on_the_window_with_the_run_checks_rules_and_says_when():
    # link_downed 0 -> 1 between the second and third readings (5-10 min) and no further.
    o = judge(series(reading(), reading(), reading(link_downed=1), reading(link_downed=1)))
    assert o.status is Status.FAIL and o.symptoms == ("ib-link-flapping",)
    assert "mlx5_1 port 1 link_downed +1 (0 -> 1): the link went down and retrained" in o.summary
    assert "grew in 1 of 3 interval(s): +1 at 5-10 min" in o.summary
    assert o.data["flaps"] == ["mlx5_1 port 1"]
    assert o.data["intervals"] == [{"start_s": 300.0, "end_s": 600.0, "grew": {"mlx5_1 port 1 link_downed": 1},
                                    "flaps": ["mlx5_1 port 1"]}]
    assert {d.cause for d in diagnose([_finding(o)], KB)} == {"ib-link-flapping"}


def test_a_link_that_went_down_and_came_back_between_readings_is_a_flap():
    # The first and last readings agree; the middle one saw the port DOWN/POLLING.
    o = judge(series(reading(), reading("DOWN", "POLLING"), reading()))
    assert o.status is Status.FAIL and o.symptoms == ("ib-link-flapping",)
    assert "mlx5_1 port 1 changed state at 0-5 min: ACTIVE/LINKUP -> DOWN/POLLING (the link flapped and came " \
           "back)" in o.summary
    # A port that went down and stayed down: the window's change of state, and when it happened.
    down = judge(series(reading(), reading(), reading("DOWN", "POLLING"), reading("DOWN", "POLLING")))
    assert down.status is Status.FAIL and down.symptoms == ("ib-link-flapping", "ib-port-down")
    assert "changed state during the soak: ACTIVE/LINKUP -> DOWN/POLLING; first seen at 5-10 min" in down.summary
    # The window's own comparison alone would have passed it.
    assert ib.ib_counters("gpu01", parse_ib_series(series(reading(), reading())).of("gpu01")).status is Status.PASS


def test_symbol_errors_faster_than_the_ibta_bound_over_the_soak_fail():
    # 40 symbol errors over 15 minutes: 160/hour > 120.
    o = judge(series(reading(), reading(symbol_error=10), reading(symbol_error=40), reading(symbol_error=40)))
    assert o.status is Status.FAIL and o.symptoms == ("ib-link-errors",)
    assert "symbol_error +40 (0 -> 40, 160/hour)" in o.summary
    assert "grew in 2 of 3 interval(s): +10 at 0-5 min, +30 at 5-10 min" in o.summary
    assert o.data["symbol_error_per_hour"] == {"mlx5_1 port 1": 160.0}
    assert o.data["peak_symbol_error_per_hour"] == {"mlx5_1 port 1": 360.0}


def test_a_burst_of_symbol_errors_in_one_interval_fails_though_the_hours_average_is_under_the_bound():
    # An hour in 5-minute readings; 20 symbol errors in the 25-30 minute interval: 20/hour over the
    # soak (a warning by the window's rule), 240/hour in that interval.
    readings = [reading(symbol_error=0 if i <= 5 else 20) for i in range(13)]
    o = judge(series(*readings))
    assert o.status is Status.FAIL and o.symptoms == ("ib-link-errors",)
    assert "symbol_error +20 (0 -> 20, 20/hour)" in o.summary
    assert "mlx5_1 port 1 symbol_error +20 at 25-30 min (240/hour, above the IBTA bound of 120/hour in that " \
           "interval" in o.summary
    # Fewer than MIN_FOR_RATE errors in that interval is not yet a rate: it only warns.
    few = [reading(symbol_error=0 if i <= 5 else 5) for i in range(13)]
    assert judge(series(*few)).status is Status.WARN


def test_a_node_without_rdma_devices_skips_and_says_so():
    o = judge(series([], [], []))
    assert o.status is Status.SKIP and o.summary.startswith("no RDMA device:")


def test_ports_without_a_readable_counter_skip():
    # The real i40iw capture: every counter "N/A (no PMA)" (iWARP without a performance agent).
    na = (Path(__file__).parents[1] / "fixtures" / "corpus" / "ibcounters" /
          "i40iw-sysfs-counters-na-no-pma-excerpt.txt").read_text().splitlines()
    o = judge(series(na, na))
    assert o.status is Status.SKIP and o.summary.startswith("the RDMA ports expose no readable counter (")


def test_one_reading_only_is_not_a_pass():
    text = block("gpu01", T0, "before", reading())
    o = judge(text)
    assert o.status is Status.SKIP and "one reading of the RDMA counters only (before)" in o.summary


def test_a_cut_block_is_dropped_with_a_note_and_a_bad_header_names_its_line(tmp_path):
    text = series(reading(), reading())
    cut = text + block("gpu01", T0 + 900, "after", reading())[:200]
    parsed = parse_ib_series(cut)
    assert len(parsed.readings) == 2 and "has no '# end'" in parsed.notes[0]
    with pytest.raises(ParseError, match=r"^line 1: expected '# preflight-ib-counters/1"):
        parse_ib_series("garbage\n" + text)
    bad = text.replace("time=1764600300.000", "time=soon")
    with pytest.raises(ParseError, match=r"line \d+: time 'soon' is not a number"):
        parse_ib_series(bad)
    (tmp_path / "ib-counters.txt").write_text(bad)
    with pytest.raises(SoakDataError, match=r"ib-counters.txt:\d+: time 'soon' is not a number"):
        ib.read_readings(tmp_path)


def _soak_dir(tmp_path, ib_text: str | None):
    tele, thr = S.real_frames("gpu01")
    soak = write_soak(tmp_path / "soak", SoakMeta("burn", S.START.isoformat(), ("gpu01",)), pd.concat([tele]),
                      pd.concat([thr]))
    if ib_text is not None:
        (soak / "ib-counters.txt").write_text(ib_text)
    return soak


def test_the_soak_analysis_reports_the_finding_the_diagnosis_and_the_soak_section(tmp_path):
    soak = _soak_dir(tmp_path, series(reading(), reading("DOWN", "POLLING"), reading()))
    analysis = judge_soak(soak, KB, plots_dir=tmp_path / "plots")
    assert (tmp_path / "plots" / "soak-gpu01.png").stat().st_size > 0
    [f] = [f for f in analysis.findings if f.check == "soak-ib-counters"]
    assert f.host == "gpu01" and f.status is Status.FAIL and f.evidence[0].probe == "ib-counters.txt"
    assert "ib-link-flapping" in {d.cause for d in analysis.diagnoses}
    section = analysis.meta["soak"]["gpu01"]["ib_counters"]
    assert section["readings"] == 3 and section["flaps"] == ["mlx5_1 port 1"]
    # And through the command line: exit 1, the finding in report.json and report.md.
    out = tmp_path / "reports"
    assert main(["analyze", str(soak), "--out", str(out), "-q"]) == 1
    [run] = out.iterdir()
    report = json.loads((run / "report.json").read_text())
    assert report["soak"]["gpu01"]["ib_counters"]["flaps"] == ["mlx5_1 port 1"]
    assert "the link flapped and came back" in (run / "report.md").read_text()


def test_a_soak_without_readings_has_no_ib_finding_and_a_damaged_file_is_refused(tmp_path, capsys):
    analysis = judge_soak(_soak_dir(tmp_path, None), KB)
    assert not [f for f in analysis.findings if f.check == "soak-ib-counters"]
    assert "ib_counters" not in analysis.meta["soak"]["gpu01"]
    soak = _soak_dir(tmp_path / "2", "# preflight-ib-counters/1 host=gpu01 time=x phase=before\n")
    assert main(["analyze", str(soak), "--out", str(tmp_path / "r"), "-q"]) == 2
    assert "ib-counters.txt:1: time 'x' is not a number" in capsys.readouterr().err


def _finding(o):
    return Finding("soak-ib-counters", o.host, o.status, o.summary, o.symptoms, o.evidence, o.data, o.action)


def test_the_plot_draws_each_ports_error_growth_where_it_grew():
    readings = parse_ib_series(series(reading(), reading(symbol_error=10), reading(symbol_error=40, link_downed=1),
                                      reading(symbol_error=40, link_downed=1))).of("gpu01")
    assert error_growth(readings) == {"mlx5_1 port 1": [(T0, 0), (T0 + 300, 10), (T0 + 600, 41), (T0 + 900, 41)]}
    # Nothing grew: no fifth panel.
    assert error_growth(parse_ib_series(series(*[reading()] * 3)).of("gpu01")) == {}
