"""What an SLO is and how users write one: ``KEY=VALUE`` (``ttft_p99=800ms``, ``error_rate=0.1%``).

Kept apart from the judging (slo.py, pandas) so that the command line can read and refuse
``--slo`` without loading the soak's analysis.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# SLO key -> the throughput.csv metric it reads (error_rate is worked out from two).
LATENCY_METRICS = {"ttft_p50": "ttft_p50_ms", "ttft_p90": "ttft_p90_ms", "ttft_p99": "ttft_p99_ms",
                   "tpot_p50": "tpot_p50_ms", "tpot_p99": "tpot_p99_ms"}
KEYS = (*LATENCY_METRICS, "error_rate")
_VALUE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|%)?\s*$")


class SloError(ValueError):
    """A ``--slo`` that cannot be read; the message says which and why."""


# The error budget a served soak is judged on when no ``--slo error_rate=`` is given: 0.1 %, the
# complement of the customary 99.9 % request-success SLO (an error budget is 100 % minus the SLO;
# docs/sources.md, "Serving error budget"). A soak of a healthy node serves every request: failed
# or timed-out requests are a finding without anyone having to ask for them.
DEFAULT_ERROR_RATE = 0.001


@dataclass(frozen=True)
class Slo:
    key: str
    limit: float  # milliseconds for latencies, a fraction for error_rate
    text: str  # as the user wrote it
    default: bool = False  # the default error budget, not one the user gave

    def show(self, value: float) -> str:
        return f"{value:.2%}" if self.key == "error_rate" else f"{value:.0f} ms"


def parse_slo(text: str) -> Slo:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or key not in KEYS:
        raise SloError(f"--slo {text!r}: expected KEY=VALUE with KEY one of {', '.join(KEYS)}")
    m = _VALUE.match(value)
    if not m:
        raise SloError(f"--slo {text!r}: {value!r} is not a number with an optional unit (ms, s, %)")
    number, unit = float(m.group(1)), m.group(2)
    if key == "error_rate":
        if unit in ("ms", "s"):
            raise SloError(f"--slo {text!r}: an error rate is a fraction or a percentage, not a time")
        limit = number / 100 if unit == "%" else number
        if limit > 1:
            raise SloError(f"--slo {text!r}: an error rate above 100 %")
    else:
        if unit == "%":
            raise SloError(f"--slo {text!r}: a latency is a time (ms or s), not a percentage")
        limit = number * 1000 if unit == "s" else number
    if not math.isfinite(limit):
        raise SloError(f"--slo {text!r}: not a finite number")
    return Slo(key, limit, f"{key}={value.strip()}")


def parse_slos(texts) -> tuple[Slo, ...]:
    slos = tuple(parse_slo(t) for t in texts or ())
    keys = [s.key for s in slos]
    if len(set(keys)) != len(keys):
        raise SloError(f"--slo: {sorted({k for k in keys if keys.count(k) > 1})[0]} given twice")
    return slos




DEFAULT_ERROR_SLO = Slo("error_rate", DEFAULT_ERROR_RATE, f"error_rate={DEFAULT_ERROR_RATE:.1%} (default)",
                        default=True)


def with_error_budget(slos: tuple[Slo, ...]) -> tuple[Slo, ...]:
    """The SLOs to judge: the user's, and the default error budget unless they set ``error_rate``."""
    return slos if any(s.key == "error_rate" for s in slos) else (*slos, DEFAULT_ERROR_SLO)
