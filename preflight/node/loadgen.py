#!/usr/bin/env python3
"""Streaming load generator for an OpenAI-compatible ``/v1/completions`` server (vLLM first).

Standard library only (asyncio streams, no aiohttp/httpx) and free of preflight imports: the
soak ships this file to a node beside the agent and runs it there with any ``python3``:

    python3 loadgen.py --url http://127.0.0.1:8000 --seconds 600 [--concurrency 256] ...

prints one JSON object a line on stdout: ``{"event": "row", "time", "metric", "value"}`` per
window and metric, ``ready``, ``note``, ``fatal`` and a closing ``summary``.

What it sends: ``concurrency`` requests kept in flight, each ``stream: true`` with
``stream_options.include_usage``; the prompt is a list of random token ids (works when the
server runs with ``--skip-tokenizer-init``, and costs no tokenizer time when it does not) or
random words with ``--text-prompts``; vLLM's ``ignore_eos`` and ``return_token_ids`` go with it
while the server accepts them. A probe request before the load picks the first body the server
takes, in this order: token ids with vLLM's extras, token ids without, text without (a plain
OpenAI server rejects unknown fields with 400).

What it reads: Server-Sent Events (``data: {...}`` lines, ``data: [DONE]`` last), over
``Transfer-Encoding: chunked``, ``Content-Length`` or read-to-close bodies. A chunk's tokens
are its ``token_ids`` (vLLM with ``return_token_ids``), else one per choice (vLLM streams a
chunk per decode step, its ``text`` empty when the server runs without a tokenizer); the
closing ``usage.completion_tokens`` tops the count up when a chunk held several tokens.
A request is an error when the status is not 200, the stream carries an ``error`` object,
the connection drops before ``[DONE]``, or it stalls past the timeouts; failed requests are
counted by kind and the worker backs off a little, so a dead server is not hammered.

Per window (default 10 s, on a grid from the start of the load; the window before the deadline
takes in a rest shorter than half a window, and a run stopped early closes its last window
where it stands):
``output_tokens_per_s`` (tokens received in the window), ``requests_per_s`` (completed),
``ttft_p50_ms``/``ttft_p90_ms``/``ttft_p99_ms`` (requests whose first token came in the
window), ``tpot_p50_ms``/``tpot_p99_ms`` ((last token - first token) / (tokens - 1) of requests
completed in the window, as ``vllm bench serve`` defines it), ``errors``, ``in_flight`` (at the
window's end); and from ``/metrics`` scraped at the window's end (Prometheus text format):
``requests_running``, ``requests_waiting``, ``kv_cache_usage`` (fraction 0-1, from
``vllm:kv_cache_usage_perc`` or the deprecated ``vllm:gpu_cache_usage_perc`` of older vLLM),
``preemptions`` (``vllm:num_preemptions_total`` increase over the window) and
``server_output_tokens_per_s`` (``vllm:generation_tokens_total`` increase over the window).
Several label sets (data-parallel engines, models) are summed, except KV-cache usage, where
the fullest engine is reported.

The run is bounded: it ends at ``seconds`` after the load began (requests in flight are
cancelled, not counted as errors), after ``max_requests`` requests, or on a stop (SIGTERM /
SIGINT, or stdin closing with ``--stop-on-stdin-eof``: the soak engine's pipe closes when the
agent dies, so the load dies with it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import ssl
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Awaitable, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

# StreamReader line limit: the first chunk of a vLLM stream echoes the prompt's token ids.
LINE_LIMIT = 1 << 20
METRICS_BODY_LIMIT = 32 << 20
ERROR_BODY_LIMIT = 4096
# Back-off after a failed request, doubling up to the maximum; a success resets it.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
READY_POLL_S = 1.0


# --- Prometheus text format (pure) -------------------------------------------------------------


@dataclass(frozen=True)
class PromSample:
    name: str
    labels: Tuple[Tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class PromText:
    samples: Tuple[PromSample, ...]
    notes: Tuple[str, ...] = ()


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(line: str, i: int) -> Tuple[Tuple[Tuple[str, str], ...], int]:
    """Labels from ``line[i]`` == "{" to the closing "}"; returns them and the index after it."""
    labels = []
    i += 1
    while True:
        while i < len(line) and line[i] in " ,":
            i += 1
        if i >= len(line):
            raise ValueError("unterminated label set")
        if line[i] == "}":
            return tuple(labels), i + 1
        eq = line.index("=", i)
        key = line[i:eq].strip()
        if eq + 1 >= len(line) or line[eq + 1] != '"':
            raise ValueError(f"label {key!r} has no quoted value")
        j, value = eq + 2, []
        while True:
            if j >= len(line):
                raise ValueError(f"label {key!r}: unterminated value")
            ch = line[j]
            if ch == "\\" and j + 1 < len(line):
                value.append(_ESCAPES.get(line[j + 1], "\\" + line[j + 1]))
                j += 2
            elif ch == '"':
                break
            else:
                value.append(ch)
                j += 1
        labels.append((key, "".join(value)))
        i = j + 1


def parse_prometheus(text: str) -> PromText:
    """Every sample line of a Prometheus text exposition (``# HELP``/``# TYPE`` and other comments
    skipped; an optional timestamp after the value ignored). A line that does not parse is left
    out with a note, so a truncated scrape still yields the lines before the cut."""
    samples, notes = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            brace, space = line.find("{"), line.find(" ")
            if brace != -1 and (space == -1 or brace < space):
                name = line[:brace]
                labels, end = _parse_labels(line, brace)
                rest = line[end:].split()
            else:
                name, labels, rest = line.split()[0], (), line.split()[1:]
            if not rest:
                raise ValueError("no value")
            samples.append(PromSample(name, labels, float(rest[0])))
        except ValueError as exc:
            notes.append(f"line {number}: {exc}: {line[:120]!r}")
    return PromText(tuple(samples), tuple(notes))


@dataclass(frozen=True)
class ServerGauges:
    """What one ``/metrics`` scrape says about a vLLM server; None where it did not say."""

    requests_running: Optional[float] = None
    requests_waiting: Optional[float] = None
    kv_cache_usage: Optional[float] = None
    kv_cache_metric: Optional[str] = None
    preemptions_total: Optional[float] = None
    generation_tokens_total: Optional[float] = None


KV_CACHE_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def vllm_gauges(prom: PromText) -> ServerGauges:
    """The vLLM series the soak follows. ``vllm:gpu_cache_usage_perc`` (deprecated in 2025-05 by
    vllm PR #18354, no longer emitted by default since) is read only when the new name is absent."""
    by_name: Dict[str, List[float]] = {}
    for s in prom.samples:
        if not math.isnan(s.value):
            by_name.setdefault(s.name, []).append(s.value)

    def total(name: str) -> Optional[float]:
        return sum(by_name[name]) if name in by_name else None

    kv_name = next((n for n in KV_CACHE_METRICS if n in by_name), None)
    return ServerGauges(
        requests_running=total("vllm:num_requests_running"),
        requests_waiting=total("vllm:num_requests_waiting"),
        kv_cache_usage=max(by_name[kv_name]) if kv_name else None,
        kv_cache_metric=kv_name,
        preemptions_total=total("vllm:num_preemptions_total"),
        generation_tokens_total=total("vllm:generation_tokens_total"),
    )


# --- Server-Sent Events and completion chunks (pure) -------------------------------------------


class SseDecoder:
    """Feeds bytes in, gets each event's data out (several ``data:`` lines of one event joined by
    "\\n"; comments and other fields ignored). Lines may be split anywhere between feeds."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: List[str] = []

    def feed(self, chunk: bytes) -> List[str]:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        out = []
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", "replace")
            if not line:
                if self._data:
                    out.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
        return out

    def close(self) -> List[str]:
        """Events left when the stream ends without the blank line that should close them."""
        out = self.feed(b"\n\n") if self._buf or self._data else []
        self._buf = b""
        return out


@dataclass(frozen=True)
class ChunkInfo:
    tokens: int = 0
    completion_tokens: Optional[int] = None
    error: Optional[str] = None


def chunk_info(event: dict) -> ChunkInfo:
    """Tokens carried by one streamed completion chunk, its usage, or its error."""
    err = event.get("error")
    if err:
        return ChunkInfo(error=str(err.get("message", err)) if isinstance(err, dict) else str(err))
    tokens = 0
    for choice in event.get("choices") or ():
        ids = choice.get("token_ids") if isinstance(choice, dict) else None
        tokens += len(ids) if isinstance(ids, list) else 1
    usage = event.get("usage")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return ChunkInfo(tokens=tokens, completion_tokens=completion if isinstance(completion, int) else None)


# --- Windows (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricRow:
    time: float
    metric: str
    value: float


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between order statistics (numpy's
    default), so a p99 of few samples stays between real values."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class _Bucket:
    tokens: int = 0
    completed: int = 0
    errors: int = 0
    ttft_s: List[float] = field(default_factory=list)
    tpot_s: List[float] = field(default_factory=list)


TTFT_PERCENTILES = (50, 90, 99)
TPOT_PERCENTILES = (50, 99)


class WindowRecorder:
    """Collects what happens between two window closes; ``close`` turns it into rows. Times are
    passed in, so the arithmetic is testable without a clock."""

    def __init__(self, t0: float):
        self.window_start = t0
        self._b = _Bucket()
        self._last_gauges: Optional[ServerGauges] = None

    def tokens(self, n: int) -> None:
        self._b.tokens += n

    def first_token(self, ttft_s: float) -> None:
        self._b.ttft_s.append(ttft_s)

    def completed(self, tpot_s: Optional[float]) -> None:
        self._b.completed += 1
        if tpot_s is not None:
            self._b.tpot_s.append(tpot_s)

    def error(self) -> None:
        self._b.errors += 1

    def baseline(self, gauges: Optional[ServerGauges]) -> None:
        """The scrape that the first window's counter increases are taken against."""
        self._last_gauges = gauges

    def close(self, t_end: float, in_flight: int) -> List[MetricRow]:
        """The client-side rows of the window ending at ``t_end``; the next window starts there."""
        b, dt = self._b, max(t_end - self.window_start, 1e-9)
        t = round(t_end, 3)
        rows = [MetricRow(t, "output_tokens_per_s", round(b.tokens / dt, 3)),
                MetricRow(t, "requests_per_s", round(b.completed / dt, 4))]
        for q in TTFT_PERCENTILES:
            if b.ttft_s:
                rows.append(MetricRow(t, f"ttft_p{q}_ms", round(percentile(b.ttft_s, q) * 1e3, 3)))
        for q in TPOT_PERCENTILES:
            if b.tpot_s:
                rows.append(MetricRow(t, f"tpot_p{q}_ms", round(percentile(b.tpot_s, q) * 1e3, 3)))
        rows += [MetricRow(t, "errors", b.errors), MetricRow(t, "in_flight", in_flight)]
        self.window_start, self._b = t_end, _Bucket()
        return rows

    def server_rows(self, t_end: float, dt: float, g: ServerGauges) -> List[MetricRow]:
        """The rows of a scrape taken as the window of ``dt`` seconds ending at ``t_end`` closed;
        counters are reported as their increase since the previous scrape."""
        t = round(t_end, 3)
        rows = [MetricRow(t, name, value) for name, value in (
            ("requests_running", g.requests_running), ("requests_waiting", g.requests_waiting),
            ("kv_cache_usage", g.kv_cache_usage)) if value is not None]
        prev = self._last_gauges
        for name, now, before, per_s in (
                ("preemptions", g.preemptions_total, prev and prev.preemptions_total, False),
                ("server_output_tokens_per_s", g.generation_tokens_total,
                 prev and prev.generation_tokens_total, True)):
            # A counter that went down means the server restarted: no increase to report.
            if now is not None and before is not None and now >= before:
                rows.append(MetricRow(t, name, round((now - before) / dt, 3) if per_s else now - before))
        self._last_gauges = g
        return rows


# --- HTTP over asyncio streams -----------------------------------------------------------------


class HttpError(Exception):
    """A response that is not HTTP, or a body cut short."""


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def from_url(cls, url: str) -> "Endpoint":
        """``http[s]://host[:port][/prefix]``; a trailing ``/v1`` is dropped (the paths used here,
        /v1/completions, /health, /metrics, are all under the server's root)."""
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[:-3]
        return cls(parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), path)

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base_path}{path}"


@dataclass
class Response:
    status: int
    headers: Dict[str, str]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


async def _timed(awaitable: Awaitable, timeout: float):
    return await asyncio.wait_for(awaitable, timeout)


async def http_request(ep: Endpoint, method: str, path: str, body: Optional[bytes], timeout: float,
                       api_key: Optional[str] = None, accept: str = "*/*",
                       head_timeout: Optional[float] = None) -> Response:
    """Sends one request on a new connection (``Connection: close``) and reads the status line
    and headers; the caller reads the body with ``body_chunks`` and closes the response.
    ``timeout`` bounds the connect and the send; ``head_timeout`` (default: the same) the wait
    for the status line, which a loaded server may send late."""
    head_timeout = timeout if head_timeout is None else head_timeout
    ctx = ssl.create_default_context() if ep.scheme == "https" else None
    reader, writer = await _timed(asyncio.open_connection(
        ep.host, ep.port, ssl=ctx, server_hostname=ep.host if ctx else None, limit=LINE_LIMIT), timeout)
    try:
        head = [f"{method} {ep.base_path}{path} HTTP/1.1", f"Host: {ep.host}:{ep.port}",
                f"Accept: {accept}", "Connection: close", "User-Agent: preflight-loadgen"]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        if api_key:
            head.append(f"Authorization: Bearer {api_key}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
        await _timed(writer.drain(), timeout)
        status_line = await _timed(reader.readline(), head_timeout)
        if not status_line:
            raise ConnectionResetError("connection closed before a response")
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP response: {status_line[:80]!r}")
        headers = {}
        while True:
            line = await _timed(reader.readline(), timeout)
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        return Response(int(parts[1]), headers, reader, writer)
    except BaseException:
        writer.close()
        raise


async def body_chunks(resp: Response, idle_timeout: float):
    """The body's bytes as they come: chunked transfer coding, Content-Length, or up to the close.
    A body cut short raises ``asyncio.IncompleteReadError`` or ``HttpError``; a read waiting
    longer than ``idle_timeout`` raises ``asyncio.TimeoutError``."""
    r = resp.reader
    if "chunked" in resp.headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await _timed(r.readline(), idle_timeout)
            if not size_line.endswith(b"\n"):
                raise HttpError("connection closed inside the chunked body")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise HttpError(f"bad chunk size line {size_line[:40]!r}") from None
            if size == 0:
                return
            data = await _timed(r.readexactly(size + 2), idle_timeout)
            yield data[:-2]
    elif "content-length" in resp.headers:
        left = int(resp.headers["content-length"])
        while left > 0:
            data = await _timed(r.read(min(left, 1 << 16)), idle_timeout)
            if not data:
                raise HttpError(f"connection closed with {left} bytes of the body missing")
            left -= len(data)
            yield data
    else:
        while True:
            data = await _timed(r.read(1 << 16), idle_timeout)
            if not data:
                return
            yield data


async def read_body(resp: Response, timeout: float, limit: int) -> bytes:
    parts, size = [], 0
    async for data in body_chunks(resp, timeout):
        parts.append(data)
        size += len(data)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


async def http_get(ep: Endpoint, path: str, timeout: float, api_key: Optional[str] = None,
                   limit: int = METRICS_BODY_LIMIT) -> Tuple[int, str]:
    resp = await http_request(ep, "GET", path, None, timeout, api_key)
    try:
        return resp.status, (await read_body(resp, timeout, limit)).decode("utf-8", "replace")
    finally:
        resp.close()


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


class NotReady(Exception):
    """The server never answered; the load cannot start."""


class _NoResponse(Exception):
    """The request got no status line: nothing listening, or the connection dropped at once."""


_WORDS = ("the quick brown fox jumps over a lazy dog while seven bright engines hum "
          "across the cold data hall and every node reports its temperature clock power").split()
_BODIES = ("token_ids+vllm", "token_ids", "text")


class LoadGenerator:
    """One run: ``await run(stop)``; rows go to ``emit`` at each window close, ``ready`` and
    ``note`` events to ``on_event``."""

    def __init__(self, cfg: LoadConfig, emit: Callable[[List[MetricRow]], None],
                 on_event: Optional[Callable[[str, dict], None]] = None):
        self.cfg = cfg
        self.ep = Endpoint.from_url(cfg.url)
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
        self._rec: Optional[WindowRecorder] = None
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
        except (asyncio.IncompleteReadError, OSError, HttpError) as exc:
            self._fail("disconnect", f"{type(exc).__name__}: {exc}")
        return False

    async def _stream(self, rid: int, t_start: float) -> bool:
        cfg = self.cfg
        try:
            resp = await http_request(self.ep, "POST", "/v1/completions", self.body(rid, self.mode),
                                      cfg.connect_timeout_s, cfg.api_key, accept="text/event-stream",
                                      head_timeout=cfg.idle_timeout_s)
        except (OSError, HttpError, asyncio.IncompleteReadError) as exc:
            raise _NoResponse(f"{type(exc).__name__}: {exc}") from None
        try:
            if resp.status != 200:
                detail = await read_body(resp, cfg.connect_timeout_s, ERROR_BODY_LIMIT)
                self._fail(f"http_{resp.status}", detail.decode("utf-8", "replace"))
                return False
            decoder, counted, usage = SseDecoder(), 0, None
            first = last = None
            done = False
            async for data in body_chunks(resp, cfg.idle_timeout_s):
                for payload in decoder.feed(data):
                    if payload.strip() == "[DONE]":
                        done = True
                        break
                    try:
                        info = chunk_info(json.loads(payload))
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

    async def _wait_ready(self, stop: asyncio.Event) -> float:
        t0 = time.monotonic()
        deadline = t0 + self.cfg.ready_timeout_s
        last = "no answer"
        while time.monotonic() < deadline and not stop.is_set():
            for path in ("/health", "/v1/models"):
                try:
                    status, _ = await http_get(self.ep, path, min(5.0, self.cfg.connect_timeout_s), self.cfg.api_key)
                except (OSError, asyncio.TimeoutError, HttpError, asyncio.IncompleteReadError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    break  # nothing listening yet: no point in the second path
                if status == 200:
                    return time.monotonic() - t0
                last = f"GET {path}: HTTP {status}"
            try:  # a sleep that a stop ends
                await asyncio.wait_for(stop.wait(), max(0.0, min(READY_POLL_S, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                pass
        if stop.is_set():
            return time.monotonic() - t0
        raise NotReady(f"{self.ep.url('')} not ready after {time.monotonic() - t0:.1f} s ({last})")

    async def _discover_model(self) -> Optional[str]:
        """The first model /v1/models lists; None when it lists none (the probe then says why)."""
        try:
            status, text = await http_get(self.ep, "/v1/models", self.cfg.connect_timeout_s, self.cfg.api_key)
            return json.loads(text)["data"][0]["id"] if status == 200 else None
        except (OSError, asyncio.TimeoutError, HttpError, asyncio.IncompleteReadError,
                ValueError, KeyError, IndexError, TypeError):
            return None

    async def _probe(self) -> None:
        """Finds the first request body the server takes (see the module docstring)."""
        order = [m for m in _BODIES if m == "text" or not self.cfg.text_prompts]
        tried = []
        for mode in order:
            try:
                resp = await http_request(self.ep, "POST", "/v1/completions", self.body(-1, mode, 2),
                                          self.cfg.connect_timeout_s, self.cfg.api_key,
                                          head_timeout=self.cfg.idle_timeout_s)
                try:
                    body = await read_body(resp, self.cfg.idle_timeout_s, 1 << 20)
                finally:
                    resp.close()
            except (OSError, asyncio.TimeoutError, HttpError, asyncio.IncompleteReadError) as exc:
                raise NotReady(f"probe request failed: {type(exc).__name__}: {exc}") from None
            if resp.status == 200:
                if tried:
                    self.note(f"server rejected {', '.join(tried)} request bodies; sending {mode}")
                self.mode = mode
                return
            if resp.status not in (400, 422):
                raise NotReady(f"probe request: HTTP {resp.status}: {body[:300].decode('utf-8', 'replace')}")
            tried.append(f"{mode} (HTTP {resp.status}: {body[:200].decode('utf-8', 'replace')})")
        raise NotReady(f"server rejected every request body: {'; '.join(tried)}")

    async def _scrape(self) -> Optional[ServerGauges]:
        if not self.cfg.scrape_metrics or self._scrape_failed:
            return None
        try:
            status, text = await http_get(self.ep, "/metrics", min(5.0, self.cfg.window_s / 2), self.cfg.api_key)
        except (OSError, asyncio.TimeoutError, HttpError, asyncio.IncompleteReadError) as exc:
            self._scrape_errors += 1
            if self._scrape_errors == 1:  # one note, not one a window
                self.note(f"/metrics scrape failed: {type(exc).__name__}: {exc}")
            return None
        if status != 200:
            # No /metrics (not vLLM, or behind a proxy): said once, not asked again.
            self._scrape_failed = True
            self.note(f"/metrics answered HTTP {status}; server metrics left out")
            return None
        gauges = vllm_gauges(parse_prometheus(text))
        if gauges.kv_cache_metric and gauges.kv_cache_metric != self._kv_metric:
            self._kv_metric = gauges.kv_cache_metric
            if gauges.kv_cache_metric != KV_CACHE_METRICS[0]:
                self.note(f"KV-cache usage from the deprecated {gauges.kv_cache_metric}")
        self._scrapes += 1
        return gauges

    # --- the run

    async def run(self, stop: Optional[asyncio.Event] = None) -> LoadSummary:
        stop = stop or asyncio.Event()
        t_ready = time.time()
        try:
            waited = await self._wait_ready(stop) if self.cfg.ready_timeout_s > 0 else 0.0
            if stop.is_set():
                self.note("stopped before the server was ready")
                return self._summary(None, time.time() - t_ready, 0)
            self.model = self.model or await self._discover_model()
            await self._probe()
        except NotReady as exc:
            return self._summary(None, time.time() - t_ready, 0, str(exc))
        self.on_event("ready", {"waited_s": round(waited, 3), "model": self.model, "prompt_mode": self.mode})
        return await self._load(stop)

    async def _load(self, stop: asyncio.Event) -> LoadSummary:
        cfg = self.cfg
        baseline = await self._scrape()
        t0 = time.time()
        self._rec = WindowRecorder(t0)
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
            return {f"p{q}": round(percentile(values, q) * 1e3, 3) for q in qs} if values else {}

        notes = list(self.notes) + [f"{kind}: e.g. {text}" for kind, text in self.error_examples.items()]
        return LoadSummary(
            model=self.model, prompt_mode=self.mode, started=t0, duration_s=round(duration, 3),
            requests_started=self._started, requests_completed=self._completed,
            requests_cancelled=self._cancelled, output_tokens=self._tokens, errors=dict(self.errors),
            ttft_ms=pct(self._all_ttft, TTFT_PERCENTILES), tpot_ms=pct(self._all_tpot, TPOT_PERCENTILES),
            windows=windows, scrapes=self._scrapes, kv_cache_metric=self._kv_metric, fatal=fatal,
            notes=tuple(notes))


def run_load(cfg: LoadConfig, emit: Callable[[List[MetricRow]], None],
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
    ap.add_argument("--concurrency", type=int, default=d.concurrency, help=f"requests in flight (default {d.concurrency})")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens, help=f"output tokens per request (default {d.max_tokens})")
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
        Endpoint.from_url(cfg.url)
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

    def emit(rows: List[MetricRow]) -> None:
        for r in rows:
            _print({"event": "row", "time": r.time, "metric": r.metric, "value": r.value})

    summary = run_load(cfg, emit, stop, lambda kind, data: _print({"event": kind, **data}))
    if summary.fatal:
        _print({"event": "fatal", "message": summary.fatal})
    _print({"event": "summary", **asdict(summary)})
    return 1 if summary.fatal else 0


if __name__ == "__main__":
    sys.exit(main())
