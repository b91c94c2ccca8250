"""Soak files that break the contract are refused with file, line and field, never a crash or
a report.json that is not JSON; odd but possible recordings are read with a note
(preflight/soak/data.py). The soak is the real five-minute H200 burn of examples/h200-soak-5min,
its telemetry edited as a corrupt file or a broken converter would leave it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from preflight.app.cli import main
from preflight.soak.data import ANALYSIS_COLUMNS, SoakDataError, read_soak


def _edit_cell(soak: Path, line: int, column: str, value: str) -> None:
    path = soak / "telemetry.csv"
    lines = path.read_text().split("\n")
    header = lines[0].split(",")
    cells = lines[line - 1].split(",")
    cells[header.index(column)] = value
    lines[line - 1] = ",".join(cells)
    path.write_text("\n".join(lines))


@pytest.mark.parametrize(("column", "value", "said"), [
    ("temperature_c", "inf", "inf is not a finite number"),
    ("temperature_c", "-inf", "-inf is not a finite number"),
    ("power_w", "Infinity", "is not a finite number"),
    ("sm_clock_mhz", "-1500", "-1500 is outside what a reading can be (0 to 100000)"),
    ("utilization_pct", "250", "250 is outside what a reading can be (0 to 100)"),
    ("gpu", "1e20", "1e+20 is outside what a reading can be (0 to 4095)"),
    ("time", "inf", "inf is not a finite number"),
    # Issue 26: these two ended in pandas' IntCastingNaNError; the huge one printed numpy's
    # "invalid value encountered in cast" and was judged on wrapped bits.
    ("clocks_event_reasons", "inf", "inf is not a bitmask (not a finite number)"),
    ("clocks_event_reasons", "-Infinity", "-inf is not a bitmask (not a finite number)"),
    ("clocks_event_reasons", "1e30", "1e+30 sets bits no reading has (above 2**53"),
    ("clocks_event_reasons", "0xFFFFFFFFFFFFFFFF", "'0xFFFFFFFFFFFFFFFF' sets bits no reading has"),
])
def test_non_finite_or_impossible_values_are_refused_with_their_line(soak, tmp_path, capsys, column, value, said):
    _edit_cell(soak, 40, column, value)
    with pytest.raises(SoakDataError) as exc:
        read_soak(soak)
    assert str(exc.value).startswith(f"{soak / 'telemetry.csv'}:40: {column}: ") and said in str(exc.value)
    assert main(["analyze", str(soak), "--out", str(tmp_path / "out"), "-q"]) == 2
    assert not (tmp_path / "out").exists()


def test_the_largest_bitmask_read_is_judged_without_warning_noise(soak, tmp_path, capsys):
    """An unknown bit as high as the reader holds exactly is reported as itself, with no numpy warning."""
    _edit_cell(soak, 40, "clocks_event_reasons", str(2**53 - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["analyze", str(soak), "--out", str(tmp_path / "out"), "-q"]) in (0, 1)
    assert "Warning" not in capsys.readouterr().err
    [report] = (tmp_path / "out").glob("*/report.json")
    seen = json.loads(report.read_text())["soak"]["vm"]["throttle_reasons_seen"]
    assert "unknown_bit_0x10000000000000" in seen, seen


def test_a_telemetry_file_that_is_not_utf8(soak):
    path = soak / "telemetry.csv"
    path.write_bytes(path.read_bytes().replace(b",vm,", b",v\xffm,", 1))
    with pytest.raises(SoakDataError, match="telemetry.csv: not UTF-8 text"):
        read_soak(soak)


@pytest.mark.parametrize("name", ["telemetry.csv", "throughput.csv", "soak.json", "events.csv"])
def test_a_directory_in_place_of_a_file(soak, name):
    (soak / name).unlink()
    (soak / name).mkdir()
    if name == "events.csv":
        read_soak(soak)  # optional, read as no events
        return
    with pytest.raises(SoakDataError, match="not a file|cannot read"):
        read_soak(soak)


def test_time_going_backwards_is_noted(soak):
    lines = (soak / "telemetry.csv").read_text().split("\n")
    lines[30], lines[31] = lines[31], lines[30]
    (soak / "telemetry.csv").write_text("\n".join(lines))
    notes = read_soak(soak).notes
    assert any(n.startswith("telemetry.csv:32: vm GPU 0: time goes back") for n in notes), notes


def test_a_gpu_appearing_mid_run_is_noted(soak):
    lines = (soak / "telemetry.csv").read_text().split("\n")
    late = [ln.replace(",vm,0,", ",vm,1,", 1) for ln in lines[100:200]]
    (soak / "telemetry.csv").write_text("\n".join(lines[:-1] + late + [""]))
    notes = read_soak(soak).notes
    assert any("vm GPU 1 first appears" in n for n in notes), notes


def test_report_json_of_an_odd_soak_is_strict_json(soak, tmp_path):
    # Every memory reading empty: figures that cannot be computed are null, never NaN.
    assert main(["analyze", str(soak), "--out", str(tmp_path / "out"), "-q", "--no-html"]) == 0
    text = next((tmp_path / "out").glob("*/report.json")).read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"report.json holds {c}"))


# Issue 26: the reader noted these in report.json's soak_notes only, and the soak-telemetry
# verdict read as if nothing had happened.

def _telemetry_finding(soak: Path, tmp_path: Path) -> dict:
    out = tmp_path / "out"
    main(["analyze", str(soak), "--out", str(out), "-q", "--no-html"])
    [report] = out.glob("*/report.json")
    return next(f for f in json.loads(report.read_text())["findings"] if f["check"] == "soak-telemetry")


def test_a_clock_that_steps_back_is_said_in_the_telemetry_verdict(soak, tmp_path):
    """The real 5-minute soak with the node's clock stepped back 10 s at line 201 (every later
    row's time 10 s lower, as an NTP step would leave them)."""
    path = soak / "telemetry.csv"
    lines = path.read_text().split("\n")
    for i in range(200, len(lines)):
        if lines[i]:
            t, rest = lines[i].split(",", 1)
            lines[i] = f"{float(t) - 10:.3f},{rest}"
    path.write_text("\n".join(lines))
    finding = _telemetry_finding(soak, tmp_path)
    assert finding["status"] == "pass"
    # 9 s back: the 10 s step less the 1 s between the two samples.
    assert ("time went back 1 time on GPU 0 (up to 9.0 s, first at telemetry.csv:201): rows sorted by time, "
            "so what was measured across a step is uncertain") in finding["summary"], finding["summary"]
    assert finding["data"]["time_steps_back"] == {"0": 1}


def test_a_gpu_that_first_appears_halfway_is_judged_on_its_own_coverage(soak, tmp_path):
    """The real soak's second half of rows repeated as GPU 1: GPU 1 joined 150 s into a 300 s soak."""
    path = soak / "telemetry.csv"
    lines = path.read_text().rstrip("\n").split("\n")
    late = [ln.replace(",vm,0,", ",vm,1,", 1) for ln in lines[151:]]
    path.write_text("\n".join(lines + late) + "\n")
    finding = _telemetry_finding(soak, tmp_path)
    assert finding["status"] == "error" and finding["symptoms"] == ["soak-incomplete"]
    assert finding["summary"].startswith("soak incomplete on a GPU: GPU 1 first sampled at +2.5 min, so it covered "
                                         "2.5 min of the planned 5.0 min"), finding["summary"]
    assert list(finding["data"]["gpus_incomplete"]) == ["1"]


def test_unknown_extra_fields_are_named_once(soak):
    meta = json.loads((soak / "soak.json").read_text())
    meta["site_rack"] = "r12"
    (soak / "soak.json").write_text(json.dumps(meta))
    for name, column in (("telemetry.csv", "fan_speed_pct"), ("throughput.csv", "batch_id")):
        path = soak / name
        lines = path.read_text().split("\n")
        lines = [lines[0] + f",{column}"] + [ln + ",1" if ln else ln for ln in lines[1:]]
        path.write_text("\n".join(lines))
    notes = read_soak(soak).notes
    named = [n for n in notes if "kept but not read" in n]
    assert named == [
        "soak.json: fields not in preflight-soak/1 or preflight's writers, kept but not read (a newer writer's?): "
        "site_rack",
        "telemetry.csv: columns not in preflight-soak/1 or preflight's writers, kept but not read (a newer "
        "writer's?): fan_speed_pct",
        "throughput.csv: columns not in preflight-soak/1 or preflight's writers, kept but not read (a newer "
        "writer's?): batch_id",
    ], notes


def test_the_soaks_notes_reach_report_md(soak, tmp_path):
    meta = json.loads((soak / "soak.json").read_text())
    meta["site_rack"] = "r12"
    (soak / "soak.json").write_text(json.dumps(meta))
    out = tmp_path / "out"
    assert main(["analyze", str(soak), "--out", str(out), "-q", "--no-html"]) == 0
    [md] = out.glob("*/report.md")
    text = md.read_text()
    assert "## Notes on the soak data" in text and "kept but not read (a newer writer's?): site_rack" in text


def test_a_clock_step_that_shortens_the_span_is_named_in_the_incomplete_verdict(soak, tmp_path):
    """The real soak's clock stepped back 60 s at line 201: the samples span 4 minutes of a
    5-minute plan, and the verdict says why the span may be short."""
    path = soak / "telemetry.csv"
    lines = path.read_text().split("\n")
    for i in range(200, len(lines)):
        if lines[i]:
            t, rest = lines[i].split(",", 1)
            lines[i] = f"{float(t) - 60:.3f},{rest}"
    path.write_text("\n".join(lines))
    finding = _telemetry_finding(soak, tmp_path)
    assert finding["status"] == "error" and finding["symptoms"] == ["soak-incomplete"]
    assert "the node's clock went back 59.0 s during the soak, so the span of its samples may understate" \
        in finding["summary"], finding["summary"]


# ---- rows with more cells than the header (issue 33) -------------------------------------------
# What a writer leaves when a line was cut off mid-write and the next one appended to it: the real
# soak's line N with the first cells of line N+1 run on after it, as one line.

def _run_on(soak: Path, lines_at: range) -> None:
    path = soak / "telemetry.csv"
    lines = path.read_text().split("\n")
    for n in lines_at:
        lines[n - 1] = lines[n - 1] + "," + lines[n].split(",", 1)[0]
    path.write_text("\n".join(lines))


def test_a_row_with_more_cells_than_the_header_is_named_and_not_read(soak):
    _run_on(soak, range(40, 41))
    healthy = 303
    for columns in (None, ANALYSIS_COLUMNS):  # the analysis reads fewer columns: it was silent there
        data = read_soak(soak, columns=columns)
        assert len(data.telemetry) == healthy - 1
        assert data.notes == ("telemetry.csv: 1 row not read, with more cells (26) than the header's 25 (a line "
                              "cut off mid-write with the next appended to it?): line 40; not judged and not "
                              "counted as covered time",)


def test_lines_after_a_row_not_read_keep_their_numbers(soak):
    _run_on(soak, range(40, 41))
    _edit_cell(soak, 100, "temperature_c", "inf")
    with pytest.raises(SoakDataError) as exc:
        read_soak(soak, columns=ANALYSIS_COLUMNS)
    assert str(exc.value).startswith(f"{soak / 'telemetry.csv'}:100: temperature_c: ")


def test_rows_not_read_at_the_end_are_not_covered_time(soak, tmp_path):
    # The last 20 samples (lines 285-304 of the 5-minute soak) run on: 20 s of the plan unread,
    # more than the 15 s the coverage tolerates, so the soak is incomplete, and says where.
    _run_on(soak, range(285, 304))
    path = soak / "telemetry.csv"
    path.write_text(path.read_text().rstrip("\n") + ",1795950600.0\n")  # the last line too
    finding = _telemetry_finding(soak, tmp_path)
    assert finding["status"] == "error" and finding["symptoms"] == ["soak-incomplete"], finding
    assert "covered 4.7 min of the planned 5.0 min" in finding["summary"], finding["summary"]
    [report] = (tmp_path / "out").glob("*/report.json")
    notes = json.loads(report.read_text())["soak_notes"]
    assert any("20 rows not read" in n and "lines 285-304" in n for n in notes), notes


def test_the_real_soak_has_no_row_not_read(soak):
    assert not [n for n in read_soak(soak, columns=ANALYSIS_COLUMNS).notes if "not read" in n]


def test_a_throughput_row_with_more_cells_is_named_too(soak):
    path = soak / "throughput.csv"
    lines = path.read_text().split("\n")
    lines[9] += "," + lines[10].split(",", 1)[0]
    path.write_text("\n".join(lines))
    data = read_soak(soak)
    assert len(data.throughput) == 239
    assert [n for n in data.notes if n.startswith("throughput.csv: 1 row not read")] and "line 10;" in data.notes[-1]


def test_an_events_row_with_more_cells_is_not_read_and_named(soak):
    # Rows as the agent writes them (time, host, gpu, event, data: an NVML Xid event), the second
    # run on into the third.
    (soak / "events.csv").write_text("time,host,gpu,event,data\n1795950400.5,vm,0,xid,79\n"
                                     "1795950401.5,vm,0,xid,791795950402.5,vm,0,xid,79\n1795950403.5,vm,0,xid,48\n")
    from preflight.soak.data import read_events
    notes: list[str] = []
    rows = read_events(soak, notes)
    assert [r["data"] for r in rows] == ["79", "48"]
    assert notes == ["events.csv: 1 row not read, with more cells (9) than the header's 5 (a line cut off mid-write "
                     "with the next appended to it?): line 3; not judged and not counted as covered time"]


def test_a_first_row_with_more_cells_shifts_no_column(soak):
    # pandas takes one cell too many on the first data line for an index and shifts every column:
    # the run-on line 2 is named like any other, and line 3's sample is read as it was written.
    third = (soak / "telemetry.csv").read_text().split("\n")[2].split(",")
    _run_on(soak, range(2, 3))
    for columns in (None, ANALYSIS_COLUMNS):
        data = read_soak(soak, columns=columns)
        assert len(data.telemetry) == 302 and "line 2;" in data.notes[0]
        first = data.telemetry.iloc[0]
        assert (first["time"], first["host"], int(first["gpu"])) == (float(third[0]), third[1], int(third[2]))
    _edit_cell(soak, 100, "temperature_c", "inf")
    with pytest.raises(SoakDataError, match=r"telemetry\.csv:100: temperature_c: "):
        read_soak(soak, columns=ANALYSIS_COLUMNS)


def test_the_parsers_other_warnings_pass_through_once():
    # Only pandas' "Skipping line" warnings are taken; any other is passed on, once, after the parse
    # (passed on inside the recording block it was recorded again, without end).
    from preflight.soak import bad_rows

    into: list[tuple[int, int, int]] = []
    with pytest.warns(UserWarning, match="another warning") as seen:
        with bad_rows.collected(into):
            warnings.warn("Skipping line 5: expected 3 fields, saw 4\n", stacklevel=1)
            warnings.warn("another warning", stacklevel=1)
    assert into == [(5, 3, 4)] and len(seen) == 1
