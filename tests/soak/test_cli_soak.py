"""`preflight analyze SOAK_DIR`: a soak directory judged and reported like a bundle."""

import json
from pathlib import Path

import soak_scenarios as S

from preflight.app.cli import main
from preflight.soak.data import SoakMeta, write_soak

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h200-soak"


def _report(out: Path) -> tuple[Path, dict]:
    [run] = out.iterdir()
    return run, json.loads((run / "report.json").read_text())


def test_real_h200_burn_soak_passes_with_its_soak_section_and_plot(tmp_path):
    # A real 60 s burn on an H200 sampled by NVML at 10 Hz (examples/h200-soak/SOURCE.md).
    assert main(["analyze", str(EXAMPLE), "--out", str(tmp_path), "-q"]) == 0
    run, report = _report(tmp_path)
    assert report["format"] == "preflight-report/1"
    soak = report["soak"]["vm"]
    assert set(soak) == {"engine", "duration_s", "max_temperature_c", "min_sm_clock_mhz",
                         "throttle_reasons_seen", "throughput_baseline", "throughput_final", "throughput_decay"}
    assert soak["engine"] == "burn" and 55 <= soak["max_temperature_c"] <= 70
    assert "sw_power_cap" in soak["throttle_reasons_seen"]  # power capping at full load: normal
    assert 600 < soak["throughput_baseline"] < 700 and abs(soak["throughput_decay"]) < 0.05
    assert report["hosts"]["vm"]["status"] == "pass" and report["diagnoses"] == []
    assert (run / report["soak_plots"]["vm"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 'src="data:image/png;base64,' in (run / "report.html").read_text()


def test_thermal_cliff_is_diagnosed_as_thermal_throttling(tmp_path):
    data = S.thermal_cliff()
    soak = write_soak(tmp_path / "soak", SoakMeta("burn", S.START.isoformat(), tuple(data.meta.hosts)),
                      data.telemetry, data.throughput)
    assert main(["analyze", str(soak), "--out", str(tmp_path / "out"), "-q", "--no-html"]) == 1
    _, report = _report(tmp_path / "out")
    assert [d["cause"] for d in report["diagnoses"]] == ["thermal-throttling"]
    thermal = next(f for f in report["findings"] if f["check"] == "soak-thermal")
    assert thermal["status"] == "fail" and "thermal-throttling" in thermal["symptoms"]


def test_bad_soak_dir_exits_2_naming_the_file(tmp_path, capsys):
    tele, thr = S.real_frames()
    soak = write_soak(tmp_path / "soak", SoakMeta("burn", S.START.isoformat(), ("h200-vm",)), tele, thr)
    text = (soak / "telemetry.csv").read_text().replace("power_limit_w", "power_lim", 1)
    (soak / "telemetry.csv").write_text(text)
    assert main(["analyze", str(soak), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "telemetry.csv" in err and "power_limit_w" in err
    assert not (tmp_path / "out").exists()
