"""What the soak agent writes (preflight/node/records.py): rows and their CSV form, the
append-only log, the heartbeat. Pure writers, on the real H200 burn's first sample and windows."""

from __future__ import annotations

import csv
import io
import json

from fake_nvml import SAMPLES

from preflight.node import records


def test_telemetry_row_text_keeps_contract_columns_first_and_empties_none():
    # The first sample of the capture: idle H200, 43 C, 345 MHz, 78.63 W, reasons 0.
    first = SAMPLES[0]
    row = records.GpuSample(time=1764408214.25, host="gpu01", gpu=0, temperature_c=first["temp"],
                               sm_clock_mhz=first["sm"], memory_clock_mhz=first["mem"], power_w=first["power_w"],
                               power_limit_w=700.0, utilization_pct=first["util"],
                               clocks_event_reasons=first["reasons"])
    header = records.csv_text([records.TELEMETRY_COLUMNS])
    assert header.startswith("time,host,gpu,temperature_c,memory_temperature_c,sm_clock_mhz,memory_clock_mhz,"
                             "power_w,power_limit_w,utilization_pct,memory_used_mib,clocks_event_reasons,")
    text = records.row_text([row])
    assert text == "1764408214.25,gpu01,0,43,,345,3201,78.63,700.0,0,,0" + "," * (len(records.TELEMETRY_COLUMNS) - 12) + "\n"
    parsed = next(csv.DictReader(io.StringIO(header + text)))
    assert parsed["memory_temperature_c"] == "" and parsed["power_w"] == "78.63"


def test_throughput_and_event_rows():
    text = records.row_text([records.ThroughputRow(10.0, "gpu01", "tflops", 674.0),
                                records.ThroughputRow(10.0, "gpu01", "gpu_tflops", 674.0, 0),
                                records.EventRow(11.5, "gpu01", 3, "xid", 79)])
    assert text.splitlines() == ["10.0,gpu01,tflops,674.0,", "10.0,gpu01,gpu_tflops,674.0,0", "11.5,gpu01,3,xid,79"]


def test_append_log_writes_header_once_and_only_whole_lines(tmp_path):
    path = tmp_path / "telemetry.csv"
    log = records.AppendLog(path, records.THROUGHPUT_COLUMNS)
    log.append(records.row_text([records.ThroughputRow(1.0, "h", "tflops", 673.2)]))
    log.close()
    log = records.AppendLog(path, records.THROUGHPUT_COLUMNS)  # reopened: no second header
    log.append(records.row_text([records.ThroughputRow(6.0, "h", "tflops", 673.8)]))
    log.sync()
    log.close()
    assert path.read_text() == "time,host,metric,value,gpu\n1.0,h,tflops,673.2,\n6.0,h,tflops,673.8,\n"


def test_heartbeat_doc_and_atomic_write(tmp_path):
    p = records.Progress(pid=4242, host="gpu01", engine="burn", started=1000.0, planned_s=3600, interval_s=0.1)
    p.state, p.ticks, p.rows, p.sampler_cpu_s = "running", 10, 80, 0.02
    p.error("GPU 3: nvmlDeviceGetPowerUsage: Unknown Error")
    doc = records.heartbeat_doc(p, now=1012.5, process_cpu_s=0.4)
    assert doc["elapsed_s"] == 12.5 and doc["state"] == "running" and doc["pid"] == 4242
    assert doc["sampler_cpu_ms_per_tick"] == 2.0 and doc["sampler_cpu_ms_per_gpu_sample"] == 0.25
    assert doc["last_error"].startswith("GPU 3") and doc["errors"] == 1
    records.write_json_atomic(tmp_path / "heartbeat.json", doc)
    assert json.loads((tmp_path / "heartbeat.json").read_text()) == doc
    assert [f.name for f in tmp_path.iterdir()] == ["heartbeat.json"]  # no temporary left behind
