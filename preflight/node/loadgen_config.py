"""What a load is: the load generator's configuration (``LoadConfig``), its summary
(``LoadSummary``), and the command line both ways (``LoadConfig.to_argv``, ``parse_args``).

Standard library only and free of preflight imports, like loadgen.py, which it serves (shipped
beside it to the nodes; loadgen.py re-exports these names): the soak agent builds a
``LoadConfig`` and starts ``loadgen.py`` with its ``to_argv()``, which ``parse_args`` reads back.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

try:
    from . import loadgen_bench, loadgen_http
except ImportError:  # a shipped copy, run beside its siblings
    import loadgen_bench
    import loadgen_http

DESCRIPTION = "Streaming load generator for an OpenAI-compatible /v1/completions server (vLLM first)."


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
    # vllm bench serve parity (loadgen_bench.py says how each is defined there).
    # sweep: concurrency levels run one after another, each for seconds / len(sweep).
    sweep: Tuple[int, ...] = ()
    warmup_requests: int = 0  # sent and waited for before the load; in no figure
    request_rate: Optional[float] = None  # requests/s (gamma arrivals) capped by concurrency; None: closed loop
    burstiness: float = 1.0
    range_ratio: float = 0.0  # prompt and output lengths uniform in n * [1 - r, 1 + r]
    goodput: Tuple[Tuple[str, float], ...] = ()  # (ttft|tpot|e2el, ms): a request within all is good
    save_result: Optional[str] = None  # a vllm bench serve result file (one a level: NAME-cN.json)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_tokens < 1 or self.prompt_tokens < 1:
            raise ValueError("concurrency, max_tokens and prompt_tokens must be at least 1")
        if self.window_s <= 0 or self.seconds <= 0:
            raise ValueError("window_s and seconds must be positive")
        if not 0 <= self.token_id_range[0] < self.token_id_range[1]:
            raise ValueError(f"token_id_range: empty range {self.token_id_range}")
        if any(c < 1 for c in self.sweep):
            raise ValueError(f"sweep: every level must be at least 1, got {list(self.sweep)}")
        if self.sweep and self.request_rate is not None:
            raise ValueError("sweep and request_rate: a sweep steps the concurrency, a request rate fixes arrivals")
        if self.warmup_requests < 0:
            raise ValueError("warmup_requests must not be negative")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError("request_rate must be positive")
        if not self.burstiness > 0:
            raise ValueError("burstiness must be positive")
        loadgen_bench.length_range(self.prompt_tokens, self.range_ratio)  # ValueError outside [0, 1)

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
        if self.sweep:
            argv += ["--sweep", ",".join(map(str, self.sweep))]
        if self.warmup_requests:
            argv += ["--num-warmups", str(self.warmup_requests)]
        if self.request_rate is not None:
            argv += ["--request-rate", repr(self.request_rate), "--burstiness", repr(self.burstiness)]
        if self.range_ratio:
            argv += ["--random-range-ratio", repr(self.range_ratio)]
        if self.goodput:
            argv += ["--goodput", *(f"{k}:{v!r}" for k, v in self.goodput)]
        if self.save_result:
            argv += ["--save-result", self.save_result]
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
    warmup: Optional[dict] = None  # the warm-up's requests, completed and errors (in no figure above)
    good_requests: Optional[int] = None  # completed within every goodput limit (None: no --goodput)
    results: Tuple[dict, ...] = ()  # one vllm bench serve result a level (the run's one without a sweep)


# --- Command line ------------------------------------------------------------------------------


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


def _levels(text: str) -> Tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"every level must be at least 1, got {text!r}")
    return levels


def parse_args(argv: Optional[List[str]]) -> Tuple[LoadConfig, bool]:
    """The load's configuration, and whether to stop when stdin closes."""
    d = LoadConfig()
    ap = argparse.ArgumentParser(prog="loadgen.py", description=DESCRIPTION)
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
    bench = ap.add_argument_group("as vllm bench serve (vLLM 0.32.0 vllm/benchmarks/serve.py)")
    bench.add_argument("--sweep", type=_levels, default=(), metavar="C1,C2,...",
                       help="concurrency levels run one after another, --seconds split evenly between them")
    bench.add_argument("--num-warmups", type=int, default=0, help="warm-up requests before the load, counted nowhere")
    bench.add_argument("--request-rate", type=_positive, default=None,
                       help="requests per second (gamma arrivals), at most --concurrency in flight (default: "
                            "closed loop, --concurrency always in flight)")
    bench.add_argument("--burstiness", type=_positive, default=d.burstiness,
                       help="gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more even (default 1)")
    bench.add_argument("--random-range-ratio", type=float, default=d.range_ratio, metavar="R",
                       help="prompt and output lengths uniform in [n(1-R), n(1+R)], 0 <= R < 1 (default 0: fixed)")
    bench.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                       help="a request is good when within every limit: ttft, tpot, e2el in ms")
    bench.add_argument("--save-result", metavar="FILE",
                       help="write the result as vllm bench serve --save-result does (a sweep: FILE-cN.json a level)")
    ap.add_argument("--stop-on-stdin-eof", action="store_true", help="stop when stdin closes (the caller died)")
    a = ap.parse_args(argv)
    try:
        cfg = LoadConfig(url=a.url, model=a.model, concurrency=a.concurrency, max_tokens=a.max_tokens,
                         prompt_tokens=a.prompt_tokens, text_prompts=a.text_prompts, token_id_range=a.token_id_range,
                         window_s=a.window, seconds=a.seconds, max_requests=a.max_requests,
                         ready_timeout_s=a.ready_timeout, connect_timeout_s=a.connect_timeout,
                         idle_timeout_s=a.idle_timeout,
                         request_timeout_s=a.request_timeout, scrape_metrics=not a.no_metrics, seed=a.seed,
                         api_key=os.environ.get("OPENAI_API_KEY") or None, sweep=a.sweep,
                         warmup_requests=a.num_warmups, request_rate=a.request_rate, burstiness=a.burstiness,
                         range_ratio=a.random_range_ratio, goodput=loadgen_bench.parse_goodput(a.goodput),
                         save_result=a.save_result)
        loadgen_http.Endpoint.from_url(cfg.url)
    except ValueError as exc:
        ap.error(str(exc))
    return cfg, a.stop_on_stdin_eof
