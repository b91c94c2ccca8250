"""The soak agent and the `preflight soak` controller, on this CPU-only machine.

NVML is replaced by ``FakeNvml``: pynvml's own constants and error classes, with the device
functions replaying the real H200 burn in tests/fixtures/corpus/h200-vm/burn_samples.json
(60 s of a bf16 GEMM sampled at 10 Hz) and the fixed values the same capture recorded
(probe.log: thresholds 89/95/87/95 C, power limit 700000 mW, max clocks 1980/3201 MHz,
remapped rows (0, 0, 0, 0), volatile ECC total 0; nvidia-smi.txt / smi-q.txt: name, UUID,
bus id, driver). What the capture did not record (memory temperature, memory used, the
clocks-event counters) answers "not supported", as such calls do on drivers without them.
The agent subprocesses load it through the agent's test hook ``--fake-nvml FILE:FACTORY``
and run the ``none`` engine (no torch here). The ``vllm`` and ``endpoint`` engines are wired in
here with servers that fail fast (no vLLM in this interpreter, nothing listening) and a stand-in
engine that reports the findings of a real vLLM server log; tests/test_soak_vllm_e2e.py runs a
real vLLM server through ``preflight soak``.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import importlib.util

import pynvml
import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "corpus" / "h200-vm"
RECORDED = ROOT / "tests" / "fixtures" / "recorded"
# vLLM 0.32.0 on this machine's CPU, its engine killed by an out-of-vocabulary prompt token id.
ENGINE_DEAD_LOG = RECORDED / "vllm-0.32.0-cpu-server-log-engine-dead-token-id-out-of-vocab-excerpt.txt"
SAMPLES = json.loads((CORPUS / "burn_samples.json").read_text())
AGENT = ROOT / "preflight" / "node" / "agent.py"
THIS = Path(__file__).resolve()


def _load_agent():
    # By path, as the controller ships it: the agent stands alone, and the agent processes that
    # load this file for FakeNvml stay free of preflight's (pandas-heavy) package imports.
    spec = importlib.util.spec_from_file_location("preflight_soak_agent_under_test", AGENT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the classes
    spec.loader.exec_module(module)
    return module


soak_agent = _load_agent()


class FakeNvml:
    """A stand-in for the ``pynvml`` module (see the module docstring for where values come from).

    ``clock`` drives the replay: GPU k reads the sample at ``(clock() - init + k * 7) mod 60.67 s``
    so that several GPUs differ. ``event_reasons=False`` makes the new clocks-event call missing
    (as on drivers before R535), ``lost_at`` makes every call about GPU 1 fail with "GPU is lost"
    from that replay time on, ``events`` are (gpu, event type, data) delivered once through
    an event set.
    """

    def __init__(self, gpus: int = 1, clock=time.monotonic, event_reasons: bool = True,
                 lost_at: float | None = None, events: tuple = ()):
        self.gpus, self.clock, self.lost_at = gpus, clock, lost_at
        self.t0 = None
        self._times = [s["t"] for s in SAMPLES]
        self._events = list(events)
        if not event_reasons:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._missing

    def __getattr__(self, name):
        value = getattr(pynvml, name)  # constants and the NVMLError classes
        if name.startswith("nvml") and callable(value):
            return self._missing  # a function this driver "lacks"
        return value

    @staticmethod
    def _missing(*_args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _elapsed(self) -> float:
        return self.clock() - self.t0

    def _sample(self, gpu: int) -> dict:
        t = self._elapsed()
        if self.lost_at is not None and gpu == 1 and t >= self.lost_at:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        t = (t + 7 * gpu) % self._times[-1]
        return SAMPLES[max(0, bisect.bisect_right(self._times, t) - 1)]

    # Lifecycle and identity
    def nvmlInit(self):
        self.t0 = self.clock()

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetIndex(self, handle):
        return handle

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, h):
        return "GPU-88c58391-6001-919c-8431-20f011c20563"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:00:06.0")

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetNVMLVersion(self):
        return "13.580.159.04"

    # Fixed values from probe.log
    def nvmlDeviceGetTemperatureThreshold(self, h, kind):
        return {pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 95,
                pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 87, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 95}[kind]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._sample(h)
        return 700000

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return 700000

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}[kind]

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        known = {pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: 0, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: 0,
                 pynvml.NVML_FI_DEV_REMAPPED_COR: 0, pynvml.NVML_FI_DEV_REMAPPED_UNC: 0,
                 pynvml.NVML_FI_DEV_REMAPPED_PENDING: 0, pynvml.NVML_FI_DEV_REMAPPED_FAILURE: 0}
        out = []
        for fid in field_ids:
            value = pynvml.c_nvmlFieldValue_t()
            value.fieldId = fid
            if fid in known:
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = known[fid]
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append(value)
        return out

    # Replayed from burn_samples.json
    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._sample(h)["temp"]

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._sample(h)["sm" if kind == pynvml.NVML_CLOCK_SM else "mem"]

    def nvmlDeviceGetPowerUsage(self, h):
        return round(self._sample(h)["power_w"] * 1000)

    def nvmlDeviceGetUtilizationRates(self, h):
        # The capture kept GPU utilisation only; memory utilisation reads as not available.
        return SimpleNamespace(gpu=self._sample(h)["util"], memory=None)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._sample(h)["reasons"]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._sample(h)["reasons"]

    # Event set
    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceGetSupportedEventTypes(self, h):
        return pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError

    def nvmlDeviceRegisterEvents(self, h, types, event_set):
        pass

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if self._events:
            gpu, kind, data = self._events.pop(0)
            return SimpleNamespace(device=gpu, eventType=kind, eventData=data)
        time.sleep(min(timeout_ms, 20) / 1000)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set):
        pass


def fake_two_gpus() -> FakeNvml:
    """Factory for the agent's ``--fake-nvml`` hook."""
    return FakeNvml(gpus=2)


FAKE_HOOK = f"{THIS}:fake_two_gpus"


class ManualClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def read_csv(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


# --- Pure writers ------------------------------------------------------------------------------


def test_telemetry_row_text_keeps_contract_columns_first_and_empties_none():
    # The first sample of the capture: idle H200, 43 C, 345 MHz, 78.63 W, reasons 0.
    first = SAMPLES[0]
    row = soak_agent.GpuSample(time=1764408214.25, host="gpu01", gpu=0, temperature_c=first["temp"],
                               sm_clock_mhz=first["sm"], memory_clock_mhz=first["mem"], power_w=first["power_w"],
                               power_limit_w=700.0, utilization_pct=first["util"],
                               clocks_event_reasons=first["reasons"])
    header = soak_agent.csv_text([soak_agent.TELEMETRY_COLUMNS])
    assert header.startswith("time,host,gpu,temperature_c,memory_temperature_c,sm_clock_mhz,memory_clock_mhz,"
                             "power_w,power_limit_w,utilization_pct,memory_used_mib,clocks_event_reasons,")
    text = soak_agent.row_text([row])
    assert text == "1764408214.25,gpu01,0,43,,345,3201,78.63,700.0,0,,0" + "," * (len(soak_agent.TELEMETRY_COLUMNS) - 12) + "\n"
    parsed = next(csv.DictReader(io.StringIO(header + text)))
    assert parsed["memory_temperature_c"] == "" and parsed["power_w"] == "78.63"


def test_throughput_and_event_rows():
    text = soak_agent.row_text([soak_agent.ThroughputRow(10.0, "gpu01", "tflops", 674.0),
                                soak_agent.ThroughputRow(10.0, "gpu01", "gpu_tflops", 674.0, 0),
                                soak_agent.EventRow(11.5, "gpu01", 3, "xid", 79)])
    assert text.splitlines() == ["10.0,gpu01,tflops,674.0,", "10.0,gpu01,gpu_tflops,674.0,0", "11.5,gpu01,3,xid,79"]


def test_append_log_writes_header_once_and_only_whole_lines(tmp_path):
    path = tmp_path / "telemetry.csv"
    log = soak_agent.AppendLog(path, soak_agent.THROUGHPUT_COLUMNS)
    log.append(soak_agent.row_text([soak_agent.ThroughputRow(1.0, "h", "tflops", 673.2)]))
    log.close()
    log = soak_agent.AppendLog(path, soak_agent.THROUGHPUT_COLUMNS)  # reopened: no second header
    log.append(soak_agent.row_text([soak_agent.ThroughputRow(6.0, "h", "tflops", 673.8)]))
    log.sync()
    log.close()
    assert path.read_text() == "time,host,metric,value,gpu\n1.0,h,tflops,673.2,\n6.0,h,tflops,673.8,\n"


def test_heartbeat_doc_and_atomic_write(tmp_path):
    p = soak_agent.Progress(pid=4242, host="gpu01", engine="burn", started=1000.0, planned_s=3600, interval_s=0.1)
    p.state, p.ticks, p.rows, p.sampler_cpu_s = "running", 10, 80, 0.02
    p.error("GPU 3: nvmlDeviceGetPowerUsage: Unknown Error")
    doc = soak_agent.heartbeat_doc(p, now=1012.5, process_cpu_s=0.4)
    assert doc["elapsed_s"] == 12.5 and doc["state"] == "running" and doc["pid"] == 4242
    assert doc["sampler_cpu_ms_per_tick"] == 2.0 and doc["sampler_cpu_ms_per_gpu_sample"] == 0.25
    assert doc["last_error"].startswith("GPU 3") and doc["errors"] == 1
    soak_agent.write_json_atomic(tmp_path / "heartbeat.json", doc)
    assert json.loads((tmp_path / "heartbeat.json").read_text()) == doc
    assert [f.name for f in tmp_path.iterdir()] == ["heartbeat.json"]  # no temporary left behind


def test_window_book_sums_gpus_and_does_not_wait_for_a_silent_gpu():
    book = soak_agent.WindowBook()
    # Per-window rates from probe.log's real 5 s windows (673.2, 673.8, 674.3 TFLOP/s; 4265 GB/s).
    book.add(1, 0, 673.2, 4265.1)
    assert book.release({0, 1}) == []
    book.add(1, 1, 673.8, 4265.1)
    assert book.release({0, 1}) == [(1, {0: (673.2, 4265.1), 1: (673.8, 4265.1)})]
    book.add(2, 0, 674.3, 4265.1)
    book.add(3, 0, 674.5, 4265.1)
    assert book.release({0, 1}) == []
    book.add(4, 0, 674.1, 4265.1)  # GPU 1 is two windows behind: window 2 goes without it
    assert book.release({0, 1}) == [(2, {0: (674.3, 4265.1)})]
    assert [k for k, _ in book.release({0, 1}, final=True)] == [3, 4]


# --- Sampler against the replayed H200 burn ---------------------------------------------------


def test_sampler_replays_the_h200_burn():
    clock = ManualClock()
    sampler = soak_agent.Sampler(FakeNvml(clock=clock), "h200")
    info = sampler.gpus[0]
    assert (info["slowdown_c"], info["shutdown_c"], info["max_operating_c"], info["memory_max_c"]) == (89, 95, 87, 95)
    assert info["power_limit_w"] == 700.0 and info["max_sm_clock_mhz"] == 1980
    assert info["name"] == "NVIDIA H200" and info["pci_bus_id"] == "00000000:00:06.0"
    idle = sampler.sample(0)
    assert (idle.temperature_c, idle.sm_clock_mhz, idle.power_w, idle.clocks_event_reasons) == (43, 345, 78.63, 0)
    clock.t = 30.25  # the sample at t=30.22 s: power-capped burn
    busy = sampler.sample(0)
    assert busy.power_w == 691.736 and busy.power_limit_w == 700.0 and busy.utilization_pct == 100
    assert busy.clocks_event_reasons == 0x4 and busy.sm_clock_mhz == 1455 and busy.memory_clock_mhz == 3201
    assert busy.slowdown_temperature_c == 89
    assert busy.remapped_rows_pending == 0 and busy.ecc_dbe_volatile == 0
    # Not recorded by the capture, so "not supported": empty cells, never errors.
    assert busy.memory_temperature_c is None and busy.memory_used_mib is None and busy.sw_power_cap_ns is None
    assert sampler.take_errors() == []


def test_sampler_falls_back_to_the_throttle_reasons_call():
    clock = ManualClock()
    sampler = soak_agent.Sampler(FakeNvml(clock=clock, event_reasons=False), "h200")
    clock.t = 30.25
    assert sampler.sample(0).clocks_event_reasons == 0x4
    assert sampler._reasons_call[0] == "nvmlDeviceGetCurrentClocksThrottleReasons"


def test_a_gpu_that_falls_off_the_bus_stops_getting_rows():
    clock = ManualClock()
    sampler = soak_agent.Sampler(FakeNvml(gpus=2, clock=clock, lost_at=2.0), "h200")
    clock.t = 1.0
    assert [s.gpu for s in map(sampler.sample, range(2))] == [0, 1]
    clock.t = 2.5
    assert [s and s.gpu for s in map(sampler.sample, range(2))] == [0, None]
    assert any("GPU 1" in e and "GPU is lost" in e for e in sampler.take_errors())


def test_event_watcher_records_an_xid():
    nvml = FakeNvml(gpus=2, events=((1, pynvml.nvmlEventTypeXidCriticalError, 79),))
    nvml.nvmlInit()
    stop = soak_agent.threading.Event()
    watcher = soak_agent.EventWatcher(nvml, [0, 1], "h200", stop)
    watcher.start()
    deadline = time.monotonic() + 2
    rows = []
    while not rows and time.monotonic() < deadline:
        rows = watcher.take()
        time.sleep(0.01)
    stop.set()
    watcher.join(2)
    assert [(r.gpu, r.event, r.data) for r in rows] == [(1, "xid", 79)]
    assert watcher.note is None


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


def agent_cmd(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(AGENT), "--out", str(out), "--engine", "none", "--fake-nvml", FAKE_HOOK, *args]


def wait_for(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def heartbeat(out: Path) -> dict | None:
    try:
        return json.loads((out / "heartbeat.json").read_text())
    except (OSError, ValueError):
        return None


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


@pytest.fixture
def controller():
    from preflight.soak import controller

    return controller


def local_plan(controller, tmp_path: Path, seconds: float, run_id: str = "run1"):
    return controller.SoakPlan(run_id=run_id, out=tmp_path / "reports", engine="none", seconds=seconds,
                               interval_s=0.1, local_name="gpu-local", node_dir=str(tmp_path / "node"),
                               agent_args=("--fake-nvml", FAKE_HOOK), poll_s=0.1)


def quiet_console():
    from rich.console import Console

    return Console(file=io.StringIO(), width=200)


def test_local_soak_runs_detached_and_merges(tmp_path, controller):
    plan = local_plan(controller, tmp_path, seconds=0.3)
    console = quiet_console()
    started = controller.start(plan, console)
    assert started[0].ok and "agent pid" in started[0].detail
    outcome = controller.follow(plan, console, started)
    assert outcome.outcomes == {"gpu-local": ("finished", None)} and not outcome.failed
    run_dir = plan.run_dir
    node_copy = run_dir / "soak" / "gpu-local"
    # The mirror is byte for byte the node's directory.
    node_dir = tmp_path / "node" / "run1"
    for name in ("telemetry.csv", "throughput.csv", "events.csv", "heartbeat.json", "soak.json"):
        assert (node_copy / name).read_bytes() == (node_dir / name).read_bytes(), name
    meta = json.loads((run_dir / "soak.json").read_text())
    assert meta["format"] == "preflight-soak/1" and meta["hosts"] == ["gpu-local"] and meta["engine"] == "none"
    assert meta["agents"]["gpu-local"]["outcome"] == "finished"
    rows = read_csv(run_dir / "telemetry.csv")
    assert {r["host"] for r in rows} == {"gpu-local"} and {r["gpu"] for r in rows} == {"0", "1"}
    # GPU 1 replays the capture from t=7 s: the power-capped burn (0x4, ~690 W of 700 W).
    assert {r["clocks_event_reasons"] for r in rows if r["gpu"] == "1"} == {"4"}
    # The merged directory is what preflight.soak.analysis reads.
    from preflight.soak.analysis import analyze_soak

    section = analyze_soak(run_dir).soak_section()["gpu-local"]
    assert section["engine"] == "none" and section["max_temperature_c"] >= 63


def test_controller_death_then_attach_collects(tmp_path, controller, capsys):
    from preflight.app.cli import main as cli_main

    plan = local_plan(controller, tmp_path, seconds=0.3)
    controller.start(plan, quiet_console())  # ...and the controller "dies" here: nobody watches
    node_dir = tmp_path / "node" / "run1"
    wait_for(lambda: (heartbeat(node_dir) or {}).get("state") == "finished")
    code = cli_main(["soak", "--attach", "run1", "--out", str(plan.out), "-q"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gpu-local: finished" in out
    assert read_csv(plan.run_dir / "telemetry.csv") and json.loads((plan.run_dir / "soak.json").read_text())["hosts"]


def test_agent_killed_mid_run_loses_at_most_one_interval(tmp_path, controller):
    plan = local_plan(controller, tmp_path, seconds=60)
    started = controller.start(plan, quiet_console())
    node_dir = tmp_path / "node" / "run1"
    beat = wait_for(lambda: (b := heartbeat(node_dir)) and b["ticks"] >= 3 and b)
    os.kill(beat["pid"], signal.SIGKILL)
    killed_at = time.time()
    outcome = controller.follow(plan, quiet_console(), started)
    assert outcome.outcomes["gpu-local"][0] == "died" and outcome.failed
    on_node = (node_dir / "telemetry.csv").read_text()
    assert on_node.endswith("\n")  # whole lines only
    assert (plan.run_dir / "soak" / "gpu-local" / "telemetry.csv").read_text() == on_node
    rows = read_csv(plan.run_dir / "telemetry.csv")
    last = heartbeat(node_dir)
    assert last["state"] == "running"
    # Rows go out before the heartbeat, so the file holds at least what the last heartbeat
    # counted, up to that heartbeat's own tick: only the tick in flight at the kill is lost.
    assert len(rows) >= last["rows"] >= 6 and {r["power_limit_w"] for r in rows} == {"700.0"}
    assert float(rows[-1]["time"]) >= last["now_epoch"] - 0.1
    assert killed_at - float(rows[-1]["time"]) < 1.0  # (a loose bound: this machine may be busy)


@pytest.mark.parametrize("argv, error", [
    (["--engine", "vllm"], "--engine vllm needs --model (built-in: llama-3-70b-dense"),
    (["--engine", "burn", "--model", "tiny-llama-ci"], "--model does not apply to --engine burn"),
    (["--engine", "vllm", "--model", "tiny-llama-ci", "--endpoint", "http://127.0.0.1:8000"],
     "--endpoint does not apply to --engine vllm"),
    (["--engine", "endpoint"], "--engine endpoint needs --endpoint URL"),
])
def test_cli_checks_the_serving_options(tmp_path, capsys, argv, error):
    from preflight.app.cli import main as cli_main

    assert cli_main(["soak", "--local", "--out", str(tmp_path), *argv]) == 2
    assert error in capsys.readouterr().err.replace("\n", "")
    assert not list(tmp_path.iterdir())


def test_plan_passes_the_serving_options_to_the_agent_as_argv(controller):
    from preflight.app.cli import build_parser

    args = build_parser().parse_args([
        "soak", "--local", "--engine", "vllm", "--model", "tiny-llama-ci", "--vllm-python", "/venv/bin/python3",
        "--vllm-arg=--enforce-eager", "--vllm-arg", "--kv-cache-dtype fp8", "--concurrency", "16",
        "--no-skip-tokenizer-init"])
    plan = controller.plan_from_args(args, "gpu01", "r1")
    assert plan.engine == "vllm" and plan.builtin_model == "tiny-llama-ci"
    assert plan.agent_args == ("--model=tiny-llama-ci", "--vllm-python=/venv/bin/python3", "--vllm-arg=--enforce-eager",
                               "--vllm-arg=--kv-cache-dtype fp8", "--no-skip-tokenizer-init", "--concurrency=16")
    # ... which the agent reads back, each --vllm-arg split like a shell line.
    agent_args = soak_agent.parse_args(["--engine", "vllm", *plan.agent_args])
    assert agent_args.vllm_arg == ("--enforce-eager", "--kv-cache-dtype", "fp8")
    assert (agent_args.model, agent_args.concurrency, agent_args.skip_tokenizer_init) == ("tiny-llama-ci", 16, False)
    endpoint = controller.plan_from_args(build_parser().parse_args(["soak", "--endpoint", "http://10.0.0.5:8000"]),
                                         "gpu01", "r2")
    assert (endpoint.engine, endpoint.agent_args, endpoint.builtin_model) == (
        "endpoint", ("--endpoint=http://10.0.0.5:8000",), None)
    assert controller.SoakPlan.from_json(plan.to_json(), plan.out) == plan


def test_agent_bundle_carries_the_engines_and_the_model_and_nothing_escapes(tmp_path, controller):
    import tarfile

    bundle = controller.agent_bundle("tiny-llama-ci")
    with tarfile.open(fileobj=io.BytesIO(bundle)) as tar:
        assert tar.getnames() == ["agent.py", "vllm_engine.py", "loadgen.py", "models/tiny-llama-ci.json"]
        assert tar.extractfile("agent.py").read() == AGENT.read_bytes()
    node = controller.LocalNode("gpu-local")
    # A bundle naming a path outside the run directory is refused before anything runs.
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        info = tarfile.TarInfo("../escaped.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    reply = node.run([sys.executable, "-c", controller._START, str(tmp_path / "node"), "r1", "--engine", "none"],
                     stdin=evil.getvalue(), timeout=60)
    assert reply.exit_code == 1 and "refusing '../escaped.py'" in reply.stderr
    assert not (tmp_path / "node" / "escaped.py").exists()


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
    lone = tmp_path / "agent.py"
    lone.write_bytes(AGENT.read_bytes())
    proc = subprocess.run([sys.executable, str(lone), "--out", str(tmp_path / "soak"), "--engine", "endpoint",
                           "--endpoint", "http://127.0.0.1:8000"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and not (tmp_path / "soak").exists()
    assert f"vllm_engine.py and loadgen.py not found beside the agent in {tmp_path}" in proc.stderr


def test_endpoint_soak_that_nothing_answers_fails_through_the_controller(tmp_path, controller):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    plan = controller.SoakPlan(run_id="ep1", out=tmp_path / "reports", engine="endpoint", seconds=30, interval_s=0.1,
                               local_name="gpu-local", node_dir=str(tmp_path / "node"), poll_s=0.1,
                               agent_args=("--fake-nvml", FAKE_HOOK, f"--endpoint=http://127.0.0.1:{port}"))
    console = quiet_console()
    outcome = controller.follow(plan, console, controller.start(plan, console))
    state, note = outcome.outcomes["gpu-local"]
    assert state == "failed" and note.startswith(f"load generator against http://127.0.0.1:{port}: ")
    node_dir = tmp_path / "node" / "ep1"
    assert sorted(p.name for p in node_dir.glob("*.py")) == ["agent.py", "loadgen.py", "vllm_engine.py"]
    # The load generator's log came back with the rest.
    assert (plan.run_dir / "soak" / "gpu-local" / "loadgen.log").read_bytes() == (node_dir / "loadgen.log").read_bytes()
    assert json.loads((plan.run_dir / "soak.json").read_text())["engine"] == "endpoint"


def test_node_status_names_the_hottest_gpu_and_active_reasons(controller):
    # Two rows of the capture: t=0.0 idle (43 C, 345 MHz, 0x0) and t=30.22 burn (65 C, 1455 MHz, 0x4).
    idle, busy = SAMPLES[0], next(s for s in SAMPLES if s["t"] == 30.22)
    rows = {0: {"temperature_c": str(idle["temp"]), "sm_clock_mhz": str(idle["sm"]), "clocks_event_reasons": "0"},
            1: {"temperature_c": str(busy["temp"]), "sm_clock_mhz": str(busy["sm"]), "clocks_event_reasons": "4"}}
    s = controller.node_status("gpu01", "running", {"elapsed_s": 30.2, "planned_s": 3600}, rows, {"tflops": 674.0}, None)
    assert s.hottest == (1, 65.0) and s.lowest_sm == (0, 345.0) and s.reasons == ("sw_power_cap",)
    assert s.throughput == (("tflops", 674.0),)


@pytest.mark.root
def test_soak_over_ssh_on_the_simulated_cluster(tmp_path, sim_cluster, controller):
    from simcluster import SimHost

    from preflight.collect.ssh import SshOptions

    cluster = sim_cluster([SimHost("gpu01"), SimHost("gpu02"), SimHost("gpu03", down=True)])
    hosts = controller.load_hosts_file(cluster.hosts_file)
    plan = controller.SoakPlan(
        run_id="ssh1", out=tmp_path / "reports", engine="none", seconds=0.3, interval_s=0.1, hosts=tuple(hosts),
        ssh=SshOptions(ssh_config=cluster.ssh_config, identity=cluster.identity, known_hosts=cluster.known_hosts),
        python=sys.executable, agent_args=("--fake-nvml", FAKE_HOOK), poll_s=0.1)
    console = quiet_console()
    started = {s.host: s for s in controller.start(plan, console)}
    assert started["gpu01"].ok and started["gpu02"].ok
    assert not started["gpu03"].ok and "connection refused" in started["gpu03"].detail
    outcome = controller.follow(plan, console, list(started.values()))
    assert {h: o[0] for h, o in outcome.outcomes.items()} == {"gpu01": "finished", "gpu02": "finished",
                                                             "gpu03": "not started"}
    meta = json.loads((plan.run_dir / "soak.json").read_text())
    assert meta["hosts"] == ["gpu01", "gpu02"] and "gpu03" in meta["missing"]
    rows = read_csv(plan.run_dir / "telemetry.csv")
    assert {r["host"] for r in rows} == {"gpu01", "gpu02"}
    # Each node kept its files in its own home directory (~/.cache/preflight/soak/ssh1).
    assert started["gpu01"].detail.endswith("/hosts/gpu01/home/.cache/preflight/soak/ssh1")
    assert "engine none" in (plan.run_dir / "soak" / "gpu01" / "agent.log").read_text()


def test_merge_maps_other_headers_and_drops_a_cut_last_line(tmp_path, controller):
    # Host a: the agent's full columns; host b: the contract's twelve only (as a converted DCGM
    # dump would have), its copy cut mid-line; host c: never delivered a soak.json.
    run_dir = tmp_path / "run9"
    rows = [soak_agent.GpuSample(time=1000.0 + s["t"], host="a", gpu=0, temperature_c=s["temp"], sm_clock_mhz=s["sm"],
                                 memory_clock_mhz=s["mem"], power_w=s["power_w"], power_limit_w=700.0,
                                 utilization_pct=s["util"], clocks_event_reasons=s["reasons"], slowdown_temperature_c=89)
            for s in SAMPLES[:20]]
    for host in ("a", "b", "c"):
        (run_dir / "soak" / host).mkdir(parents=True)
    for host in ("a", "b"):
        (run_dir / "soak" / host / "soak.json").write_text(json.dumps(
            {"format": "preflight-soak/1", "engine": "burn", "started": f"2026-11-29T10:0{'ab'.index(host)}:00+00:00",
             "hosts": [host], "gpus": {host: [{"gpu": 0, "slowdown_c": 89}]}}))
    header = soak_agent.csv_text([soak_agent.TELEMETRY_COLUMNS])
    (run_dir / "soak" / "a" / "telemetry.csv").write_text(header + soak_agent.row_text(rows))
    b_lines = [",".join(line.split(",")[:12]).replace(",a,", ",b,", 1)
               for line in (header + soak_agent.row_text(rows[:5])).splitlines()]
    (run_dir / "soak" / "b" / "telemetry.csv").write_text("\n".join(b_lines) + "\n" + b_lines[-1][:17])
    meta = controller.merge_soak(run_dir, {"a": ("finished", None), "b": ("died", "killed"),
                                           "c": ("unreachable", "connect timed out")})
    assert meta["hosts"] == ["a", "b"] and meta["started"] == "2026-11-29T10:00:00+00:00"
    assert meta["missing"] == {"c": "connect timed out"} and meta["agents"]["b"]["outcome"] == "died"
    merged = read_csv(run_dir / "telemetry.csv")
    assert len(merged) == 25 and list(merged[0]) == list(soak_agent.TELEMETRY_COLUMNS)
    b = [r for r in merged if r["host"] == "b"]
    assert [r["power_w"] for r in b] == [str(s["power_w"]) for s in SAMPLES[:5]]
    assert all(r["slowdown_temperature_c"] == "" for r in b)
    assert read_csv(run_dir / "throughput.csv") == []  # nobody wrote one: header only


def test_mirror_follows_byte_offsets_across_a_cut_line_and_a_new_controller(tmp_path, controller):
    import base64

    rows = [soak_agent.GpuSample(time=1000.0 + s["t"], host="h", gpu=0, temperature_c=s["temp"], sm_clock_mhz=s["sm"],
                                 power_w=s["power_w"], clocks_event_reasons=s["reasons"]) for s in SAMPLES[:6]]
    text = (soak_agent.csv_text([soak_agent.TELEMETRY_COLUMNS]) + soak_agent.row_text(rows)).encode()
    cut = text.index(b"\n") + 20  # inside the first data row

    def pulled(start, end):
        return {"telemetry.csv": {"offset": start, "size": end,
                                  "data": base64.b64encode(text[start:end]).decode()}}

    first = controller.Mirror(tmp_path / "copy")
    assert first.apply(pulled(0, cut)) == {"telemetry.csv": []} and first.caught_up
    second = controller.Mirror(tmp_path / "copy")  # the controller died; --attach starts a new one
    assert second.sizes["telemetry.csv"] == cut
    got = second.apply(pulled(cut, len(text)))["telemetry.csv"]
    assert [r["power_w"] for r in got] == [str(s["power_w"]) for s in SAMPLES[:6]]
    assert (tmp_path / "copy" / "telemetry.csv").read_bytes() == text
