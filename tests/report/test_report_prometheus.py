"""`--prometheus FILE`: node_exporter textfile format, on the fixed bundle of test_report_html."""

from __future__ import annotations

import re

import pytest
from derived import h200_node_xml
from test_cli import write_bundle
from test_report_html import golden_analysis

from preflight.app.cli import main
from preflight.model import Analysis, Finding, HostVerdict, Status
from preflight.report import prometheus

# The text exposition format: `name{label="value",...} number`, label values with \\ \" \n escaped.
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{{{LABEL}(?:,{LABEL})*\}})? -?[0-9.e+-]+$")


def samples(text: str) -> list[str]:
    lines = text.splitlines()
    for line in lines:
        assert line.startswith(("# HELP ", "# TYPE ")) or SAMPLE.match(line), line
    return [line for line in lines if not line.startswith("#")]


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    return prometheus.render(golden_analysis(tmp_path_factory.mktemp("prom")))


def test_host_verdicts_reachability_and_counts(text):
    lines = samples(text)
    assert 'preflight_host_status{host="gpu04",status="fail"} 1' in lines
    assert 'preflight_host_status{host="gpu06",status="warn"} 1' in lines
    assert 'preflight_host_reachable{host="gpu08"} 0' in lines and 'preflight_host_reachable{host="gpu01"} 1' in lines
    assert ['preflight_hosts{status="pass"} 3', 'preflight_hosts{status="warn"} 1', 'preflight_hosts{status="fail"} 2',
            'preflight_hosts{status="error"} 2'] == [s for s in lines if s.startswith("preflight_hosts{")]
    # 2026-11-29T10:00:00+00:00, the bundle's creation time.
    assert "preflight_run_timestamp_seconds 1795946400" in lines


def test_check_statuses_figures_and_diagnoses(text):
    lines = samples(text)
    assert 'preflight_check_status{host="gpu04",check="gpu-inventory",status="fail"} 1' in lines
    assert 'preflight_check_status{host="gpu07",check="gpu-inventory",status="error"} 1' in lines
    # gpu_count from gpu-inventory's data: 7 on the derived 7-GPU node.
    assert 'preflight_check_figure{host="gpu04",check="gpu-inventory",figure="gpu_count"} 7' in lines
    assert not [s for s in lines if 'figure="gpu_models"' in s or 'figure="driver_version"' in s]
    assert 'preflight_diagnosis{host="gpu04",cause="gpu-missing",confidence="high"} 1' in lines
    assert 'preflight_soak_figure{host="gpu01",figure="max_temperature_c"} 66' in lines
    assert 'preflight_soak_figure{host="gpu01",figure="throughput_decay"} 0.0034' in lines
    # Every series appears once, and every metric has its HELP and TYPE.
    series = [s.rsplit(" ", 1)[0] for s in lines]
    assert len(series) == len(set(series))
    for name in {s.split("{")[0].split(" ")[0] for s in lines}:
        assert f"# TYPE {name} gauge" in text and f"# HELP {name} " in text


def test_label_values_are_escaped_and_odd_figures_left_out():
    host = 'gpu"1\\a\nb'
    f = Finding("odd-check", host, Status.WARN, "s", data={
        "busbw_gbs": 362.5, "ok": True, "per_rep": [1, 2], "nan": float("nan"), "nested": {"cv": 0.02},
        'we"ird': 1})
    fleet = Finding("fleet-x", None, Status.FAIL, "fleet-wide")
    text = prometheus.render(Analysis({host: HostVerdict("warn", True, "generic", "t")}, [f, fleet], [], []))
    lines = samples(text)
    label = 'host="gpu\\"1\\\\a\\nb"'
    assert f'preflight_host_status{{{label},status="warn"}} 1' in lines
    assert f'preflight_check_figure{{{label},check="odd-check",figure="busbw_gbs"}} 362.5' in lines
    assert f'preflight_check_figure{{{label},check="odd-check",figure="nested.cv"}} 0.02' in lines
    assert f'preflight_check_figure{{{label},check="odd-check",figure="we\\"ird"}} 1' in lines
    assert not [s for s in lines if 'figure="ok"' in s or "per_rep" in s or 'figure="nan"' in s]
    assert 'preflight_check_status{check="fleet-x",status="fail"} 1' in lines
    assert "preflight_run_timestamp_seconds" not in text  # no `created` in meta: no timestamp


def test_several_findings_of_one_check_give_one_series_with_the_worst_status():
    fs = [Finding("fabric", "a", Status.PASS, "ok", data={"gpus": 8}),
          Finding("fabric", "a", Status.FAIL, "bad", data={"gpus": 4})]
    lines = samples(prometheus.render(Analysis({"a": HostVerdict("fail", True, "generic", "t")}, fs, [], [])))
    assert [s for s in lines if s.startswith("preflight_check_")] == [
        'preflight_check_status{host="a",check="fabric",status="fail"} 1',
        'preflight_check_figure{host="a",check="fabric",figure="gpus"} 8']


def test_cli_writes_the_file_and_refuses_a_missing_directory(tmp_path, capsys):
    bundle = write_bundle(tmp_path / "b", {"a": {"nvidia-smi-q-x": h200_node_xml(8)}})
    prom = tmp_path / "preflight.prom"
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "out"), "-q", "--prometheus", str(prom)]) == 0
    assert 'preflight_host_status{host="a",status="pass"} 1' in samples(prom.read_text())
    assert not list(tmp_path.glob(".*tmp*"))  # written through a temporary file, renamed into place
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "out2"), "-q",
                 "--prometheus", str(tmp_path / "no" / "x.prom")]) == 2
    assert "--prometheus:" in capsys.readouterr().err and not (tmp_path / "out2").exists()
