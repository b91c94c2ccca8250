"""The streaming load generator (preflight/node/loadgen.py) against a fake OpenAI SSE server.

The fake server (asyncio, loopback only, a free port) answers ``/health``, ``/v1/models``,
``/metrics`` (a real vLLM 0.32.0 capture) and ``/v1/completions`` with Server-Sent Events in
chunked transfer coding, timed as each test's plan says. Its chunks are the recorded vLLM stream
(tests/fixtures/recorded/vllm-0.32.0-cpu-completions-stream-token-ids-raw-http.txt) with the
token ids and finish reason set per token; one test replays the recorded bytes unchanged.
Requests with ``max_tokens`` 2 are the generator's probe and are answered at once.

The load generator is three files that a node runs as a script from one directory (loadgen.py
with loadgen_http.py and loadgen_windows.py beside it; tests/soak/test_soak_controller.py runs them
that way); here they are imported from the package. tests/test_layers.py keeps them free of
preflight imports.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from preflight.node import loadgen as lg
from preflight.node import loadgen_http as lh
from preflight.node import loadgen_windows as lw

ROOT = Path(__file__).resolve().parents[2]
LOADGEN = ROOT / "preflight" / "node" / "loadgen.py"
RECORDED = ROOT / "tests" / "fixtures" / "recorded"
RAW_STREAM = RECORDED / "vllm-0.32.0-cpu-completions-stream-token-ids-raw-http.txt"
METRICS_032 = RECORDED / "vllm-metrics-0.32.0-cpu-tiny-llama-128-running-192-waiting.txt"
METRICS_318 = RECORDED / "vllm-metrics-v1-gpu-cache-usage-perc-production-stack-318-excerpt.txt"



def _recorded_events() -> list[dict]:
    """The JSON chunks of the recorded stream, in order (3 token chunks, then usage)."""
    return [json.loads(line[6:]) for line in RAW_STREAM.read_text().splitlines() if line.startswith("data: {")]


EVENTS = _recorded_events()
FIRST, _, LAST, USAGE = EVENTS
HEAD, _, _ = RAW_STREAM.read_bytes().partition(b"\r\n\r\n")


@dataclass(frozen=True)
class Reply:
    kind: str = "ok"  # ok | status | drop | raw
    tokens: int = 5
    ttft_s: float = 0.0
    gap_s: float = 0.0
    status: int = 500
    drop_after: int = 2
    ids: bool = True  # token_ids in each chunk (vLLM's return_token_ids); else None, as without it
    per_chunk: int = 1  # tokens each chunk stands for (usage counts them all)


def token_chunk(i: int, n: int, ids: bool, per_chunk: int) -> dict:
    """The recorded first/last chunk with this token's ids and finish reason."""
    doc = copy.deepcopy(FIRST if i == 0 else LAST)
    choice = doc["choices"][0]
    choice["token_ids"] = [100 + i * per_chunk + k for k in range(per_chunk)] if ids else None
    choice["prompt_token_ids"] = FIRST["choices"][0]["prompt_token_ids"] if i == 0 else None
    choice["finish_reason"] = "length" if i == n - 1 else None
    return doc


class FakeServer:
    """See the module docstring. ``plan(i)`` says how to answer the i-th completion (probes not
    counted); ``strict`` rejects vLLM's extra fields with 400, as a plain OpenAI server does."""

    def __init__(self, plan: Callable[[int], Reply] = lambda i: Reply(), metrics: Path = METRICS_032,
                 strict: bool = False):
        self.plan, self.metrics, self.strict = plan, metrics.read_bytes(), strict
        self.bodies: list[dict] = []
        self.scrapes = 0

    async def __aenter__(self) -> FakeServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            method, path, _ = (await reader.readline()).decode().split(" ", 2)
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                key, _, value = line.decode().partition(":")
                if key.lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            if path == "/health":
                await self._plain(writer, 200, b"")
            elif path == "/v1/models":
                await self._plain(writer, 200, json.dumps({"object": "list", "data": [{"id": "tiny"}]}).encode())
            elif path == "/metrics":
                self.scrapes += 1
                await self._plain(writer, 200, self.metrics)
            else:
                await self._completion(writer, json.loads(body))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away (cancelled at the end of a run)
        finally:
            writer.close()

    async def _plain(self, writer, status: int, body: bytes) -> None:
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()

    async def _completion(self, writer, doc: dict) -> None:
        if self.strict and ("ignore_eos" in doc or "return_token_ids" in doc):
            return await self._plain(writer, 400, b'{"error": {"message": "Unrecognized request argument"}}')
        probe = doc["max_tokens"] == 2
        reply = Reply(tokens=2) if probe else self.plan(len(self.bodies))
        if not probe:
            self.bodies.append(doc)
        if reply.kind == "status":
            return await self._plain(writer, reply.status, b'{"error": {"message": "boom"}}')
        if reply.kind == "raw":
            writer.write(RAW_STREAM.read_bytes())
            return await writer.drain()
        writer.write(HEAD + b"\r\n\r\n")

        async def send(event) -> None:
            data = f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        for i in range(reply.tokens):
            await asyncio.sleep(reply.ttft_s if i == 0 else reply.gap_s)
            if reply.kind == "drop" and i == reply.drop_after:
                return  # connection closed mid-stream, no terminating chunk
            await send(token_chunk(i, reply.tokens, reply.ids, reply.per_chunk))
        usage = copy.deepcopy(USAGE)
        usage["usage"]["completion_tokens"] = reply.tokens * reply.per_chunk
        await send(usage)
        await send("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def run(server: FakeServer, **cfg) -> tuple[list, lg.LoadSummary, list]:
    """Runs one load against ``server`` in this event loop; returns the windows' rows (one list
    per window), the summary and the events."""

    async def main():
        async with server:
            windows, events = [], []
            gen = lg.LoadGenerator(lg.LoadConfig(url=server.url, **cfg), windows.append,
                                   lambda kind, data: events.append((kind, data)))
            return windows, await gen.run(), events

    return asyncio.run(main())


def by_metric(rows) -> dict:
    return {r.metric: r.value for r in rows}


# --- Against the fake server -------------------------------------------------------------------


def test_recorded_vllm_stream_bytes_are_parsed_end_to_end():
    server = FakeServer(lambda i: Reply(kind="raw"))
    windows, summary, events = run(server, concurrency=1, max_requests=3, window_s=5.0, seconds=5.0)
    # Each recorded response streams 3 tokens (usage: completion_tokens 3) over chunked coding.
    assert summary.requests_completed == 3 and summary.output_tokens == 9
    assert summary.errors == {} and summary.fatal is None
    assert summary.model == "tiny" and summary.prompt_mode == "token_ids+vllm"
    assert events[0] == ("ready", {"waited_s": 0.0, "model": "tiny", "prompt_mode": "token_ids+vllm"})
    body = server.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["return_token_ids"] is True
    assert len(body["prompt"]) == 256 and all(100 <= t < 32000 for t in body["prompt"])
    assert body["prompt"] != server.bodies[1]["prompt"]  # random per request: no prefix-cache hits
    # The run ended by count, so its one window closed where it stood.
    assert len(windows) == 1 and by_metric(windows[0])["errors"] == 0


def test_windows_measure_ttft_tpot_tokens_and_scrape_metrics():
    # Every request: first token after 80 ms, then 4 more 20 ms apart (TPOT 20 ms).
    server = FakeServer(lambda i: Reply(tokens=5, ttft_s=0.08, gap_s=0.02))
    windows, summary, _ = run(server, concurrency=4, window_s=0.3, seconds=0.6)
    assert len(windows) == 2 and summary.windows == 2 and summary.errors == {}
    t0 = summary.started
    for k, rows in enumerate(windows, 1):
        m = by_metric(rows)
        # Server-side delays are floors; a busy machine adds to them (bounds allow for a CPU-bound
        # neighbour; on a quiet machine: 83 ms, 21 ms, 106 tokens/s).
        assert 75 <= m["ttft_p50_ms"] <= 200
        assert m["ttft_p50_ms"] <= m["ttft_p90_ms"] <= m["ttft_p99_ms"]
        assert 15 <= m["tpot_p50_ms"] <= 40 and m["tpot_p99_ms"] >= m["tpot_p50_ms"]
        # A worker streams 5 tokens in >= 0.16 s: at most 125 tokens/s for 4.
        assert 60 <= m["output_tokens_per_s"] <= 125
        assert m["errors"] == 0 and m["in_flight"] == 4
        assert rows[0].time == pytest.approx(t0 + 0.3 * k, abs=0.08)
        # From the recorded /metrics (vLLM 0.32.0 on the CPU with 320 requests sent to it).
        assert m["requests_running"] == 128.0 and m["requests_waiting"] == 192.0
        assert m["kv_cache_usage"] == 0.1250610649731314
        assert m["preemptions"] == 0.0 and m["server_output_tokens_per_s"] == 0.0  # same counters
    # Requests completed, window by window, add up to the run's (the last window closed at the
    # deadline, before the 4 in flight were cancelled).
    spans = [w[0].time - start for w, start in zip(windows, [t0] + [w[0].time for w in windows], strict=False)]
    assert sum(round(by_metric(w)["requests_per_s"] * dt) for w, dt in zip(windows, spans, strict=True)) == summary.requests_completed
    assert server.scrapes == 3  # the baseline, then one a window
    assert summary.kv_cache_metric == "vllm:kv_cache_usage_perc"
    assert summary.requests_cancelled == 4  # in flight at the deadline: cancelled, not errors
    # Completed requests brought 5 tokens each; the 4 cancelled ones at most 4 each.
    assert 0 <= summary.output_tokens - 5 * summary.requests_completed <= 4 * 4


def test_server_errors_and_disconnects_are_counted_per_kind():
    plans = {0: Reply(kind="status", status=500), 1: Reply(kind="drop", drop_after=2, tokens=5)}
    server = FakeServer(lambda i: plans.get(i, Reply(tokens=5)))
    windows, summary, _ = run(server, concurrency=2, max_requests=4, window_s=5.0, seconds=5.0)
    assert summary.errors == {"http_500": 1, "disconnect": 1}
    assert summary.requests_started == 4 and summary.requests_completed == 2
    # The dropped request's 2 tokens were generated and are counted; it has no TPOT.
    assert summary.output_tokens == 2 + 2 * 5
    assert sum(by_metric(w)["errors"] for w in windows) == 2
    assert any("http_500: e.g." in n and "boom" in n for n in summary.notes)
    assert any(n.startswith("disconnect: e.g.") for n in summary.notes)


def test_strict_server_gets_plain_bodies_and_usage_tops_up_the_count():
    # Chunks without token_ids (as vLLM sends them without return_token_ids), each standing for
    # two tokens: counted one a chunk, then topped up from usage.completion_tokens.
    server = FakeServer(lambda i: Reply(tokens=4, ids=False, per_chunk=2), strict=True)
    _, summary, events = run(server, concurrency=1, max_requests=2, window_s=5.0, seconds=5.0)
    assert summary.prompt_mode == "token_ids"
    assert "ignore_eos" not in server.bodies[0] and "return_token_ids" not in server.bodies[0]
    assert summary.output_tokens == 2 * 8 and summary.requests_completed == 2
    assert any(kind == "note" and "rejected token_ids+vllm" in data["message"] for kind, data in events)


def test_no_server_is_a_fatal_not_ready():
    async def main():
        # A port that was free a moment ago: nothing listens there.
        srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        srv.close()
        await srv.wait_closed()
        cfg = lg.LoadConfig(url=f"http://127.0.0.1:{port}", ready_timeout_s=0.3, seconds=5.0)
        return await lg.LoadGenerator(cfg, lambda rows: None).run()

    summary = asyncio.run(main())
    assert summary.fatal.startswith("http://127.0.0.1:") and "not ready after" in summary.fatal
    assert "ConnectionRefusedError" in summary.fatal and summary.requests_started == 0


def test_command_line_prints_json_lines_and_stops_when_stdin_closes():
    async def main():
        async with FakeServer(lambda i: Reply(tokens=3, gap_s=0.01)) as server:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(LOADGEN), "--url", server.url + "/v1", "--concurrency", "2", "--window", "0.2",
                "--seconds", "30", "--stop-on-stdin-eof", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE)
            lines = []
            while not any(doc["event"] == "row" for doc in lines):
                lines.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 10)))
            proc.stdin.close()  # as when the agent dies
            out, _ = await asyncio.wait_for(proc.communicate(), 10)
            return lines + [json.loads(line) for line in out.decode().splitlines()], proc.returncode

    docs, code = asyncio.run(main())
    assert code == 0
    assert docs[0] == {"event": "ready", "waited_s": 0.0, "model": "tiny", "prompt_mode": "token_ids+vllm"}
    rows = [d for d in docs if d["event"] == "row"]
    assert {"output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "errors", "kv_cache_usage"} <= {r["metric"] for r in rows}
    summary = docs[-1]
    assert summary["event"] == "summary" and summary["fatal"] is None and summary["duration_s"] < 10


# --- Pure parts on recorded text ---------------------------------------------------------------


def test_prometheus_text_of_vllm_0_32():
    prom = lw.parse_prometheus(METRICS_032.read_text())
    # Every non-comment line of the capture is a sample, histogram buckets (le="+Inf") included.
    assert len(prom.samples) == 447 and prom.notes == ()
    inf = [s for s in prom.samples if s.name == "vllm:request_prompt_tokens_bucket" and ("le", "+Inf") in s.labels]
    assert inf[0].value == 609.0 and inf[0].labels == (("engine", "0"), ("le", "+Inf"), ("model_name", "/tmp/vt/tiny"))
    g = lw.vllm_gauges(prom)
    assert g == lw.ServerGauges(requests_running=128.0, requests_waiting=192.0, kv_cache_usage=0.1250610649731314,
                                kv_cache_metric="vllm:kv_cache_usage_perc", preemptions_total=0.0,
                                generation_tokens_total=147693.0)


def test_prometheus_falls_back_to_the_deprecated_kv_cache_gauge_on_a_cut_scrape():
    prom = lw.parse_prometheus(METRICS_318.read_text())
    # The excerpt ends inside a sample line: the lines before it are kept, the cut one noted.
    assert len(prom.samples) == 7 and prom.notes == ("line 24: no value: 'vllm:gpu_prefix'",)
    g = lw.vllm_gauges(prom)
    assert (g.kv_cache_usage, g.kv_cache_metric) == (0.0, "vllm:gpu_cache_usage_perc")
    assert (g.requests_running, g.requests_waiting, g.preemptions_total) == (0.0, 0.0, None)


def test_two_engines_are_summed_and_the_fullest_kv_cache_reported():
    # Synthetic variant of the real capture: its engine "0" gauges copied as an engine "1".
    text = METRICS_032.read_text()
    extra = [line.replace('engine="0"', 'engine="1"').replace("} 0.1250610649731314", "} 0.5")
             for line in text.splitlines()
             if line.startswith(("vllm:num_requests_running{", "vllm:kv_cache_usage_perc{"))]
    g = lw.vllm_gauges(lw.parse_prometheus(text + "\n".join(extra) + "\n"))
    assert g.requests_running == 256.0 and g.kv_cache_usage == 0.5


def test_label_values_with_escapes():
    prom = lw.parse_prometheus('vllm:x{model_name="a\\"b,c}",le="+Inf"} 3 1700000000000\n')
    assert prom.samples == (lw.PromSample("vllm:x", (("model_name", 'a"b,c}'), ("le", "+Inf")), 3.0),)


def test_sse_decoder_on_the_recorded_stream_split_anywhere():
    _, _, body = RAW_STREAM.read_bytes().partition(b"\r\n\r\n")
    # Undo the chunked coding by hand: size line, data, CRLF.
    payload, rest = b"", body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        payload, rest = payload + rest[:size], rest[size + 2:]
    whole = lh.SseDecoder().feed(payload)
    assert [json.loads(e) for e in whole[:-1]] == EVENTS and whole[-1] == "[DONE]"
    for step in (1, 7, 64):
        dec = lh.SseDecoder()
        got = [e for i in range(0, len(payload), step) for e in dec.feed(payload[i:i + step])] + dec.close()
        assert got == whole
    infos = [lh.chunk_info(e) for e in EVENTS]
    assert [i.tokens for i in infos] == [1, 1, 1, 0]
    assert infos[-1].completion_tokens == 3 and all(i.error is None for i in infos)


def test_window_recorder_arithmetic_with_counter_increases():
    # Baseline: the recorded scrape; window end: the same text with generation_tokens_total
    # up by 1000 and num_preemptions_total by 2 (a synthetic variant of the real file).
    text = METRICS_032.read_text()
    later = text.replace("} 147693.0", "} 148693.0").replace(
        'vllm:num_preemptions_total{engine="0",model_name="/tmp/vt/tiny"} 0.0',
        'vllm:num_preemptions_total{engine="0",model_name="/tmp/vt/tiny"} 2.0')
    rec = lw.WindowRecorder(100.0)
    rec.baseline(lw.vllm_gauges(lw.parse_prometheus(text)))
    rec.tokens(30)
    rec.tokens(20)
    for ttft in (0.1, 0.3):
        rec.first_token(ttft)
    rec.completed(0.01)
    rec.error()
    rows = rec.close(102.0, in_flight=3) + rec.server_rows(102.0, 2.0, lw.vllm_gauges(lw.parse_prometheus(later)))
    assert by_metric(rows) == {
        "output_tokens_per_s": 25.0, "requests_per_s": 0.5, "ttft_p50_ms": 200.0, "ttft_p90_ms": 280.0,
        "ttft_p99_ms": 298.0, "tpot_p50_ms": 10.0, "tpot_p99_ms": 10.0, "errors": 1, "in_flight": 3,
        "requests_running": 128.0, "requests_waiting": 192.0, "kv_cache_usage": 0.1250610649731314,
        "preemptions": 2.0, "server_output_tokens_per_s": 500.0}
    assert {r.time for r in rows} == {102.0}
    # The next window starts empty: no latency rows, zero rates.
    assert by_metric(rec.close(104.0, in_flight=0)) == {
        "output_tokens_per_s": 0.0, "requests_per_s": 0.0, "errors": 0, "in_flight": 0}


def test_percentile_interpolates_like_numpy():
    assert lw.percentile([5.0], 99) == 5.0
    assert lw.percentile([1, 2, 3, 4], 50) == 2.5
    assert lw.percentile([10, 20, 30, 40, 50], 90) == pytest.approx(46.0)


def test_endpoint_urls_and_argv_round_trip():
    assert lh.Endpoint.from_url("http://127.0.0.1:8000/v1/") == lh.Endpoint("http", "127.0.0.1", 8000, "")
    assert lh.Endpoint.from_url("https://gw.example/llm/v1").url("/metrics") == "https://gw.example:443/llm/metrics"
    assert lh.Endpoint.from_url("localhost:9000").port == 9000
    with pytest.raises(ValueError):
        lh.Endpoint.from_url("ftp://x")
    cfg = lg.LoadConfig(url="http://127.0.0.1:9", model="m", concurrency=3, max_tokens=7, prompt_tokens=5,
                        text_prompts=True, token_id_range=(10, 1024), window_s=2.5, seconds=30.0, max_requests=9,
                        ready_timeout_s=60.0, scrape_metrics=False, seed=4)
    assert lg.parse_args(cfg.to_argv()) == (cfg, False)


# --- vllm bench serve parity (loadgen_bench.py) ------------------------------------------------

VLLM_SERVE = sorted(Path("/opt/preflight-vllm-venv").glob("lib/python3*/site-packages/vllm/benchmarks/serve.py"))


def rows_of(windows, metric: str) -> list:
    return [r.value for w in windows for r in w if r.metric == metric]


def test_a_sweep_steps_the_concurrency_and_gives_one_result_a_level():
    server = FakeServer(lambda i: Reply(tokens=4, ttft_s=0.02, gap_s=0.01))
    windows, summary, _ = run(server, concurrency=99, sweep=(1, 3), window_s=0.2, seconds=0.8)
    levels = rows_of(windows, "concurrency")
    # Two windows a level, each window stamped with the level it ran at.
    assert levels == [1, 1, 3, 3], levels
    in_flight = rows_of(windows, "in_flight")
    assert in_flight[:2] == [1, 1] and in_flight[2:] == [3, 3]
    assert [r["max_concurrency"] for r in summary.results] == [1, 3]
    first, second = summary.results
    # Three requests in flight complete about three times as many as one.
    assert second["completed"] >= 2 * first["completed"] > 0
    assert sum(r["completed"] for r in summary.results) == summary.requests_completed
    assert first["duration"] == pytest.approx(0.4, abs=0.1) and first["request_goodput"] is None


def test_goodput_counts_requests_within_every_limit_per_window_and_per_level():
    # Every other request has its first token after 120 ms: over the 50 ms TTFT limit.
    server = FakeServer(lambda i: Reply(tokens=3, ttft_s=0.12 if i % 2 else 0.0, gap_s=0.01))
    windows, summary, _ = run(server, concurrency=1, max_requests=8, window_s=5.0, seconds=5.0,
                              goodput=(("ttft", 50.0), ("tpot", 500.0)))
    assert summary.requests_completed == 8 and summary.good_requests == 4
    (level,) = summary.results
    assert level["completed"] == 8 and level["request_goodput"] == pytest.approx(4 / level["duration"])
    # The window's goodput row is the same count over the window.
    (window,) = windows
    m = by_metric(window)
    assert m["goodput_requests_per_s"] == pytest.approx(m["requests_per_s"] / 2, rel=0.01)
    # Without limits there is no goodput row and no count.
    windows, summary, _ = run(FakeServer(), concurrency=1, max_requests=2, window_s=5.0, seconds=5.0)
    assert "goodput_requests_per_s" not in by_metric(windows[0]) and summary.good_requests is None


def test_warm_up_requests_are_in_no_figure():
    server = FakeServer(lambda i: Reply(tokens=5) if i >= 3 else Reply(kind="status", status=503))
    windows, summary, _ = run(server, concurrency=2, max_requests=4, window_s=5.0, seconds=5.0, warmup_requests=3)
    assert len(server.bodies) == 7  # 3 warm-up requests, then 4
    assert summary.warmup["requests"] == 3 and summary.warmup["errors"] == {"http_503": 3}
    assert summary.errors == {} and summary.requests_started == 4 and summary.requests_completed == 4
    assert summary.output_tokens == 4 * 5 and sum(rows_of(windows, "errors")) == 0


def test_a_request_rate_caps_the_requests_in_flight():
    # 200 requests/s offered, each taking >= 50 ms, at most 2 in flight: the cap holds.
    server = FakeServer(lambda i: Reply(tokens=2, ttft_s=0.05))
    windows, summary, _ = run(server, concurrency=2, request_rate=200.0, burstiness=0.5, max_requests=6,
                              window_s=5.0, seconds=5.0)
    assert summary.requests_completed == 6 and summary.errors == {}
    assert max(rows_of(windows, "in_flight")) <= 2
    (level,) = summary.results
    assert level["request_rate"] == 200.0 and level["burstiness"] == 0.5 and level["max_concurrency"] == 2


def test_gamma_arrivals_have_vllms_mean_and_spread():
    import random
    import statistics

    from preflight.node import loadgen_bench as lb

    rng = random.Random(7)
    for burstiness in (0.25, 1.0, 4.0):
        gaps = [lb.arrival_gap(rng, 10.0, burstiness) for _ in range(20000)]
        # Gamma(shape b, scale 1/(r b)): mean 1/r, variance 1/(r^2 b).
        assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
        assert statistics.pvariance(gaps) == pytest.approx(0.01 / burstiness, rel=0.1)
    assert lb.arrival_gap(rng, 4.0, float("inf")) == 0.25


def test_prompt_and_output_lengths_follow_the_range_ratio():
    from preflight.node import loadgen_bench as lb

    # vLLM 0.32.0 datasets/utils.py get_sampling_params: [floor(n(1-r)), ceil(n(1+r))], output >= 1.
    assert lb.length_range(100, 0.25) == (75, 125) and lb.length_range(3, 0.9) == (1, 6)
    with pytest.raises(ValueError):
        lb.length_range(10, 1.0)
    server = FakeServer(lambda i: Reply(tokens=2))
    run(server, concurrency=1, max_requests=20, window_s=5.0, seconds=5.0, prompt_tokens=40, max_tokens=8,
        range_ratio=0.5)
    prompts = [len(b["prompt"]) for b in server.bodies]
    outputs = [b["max_tokens"] for b in server.bodies]
    assert all(20 <= n <= 60 for n in prompts) and len(set(prompts)) > 3
    assert all(4 <= n <= 12 for n in outputs) and len(set(outputs)) > 1


def test_goodput_spec_is_read_as_vllm_reads_it():
    from preflight.node import loadgen_bench as lb

    assert lb.parse_goodput(["ttft:800", "e2el:2000.5"]) == (("ttft", 800.0), ("e2el", 2000.5))
    for bad in (["ttft=800"], ["itl:5"], ["tpot:-1"], ["tpot:x"], ["ttft:1", "ttft:2"]):
        with pytest.raises(ValueError, match="goodput"):
            lb.parse_goodput(bad)
    one_token = lb.RequestResult(True, 10, 1, 0.01, 0.01)
    assert one_token.tpot == 0.0 and lb.is_good(one_token, (("tpot", 0.0),))  # vLLM: TPOT 0 for one token
    assert not lb.is_good(lb.RequestResult(False, 10, 0, None, 1.0), ())


def test_the_result_file_has_the_keys_vllm_bench_serve_saves(tmp_path):
    server = FakeServer(lambda i: Reply(tokens=3))
    out = tmp_path / "result.json"

    async def main():
        async with server:
            cfg = lg.parse_args(["--url", server.url, "--concurrency", "1", "--max-requests", "3", "--window", "5",
                                 "--seconds", "5", "--goodput", "ttft:1000", "--save-result", str(out)])[0]
            summary = await lg.LoadGenerator(cfg, lambda rows: None).run()
            return cfg, summary

    cfg, summary = asyncio.run(main())
    assert lg.parse_args(cfg.to_argv()) == (cfg, False)
    doc = summary.results[0]
    for path, level in lg.result_paths(str(out), summary.results):
        Path(path).write_text(json.dumps(level))
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(doc)) and saved["completed"] == 3 and saved["request_goodput"] > 0
    assert saved["max_concurrent_requests"] == 1 and saved["max_concurrency"] == 1
    assert lg.result_paths("r.json", [{"max_concurrency": 8}, {"max_concurrency": 16}]) == [
        ("r-c8.json", {"max_concurrency": 8}), ("r-c16.json", {"max_concurrency": 16})]
    if not VLLM_SERVE:
        pytest.skip("no vLLM 0.32.0 source at /opt/preflight-vllm-venv to compare the keys with")
    # The keys vLLM 0.32.0 itself writes (vllm/benchmarks/serve.py): result_json["..."], the
    # BenchmarkMetrics result dict, and process_one_metric's mean/median/std/p99 for ttft, tpot, e2el
    # (--metric-percentiles default 99); minus the per-request lists it drops without --save-detailed.
    import re

    source = VLLM_SERVE[0].read_text()
    keys = set(re.findall(r'result_json\["(\w+)"\]', source))
    block = source[source.index("result = {\n            \"duration\": benchmark_duration"):]
    keys |= set(re.findall(r'^\s+"(\w+)":', block[:block.index("}")], re.M))
    keys -= {"input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors", "start_times",
             "latencies", "queue_times", "ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps",
             "max_output_tokens_per_s", "rtfx"}
    keys |= {f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "e2el")}
    assert keys - set(saved) == set(), sorted(keys - set(saved))
