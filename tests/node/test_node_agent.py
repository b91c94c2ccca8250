"""The soak agent (preflight/node/agent.py) in this process and as the process a node runs.

NVML is replaced by ``FakeNvml`` (tests/fake_nvml.py: the real H200 burn replayed); agent
processes load it through the agent's test hook ``--fake-nvml FILE:FACTORY`` and run the
``none`` engine (no torch here). The ``vllm`` and ``endpoint`` engines are wired in here with
servers that fail fast (no vLLM in this interpreter, nothing listening) and a stand-in engine
that reports the findings of a real vLLM server log; tests/soak/test_soak_vllm_e2e.py runs a real
vLLM server through ``preflight soak``. Run as a script, the agent imports its siblings by plain
name from its own directory, as on a node; imported here, from the package.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from agent_runs import AGENT, heartbeat, read_csv, wait_for
from fake_nvml import FAKE_HOOK, FakeNvml

from preflight.node import agent as soak_agent

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
# vLLM 0.32.0 on this machine's CPU, its engine killed by an out-of-vocabulary prompt token id.
ENGINE_DEAD_LOG = RECORDED / "vllm-0.32.0-cpu-server-log-engine-dead-token-id-out-of-vocab-excerpt.txt"


def test_agent_in_process_writes_a_soak_dir(tmp_path):
    cfg = soak_agent.AgentConfig(out=tmp_path, host="h200", engine="none", seconds=0.3, interval_s=0.1)
    agent = soak_agent.Agent(cfg, lambda: FakeNvml(gpus=2))
    assert agent.run() == 0
    meta = json.loads((tmp_path / "soak.json").read_text())
    assert meta["format"] == "preflight-soak/1" and meta["hosts"] == ["h200"] and meta["engine"] == "none"
    assert [g["slowdown_c"] for g in meta["gpus"]["h200"]] == [89, 89]
    rows = read_csv(tmp_path / "telemetry.csv")
    assert {r["gpu"] for r in rows} == {"0", "1"} and len(rows) >= 6
    beat = json.loads((tmp_path / "heartbeat.json").read_text())
    assert beat["state"] == "finished" and beat["rows"] == len(rows)
    assert beat["sampler_cpu_ms_per_tick"] > 0
    assert read_csv(tmp_path / "throughput.csv") == []


# --- The agent as a process --------------------------------------------------------------------


# --- The agent as a process --------------------------------------------------------------------


def agent_cmd(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(AGENT), "--out", str(out), "--engine", "none", "--fake-nvml", FAKE_HOOK, *args]


def test_sigterm_stops_cleanly(tmp_path):
    out = tmp_path / "soak"
    proc = subprocess.Popen(agent_cmd(out, "--seconds", "60", "--interval", "0.1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (heartbeat(out) or {}).get("ticks", 0) >= 2)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    beat = heartbeat(out)
    assert beat["state"] == "finished" and beat["summary"]["stopped_by_signal"] is True
    assert f"writing to {out}" in stdout
    assert beat["summary"]["power"]["0"]["power_limit_w"] == 700.0


def test_refuses_an_existing_soak_dir(tmp_path):
    (tmp_path / "soak.json").write_text("{}")
    proc = subprocess.run(agent_cmd(tmp_path, "--seconds", "1"), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "already holds a soak" in proc.stderr


def test_nvml_missing_is_a_failed_heartbeat(tmp_path):
    proc = subprocess.run([sys.executable, str(AGENT), "--out", str(tmp_path), "--engine", "none", "--seconds", "1",
                           "--fake-nvml", f"{tmp_path / 'absent.py'}:nothing"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    beat = heartbeat(tmp_path)
    assert beat["state"] == "failed" and "NVML" in beat["last_error"]
    assert json.loads((tmp_path / "soak.json").read_text())["format"] == "preflight-soak/1"


# --- The controller: ship, detach, watch, attach, merge ----------------------------------------

# preflight's modules are imported in the tests, not at the top: the agent processes load this
# file for FakeNvml, and preflight.soak pulls in pandas.


# --- The serving engines -----------------------------------------------------------------------


class ServerLogEngine:
    """Stands in for vllm_engine.VllmEngine: no server, but the summary the real engine gives
    for the recorded log of a vLLM engine that died (its findings from scan_server_log)."""

    def __init__(self, findings):
        self.findings, self.polls = findings, 0

    def start(self, grid_t0):
        pass

    def poll(self, host, final=False):
        self.polls += 1
        return [], []

    def running(self):
        return self.polls < 3

    def finish(self, stopped):
        return []

    def summary(self):
        return {"server": {"log": "vllm-server.log", "ready_after_s": 41.5, "rss_peak_mib": 2830.6, "exit_code": 1,
                           "stopped_with": None},
                "load": None, "findings": [dataclasses.asdict(f) for f in self.findings], "notes": []}


def _no_nvml():
    raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_vllm_without_the_nvidia_driver_runs_without_telemetry_and_records_log_findings(tmp_path, capsys):
    findings = soak_agent.serving_module().scan_server_log(ENGINE_DEAD_LOG.read_text())
    cfg = soak_agent.AgentConfig(out=tmp_path, host="cpu01", engine="vllm", seconds=0.3, interval_s=0.1,
                                 serve=soak_agent.ServeParams(model="tiny-llama-ci", ready_timeout_s=5))
    agent = soak_agent.Agent(cfg, _no_nvml, lambda cfg, gpus: ServerLogEngine(findings), driver_loaded=lambda: False)
    assert agent.run() == 0
    meta = json.loads((tmp_path / "soak.json").read_text())
    assert meta["engine"] == "vllm" and meta["gpus"] == {"cpu01": []}
    assert meta["no_telemetry"]["cpu01"].startswith("no NVIDIA driver on this machine (NVML: ")
    assert read_csv(tmp_path / "telemetry.csv") == []
    # The log's finding went to events.csv: the symptom, and its line in the server log.
    [event] = read_csv(tmp_path / "events.csv")
    assert (event["host"], event["gpu"], event["event"], event["data"]) == ("cpu01", "", "vllm-engine-dead", "5")
    beat = json.loads((tmp_path / "heartbeat.json").read_text())
    assert beat["state"] == "finished" and beat["summary"]["no_telemetry"] == meta["no_telemetry"]["cpu01"]
    out = capsys.readouterr().out
    assert "no GPU telemetry: no NVIDIA driver on this machine" in out
    assert "vLLM server: ready after 41.5 s, RSS peak 2830.6 MiB, exit code 1; log vllm-server.log" in out
    assert ("server log line 5: vllm-engine-dead: the vLLM engine process died during the soak; try: read the "
            "traceback") in out


def test_nvml_failing_where_the_driver_is_loaded_fails_even_vllm(tmp_path):
    cfg = soak_agent.AgentConfig(out=tmp_path, host="gpu01", engine="vllm", seconds=0.3, interval_s=0.1,
                                 serve=soak_agent.ServeParams(model="tiny-llama-ci"))
    agent = soak_agent.Agent(cfg, _no_nvml, lambda cfg, gpus: pytest.fail("no engine without NVML"),
                             driver_loaded=lambda: True)
    assert agent.run() == 1
    beat = heartbeat(tmp_path)
    assert beat["state"] == "failed" and beat["last_error"].startswith("NVML: NVMLError_LibraryNotFound")


def test_vllm_engine_whose_server_cannot_start_fails_the_agent(tmp_path):
    # The real VllmEngine, told that this interpreter (which has no vllm) is vLLM's: the server
    # exits at once, and the agent fails saying so, the server's own words in its log.
    out = tmp_path / "soak"
    proc = subprocess.run([sys.executable, str(AGENT), "--out", str(out), "--engine", "vllm", "--model", "tiny-llama-ci",
                           "--vllm-python", sys.executable, "--seconds", "30", "--interval", "0.2",
                           "--fake-nvml", FAKE_HOOK], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    beat = heartbeat(out)
    assert beat["state"] == "failed" and beat["elapsed_s"] < 20
    assert beat["last_error"].startswith("vLLM server exited with code 1 before it was ready")
    assert "No module named 'vllm'" in (out / "vllm-server.log").read_text()
    assert json.loads((out / "model-tiny-llama-ci" / "config.json").read_text())["vocab_size"] == 1024
    assert "vLLM server: never ready" in proc.stdout


def test_serving_engines_need_their_files_beside_the_agent(tmp_path):
    # The agent's own modules, without the vllm and endpoint engines' files.
    for name in ("agent.py", "agent_options.py", "records.py", "sampler.py", "burn.py", "ib_snapshots.py"):
        shutil.copy(AGENT.with_name(name), tmp_path / name)
    proc = subprocess.run([sys.executable, str(tmp_path / "agent.py"), "--out", str(tmp_path / "soak"), "--engine",
                           "endpoint", "--endpoint", "http://127.0.0.1:8000"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and not (tmp_path / "soak").exists()
    assert ("vllm_engine.py, vllm_log.py, loadgen.py, loadgen_config.py, loadgen_bench.py, loadgen_http.py and "
            "loadgen_windows.py "
            f"not found beside the agent in {tmp_path}") in proc.stderr
