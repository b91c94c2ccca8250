"""Soak analysis on the real H200 burn (tests/fixtures/corpus/h200-vm) and on runs derived from it.

The real capture is a healthy 60 s bf16 GEMM burn: 605 NVML samples at 10 Hz, power-capped at
~692 of 700 W with reasons 0x4 under load, 64-66 °C, SM ~1440 MHz, 11 TFLOP/s windows of
673.2-674.5. Faulty runs come from tests/soak_scenarios.py, which documents each transform.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import soak_scenarios as S

from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Status
from preflight.soak.analysis import analyze, analyze_soak
from preflight.soak.data import SLOWDOWN_COLUMN, SoakDataError, SoakMeta, read_soak, write_soak
from preflight.soak.figures import Thresholds, throughput_trend


def _by_check(result, host=None):
    return {f.check: f for f in result.findings if host is None or f.host == host}


def _write_real(tmp_path, name="soak"):
    tele, thr = S.real_frames()
    return write_soak(tmp_path / name, SoakMeta("burn", S.START.isoformat(), ("h200-vm",)), tele, thr)


# --- the real capture ----------------------------------------------------------------------


def test_converter_writes_the_real_burn_as_a_soak_directory(tmp_path):
    soak = _write_real(tmp_path)
    assert json.loads((soak / "soak.json").read_text()) == {
        "format": "preflight-soak/1", "engine": "burn", "started": "2026-11-29T09:23:34+00:00", "hosts": ["h200-vm"]}
    lines = (soak / "telemetry.csv").read_text().splitlines()
    assert lines[0].startswith("time,host,gpu,temperature_c,memory_temperature_c,sm_clock_mhz,")
    assert len(lines) == 1 + 605
    # First real sample {"t": 0.0, "temp": 43, "sm": 345, "mem": 3201, "power_w": 78.63, "util": 0,
    # "reasons": 0}; memory temperature and memory used are not in the capture: empty cells.
    assert lines[1] == f"{S.START.timestamp()},h200-vm,0,43.0,,345.0,3201.0,78.63,700.0,0.0,,0,89.0"

    data = read_soak(soak)
    assert data.notes == ()
    assert len(data.telemetry) == 605 and data.telemetry["memory_temperature_c"].isna().all()
    assert data.telemetry["clocks_event_reasons"].value_counts().to_dict() == {4.0: 598, 0.0: 7}
    assert data.throughput["value"].tolist() == [673.2, 673.8, 674.3, 674.5, 674.1, 674.2, 674.4, 674.2,
                                                 674.3, 674.2, 673.4]
    # Windows placed from the first sample at 100% utilisation (t = 0.97 s), 5 s apart.
    assert data.throughput["time"].iloc[0] - S.START.timestamp() == pytest.approx(5.97)


def test_real_burn_is_healthy_and_its_soak_section_matches_the_contract(tmp_path):
    result = analyze_soak(_write_real(tmp_path))
    assert result.soak_section() == {"h200-vm": {
        "engine": "burn",
        "duration_s": 60.67,
        "max_temperature_c": 66.0,
        "min_sm_clock_mhz": 1155.0,  # t = 1.57 s, util 100, power still ramping to the cap
        "throttle_reasons_seen": ["sw_power_cap"],
        "throughput_baseline": 673.8,  # median of the first 3 windows (the first quarter of a 50 s span)
        "throughput_final": 674.2,  # median of the last 3
        "throughput_decay": -0.0006,
    }}
    f = _by_check(result)
    assert f["soak-thermal"].status is Status.PASS
    assert f["soak-thermal"].summary == "max 66 °C (GPU 0), 23 °C below slowdown (89 °C); no thermal slowdown"
    assert f["soak-power"].status is Status.PASS and f["soak-power"].symptoms == ()
    assert "SW power cap in 100% of loaded samples, median 692 W of 700 W, SM clock median 1440 MHz" in f["soak-power"].summary
    assert f["soak-power"].data["gpus"][0]["clock_floor_mhz"] == 1008.0
    assert f["soak-throughput"].status is Status.PASS
    assert f["soak-outliers"].status is Status.SKIP
    assert f["soak-telemetry"].status is Status.PASS and "605 samples" in f["soak-telemetry"].summary
    assert not result.failed and result.notes == ()
    json.dumps({"soak": result.soak_section(), "findings": [f.to_dict() for f in result.findings]})


def test_short_thermal_blip_in_the_real_burn_is_mentioned_not_failed():
    # Derived: the real burn with SW thermal slowdown (0x20) added to 3 consecutive loaded samples (0.3 s).
    tele, thr = S.real_frames()
    tele.loc[100:102, "clocks_event_reasons"] = 0x4 | 0x20
    f = _by_check(analyze(S.soak_data(tele, thr)))["soak-thermal"]
    assert f.status is Status.PASS
    assert "bits seen for 0.3 s on GPU 0" in f.summary


def test_empty_cells_are_not_available_never_a_crash():
    # Derived: the real burn with every temperature and bitmask cell emptied.
    tele, thr = S.real_frames()
    tele["temperature_c"] = np.nan
    tele["clocks_event_reasons"] = np.nan
    result = analyze(S.soak_data(tele, thr))
    section = result.soak_section()["h200-vm"]
    assert section["max_temperature_c"] is None and section["throttle_reasons_seen"] == []
    assert section["min_sm_clock_mhz"] == 1155.0
    f = _by_check(result)
    assert f["soak-thermal"].status is Status.ERROR
    assert f["soak-power"].summary.startswith("clock-event reasons not recorded")


# --- derived runs --------------------------------------------------------------------------


def test_steady_hour_on_eight_gpus_passes():
    result = analyze(S.steady())
    assert {c: f.status for c, f in _by_check(result).items()} == {
        "soak-thermal": Status.PASS, "soak-power": Status.PASS, "soak-throughput": Status.PASS,
        "soak-outliers": Status.PASS, "soak-telemetry": Status.PASS,
        "soak-memory": Status.SKIP,  # the real samples this hour is built from have no memory column
        "soak-sdc": Status.SKIP}  # nor result checks (recorded before the burn had them)
    section = result.soak_section()["gpu001"]
    assert section["duration_s"] == 3599.0 and section["throttle_reasons_seen"] == ["sw_power_cap"]
    assert section["max_temperature_c"] == 66.0 and section["throughput_decay"] == 0.0


def test_thermal_cliff_fails_and_diagnoses_thermal_throttling_alone():
    result = analyze(S.thermal_cliff())
    f = _by_check(result)
    thermal, throughput = f["soak-thermal"], f["soak-throughput"]
    assert thermal.status is Status.FAIL and thermal.symptoms == ("thermal-throttling",)
    assert "thermal slowdown (hw_thermal_slowdown, sw_thermal_slowdown) on GPUs 0-7 for up to 42.0 min" in thermal.summary
    assert "at or above the slowdown temperature (89 °C)" in thermal.summary
    assert thermal.evidence[0].excerpt.startswith("GPU 0 at +18.0 min: 89 °C, SM 873 MHz")
    assert throughput.status is Status.FAIL and throughput.symptoms == ("throughput-cliff",)
    assert throughput.summary.startswith("tflops fell 40% from 674.2 to 404.5 at +17.9 min for 42.1 min")
    assert "sw_thermal_slowdown" in throughput.summary
    # Clocks fell under thermal slowdown, not under the power cap: the power check stays quiet.
    assert f["soak-power"].status is Status.PASS
    section = result.soak_section()["gpu001"]
    assert section["max_temperature_c"] == 90.0 and section["throughput_decay"] == 0.4
    assert section["throttle_reasons_seen"] == ["hw_thermal_slowdown", "sw_power_cap", "sw_thermal_slowdown"]
    diagnoses = diagnose(list(result.findings), load_knowledge())
    assert [(d.cause, d.confidence, d.symptoms) for d in diagnoses] == [
        ("thermal-throttling", "high", ("thermal-throttling", "throughput-cliff"))]


def test_thermal_verdict_stands_on_either_the_bits_or_the_threshold():
    # Derived from the thermal cliff: without the slowdown column the bits alone fail it ...
    cliff = S.thermal_cliff()
    bits_only = S.soak_data(cliff.telemetry.drop(columns=SLOWDOWN_COLUMN), cliff.throughput)
    f = _by_check(analyze(bits_only))["soak-thermal"]
    assert f.status is Status.FAIL and "slowdown temperature" not in f.summary
    # ... and with the thermal bits cleared (0x4 kept), a threshold from the caller fails it.
    temp_only = S.soak_data(bits_only.telemetry.assign(clocks_event_reasons=0x4), cliff.throughput)
    f = _by_check(analyze(temp_only, slowdown_temperature_c=89))["soak-thermal"]
    assert f.status is Status.FAIL and f.summary.startswith("at or above the slowdown temperature (89 °C) on GPUs 0-7")


def test_thermal_cliff_on_two_gpus_shows_in_their_own_throughput():
    # Throughput laid out as the soak agent writes it: per-GPU gpu_tflops and the node's tflops.
    result = analyze(S.thermal_cliff(per_gpu=True, gpus_hit=(3, 5)))
    f = _by_check(result)
    assert f["soak-thermal"].status is Status.FAIL and "on GPUs 3, 5 for up to 42.0 min" in f["soak-thermal"].summary
    throughput = f["soak-throughput"]
    assert throughput.status is Status.FAIL and throughput.symptoms == ("throughput-cliff",)
    # The node lost 2 x 40% of 8 GPUs: reported as the cliff's share, not as a second finding.
    assert throughput.summary.startswith("tflops 10.0% lower at the end (the cliff's share); "
                                         "gpu_tflops on GPUs 3, 5 fell 40% from 674.2 to 404.5 at +17.9 min")
    section = result.soak_section()["gpu001"]
    assert (section["throughput_baseline"], section["throughput_final"], section["throughput_decay"]) == \
        (5391.9, 4852.84, 0.1)
    assert f["soak-outliers"].summary.startswith("GPU 3 runs at 89 °C, 24 °C above and clocks 864 MHz, 40% below")
    causes = {d.cause for d in diagnose(list(result.findings), load_knowledge())}
    assert causes == {"thermal-throttling", "gpu-outlier"}


def test_gpu_slower_than_its_peers_in_per_gpu_throughput_is_an_outlier():
    result = analyze(S.slow_gpu())
    f = _by_check(result)
    assert f["soak-outliers"].status is Status.WARN
    assert f["soak-outliers"].summary == "GPU 6 gpu_tflops 573.1, 15% below the median of the node"
    assert f["soak-throughput"].status is Status.PASS and f["soak-thermal"].status is Status.PASS


def test_power_brake_episode_warns():
    result = analyze(S.power_brake())
    f = _by_check(result)
    assert f["soak-power"].status is Status.WARN and f["soak-power"].symptoms == ("power-capping",)
    assert f["soak-power"].summary == "HW power brake (0x80) engaged on GPU 2 for up to 30.0 s"
    assert "reasons 0x88 (hw_power_brake_slowdown, hw_slowdown)" in f["soak-power"].evidence[0].excerpt
    # 30 s at 90% is neither a cliff nor a decay.
    assert f["soak-throughput"].status is Status.PASS and f["soak-thermal"].status is Status.PASS
    assert result.soak_section()["gpu001"]["min_sm_clock_mhz"] == 712.5


def test_cliff_under_the_power_cap_points_at_power_delivery_or_cooling():
    result = analyze(S.power_cliff())
    f = _by_check(result)
    assert f["soak-power"].status is Status.WARN
    assert "below the floor on GPUs 0-7: down to 855 MHz" in f["soak-power"].summary
    assert "floor 1008 MHz = 70% of the 1440 MHz baseline median" in f["soak-power"].summary
    assert f["soak-throughput"].status is Status.FAIL and "reasons meanwhile: sw_power_cap;" in f["soak-throughput"].summary
    assert f["soak-thermal"].status is Status.PASS
    causes = {d.cause: d.confidence for d in diagnose(list(result.findings), load_knowledge())}
    assert causes["power-delivery-or-cooling"] == "medium"
    assert "thermal-throttling" not in causes


def test_gpu_that_stops_reporting_has_fallen_off_the_bus():
    f = _by_check(analyze(S.fallen_off()))["soak-telemetry"]
    assert f.status is Status.FAIL and f.symptoms == ("gpu-fallen-off-bus",)
    assert f.summary == "GPU 5 stopped reporting at +40.0 min of 60.0 min"


def test_one_hot_gpu_of_eight_is_a_node_outlier():
    result = analyze(S.hot_gpu())
    f = _by_check(result)
    assert f["soak-outliers"].status is Status.WARN and f["soak-outliers"].symptoms == ("gpu-outlier",)
    assert f["soak-outliers"].summary == "GPU 3 runs at 80 °C, 15 °C above the median of the node"
    assert f["soak-thermal"].status is Status.PASS  # 80-81 °C is still below the 89 °C slowdown


def test_hot_single_gpu_host_is_a_fleet_outlier():
    result = analyze(S.hot_host_in_fleet())
    statuses = {f.host: f.status for f in result.findings if f.check == "soak-outliers"}
    assert statuses == {"vm1": Status.PASS, "vm2": Status.PASS, "vm3": Status.WARN, "vm4": Status.PASS}
    assert _by_check(result, "vm3")["soak-outliers"].summary == "GPU 0 runs at 80 °C, 15 °C above the median of the fleet"
    assert "fleet median 65 °C, 1440 MHz" in _by_check(result, "vm1")["soak-outliers"].summary


def test_eight_percent_decay_with_steady_clocks_is_a_software_slowdown():
    # The real H200 telemetry unchanged under a throughput that decays: the GPUs did not slow.
    result = analyze(S.decay())
    f = _by_check(result)["soak-throughput"]
    assert f.status is Status.WARN and f.symptoms == ("software-slowdown",)
    assert "decayed 7.4% over the run" in f.summary
    assert "clocks steady (loaded SM clock 1440 MHz at first, 1440 MHz at the end, +0.0%, no new" in f.summary
    assert "a software or serving slowdown, not the GPUs" in f.summary
    section = result.soak_section()["gpu001"]
    # Linear 8% over the hour; the 5-minute medians sit 2.5 minutes in from each end.
    assert section["throughput_decay"] == pytest.approx(0.08 * 55 / 60, abs=0.002)
    causes = [d.cause for d in diagnose(list(result.findings), load_knowledge())]
    assert causes == ["software-slowdown"]


def test_decay_with_the_clocks_falling_alike_is_the_gpus():
    result = analyze(S.clock_decay())
    f = _by_check(result)["soak-throughput"]
    assert f.status is Status.WARN and f.symptoms == ("throughput-decay",)
    assert ("the GPUs slowed: loaded SM clock 1436 MHz at first, 1331 MHz at the end, -7.3%, clock-event reasons at "
            "the end: sw_power_cap") in f.summary
    assert [d.cause for d in diagnose(list(result.findings), load_knowledge())] == ["throughput-decay"]


def test_telemetry_gap_is_a_note():
    result = analyze(S.telemetry_gap())
    assert result.notes == ("gpu001: no telemetry for 21.0 s after +30.0 min (GPUs 0-7)",)
    f = _by_check(result)["soak-telemetry"]
    assert f.status is Status.PASS and "1 gap longer than 10 intervals" in f.summary


def test_host_listed_without_telemetry_is_an_error():
    tele, thr = S.real_frames()
    result = analyze(S.soak_data(tele, thr, hosts=["h200-vm", "gpu009"]))
    f = _by_check(result, "gpu009")
    assert list(f) == ["soak-telemetry"] and f["soak-telemetry"].status is Status.ERROR
    assert result.soak_section()["gpu009"]["max_temperature_c"] is None and result.failed


def test_directory_round_trip_gives_the_same_verdicts(tmp_path):
    # Per-GPU throughput: the gpu column is empty on the node's rows and set on the GPUs'.
    data = S.slow_gpu(minutes=10)
    soak = write_soak(tmp_path / "slow", data.meta, data.telemetry, data.throughput)
    assert (soak / "throughput.csv").read_text().splitlines()[1:3] == [
        f"{S.START.timestamp() + 5},gpu001,tflops,5291.54,", f"{S.START.timestamp() + 5},gpu001,gpu_tflops,673.2,0"]
    on_disk, in_memory = analyze_soak(soak), analyze(data)
    assert on_disk.soak_section() == in_memory.soak_section()
    assert [(f.check, f.status, f.summary) for f in on_disk.findings] == \
        [(f.check, f.status, f.summary) for f in in_memory.findings]


# --- invalid and odd directories -----------------------------------------------------------


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("breakage, where, field", [
    (lambda d: (d / "soak.json").unlink(), "soak.json", None),
    (lambda d: _edit(d / "soak.json", "preflight-soak/1", "preflight-soak/0"), "soak.json", "format"),
    (lambda d: _edit(d / "telemetry.csv", "sm_clock_mhz", "sm_clock"), "telemetry.csv:1", "sm_clock_mhz"),
    # Line 11 is the 10th sample (t = 1.07 s), line 12 the first at 61 °C (t = 1.17 s).
    (lambda d: _edit(d / "telemetry.csv", "\n1795944215.07,", "\n1795944215.o7,"), "telemetry.csv:11", "time"),
    (lambda d: _edit(d / "telemetry.csv", ",h200-vm,0,61.0,", ",h200-vm,0,hot,"), "telemetry.csv:12", "temperature_c"),
    (lambda d: _edit(d / "throughput.csv", "673.8", "fast"), "throughput.csv:3", "value"),
])
def test_invalid_directory_names_file_line_and_field(tmp_path, breakage, where, field):
    soak = _write_real(tmp_path)
    breakage(soak)
    with pytest.raises(SoakDataError) as err:
        read_soak(soak)
    assert f"{soak}/{where}" in str(err.value)
    assert err.value.field == field
    if field:
        assert f": {field}: " in str(err.value)


def test_cut_off_last_line_hex_bitmask_and_na_cells_are_tolerated(tmp_path):
    soak = _write_real(tmp_path)
    tele = soak / "telemetry.csv"
    text = tele.read_text()
    # Derived: the last line half written (an agent killed mid-write), the bitmask in hex as
    # nvidia-smi prints it, and one temperature as nvidia-smi's "[N/A]".
    text = text[:-20].replace(",4,89.0\n", ",0x4,89.0\n").replace(",h200-vm,0,61.0,", ",h200-vm,0,[N/A],", 1)
    tele.write_text(text)
    data = read_soak(soak)
    assert data.notes == ("telemetry.csv: last line 606 has no newline (cut off while being written); ignored",)
    assert len(data.telemetry) == 604
    assert data.telemetry["clocks_event_reasons"].value_counts().to_dict() == {4.0: 597, 0.0: 7}
    assert data.telemetry["temperature_c"].isna().sum() == 1
    assert analyze(data).soak_section()["h200-vm"]["max_temperature_c"] == 66.0


def test_missing_throughput_file_is_a_note_and_a_skip(tmp_path):
    soak = _write_real(tmp_path)
    (soak / "throughput.csv").unlink()
    result = analyze_soak(soak)
    assert result.notes == ("throughput.csv absent: throughput not judged",)
    assert _by_check(result)["soak-throughput"].status is Status.SKIP
    assert result.soak_section()["h200-vm"]["throughput_baseline"] is None


# --- plots ---------------------------------------------------------------------------------


def test_plot_of_the_real_burn_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from preflight.soak.plots import plot_soak

    tele, thr = S.real_frames()
    paths = plot_soak(S.soak_data(tele, thr), tmp_path)
    assert list(paths) == ["h200-vm"]
    png = paths["h200-vm"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def _with_memory(data, growth_mib_per_min: float):
    """The steady hour with memory used filled in: 100 GiB from the start (a serving engine's
    up-front allocation), growing by ``growth_mib_per_min`` on GPU 3 only."""
    tele = data.telemetry.copy()
    t0 = tele["time"].min()
    tele["memory_used_mib"] = 102400.0
    on_gpu3 = tele["gpu"] == 3
    tele.loc[on_gpu3, "memory_used_mib"] += (tele.loc[on_gpu3, "time"] - t0) / 60 * growth_mib_per_min
    return S.soak_data(tele, data.throughput)


def test_memory_growth_under_steady_load_warns_on_that_gpu():
    result = analyze(_with_memory(S.steady(), growth_mib_per_min=100))  # +~5.5 GiB over the hour
    f = _by_check(result, "gpu001")["soak-memory"]
    assert f.status is Status.WARN and f.symptoms == ("gpu-memory-growth",)
    assert f.summary.startswith("GPU memory kept growing under load (GPU 3: ")
    assert [g for g, *_ in f.data["grown"]] == [3]


def test_steady_or_unrecorded_memory_is_not_a_finding():
    steady = _by_check(analyze(_with_memory(S.steady(), growth_mib_per_min=0)), "gpu001")["soak-memory"]
    assert steady.status is Status.PASS and "steady on 8 GPU(s)" in steady.summary
    # The real capture has no memory column: nothing to judge.
    assert _by_check(analyze(S.soak_data(*S.real_frames())), "h200-vm")["soak-memory"].status is Status.SKIP


def test_one_slow_window_at_an_end_is_no_cliff_however_the_smoothing_reads_it():
    """A real 30 s vLLM-on-CPU soak of CI (tests/soak/test_soak_vllm_e2e.py, 2026-12-01) gave
    three windows of 2053.707, 846.51 and 1807.632 output tokens/s. The centred median at the
    last window is of two (846.51 and 1807.632), below the 20 % line, but the last window itself
    is the baseline: no cliff. The same dip held for two windows is one."""
    th = Thresholds()
    t = np.array([1796159941.186, 1796159951.705, 1796159961.186])
    trend = throughput_trend("output_tokens_per_s", t, np.array([2053.707, 846.51, 1807.632]), th)
    assert trend.baseline == 1807.632 and trend.cliff is None
    longer = throughput_trend("output_tokens_per_s", np.append(t, t[-1] + 10),
                              np.array([2053.707, 1807.632, 846.51, 846.51]), th)
    assert longer.cliff is not None and longer.cliff.level == 846.51
