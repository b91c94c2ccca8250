#!/usr/bin/env python3
"""Streaming load generator for an OpenAI-compatible ``/v1/completions`` server (vLLM first).

Standard library only (asyncio streams, no aiohttp/httpx) and free of preflight imports: the
soak ships this file to a node beside the agent, with its two siblings (``loadgen_http.py``:
the HTTP client and the stream's decoding; ``loadgen_windows.py``: the per-window figures and
the server's gauges), and runs it there with any ``python3``:

    python3 loadgen.py --url http://127.0.0.1:8000 --seconds 600 [--concurrency 256] ...

prints one JSON object a line on stdout: ``{"event": "row", "time", "metric", "value"}`` per
window and metric (loadgen_windows.py lists them), ``ready``, ``note``, ``fatal`` and a closing
``summary``.

What it sends: ``concurrency`` requests kept in flight, each ``stream: true`` with
``stream_options.include_usage``; the prompt is a list of random token ids (works when the
server runs with ``--skip-tokenizer-init``, and costs no tokenizer time when it does not) or
random words with ``--text-prompts``; vLLM's ``ignore_eos`` and ``return_token_ids`` go with it
while the server accepts them. A probe request before the load picks the first body the server
takes, in this order: token ids with vLLM's extras, token ids without, text without (a plain
OpenAI server rejects unknown fields with 400).

A request is an error when the status is not 200, the stream carries an ``error`` object,
the connection drops before ``[DONE]``, or it stalls past the timeouts; failed requests are
counted by kind and the worker backs off a little, so a dead server is not hammered.

The run is bounded: it ends at ``seconds`` after the load began (requests in flight are
cancelled, not counted as errors), after ``max_requests`` requests, or on a stop (SIGTERM /
SIGINT, or stdin closing with ``--stop-on-stdin-eof``: the soak engine's pipe closes when the
agent dies, so the load dies with it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

try:
    from . import loadgen_http, loadgen_windows
except ImportError:  # a shipped copy, run as a script beside its siblings
    import loadgen_http
    import loadgen_windows

ERROR_BODY_LIMIT = 4096
# Back-off after a failed request, doubling up to the maximum; a success resets it.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0


# --- The load generator ------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadConfig:
    url: str = "http://127.0.0.1:8000"
    model: Optional[str] = None  # None: the first model /v1/models lists
    concurrency: int = 256
    max_tokens: int = 256
    prompt_tokens: int = 256
    text_prompts: bool = False
    # Token ids are drawn from [lo, hi): above the special tokens at the bottom of most
    # vocabularies and below 32000, the smallest vocabulary of the Llama family.
    token_id_range: Tuple[int, int] = (100, 32000)
    window_s: float = 10.0
    seconds: float = 60.0
    max_requests: Optional[int] = None
    ready_timeout_s: float = 0.0  # > 0: wait that long for /health or /v1/models first
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0  # longest silence inside a response (queueing included)
    request_timeout_s: float = 1800.0
    scrape_metrics: bool = True
    seed: int = 0
    api_key: Optional[str] = None

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_tokens < 1 or self.prompt_tokens < 1:
            raise ValueError("concurrency, max_tokens and prompt_tokens must be at least 1")
        if self.window_s <= 0 or self.seconds <= 0:
            raise ValueError("window_s and seconds must be positive")
        if not 0 <= self.token_id_range[0] < self.token_id_range[1]:
            raise ValueError(f"token_id_range: empty range {self.token_id_range}")

    def to_argv(self) -> List[str]:
        """The command-line flags that give ``parse_args`` this configuration back (the API key
        excepted: it travels in the OPENAI_API_KEY environment variable, not in ``ps``)."""
        argv = ["--url", self.url, "--concurrency", str(self.concurrency), "--max-tokens", str(self.max_tokens),
                "--prompt-tokens", str(self.prompt_tokens), "--token-id-range", "%d:%d" % self.token_id_range,
                "--window", repr(self.window_s), "--seconds", repr(self.seconds),
                "--ready-timeout", repr(self.ready_timeout_s), "--connect-timeout", repr(self.connect_timeout_s),
                "--idle-timeout", repr(self.idle_timeout_s), "--request-timeout", repr(self.request_timeout_s),
                "--seed", str(self.seed)]
        if self.model:
            argv += ["--model", self.model]
        if self.text_prompts:
            argv.append("--text-prompts")
        if self.max_requests is not None:
            argv += ["--max-requests", str(self.max_requests)]
        if not self.scrape_metrics:
            argv.append("--no-metrics")
        return argv


@dataclass(frozen=True)
class LoadSummary:
    model: Optional[str]
    prompt_mode: str  # "token_ids+vllm", "token_ids" or "text"
    started: Optional[float]
    duration_s: float
    requests_started: int
    requests_completed: int
    requests_cancelled: int
    output_tokens: int
    errors: Dict[str, int]
    ttft_ms: Dict[str, float]
    tpot_ms: Dict[str, float]
    windows: int
    scrapes: int
    kv_cache_metric: Optional[str]
    fatal: Optional[str] = None
    notes: Tuple[str, ...] = ()


class _NoResponse(Exception):
    """The request got no status line: nothing listening, or the connection dropped at once."""


_WORDS = ("the quick brown fox jumps over a lazy dog while seven bright engines hum "
          "across the cold data hall and every node reports its temperature clock power").split()
_BODIES = ("token_ids+vllm", "token_ids", "text")


class LoadGenerator:
    """One run: ``await run(stop)``; rows go to ``emit`` at each window close, ``ready`` and
    ``note`` events to ``on_event``."""

    def __init__(self, cfg: LoadConfig, emit: Callable[[List[loadgen_windows.MetricRow]], None],
                 on_event: Optional[Callable[[str, dict], None]] = None):
        self.cfg = cfg
        self.ep = loadgen_http.Endpoint.from_url(cfg.url)
        self.emit = emit
        self.on_event = on_event or (lambda kind, data: None)
        self.model = cfg.model
        self.mode = "text" if cfg.text_prompts else "token_ids+vllm"
        self.notes: List[str] = []
        self.errors: Dict[str, int] = {}
        self.error_examples: Dict[str, str] = {}
        self._started = self._completed = self._cancelled = self._in_flight = self._tokens = 0
        self._all_ttft: List[float] = []
        self._all_tpot: List[float] = []
        self._rec: Optional[loadgen_windows.WindowRecorder] = None
        self._stopping = False
        self._scrapes = 0
        self._scrape_errors = 0
        self._scrape_failed = False
        self._kv_metric: Optional[str] = None

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.on_event("note", {"message": message})

    # --- one request

    def body(self, rid: int, mode: str, max_tokens: Optional[int] = None) -> bytes:
        cfg = self.cfg
        rng = random.Random(cfg.seed * 1_000_003 + rid)
        doc: dict = {"model": self.model, "max_tokens": max_tokens or cfg.max_tokens, "stream": True,
                     "stream_options": {"include_usage": True}, "temperature": 1.0}
        if mode == "text":
            doc["prompt"] = " ".join(rng.choice(_WORDS) for _ in range(cfg.prompt_tokens))
        else:
            lo, hi = cfg.token_id_range
            # Random per request, so prefix caching cannot turn the prefill into a cache hit.
            doc["prompt"] = [rng.randrange(lo, hi) for _ in range(cfg.prompt_tokens)]
        if mode == "token_ids+vllm":
            doc["ignore_eos"] = True
            doc["return_token_ids"] = True
        return json.dumps(doc, separators=(",", ":")).encode()

    def _fail(self, kind: str, detail: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.error_examples.setdefault(kind, detail[:300])
        if self._rec is not None:
            self._rec.error()

    async def _request(self, rid: int) -> bool:
        """One streamed completion; True when it completed."""
        cfg = self.cfg
        t_start = time.monotonic()
        try:
            return await asyncio.wait_for(self._stream(rid, t_start), cfg.request_timeout_s)
        except asyncio.TimeoutError:
            self._fail("timeout", f"no progress for {cfg.idle_timeout_s:g} s or over {cfg.request_timeout_s:g} s")
        except _NoResponse as exc:
            self._fail("no_response", str(exc))
        except (asyncio.IncompleteReadError, OSError, loadgen_http.HttpError) as exc:
            self._fail("disconnect", f"{type(exc).__name__}: {exc}")
        return False

    async def _stream(self, rid: int, t_start: float) -> bool:
        cfg = self.cfg
        try:
            resp = await loadgen_http.http_request(self.ep, "POST", "/v1/completions", self.body(rid, self.mode),
                                      cfg.connect_timeout_s, cfg.api_key, accept="text/event-stream",
                                      head_timeout=cfg.idle_timeout_s)
        except (OSError, loadgen_http.HttpError, asyncio.IncompleteReadError) as exc:
            raise _NoResponse(f"{type(exc).__name__}: {exc}") from None
        try:
            if resp.status != 200:
                detail = await loadgen_http.read_body(resp, cfg.connect_timeout_s, ERROR_BODY_LIMIT)
                self._fail(f"http_{resp.status}", detail.decode("utf-8", "replace"))
                return False
            decoder, counted, usage = loadgen_http.SseDecoder(), 0, None
            first = last = None
            done = False
            async for data in loadgen_http.body_chunks(resp, cfg.idle_timeout_s):
                for payload in decoder.feed(data):
                    if payload.strip() == "[DONE]":
                        done = True
                        break
                    try:
                        info = loadgen_http.chunk_info(json.loads(payload))
                    except (ValueError, AttributeError):
                        self._fail("bad_chunk", payload[:200])
                        return False
                    if info.error:
                        self._fail("stream_error", info.error)
                        return False
                    if info.tokens:
                        now = time.monotonic()
                        if first is None:
                            first = now
                            self._record_ttft(now - t_start)
                        last, counted = now, counted + info.tokens
                        self._add_tokens(info.tokens)
                    if info.completion_tokens is not None:
                        usage = info.completion_tokens
                if done:
                    break
            if not done:
                self._fail("disconnect", "stream ended without data: [DONE]")
                return False
            if usage is not None and usage > counted:
                self._add_tokens(usage - counted)
            tokens = max(counted, usage or 0)
            tpot = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
            self._completed += 1
            if tpot is not None:
                self._all_tpot.append(tpot)
            if self._rec is not None:
                self._rec.completed(tpot)
            return True
        finally:
            resp.close()

    def _record_ttft(self, ttft: float) -> None:
        self._all_ttft.append(ttft)
        if self._rec is not None:
            self._rec.first_token(ttft)

    def _add_tokens(self, n: int) -> None:
        self._tokens += n
        if self._rec is not None:
            self._rec.tokens(n)

    async def _worker(self) -> None:
        backoff = BACKOFF_MIN_S
        limit = self.cfg.max_requests
        while not self._stopping and (limit is None or self._started < limit):
            rid = self._started
            self._started += 1
            self._in_flight += 1
            try:
                ok = await self._request(rid)
            except asyncio.CancelledError:
                self._cancelled += 1
                raise
            finally:
                self._in_flight -= 1
            if ok:
                backoff = BACKOFF_MIN_S
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    # --- before the load

    async def _probe(self) -> None:
        """Finds the first request body the server takes (see the module docstring)."""
        order = [m for m in _BODIES if m == "text" or not self.cfg.text_prompts]
        tried = []
        for mode in order:
            try:
                resp = await loadgen_http.http_request(self.ep, "POST", "/v1/completions", self.body(-1, mode, 2),
                                          self.cfg.connect_timeout_s, self.cfg.api_key,
                                          head_timeout=self.cfg.idle_timeout_s)
                try:
                    body = await loadgen_http.read_body(resp, self.cfg.idle_timeout_s, 1 << 20)
                finally:
                    resp.close()
            except (OSError, asyncio.TimeoutError, loadgen_http.HttpError, asyncio.IncompleteReadError) as exc:
                raise loadgen_http.NotReady(f"probe request failed: {type(exc).__name__}: {exc}") from None
            if resp.status == 200:
                if tried:
                    self.note(f"server rejected {', '.join(tried)} request bodies; sending {mode}")
                self.mode = mode
                return
            if resp.status not in (400, 422):
                raise loadgen_http.NotReady(
                    f"probe request: HTTP {resp.status}: {body[:300].decode('utf-8', 'replace')}")
            tried.append(f"{mode} (HTTP {resp.status}: {body[:200].decode('utf-8', 'replace')})")
        raise loadgen_http.NotReady(f"server rejected every request body: {'; '.join(tried)}")

    async def _scrape(self) -> Optional[loadgen_windows.ServerGauges]:
        if not self.cfg.scrape_metrics or self._scrape_failed:
            return None
        try:
            status, text = await loadgen_http.http_get(self.ep, "/metrics", min(5.0, self.cfg.window_s / 2),
                                                       self.cfg.api_key)
        except (OSError, asyncio.TimeoutError, loadgen_http.HttpError, asyncio.IncompleteReadError) as exc:
            self._scrape_errors += 1
            if self._scrape_errors == 1:  # one note, not one a window
                self.note(f"/metrics scrape failed: {type(exc).__name__}: {exc}")
            return None
        if status != 200:
            # No /metrics (not vLLM, or behind a proxy): said once, not asked again.
            self._scrape_failed = True
            self.note(f"/metrics answered HTTP {status}; server metrics left out")
            return None
        gauges = loadgen_windows.vllm_gauges(loadgen_windows.parse_prometheus(text))
        if gauges.kv_cache_metric and gauges.kv_cache_metric != self._kv_metric:
            self._kv_metric = gauges.kv_cache_metric
            if gauges.kv_cache_metric != loadgen_windows.KV_CACHE_METRICS[0]:
                self.note(f"KV-cache usage from the deprecated {gauges.kv_cache_metric}")
        self._scrapes += 1
        return gauges

    # --- the run

    async def run(self, stop: Optional[asyncio.Event] = None) -> LoadSummary:
        stop = stop or asyncio.Event()
        t_ready = time.time()
        try:
            cfg = self.cfg
            waited = (await loadgen_http.wait_ready(self.ep, cfg.ready_timeout_s, cfg.connect_timeout_s, cfg.api_key,
                                                    stop) if cfg.ready_timeout_s > 0 else 0.0)
            if stop.is_set():
                self.note("stopped before the server was ready")
                return self._summary(None, time.time() - t_ready, 0)
            self.model = self.model or await loadgen_http.first_model(self.ep, cfg.connect_timeout_s, cfg.api_key)
            await self._probe()
        except loadgen_http.NotReady as exc:
            return self._summary(None, time.time() - t_ready, 0, str(exc))
        self.on_event("ready", {"waited_s": round(waited, 3), "model": self.model, "prompt_mode": self.mode})
        return await self._load(stop)

    async def _load(self, stop: asyncio.Event) -> LoadSummary:
        cfg = self.cfg
        baseline = await self._scrape()
        t0 = time.time()
        self._rec = loadgen_windows.WindowRecorder(t0)
        self._rec.baseline(baseline)
        end = t0 + cfg.seconds
        workers = [asyncio.ensure_future(self._worker()) for _ in range(cfg.concurrency)]
        all_done = asyncio.ensure_future(asyncio.gather(*workers, return_exceptions=True))
        stopped = asyncio.ensure_future(stop.wait())
        windows, k = 0, 1
        try:
            while True:
                boundary = t0 + k * cfg.window_s
                if end - boundary < cfg.window_s / 2:  # no stub of a window before the end
                    boundary = end
                await asyncio.wait([all_done, stopped], timeout=max(0.0, boundary - time.time()),
                                   return_when=asyncio.FIRST_COMPLETED)
                now = time.time()
                # The last window is closed before the requests in flight are cancelled, so that
                # its rows describe the load as it ran.
                if now > self._rec.window_start:
                    await self._close_window(now)
                    windows += 1
                if all_done.done() or stopped.done() or now >= end - 1e-3:  # timers may fire a hair early
                    break
                k += 1
        finally:
            self._stopping = True
            for w in workers:
                w.cancel()
            await asyncio.gather(all_done, return_exceptions=True)
            stopped.cancel()
        return self._summary(t0, time.time() - t0, windows)

    async def _close_window(self, now: float) -> None:
        """Counts stop at ``now``; the scrape that follows (load still running) gives the server's side."""
        start = self._rec.window_start
        rows = self._rec.close(now, self._in_flight)
        gauges = await self._scrape()
        if gauges is not None:
            rows += self._rec.server_rows(now, now - start, gauges)
        self.emit(rows)

    def _summary(self, t0: Optional[float], duration: float, windows: int, fatal: Optional[str] = None) -> LoadSummary:
        def pct(values: List[float], qs: Sequence[int]) -> Dict[str, float]:
            return {f"p{q}": round(loadgen_windows.percentile(values, q) * 1e3, 3) for q in qs} if values else {}

        notes = list(self.notes) + [f"{kind}: e.g. {text}" for kind, text in self.error_examples.items()]
        return LoadSummary(
            model=self.model, prompt_mode=self.mode, started=t0, duration_s=round(duration, 3),
            requests_started=self._started, requests_completed=self._completed,
            requests_cancelled=self._cancelled, output_tokens=self._tokens, errors=dict(self.errors),
            ttft_ms=pct(self._all_ttft, loadgen_windows.TTFT_PERCENTILES),
            tpot_ms=pct(self._all_tpot, loadgen_windows.TPOT_PERCENTILES),
            windows=windows, scrapes=self._scrapes, kv_cache_metric=self._kv_metric, fatal=fatal,
            notes=tuple(notes))


def run_load(cfg: LoadConfig, emit: Callable[[List[loadgen_windows.MetricRow]], None],
             stop: Optional[threading.Event] = None,
             on_event: Optional[Callable[[str, dict], None]] = None) -> LoadSummary:
    """Runs a load to its end in a new event loop; ``stop`` (set from any thread) ends it early."""

    async def watch(stop_async: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(0.1)
        stop_async.set()

    async def main() -> LoadSummary:
        stop_async = asyncio.Event()
        watcher = asyncio.ensure_future(watch(stop_async)) if stop is not None else None
        try:
            return await LoadGenerator(cfg, emit, on_event).run(stop_async)
        finally:
            if watcher is not None:
                watcher.cancel()

    return asyncio.run(main())


# --- Command line: JSON lines on stdout --------------------------------------------------------


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _id_range(text: str) -> Tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected LO:HI, got {text!r}")
    return int(lo), int(hi)


def parse_args(argv: Optional[List[str]]) -> Tuple[LoadConfig, bool]:
    """The load's configuration, and whether to stop when stdin closes."""
    d = LoadConfig()
    ap = argparse.ArgumentParser(prog="loadgen.py", description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=d.url, help=f"server base URL (default {d.url})")
    ap.add_argument("--model", default=None, help="model name (default: the first /v1/models lists)")
    ap.add_argument("--concurrency", type=int, default=d.concurrency,
                    help=f"requests in flight (default {d.concurrency})")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens,
                    help=f"output tokens per request (default {d.max_tokens})")
    ap.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens,
                    help=f"prompt length in tokens (words with --text-prompts; default {d.prompt_tokens})")
    ap.add_argument("--text-prompts", action="store_true", help="send text prompts instead of token ids")
    ap.add_argument("--token-id-range", type=_id_range, default=d.token_id_range, metavar="LO:HI",
                    help="draw prompt token ids from [LO, HI) (default %d:%d)" % d.token_id_range)
    ap.add_argument("--window", type=_positive, default=d.window_s, help=f"seconds per window (default {d.window_s:g})")
    ap.add_argument("--seconds", type=_positive, default=d.seconds, help=f"length of the load (default {d.seconds:g})")
    ap.add_argument("--max-requests", type=int, default=None, help="stop after this many requests")
    ap.add_argument("--ready-timeout", type=float, default=d.ready_timeout_s,
                    help="wait up to this long for the server to answer /health or /v1/models (default: do not wait)")
    ap.add_argument("--connect-timeout", type=_positive, default=d.connect_timeout_s,
                    help=f"longest wait for a connection and a response's headers (default {d.connect_timeout_s:g})")
    ap.add_argument("--idle-timeout", type=_positive, default=d.idle_timeout_s,
                    help=f"longest silence inside a response (default {d.idle_timeout_s:g})")
    ap.add_argument("--request-timeout", type=_positive, default=d.request_timeout_s,
                    help=f"longest request (default {d.request_timeout_s:g})")
    ap.add_argument("--no-metrics", action="store_true", help="do not scrape /metrics")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--stop-on-stdin-eof", action="store_true", help="stop when stdin closes (the caller died)")
    a = ap.parse_args(argv)
    try:
        cfg = LoadConfig(url=a.url, model=a.model, concurrency=a.concurrency, max_tokens=a.max_tokens,
                         prompt_tokens=a.prompt_tokens, text_prompts=a.text_prompts, token_id_range=a.token_id_range,
                         window_s=a.window, seconds=a.seconds, max_requests=a.max_requests,
                         ready_timeout_s=a.ready_timeout, connect_timeout_s=a.connect_timeout,
                         idle_timeout_s=a.idle_timeout,
                         request_timeout_s=a.request_timeout, scrape_metrics=not a.no_metrics, seed=a.seed,
                         api_key=os.environ.get("OPENAI_API_KEY") or None)
        loadgen_http.Endpoint.from_url(cfg.url)
    except ValueError as exc:
        ap.error(str(exc))
    return cfg, a.stop_on_stdin_eof


def _print(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main(argv: Optional[List[str]] = None) -> int:
    cfg, stop_on_eof = parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if stop_on_eof:
        def watch_stdin() -> None:
            # os.read, not sys.stdin: a daemon thread blocked inside the buffered reader holds its
            # lock, and the interpreter aborts at exit when it cannot take it.
            while os.read(0, 4096):
                pass
            stop.set()

        threading.Thread(target=watch_stdin, daemon=True).start()

    def emit(rows: List[loadgen_windows.MetricRow]) -> None:
        for r in rows:
            _print({"event": "row", "time": r.time, "metric": r.metric, "value": r.value})

    summary = run_load(cfg, emit, stop, lambda kind, data: _print({"event": kind, **data}))
    if summary.fatal:
        _print({"event": "fatal", "message": summary.fatal})
    _print({"event": "summary", **asdict(summary)})
    return 1 if summary.fatal else 0


if __name__ == "__main__":
    sys.exit(main())
