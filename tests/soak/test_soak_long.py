"""A long soak's analysis stays bounded without changing a verdict (issue 17, "long soaks stay
cheap"; bench/bench_long_soak.py measures the 72-hour case). The reader parses telemetry.csv
and throughput.csv in chunks into compact columns and the analysis reads only the columns it
judges; these tests hold that to the one-chunk, whole-file reading on real recorded soaks:
the H200 burns (examples/h200-soak-5min, tests/fixtures/h200-device/burn-sdc-150s, both
written on the lent H200) and the vLLM-on-CPU soak (tests/fixtures/vllm-cpu/soak-90s)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from preflight.soak import data as soak_data
from preflight.soak.analysis import analyze
from preflight.soak.data import ANALYSIS_COLUMNS, SoakDataError, read_soak

ROOT = Path(__file__).resolve().parents[2]
REAL = [ROOT / "examples" / "h200-soak-5min", ROOT / "tests" / "fixtures" / "h200-device" / "burn-sdc-150s",
        ROOT / "tests" / "fixtures" / "vllm-cpu" / "soak-90s"]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.png", "*.md"))
    return dst


@pytest.fixture
def two_hosts(tmp_path) -> Path:
    """The five-minute H200 burn as two nodes: its rows repeated under a second host name,
    interleaved in time as a merged fleet file is (only the host field differs)."""
    soak = _copy(REAL[0], tmp_path / "two")
    for name in ("telemetry.csv", "throughput.csv"):
        head, *rows = (soak / name).read_text().splitlines(keepends=True)
        (soak / name).write_text(head + "".join(r + r.replace(",vm,", ",vm2,", 1) for r in rows))
    meta = json.loads((soak / "soak.json").read_text())
    meta["hosts"] = ["vm", "vm2"]
    (soak / "soak.json").write_text(json.dumps(meta))
    return soak


def _analysis(soak: Path) -> tuple:
    result = analyze(read_soak(soak, columns=ANALYSIS_COLUMNS))
    return result.findings, result.soak_section(), result.notes, result.sweeps


@pytest.mark.parametrize("soak", [*REAL, "two_hosts"], ids=["h200-5min", "h200-sdc", "vllm-cpu", "two-hosts"])
def test_reading_in_small_chunks_gives_the_frame_and_the_verdicts_of_one_chunk(soak, request, monkeypatch):
    soak = request.getfixturevalue(soak) if soak == "two_hosts" else soak
    whole = read_soak(soak, columns=ANALYSIS_COLUMNS)
    judged = _analysis(soak)
    monkeypatch.setattr(soak_data, "CHUNK_ROWS", 7)
    chunked = read_soak(soak, columns=ANALYSIS_COLUMNS)
    for a, b in ((whole.telemetry, chunked.telemetry), (whole.throughput, chunked.throughput)):
        pd.testing.assert_frame_equal(a.astype({c: float for c in a.columns if a[c].dtype.kind == "f"}),
                                      b.astype({c: float for c in b.columns if b[c].dtype.kind == "f"}))
    assert whole.notes == chunked.notes
    assert _analysis(soak) == judged
    assert judged[0], "the analysis found nothing to compare"


@pytest.mark.parametrize("soak", REAL[:2], ids=["h200-5min", "h200-sdc"])
def test_compact_columns_hold_every_recorded_value_exactly(soak):
    tele = read_soak(soak).telemetry
    plain = pd.read_csv(soak / "telemetry.csv")
    for col in plain.columns.drop(["host"]):
        np.testing.assert_array_equal(tele[col].to_numpy(float), plain[col].to_numpy(float), err_msg=col)
    # Whole degrees fit a float32; power in mW-precision watts (95.142) does not and stays float64.
    assert tele["temperature_c"].dtype == np.float32 and tele["sm_clock_mhz"].dtype == np.float32
    assert tele["power_w"].dtype == np.float64 and tele["time"].dtype == np.float64


def test_the_analysis_reads_only_the_columns_it_judges_and_judges_the_same():
    soak = REAL[1]
    everything = read_soak(soak)
    judged = read_soak(soak, columns=ANALYSIS_COLUMNS)
    assert "hw_power_brake_ns" in everything.telemetry and "hw_power_brake_ns" not in judged.telemetry
    assert list(judged.telemetry.columns) == list(ANALYSIS_COLUMNS)
    full = analyze(everything)
    assert (full.findings, full.soak_section(), full.notes) == _analysis(soak)[:3]


def test_a_bad_cell_in_a_later_chunk_is_refused_with_its_own_line(tmp_path, monkeypatch):
    soak = _copy(REAL[0], tmp_path / "soak")
    path = soak / "telemetry.csv"
    lines = path.read_text().split("\n")
    lines[199] = lines[199].replace(",vm,0,", ",vm,zero,", 1)
    path.write_text("\n".join(lines))
    monkeypatch.setattr(soak_data, "CHUNK_ROWS", 50)
    with pytest.raises(SoakDataError, match=r"telemetry\.csv:200: gpu: 'zero' is not a number"):
        read_soak(soak)


def test_a_cut_last_line_is_dropped_when_it_ends_the_last_of_many_chunks(tmp_path, monkeypatch):
    soak = _copy(REAL[0], tmp_path / "soak")
    path = soak / "telemetry.csv"
    text = path.read_text()
    rows = text.count("\n") - 1
    path.write_text(text[:-1][: text[:-1].rindex("\n") + 20])  # the agent killed mid-row
    monkeypatch.setattr(soak_data, "CHUNK_ROWS", 50)
    data = read_soak(soak)
    assert len(data.telemetry) == rows - 1
    assert f"telemetry.csv: last line {rows + 1} has no newline (cut off while being written); ignored" in data.notes


def test_rows_not_read_in_several_chunks_keep_every_later_line_number(tmp_path, monkeypatch):
    """Run-on rows (a cut line with the next appended: more cells than the header) in the first
    and third chunks: each is named, and a bad cell after them still names its own line."""
    soak = _copy(REAL[0], tmp_path / "soak")
    path = soak / "telemetry.csv"
    lines = path.read_text().split("\n")
    for n in (30, 130, 131):
        lines[n - 1] += "," + lines[n].split(",", 1)[0]
    lines[249] = lines[249].replace(",vm,0,", ",vm,zero,", 1)
    path.write_text("\n".join(lines))
    monkeypatch.setattr(soak_data, "CHUNK_ROWS", 50)
    with pytest.raises(SoakDataError, match=r"telemetry\.csv:250: gpu: 'zero' is not a number"):
        read_soak(soak, columns=ANALYSIS_COLUMNS)
    lines[249] = lines[249].replace(",vm,zero,", ",vm,0,", 1)
    path.write_text("\n".join(lines))
    with_spill = read_soak(soak, spill_dir=tmp_path / "spill")
    assert [n for n in with_spill.notes if "not read" in n] == [
        "telemetry.csv: 3 rows not read, with more cells (26) than the header's 25 (a line cut off mid-write with "
        "the next appended to it?): lines 30, 130-131; not judged and not counted as covered time"]


def _float64(df: pd.DataFrame) -> pd.DataFrame:
    return df.astype({c: float for c in df.columns if df[c].dtype.kind == "f"}).reset_index(drop=True)


@pytest.mark.parametrize("soak", [*REAL, "two_hosts"], ids=["h200-5min", "h200-sdc", "vllm-cpu", "two-hosts"])
def test_spilled_hosts_are_the_rows_and_the_verdicts_of_the_whole_frame(soak, request, monkeypatch, tmp_path):
    """The analysis keeps each host's rows on disk (hostrows.SpillStore) and reads one back at a
    time; in small chunks, each host's frame, the notes and the whole analysis must be those of
    the frame read whole."""
    soak = request.getfixturevalue(soak) if soak == "two_hosts" else soak
    whole = read_soak(soak, columns=ANALYSIS_COLUMNS)
    monkeypatch.setattr(soak_data, "CHUNK_ROWS", 7)
    spilled = read_soak(soak, columns=ANALYSIS_COLUMNS, spill_dir=tmp_path / "spill")
    assert spilled.telemetry.empty and list(spilled.telemetry.columns) == list(whole.telemetry.columns)
    for a, b in ((whole.telemetry_by_host, spilled.telemetry_by_host),
                 (whole.throughput_by_host, spilled.throughput_by_host)):
        assert sorted(a) == sorted(b)
        for host in a:
            pd.testing.assert_frame_equal(_float64(a[host]), _float64(b[host]))
    assert spilled.notes == whole.notes
    found, judged = analyze(whole), analyze(spilled)
    assert (found.findings, found.soak_section(), found.notes) == (judged.findings, judged.soak_section(),
                                                                   judged.notes)


def test_spilled_reading_notes_time_going_back_with_its_line(tmp_path, monkeypatch):
    soak = _copy(REAL[0], tmp_path / "soak")
    path = soak / "telemetry.csv"
    lines = path.read_text().split("\n")
    lines[100], lines[101] = lines[101], lines[100]  # two samples out of order, in the third chunk
    path.write_text("\n".join(lines))
    monkeypatch.setattr(soak_data, "CHUNK_ROWS", 40)
    notes = read_soak(soak, columns=ANALYSIS_COLUMNS, spill_dir=tmp_path / "spill").notes
    assert [n for n in notes if "time goes back" in n] == ["telemetry.csv:102: vm GPU 0: time goes back 1 s "
                                                          "(1 time); rows sorted by time"]
    assert notes == read_soak(soak, columns=ANALYSIS_COLUMNS).notes


def test_the_analysis_leaves_no_scratch_behind_judged_or_refused(tmp_path, monkeypatch):
    from preflight.diagnose.engine import load_knowledge
    from preflight.soak.judge import judge_soak

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    assert judge_soak(REAL[1], load_knowledge()).findings
    bad = _copy(REAL[0], tmp_path / "bad")
    (bad / "telemetry.csv").write_text((bad / "telemetry.csv").read_text().replace(",vm,0,", ",vm,zero,", 1))
    with pytest.raises(SoakDataError, match=r"telemetry\.csv:2: gpu"):
        judge_soak(bad, load_knowledge())
    assert list(scratch.iterdir()) == []


def test_an_extra_column_text_in_one_chunk_and_numbers_in_the_next_is_left_out_of_the_spill(tmp_path, monkeypatch):
    soak = _copy(REAL[0], tmp_path / "soak")
    path = soak / "throughput.csv"
    head, *rows = path.read_text().splitlines()
    # A column after the contract's (allowed): words in the first block, numbers after.
    path.write_text("\n".join([f"{head},note", *(f"{r},{'warm-up' if i < 30 else i}" for i, r in enumerate(rows))])
                    + "\n")
    monkeypatch.setattr(soak_data, "CHUNK_ROWS", 50)
    whole = read_soak(soak)
    assert "note" in whole.throughput
    spilled = read_soak(soak, spill_dir=tmp_path / "spill")
    assert "note" not in spilled.throughput_by_host["vm"]
    assert _analysis(soak)[:3] == (lambda r: (r.findings, r.soak_section(), r.notes))(analyze(spilled))
