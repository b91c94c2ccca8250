"""What the soak agent is asked to do: its options (``parse_args``) and the configuration they
make (``AgentConfig``, with the serving engines' ``ServeParams``; ``config_of``).

Shipped beside agent.py and, like it, stdlib only and free of preflight imports (it runs under
any python3 >= 3.8 on the nodes); agent.py re-exports these names. The controller's soak
command builds the same options (preflight/app/soak_cli.py), and its tests read them back with
``parse_args``.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field
from pathlib import Path

try:
    from .burn import BurnParams
    from .ib_snapshots import DEFAULT_INTERVAL_S as IB_INTERVAL_S
    from .ib_snapshots import SYSFS
except ImportError:  # a shipped copy, run from a directory holding its siblings
    from burn import BurnParams
    from ib_snapshots import DEFAULT_INTERVAL_S as IB_INTERVAL_S
    from ib_snapshots import SYSFS

DESCRIPTION = "preflight soak agent: load the GPUs of this node, sample them through NVML, write it all down."
ENGINES = ("burn", "none", "vllm", "endpoint")
SERVING_ENGINES = ("vllm", "endpoint")  # from vllm_engine.py beside this file
MAX_RATE_HZ = 10.0


# --- Configuration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeParams:
    """The ``vllm`` and ``endpoint`` engines' options (vllm_engine.VllmParams and loadgen.LoadConfig
    are built from them only when such an engine runs, so burn nodes need neither file)."""

    model: str | None = None
    python: str = "python3"
    extra_args: tuple[str, ...] = ()
    skip_tokenizer_init: bool = True
    ready_timeout_s: float = 1200.0
    endpoint: str | None = None
    concurrency: int = 256
    max_tokens: int = 256
    # As vllm bench serve (loadgen_bench.py): the load generator's LoadConfig fields of these names.
    prompt_tokens: int = 256
    sweep: tuple[int, ...] = ()
    warmup_requests: int = 0
    request_rate: float | None = None
    burstiness: float = 1.0
    range_ratio: float = 0.0
    goodput: tuple[tuple[str, float], ...] = ()

    def load_fields(self) -> dict:
        """The load generator's options (``LoadConfig`` keyword arguments) these hold."""
        return {"concurrency": self.concurrency, "max_tokens": self.max_tokens, "prompt_tokens": self.prompt_tokens,
                "sweep": self.sweep, "warmup_requests": self.warmup_requests, "request_rate": self.request_rate,
                "burstiness": self.burstiness, "range_ratio": self.range_ratio, "goodput": self.goodput}


@dataclass(frozen=True)
class AgentConfig:
    out: Path
    host: str
    engine: str
    seconds: float
    interval_s: float
    gpus: tuple[int, ...] | None = None
    burn: BurnParams = field(default_factory=BurnParams)
    serve: ServeParams = field(default_factory=ServeParams)
    ib_interval_s: float = IB_INTERVAL_S  # 0: the RDMA counters are not read (ib_snapshots.py)
    ib_root: Path = SYSFS

    @property
    def startup_allowance_s(self) -> float:
        """Time past ``seconds`` the soak may take: a vLLM server's start-up (see the docstring)."""
        return self.serve.ready_timeout_s if self.engine == "vllm" else 0.0


# --- Command line ------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds: {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers: {text!r}") from None
    if min(levels) < 1:
        raise argparse.ArgumentTypeError(f"every level must be at least 1: {text!r}")
    return levels


def _goodput(pairs: list[str]) -> tuple[tuple[str, float], ...]:
    """``KEY:MS`` pairs as loadgen_bench.parse_goodput reads them (that file is shipped only with
    the serving engines, so the agent checks the shape itself)."""
    out = []
    for pair in pairs:
        key, _, value = pair.partition(":")
        try:
            limit = float(value)
        except ValueError:
            limit = -1.0
        if key not in ("ttft", "tpot", "e2el") or not 0 <= limit < float("inf") or key in dict(out):
            raise ValueError(f"--goodput {pair!r}: expected KEY:MS, KEY one of ttft, tpot, e2el, each once")
        out.append((key, limit))
    return tuple(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="agent.py", description=DESCRIPTION)
    ap.add_argument("--out", type=Path, help="soak directory to create (default: ./soak-TIMESTAMP)")
    ap.add_argument("--seconds", type=_seconds, default=3600.0, help="how long to run (default 3600)")
    ap.add_argument("--engine", choices=ENGINES, default="burn")
    ap.add_argument("--interval", type=_seconds, default=1.0, help="seconds between samples (default 1; min 0.1)")
    ap.add_argument("--host", default=None, help="name for the host column (default: this host's name)")
    ap.add_argument("--gpus", default=None, help="comma-separated NVML indices to load (default: all; all are sampled)")
    ap.add_argument("--window", type=_seconds, default=5.0, help="burn: seconds per throughput window (default 5)")
    ap.add_argument("--copy-fraction", type=float, default=0.05,
                    help="burn: share of the time spent copying, after every ~50 ms of GEMMs (default 0.05)")
    ap.add_argument("--no-sdc", dest="sdc", action="store_false",
                    help="burn: do not checksum the GEMM's results (only to measure what the check costs)")
    ap.add_argument("--gemm-size", type=int, default=None, help="burn: GEMM size n (default: by GPU memory)")
    ap.add_argument("--bench", type=_seconds, default=0.0, metavar="S",
                    help="burn: afterwards, run a plain torch.matmul loop on the same sizes for S seconds per GPU")
    serve = ap.add_argument_group("vllm and endpoint engines")
    serve.add_argument("--model", help="vllm: a built-in model config (tiny-llama-ci, llama-3-70b-dense, "
                       "qwen3-235b-a22b-moe), an HF config directory or .json, or a model path")
    serve.add_argument("--vllm-python", default="python3", help="vllm: the Python that has vLLM (default python3)")
    serve.add_argument("--vllm-arg", action="append", default=[], metavar="ARGS",
                       help="vllm: more server flags, split like a shell line; repeatable; write "
                            "--vllm-arg=--enforce-eager or --vllm-arg='--kv-cache-dtype fp8'")
    serve.add_argument("--skip-tokenizer-init", dest="skip_tokenizer_init", action="store_true", default=True,
                       help="vllm: start the server without a tokenizer (the default: the load sends token ids)")
    serve.add_argument("--no-skip-tokenizer-init", dest="skip_tokenizer_init", action="store_false",
                       help="vllm: let the server load the model's tokenizer")
    serve.add_argument("--ready-timeout", type=_seconds, default=ServeParams.ready_timeout_s, metavar="S",
                       help="vllm: longest server start-up, on top of --seconds (default %(default)g)")
    serve.add_argument("--endpoint", metavar="URL", help="endpoint: base URL of the OpenAI-compatible server to load")
    serve.add_argument("--concurrency", type=_count, default=ServeParams.concurrency,
                       help="requests kept in flight (default %(default)d)")
    serve.add_argument("--max-tokens", type=_count, default=ServeParams.max_tokens,
                       help="output tokens per request (default %(default)d)")
    ap.add_argument("--ib-interval", type=_non_negative, default=IB_INTERVAL_S, metavar="S",
                    help="seconds between readings of the RDMA port counters, besides one before and one after "
                         "the load (default %(default)g; 0: none)")
    ap.add_argument("--ib-sysfs", type=Path, default=SYSFS, help=argparse.SUPPRESS)  # tests: a recorded tree
    serve.add_argument("--prompt-tokens", type=_count, default=ServeParams.prompt_tokens,
                       help="prompt tokens per request (default %(default)d)")
    serve.add_argument("--sweep", type=_levels, default=(), metavar="C1,C2,...",
                       help="concurrency levels one after another, --seconds split evenly between them")
    serve.add_argument("--warmup-requests", type=int, default=0, help="requests before the load, in no figure")
    serve.add_argument("--request-rate", type=_seconds, default=None, help="requests/s (gamma arrivals), "
                       "at most --concurrency in flight")
    serve.add_argument("--burstiness", type=_seconds, default=1.0, help="gamma shape of the arrival gaps (default 1)")
    serve.add_argument("--range-ratio", type=float, default=0.0,
                       help="prompt and output lengths uniform in n * [1 - R, 1 + R] (default 0)")
    serve.add_argument("--goodput", action="append", default=[], metavar="KEY:MS",
                       help="a request within every limit (ttft, tpot, e2el in ms) is good; repeatable")
    ap.add_argument("--detach", action="store_true",
                    help="run in the background, detached from the terminal/SSH session")
    ap.add_argument("--fake-nvml", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine == "vllm" and not args.model:
        ap.error("--engine vllm needs --model")
    if (args.engine == "endpoint") != bool(args.endpoint):
        ap.error("--endpoint URL goes with --engine endpoint, and --engine endpoint needs it")
    try:
        args.vllm_arg = tuple(a for text in args.vllm_arg for a in shlex.split(text))
    except ValueError as exc:
        ap.error(f"--vllm-arg: {exc}")
    if args.interval < 1 / MAX_RATE_HZ:
        ap.error(f"--interval: at most {MAX_RATE_HZ:g} samples a second (>= {1 / MAX_RATE_HZ:g} s)")
    if not 0 <= args.copy_fraction < 1:
        ap.error("--copy-fraction: must be in [0, 1)")
    if not 0 <= args.range_ratio < 1:
        ap.error("--range-ratio: must be in [0, 1)")
    if args.warmup_requests < 0:
        ap.error("--warmup-requests: must not be negative")
    if args.sweep and args.request_rate is not None:
        ap.error("--sweep steps the concurrency; it does not go with --request-rate")
    try:
        args.goodput = _goodput(args.goodput)
    except ValueError as exc:
        ap.error(str(exc))
    if args.gpus is not None:
        try:
            args.gpus = tuple(int(g) for g in args.gpus.split(",") if g.strip())
        except ValueError:
            ap.error(f"--gpus: not a list of GPU indices: {args.gpus!r}")
    return args


def config_of(args: argparse.Namespace, out: Path, host: str) -> AgentConfig:
    """The configuration ``parse_args``'s options make, for a soak written to ``out`` as ``host``."""
    return AgentConfig(out=out, host=host, engine=args.engine, seconds=args.seconds,
                       interval_s=args.interval, gpus=args.gpus,
                       burn=BurnParams(args.window, args.copy_fraction, args.gemm_size, args.bench, args.sdc),
                       serve=ServeParams(args.model, args.vllm_python, args.vllm_arg, args.skip_tokenizer_init,
                                         args.ready_timeout, args.endpoint, args.concurrency, args.max_tokens,
                                         args.prompt_tokens, args.sweep, args.warmup_requests, args.request_rate,
                                         args.burstiness, args.range_ratio, args.goodput),
                       ib_interval_s=args.ib_interval, ib_root=args.ib_sysfs.absolute())
