"""What the load generator shares with ``vllm bench serve``: goodput, arrivals, lengths, results.

Standard library only and free of preflight imports, like loadgen.py, which it serves (shipped
beside it to a node). Pure, apart from the random draws, which take a ``random.Random``.

Each definition follows vLLM 0.32.0's ``vllm/benchmarks/serve.py`` (and ``datasets/utils.py``
for the lengths), so a soak's figures compare with a user's own ``vllm bench serve`` runs:

- **Goodput** (``--goodput ttft:800 tpot:50 e2el:2000``, milliseconds): a completed request is
  good when every named figure is at or under its limit; goodput is good requests per second of
  the run (``request_goodput``). TPOT is (latency - TTFT) / (output tokens - 1), counted as 0
  for a request of one token; failed requests are never good.
- **Arrivals** at a request rate: gaps drawn from a gamma distribution of shape ``burstiness``
  and scale ``1 / (rate * burstiness)`` (mean gap 1/rate; burstiness 1 is a Poisson process,
  below 1 burstier, above 1 more even), capped by a concurrency limit (``--max-concurrency``).
- **Lengths** (``--random-range-ratio r``): prompt and output lengths drawn uniformly from the
  integers in [floor(n * (1 - r)), ceil(n * (1 + r))], r in [0, 1), the output at least 1.
- **The result file** (``--save-result``): the keys vLLM writes without ``--save-detailed``
  (``date``, ``backend``, ``model_id``, ``num_prompts``, ``request_rate``, ``burstiness``,
  ``max_concurrency``, ``duration``, ``completed``, ``failed``, token totals, throughputs,
  ``request_goodput``, ``max_concurrent_requests``, and ``mean_/median_/std_/p99_`` of ``ttft``,
  ``tpot`` and ``e2el`` in ms). Left out, because a long soak cannot keep one value per request
  or per token: the per-request lists (``latencies``, ``queue_times``, and those vLLM drops
  without ``--save-detailed``) and inter-token latencies (``*_itl_ms``; vLLM too leaves out the
  metrics it was not asked for); also ``max_output_tokens_per_s`` (vLLM's is over one-second
  buckets, the soak's windows are longer) and ``rtfx`` (audio models).

A long soak cannot keep every request's figures: ``Sample`` keeps exact counts, sums and
squares, and a uniform reservoir of at most ``RESERVOIR`` values for the percentiles.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

try:
    from .loadgen_windows import percentile
except ImportError:  # a shipped copy, run from the agent's directory
    from loadgen_windows import percentile

GOODPUT_KEYS = ("ttft", "tpot", "e2el")
RESERVOIR = 20000


def parse_goodput(pairs: List[str]) -> Tuple[Tuple[str, float], ...]:
    """``["ttft:800", "tpot:50"]`` -> ``(("ttft", 800.0), ("tpot", 50.0))``; ValueError naming
    the pair that is not KEY:MILLISECONDS with KEY one of ttft, tpot, e2el."""
    out: Dict[str, float] = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        try:
            limit = float(value)
        except ValueError:
            limit = float("nan")
        if not sep or key not in GOODPUT_KEYS or not math.isfinite(limit) or limit < 0:
            raise ValueError(f"goodput {pair!r}: expected KEY:MILLISECONDS with KEY one of {', '.join(GOODPUT_KEYS)}")
        if key in out:
            raise ValueError(f"goodput {pair!r}: {key} given twice")
        out[key] = limit
    return tuple(out.items())


@dataclass(frozen=True)
class RequestResult:
    """One request as vLLM's benchmark sees it (seconds; ``ttft`` None when no token came)."""

    ok: bool
    prompt_len: int
    output_len: int
    ttft: Optional[float]
    latency: float

    @property
    def tpot(self) -> float:
        if self.output_len > 1 and self.ttft is not None:
            return (self.latency - self.ttft) / (self.output_len - 1)
        return 0.0


def is_good(r: RequestResult, goodput: Tuple[Tuple[str, float], ...]) -> bool:
    """Every goodput limit met (vLLM: ``s >= r`` for each SLO); a failed request is not good."""
    if not r.ok or r.ttft is None:
        return False
    value = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.latency}
    return all(value[key] * 1e3 <= limit for key, limit in goodput)


class Sample:
    """Count, mean and population std (as numpy's) exactly; percentiles from a reservoir."""

    def __init__(self, rng: random.Random, size: int = RESERVOIR):
        self.n, self.total, self.squares = 0, 0.0, 0.0
        self.kept: List[float] = []
        self._rng, self._size = rng, size

    def add(self, value: float) -> None:
        self.n += 1
        self.total += value
        self.squares += value * value
        if len(self.kept) < self._size:
            self.kept.append(value)
        else:  # Algorithm R: every value seen so far stays with probability size / n
            j = self._rng.randrange(self.n)
            if j < self._size:
                self.kept[j] = value

    def stats_ms(self, name: str, percentiles: Tuple[int, ...] = (99,)) -> Dict[str, float]:
        """vLLM's keys for one metric, in ms (its ``np.mean(values or 0)``: 0 for no values)."""
        if not self.n:
            return {f"mean_{name}_ms": 0.0, f"median_{name}_ms": 0.0, f"std_{name}_ms": 0.0,
                    **{f"p{p}_{name}_ms": 0.0 for p in percentiles}}
        mean = self.total / self.n
        var = max(0.0, self.squares / self.n - mean * mean)
        out = {f"mean_{name}_ms": mean * 1e3, f"median_{name}_ms": percentile(self.kept, 50) * 1e3,
               f"std_{name}_ms": math.sqrt(var) * 1e3}
        for p in percentiles:
            out[f"p{p}_{name}_ms"] = percentile(self.kept, p) * 1e3
        return out


@dataclass
class Level:
    """What one stretch of the load (the run, or one level of a sweep) did, for its result."""

    concurrency: Optional[int]
    started: float
    seed: int = 0
    completed: int = 0
    failed: int = 0
    good: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    max_in_flight: int = 0
    ttft: Sample = field(init=False)
    tpot: Sample = field(init=False)
    e2el: Sample = field(init=False)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.ttft, self.tpot, self.e2el = Sample(rng), Sample(rng), Sample(rng)

    def add(self, r: RequestResult, goodput: Tuple[Tuple[str, float], ...]) -> None:
        if not r.ok:
            self.failed += 1
            return
        self.completed += 1
        self.input_tokens += r.prompt_len
        self.output_tokens += r.output_len
        if r.ttft is not None:
            self.ttft.add(r.ttft)
        if r.output_len > 1:  # vLLM's TPOT statistics leave one-token requests out
            self.tpot.add(r.tpot)
        self.e2el.add(r.latency)
        if goodput and is_good(r, goodput):
            self.good += 1


@dataclass(frozen=True)
class RunInfo:
    """What the result file says about how the load was driven."""

    model: Optional[str]
    request_rate: Optional[float]  # None: as fast as the concurrency allows ("inf")
    burstiness: float
    goodput: Tuple[Tuple[str, float], ...]


def result(level: Level, info: RunInfo, duration_s: float, now: Optional[float] = None) -> dict:
    """The ``vllm bench serve --save-result`` document of one level (see the module docstring)."""
    dur = max(duration_s, 1e-9)
    doc = {
        "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(now)),
        "endpoint_type": "vllm", "backend": "vllm", "label": None,
        "model_id": info.model, "tokenizer_id": info.model,
        "num_prompts": level.completed + level.failed,
        "request_rate": info.request_rate if info.request_rate is not None else "inf",
        "burstiness": info.burstiness, "max_concurrency": level.concurrency,
        "duration": duration_s, "completed": level.completed, "failed": level.failed,
        "total_input_tokens": level.input_tokens, "total_output_tokens": level.output_tokens,
        "request_throughput": level.completed / dur,
        "request_goodput": level.good / dur if info.goodput else None,
        "output_throughput": level.output_tokens / dur,
        "total_token_throughput": (level.input_tokens + level.output_tokens) / dur,
        "max_concurrent_requests": level.max_in_flight,
    }
    for name, sample in (("ttft", level.ttft), ("tpot", level.tpot), ("e2el", level.e2el)):
        doc.update(sample.stats_ms(name))
    doc["preflight"] = {"goodput_slos_ms": dict(info.goodput), "itl": "not recorded"}
    return doc


# --- Arrivals and lengths ----------------------------------------------------------------------


def arrival_gap(rng: random.Random, rate: float, burstiness: float) -> float:
    """Seconds to the next request at ``rate`` requests/s (see the module docstring)."""
    if math.isinf(burstiness):
        return 1.0 / rate
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def length_range(n: int, ratio: float, at_least: int = 1) -> Tuple[int, int]:
    """The inclusive range vLLM's random dataset draws a length of mean ``n`` from."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"range ratio must be in [0, 1), got {ratio}")
    return max(at_least, math.floor(n * (1 - ratio))), max(at_least, math.ceil(n * (1 + ratio)))


def draw_length(rng: random.Random, n: int, ratio: float) -> int:
    lo, hi = length_range(n, ratio)
    return rng.randint(lo, hi) if hi > lo else lo
