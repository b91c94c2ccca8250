"""``preflight soak``'s load options for the vllm and endpoint engines, as ``vllm bench serve``
has them: the concurrency sweep, warm-up requests, a request rate with burstiness, the
prompt-length distribution and goodput (``preflight/node/loadgen_bench.py`` defines each).

``--sweep 32,64,128,256,512 --step-minutes 10`` runs the levels one after another on every
node, on one server, and sets the soak's length (levels x step), so it goes without
``--hours``/``--minutes``. ``--goodput ttft:800 tpot:50`` (vLLM's ``KEY:MS``) counts the requests
within every limit; without it, the ``--slo`` latency limits are the per-request limits
(``ttft_p99=800ms`` makes a request good only if its own TTFT is at most 800 ms, the tightest
of several TTFT SLOs counting), which is what goodput means in vLLM: requests meeting every SLO.
"""

from __future__ import annotations

import argparse

from preflight.app.errors import UsageError
from preflight.knowledge.datafile import LONGEST_S, positive

# argparse dest -> the agent's flag (each applies to the vllm and endpoint engines).
OPTIONS = {"sweep": "--sweep", "step_minutes": None, "warmup_requests": "--warmup-requests",
           "request_rate": "--request-rate", "burstiness": "--burstiness", "range_ratio": "--range-ratio",
           "prompt_tokens": "--prompt-tokens", "goodput": "--goodput"}
DEFAULT_STEP_MINUTES = 10.0
GOODPUT_KEYS = ("ttft", "tpot", "e2el")


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if min(levels) < 1 or len(set(levels)) != len(levels):
        raise argparse.ArgumentTypeError(f"levels must be at least 1 and each given once, got {text!r}")
    return levels


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value


def _goodput(text: str) -> tuple[str, float]:
    key, sep, value = text.partition(":")
    try:
        limit = float(value)
    except ValueError:
        limit = -1.0
    if not sep or key not in GOODPUT_KEYS or not 0 <= limit < float("inf"):
        raise argparse.ArgumentTypeError(f"expected KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}, got {text!r}")
    return key, limit


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def add_options(group) -> None:
    group.add_argument("--sweep", type=_levels, metavar="C1,C2,...",
                       help="vllm/endpoint: concurrency levels one after another (e.g. 32,64,128,256,512); marks "
                            "the knee and recommends a level; the soak lasts levels x --step-minutes")
    group.add_argument("--step-minutes", type=positive(float, LONGEST_S / 60), metavar="M",
                       help=f"vllm/endpoint: minutes per --sweep level (default {DEFAULT_STEP_MINUTES:g})")
    group.add_argument("--warmup-requests", type=_count, metavar="N",
                       help="vllm/endpoint: requests sent before the load and counted nowhere (default 0)")
    group.add_argument("--request-rate", type=positive(float), metavar="R",
                       help="vllm/endpoint: requests per second with gamma arrivals, at most --concurrency in "
                            "flight (default: --concurrency always in flight)")
    group.add_argument("--burstiness", type=positive(float), metavar="B",
                       help="vllm/endpoint: gamma shape of the arrival gaps with --request-rate: 1 Poisson, "
                            "< 1 burstier (default 1)")
    group.add_argument("--range-ratio", type=_ratio, metavar="R",
                       help="vllm/endpoint: prompt and output lengths uniform in n x [1-R, 1+R] "
                            "(vllm bench --random-range-ratio; default 0, fixed)")
    group.add_argument("--prompt-tokens", type=positive(int), help="vllm/endpoint: prompt tokens (default 256)")
    group.add_argument("--goodput", type=_goodput, action="append", metavar="KEY:MS",
                       help="vllm/endpoint: a request within every limit is good (ttft, tpot, e2el in ms; "
                            "repeatable; default: the --slo latency limits)")


def sweep_seconds(args) -> float | None:
    """The soak's length a sweep sets, or None without one; bad combinations are usage errors."""
    sweep, step = getattr(args, "sweep", None), getattr(args, "step_minutes", None)
    if not sweep:
        if step is not None:
            raise UsageError("--step-minutes goes with --sweep")
        return None
    if args.hours or args.minutes:
        raise UsageError("--sweep sets the soak's length (levels x --step-minutes): leave out --hours/--minutes")
    if getattr(args, "request_rate", None) is not None:
        raise UsageError("--sweep steps the concurrency: it does not go with --request-rate")
    return len(sweep) * (step or DEFAULT_STEP_MINUTES) * 60


def goodput_of(args, slos) -> tuple[tuple[str, float], ...]:
    """``--goodput``, or the per-request limits the latency SLOs stand for (see the docstring)."""
    given = getattr(args, "goodput", None)
    if given:
        keys = [k for k, _ in given]
        if len(set(keys)) != len(keys):
            raise UsageError(f"--goodput: {sorted(k for k in keys if keys.count(k) > 1)[0]} given twice")
        return tuple(given)
    limits: dict[str, float] = {}
    for slo in slos:
        key = slo.key.split("_")[0]
        if key in GOODPUT_KEYS:
            limits[key] = min(limits.get(key, slo.limit), slo.limit)
    return tuple(limits.items())


def agent_args(args, slos) -> tuple[str, ...]:
    """The agent's flags for these options (one argv item each, ``--flag=value``)."""
    out = []
    for dest, flag in OPTIONS.items():
        value = getattr(args, dest, None)
        if flag is None or value is None or dest == "goodput":
            continue
        out.append(f"{flag}={','.join(map(str, value)) if dest == 'sweep' else value}")
    out += [f"--goodput={key}:{limit:g}" for key, limit in goodput_of(args, slos)]
    return tuple(out)
