"""`--slo KEY=VALUE` as users write it (preflight/soak/slo_spec.py): units, and what is refused."""

from __future__ import annotations

import pytest

from preflight.soak.slo_spec import SloError, parse_slo, parse_slos


@pytest.mark.parametrize("text, key, limit", [
    ("ttft_p99=800ms", "ttft_p99", 800.0), ("ttft_p99=0.8s", "ttft_p99", 800.0), ("tpot_p50=50", "tpot_p50", 50.0),
    ("error_rate=0.1%", "error_rate", 0.001), ("error_rate=0.001", "error_rate", 0.001),
    (" ttft_p90 = 1.5 s ", "ttft_p90", 1500.0), ("tpot_p99=2e1ms", "tpot_p99", 20.0),
])
def test_units(text, key, limit):
    slo = parse_slo(text)
    assert slo.key == key and slo.limit == pytest.approx(limit)


@pytest.mark.parametrize("text, says", [
    ("ttft_p95=800ms", "KEY one of ttft_p50, ttft_p90, ttft_p99, tpot_p50, tpot_p99, error_rate"),
    ("ttft_p99", "expected KEY=VALUE"), ("ttft_p99=fast", "'fast' is not a number"),
    ("ttft_p99=nan", "is not a number"), ("ttft_p99=-5ms", "is not a number"), ("ttft_p99=10%", "not a percentage"),
    ("error_rate=5ms", "not a time"), ("error_rate=150%", "above 100 %"), ("ttft_p99=1e999", "not a finite number"),
])
def test_what_is_refused_names_the_option_and_why(text, says):
    with pytest.raises(SloError) as exc:
        parse_slo(text)
    assert str(exc.value).startswith(f"--slo {text!r}: ") and says in str(exc.value)


def test_a_key_twice_is_refused():
    with pytest.raises(SloError, match="ttft_p99 given twice"):
        parse_slos(["ttft_p99=1s", "ttft_p99=2s"])
    assert parse_slos(None) == ()
