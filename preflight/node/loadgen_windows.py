"""The load generator's windows: what the client saw in each, and what the server's /metrics said.

Standard library only and free of preflight imports, like loadgen.py, which it serves (shipped
beside it to a node). Pure: times and scrapes are passed in, so the arithmetic is testable
without a clock or a server.

Per window (default 10 s, on a grid from the start of the load; the window before the deadline
takes in a rest shorter than half a window, and a run stopped early closes its last window
where it stands):
``output_tokens_per_s`` (tokens received in the window), ``requests_per_s`` (completed),
``goodput_requests_per_s`` (completed within every ``--goodput`` limit; only with goodput
limits, loadgen_bench.py defines them), ``ttft_p50_ms``/``ttft_p90_ms``/``ttft_p99_ms``
(requests whose first token came in the window), ``tpot_p50_ms``/``tpot_p99_ms`` ((last
token - first token) / (tokens - 1) of requests completed in the window, as ``vllm bench
serve`` defines it), ``errors``, ``in_flight`` (at the window's end), ``concurrency`` (a
sweep's level, only in a sweep); and from ``/metrics`` scraped at the window's end (Prometheus text format):
``requests_running``, ``requests_waiting``, ``kv_cache_usage`` (fraction 0-1, from
``vllm:kv_cache_usage_perc`` or the deprecated ``vllm:gpu_cache_usage_perc`` of older vLLM),
``preemptions`` (``vllm:num_preemptions_total`` increase over the window) and
``server_output_tokens_per_s`` (``vllm:generation_tokens_total`` increase over the window).
Several label sets (data-parallel engines, models) are summed, except KV-cache usage, where
the fullest engine is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

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
    good: int = 0
    errors: int = 0
    ttft_s: List[float] = field(default_factory=list)
    tpot_s: List[float] = field(default_factory=list)


TTFT_PERCENTILES = (50, 90, 99)
TPOT_PERCENTILES = (50, 99)


class WindowRecorder:
    """Collects what happens between two window closes; ``close`` turns it into rows. Times are
    passed in, so the arithmetic is testable without a clock."""

    def __init__(self, t0: float, goodput: bool = False):
        self.window_start = t0
        self.goodput = goodput
        self._b = _Bucket()
        self._last_gauges: Optional[ServerGauges] = None

    def tokens(self, n: int) -> None:
        self._b.tokens += n

    def first_token(self, ttft_s: float) -> None:
        self._b.ttft_s.append(ttft_s)

    def completed(self, tpot_s: Optional[float], good: bool = False) -> None:
        self._b.completed += 1
        self._b.good += good
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
        if self.goodput:
            rows.append(MetricRow(t, "goodput_requests_per_s", round(b.good / dt, 4)))
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

