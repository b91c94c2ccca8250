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

import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import asdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

try:
    from . import loadgen_bench, loadgen_http, loadgen_windows
    from .loadgen_config import LoadConfig, LoadSummary, parse_args
except ImportError:  # a shipped copy, run as a script beside its siblings
    import loadgen_bench
    import loadgen_http
    import loadgen_windows
    from loadgen_config import LoadConfig, LoadSummary, parse_args

__all__ = ["LoadConfig", "LoadGenerator", "LoadSummary", "main", "parse_args", "result_paths", "run_load"]

ERROR_BODY_LIMIT = 4096
# Back-off after a failed request, doubling up to the maximum; a success resets it.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0


# --- The load generator ------------------------------------------------------------------------


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
        # Bounded however long the soak: a reservoir for the run's percentiles.
        self._all_ttft = loadgen_bench.Sample(random.Random(cfg.seed + 1))
        self._all_tpot = loadgen_bench.Sample(random.Random(cfg.seed + 2))
        self._rec: Optional[loadgen_windows.WindowRecorder] = None
        self._level: Optional[loadgen_bench.Level] = None  # the stretch results are counted in
        self._levels: List[Tuple[loadgen_bench.Level, float]] = []  # finished ones, with their length
        self._good = 0
        self._target = cfg.concurrency  # workers at or above this index stop (a sweep's level)
        self._tasks: List[asyncio.Future] = []
        self._warmup: Optional[dict] = None
        self._stopping = False
        self._scrapes = 0
        self._scrape_errors = 0
        self._scrape_failed = False
        self._kv_metric: Optional[str] = None

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.on_event("note", {"message": message})

    # --- one request

    def lengths(self, rid: int) -> Tuple[int, int]:
        """Request ``rid``'s prompt and output lengths (fixed, or drawn as vLLM's random dataset does)."""
        cfg = self.cfg
        if not cfg.range_ratio:
            return cfg.prompt_tokens, cfg.max_tokens
        rng = random.Random(cfg.seed * 1_000_003 + rid + 0x5EED)
        return (loadgen_bench.draw_length(rng, cfg.prompt_tokens, cfg.range_ratio),
                loadgen_bench.draw_length(rng, cfg.max_tokens, cfg.range_ratio))

    def body(self, rid: int, mode: str, max_tokens: Optional[int] = None) -> bytes:
        cfg = self.cfg
        rng = random.Random(cfg.seed * 1_000_003 + rid)
        prompt_len, output_len = self.lengths(rid)
        doc: dict = {"model": self.model, "max_tokens": max_tokens or output_len, "stream": True,
                     "stream_options": {"include_usage": True}, "temperature": 1.0}
        if mode == "text":
            doc["prompt"] = " ".join(rng.choice(_WORDS) for _ in range(prompt_len))
        else:
            lo, hi = cfg.token_id_range
            # Random per request, so prefix caching cannot turn the prefill into a cache hit.
            doc["prompt"] = [rng.randrange(lo, hi) for _ in range(prompt_len)]
        if mode == "token_ids+vllm":
            doc["ignore_eos"] = True
            doc["return_token_ids"] = True
        return json.dumps(doc, separators=(",", ":")).encode()

    def _fail(self, kind: str, detail: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.error_examples.setdefault(kind, detail[:300])
        if self._rec is not None:
            self._rec.error()
        if self._level is not None:
            self._level.failed += 1

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
            if self._stopping:
                # The load is over and its requests are being cancelled; one whose last chunk
                # arrives in that same turn of the event loop (asyncio.wait_for before 3.12 then
                # returns its result rather than the cancellation) is one of them, not a
                # completion outside every level.
                raise asyncio.CancelledError
            self._completed += 1
            if tpot is not None:
                self._all_tpot.add(tpot)
            done_at = time.monotonic()
            result = loadgen_bench.RequestResult(True, self.lengths(rid)[0], tokens,
                                                 None if first is None else first - t_start, done_at - t_start)
            good = bool(cfg.goodput) and loadgen_bench.is_good(result, cfg.goodput)
            self._good += good
            if self._level is not None:
                self._level.add(result, cfg.goodput)
            if self._rec is not None:
                self._rec.completed(tpot, good)
            return True
        finally:
            resp.close()

    def _record_ttft(self, ttft: float) -> None:
        self._all_ttft.add(ttft)
        if self._rec is not None:
            self._rec.first_token(ttft)

    def _add_tokens(self, n: int) -> None:
        self._tokens += n
        if self._rec is not None:
            self._rec.tokens(n)

    async def _worker(self, index: int, limit: Optional[int]) -> None:
        """Keeps one request in flight while ``index`` is below the level's concurrency."""
        backoff = BACKOFF_MIN_S
        while not self._stopping and index < self._target and (limit is None or self._started < limit):
            if not await self._send():
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            else:
                backoff = BACKOFF_MIN_S

    async def _send(self) -> bool:
        rid = self._started
        self._started += 1
        self._in_flight += 1
        if self._level is not None:
            self._level.max_in_flight = max(self._level.max_in_flight, self._in_flight)
        try:
            return await self._request(rid)
        except asyncio.CancelledError:
            self._cancelled += 1
            raise
        finally:
            self._in_flight -= 1

    async def _dispatch(self) -> None:
        """Open loop: a request every gamma-distributed gap, at most ``concurrency`` in flight (the
        rest wait for a slot, as under vLLM's --max-concurrency; waiting is not in their TTFT)."""
        cfg = self.cfg
        rng = random.Random(cfg.seed + 3)
        slots = asyncio.Semaphore(cfg.concurrency)
        pending: set = set()

        async def one() -> None:
            async with slots:
                if not self._stopping:
                    await self._send()

        dispatched, due = 0, time.monotonic()
        try:
            while not self._stopping and (cfg.max_requests is None or dispatched < cfg.max_requests):
                due += loadgen_bench.arrival_gap(rng, cfg.request_rate, cfg.burstiness)
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                task = asyncio.ensure_future(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
                dispatched += 1
            await asyncio.gather(*list(pending))
        finally:
            for task in list(pending):
                task.cancel()
            await asyncio.gather(*list(pending), return_exceptions=True)

    async def _warm_up(self, stop: asyncio.Event) -> None:
        """``warmup_requests`` requests (at most ``concurrency`` at once), then every count reset:
        the first requests of a fresh server (compilation, allocation) are in no figure."""
        cfg = self.cfg
        t0 = time.time()
        self._target, left = cfg.concurrency, cfg.warmup_requests
        workers = [asyncio.ensure_future(self._worker(i, cfg.warmup_requests))
                   for i in range(min(cfg.concurrency, left))]
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([asyncio.gather(*workers, return_exceptions=True), stopped],
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            stopped.cancel()
        self._warmup = {"requests": self._started, "completed": self._completed, "errors": dict(self.errors),
                        "seconds": round(time.time() - t0, 3)}
        self._started = self._completed = self._cancelled = self._tokens = self._good = 0
        self.errors, self.error_examples = {}, {}
        self._all_ttft = loadgen_bench.Sample(random.Random(cfg.seed + 1))
        self._all_tpot = loadgen_bench.Sample(random.Random(cfg.seed + 2))

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
        """The load: one level (the concurrency, or the request rate), or a sweep's levels one after
        another, each on its own grid of windows from the level's start."""
        cfg = self.cfg
        if cfg.warmup_requests:
            await self._warm_up(stop)
            if stop.is_set():
                return self._summary(None, 0.0, 0)
        baseline = await self._scrape()
        t0 = time.time()
        self._rec = loadgen_windows.WindowRecorder(t0, goodput=bool(cfg.goodput))
        self._rec.baseline(baseline)
        levels = cfg.sweep or (cfg.concurrency,)
        step = cfg.seconds / len(levels)
        stopped = asyncio.ensure_future(stop.wait())
        windows, finished = 0, False
        try:
            for i, level in enumerate(levels):
                start = t0 + i * step
                end = t0 + cfg.seconds if i == len(levels) - 1 else start + step
                self._level = loadgen_bench.Level(level if cfg.sweep or cfg.request_rate is None else cfg.concurrency,
                                                  time.time(), seed=cfg.seed + i)
                if cfg.request_rate is not None:
                    self._tasks = [asyncio.ensure_future(self._dispatch())]
                else:
                    self._target = level
                    # Workers below the level are running; a lower level lets the rest finish and stop.
                    for j in range(level):
                        worker = asyncio.ensure_future(self._worker(j, cfg.max_requests))
                        if j == len(self._tasks):
                            self._tasks.append(worker)
                        elif self._tasks[j].done():  # it left an earlier, lower level
                            self._tasks[j] = worker
                        else:
                            worker.cancel()
                k, now = 1, time.time()
                while True:
                    boundary = start + k * cfg.window_s
                    if end - boundary < cfg.window_s / 2:  # no stub of a window before the end
                        boundary = end
                    await self._wait(stopped, boundary)
                    now = time.time()
                    # The last window is closed before the requests in flight are cancelled, so
                    # that its rows describe the load as it ran.
                    if now > self._rec.window_start:
                        await self._close_window(now)
                        windows += 1
                    finished = self._all_done() or stopped.done()
                    if finished or now >= end - 1e-3:  # timers may fire a hair early
                        break
                    k += 1
                self._levels.append((self._level, now - self._level.started))
                if finished:
                    break
        finally:
            self._stopping = True
            self._level = None  # requests cancelled now belong to no level
            for w in self._tasks:
                w.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            stopped.cancel()
        return self._summary(t0, time.time() - t0, windows)

    def _all_done(self) -> bool:
        return bool(self._tasks) and all(t.done() for t in self._tasks)

    async def _wait(self, stopped: asyncio.Future, until: float) -> None:
        """Until ``until``, a stop, or every worker done (a worker leaving a lower level is not)."""
        while not stopped.done() and not self._all_done():
            left = until - time.time()
            if left <= 0:
                return
            await asyncio.wait([t for t in self._tasks if not t.done()] + [stopped], timeout=left,
                               return_when=asyncio.FIRST_COMPLETED)

    async def _close_window(self, now: float) -> None:
        """Counts stop at ``now``; the scrape that follows (load still running) gives the server's side."""
        start = self._rec.window_start
        rows = self._rec.close(now, self._in_flight)
        if self.cfg.sweep and self._level is not None:
            rows.append(loadgen_windows.MetricRow(round(now, 3), "concurrency", self._level.concurrency))
        gauges = await self._scrape()
        if gauges is not None:
            rows += self._rec.server_rows(now, now - start, gauges)
        self.emit(rows)

    def _summary(self, t0: Optional[float], duration: float, windows: int, fatal: Optional[str] = None) -> LoadSummary:
        def pct(sample: loadgen_bench.Sample, qs: Sequence[int]) -> Dict[str, float]:
            values = sample.kept
            return {f"p{q}": round(loadgen_windows.percentile(values, q) * 1e3, 3) for q in qs} if values else {}

        cfg = self.cfg
        notes = list(self.notes) + [f"{kind}: e.g. {text}" for kind, text in self.error_examples.items()]
        info = loadgen_bench.RunInfo(self.model, cfg.request_rate, cfg.burstiness, cfg.goodput)
        results = tuple(loadgen_bench.result(level, info, seconds, level.started) for level, seconds in self._levels)
        return LoadSummary(
            model=self.model, prompt_mode=self.mode, started=t0, duration_s=round(duration, 3),
            requests_started=self._started, requests_completed=self._completed,
            requests_cancelled=self._cancelled, output_tokens=self._tokens, errors=dict(self.errors),
            ttft_ms=pct(self._all_ttft, loadgen_windows.TTFT_PERCENTILES),
            tpot_ms=pct(self._all_tpot, loadgen_windows.TPOT_PERCENTILES),
            windows=windows, scrapes=self._scrapes, kv_cache_metric=self._kv_metric, fatal=fatal,
            notes=tuple(notes), warmup=self._warmup, good_requests=self._good if cfg.goodput else None,
            results=results)


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


def result_paths(path: str, results: Sequence[dict]) -> List[Tuple[str, dict]]:
    """Where each level's result file goes: ``path`` itself for one, ``STEM-cN.json`` for a sweep's."""
    if len(results) == 1:
        return [(path, results[0])]
    stem, dot, ext = path.rpartition(".")
    stem, ext = (stem, "." + ext) if dot and "/" not in ext else (path, "")
    return [(f"{stem}-c{r['max_concurrency']}{ext}", r) for r in results]


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
    if cfg.save_result and summary.results:
        for path, doc in result_paths(cfg.save_result, summary.results):
            tmp = f"{path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, path)  # never a half-written result
    _print({"event": "summary", **asdict(summary)})
    return 1 if summary.fatal else 0


if __name__ == "__main__":
    sys.exit(main())
