"""The load generator's HTTP client: requests over asyncio streams, Server-Sent Events decoded.

Standard library only and free of preflight imports, like loadgen.py, which it serves (shipped
beside it to a node). No aiohttp or httpx: a node has a bare ``python3``.

What it reads: Server-Sent Events (``data: {...}`` lines, ``data: [DONE]`` last), over
``Transfer-Encoding: chunked``, ``Content-Length`` or read-to-close bodies. A chunk's tokens
are its ``token_ids`` (vLLM with ``return_token_ids``), else one per choice (vLLM streams a
chunk per decode step, its ``text`` empty when the server runs without a tokenizer); the
closing ``usage.completion_tokens`` tops the count up when a chunk held several tokens.
Each request goes on a connection of its own (``Connection: close``).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass
from typing import Awaitable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

# StreamReader line limit: the first chunk of a vLLM stream echoes the prompt's token ids.
LINE_LIMIT = 1 << 20
METRICS_BODY_LIMIT = 32 << 20
READY_POLL_S = 1.0


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


# --- Before the load -------------------------------------------------------------------------


class NotReady(Exception):
    """The server never answered; the load cannot start."""


async def wait_ready(ep: Endpoint, timeout_s: float, connect_timeout_s: float, api_key: Optional[str],
                     stop: asyncio.Event) -> float:
    """Seconds until the server answered ``/health`` or ``/v1/models`` with 200 (or a stop came);
    NotReady after ``timeout_s`` with what it last said."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    last = "no answer"
    while time.monotonic() < deadline and not stop.is_set():
        for path in ("/health", "/v1/models"):
            try:
                status, _ = await http_get(ep, path, min(5.0, connect_timeout_s), api_key)
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
    raise NotReady(f"{ep.url('')} not ready after {time.monotonic() - t0:.1f} s ({last})")


async def first_model(ep: Endpoint, timeout: float, api_key: Optional[str]) -> Optional[str]:
    """The first model /v1/models lists; None when it lists none (the probe then says why)."""
    try:
        status, text = await http_get(ep, "/v1/models", timeout, api_key)
        return json.loads(text)["data"][0]["id"] if status == 200 else None
    except (OSError, asyncio.TimeoutError, HttpError, asyncio.IncompleteReadError,
            ValueError, KeyError, IndexError, TypeError):
        return None
