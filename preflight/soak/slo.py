"""Serving latency and error SLOs, judged on a vLLM or endpoint soak's windows (``soak-latency``).

An SLO is ``KEY=VALUE`` as users write them (``--slo ttft_p99=800ms --slo error_rate=0.1%``):
the load generator's per-window percentiles (TTFT and TPOT, ``preflight/node/loadgen.py``) and
the window's error rate, errors over requests that ended (completed + errored). Every window is
compared; a host FAILs ``slo-violated`` when an SLO is broken in more than ``slo_budget`` of its
judged windows (default 5 %), and WARNs when it is broken in fewer; the worst windows are the
evidence. A window that saw no completion has no percentile: it is not judged, and is counted.

Failed and timed-out requests are judged without any ``--slo``: when no ``error_rate`` is given,
the default error budget (``slo_spec.DEFAULT_ERROR_RATE``, 0.1 %) is judged in its place, the same
way, and the verdict names it as the default; ``--slo error_rate=`` replaces it. The run's
failed requests and their share are stated whenever the windows count them.

With or without SLOs the verdict states P50/P99 TTFT and TPOT over the run, and a latency that
doubles from the first quarter of the windows to the last while throughput holds (within 10 %)
WARNs ``latency-drift``: requests queue, or the node slows, with the same work done.
"""

from __future__ import annotations

import pandas as pd

from preflight.check import Outcome
from preflight.contracts import THROUGHPUT_CSV
from preflight.model import Evidence, Status, worst
from preflight.soak.figures import Thresholds
from preflight.soak.slo_spec import LATENCY_METRICS, Slo, with_error_budget
from preflight.soak.throughput import clock_change

DRIFT_FACTOR = 2.0
HOLD_FRACTION = 0.9

def windows(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per window (time): its metrics as columns, its length (``span_s``: rows are
    stamped at a window's end; the first is taken as long as the second) and its error rate."""
    node = rows[rows["gpu"].isna()] if "gpu" in rows else rows
    wide = node.pivot_table(index="time", columns="metric", values="value", aggfunc="last").sort_index()
    spans = wide.index.to_series().diff()
    if len(spans):
        spans.iloc[0] = spans.iloc[1] if len(spans) > 1 else float("nan")
    wide["span_s"] = spans
    if "errors" in wide and "requests_per_s" in wide:
        done = wide["requests_per_s"] * spans
        ended = done + wide["errors"]
        wide["error_rate"] = (wide["errors"] / ended).where(ended > 0)
    return wide


def latency(host: str, rows: pd.DataFrame, slos: tuple[Slo, ...], budget: float,
            tele: pd.DataFrame | None = None, th: Thresholds | None = None) -> Outcome:
    """``rows``: the host's throughput.csv rows; ``tele``: its telemetry, to tell a drift the
    GPUs caused from one the server did."""
    wide = windows(rows)
    if "output_tokens_per_s" not in wide or "ttft_p99_ms" not in wide:
        return Outcome(Status.SKIP, "no serving windows (TTFT, TPOT): a vllm or endpoint soak has them", host=host)
    t0 = wide.index.min()
    summary = _percentiles(wide)
    broken, notes, evidence, data = [], [], [], {"slos": {}}
    verdict = Status.PASS
    asked = slos
    for slo in with_error_budget(slos):
        column = LATENCY_METRICS.get(slo.key, slo.key)
        values = wide[column].dropna() if column in wide else pd.Series(dtype=float)
        if values.empty and slo.default:
            continue  # no error counts in these windows (a hand-made soak): nothing to hold them to
        if values.empty:
            notes.append(f"{slo.text}: no window has {column}")
            verdict = worst((verdict, Status.ERROR))
            continue
        over = values[values > slo.limit]
        share = len(over) / len(values)
        data["slos"][slo.text] = {"windows": len(values), "broken": len(over), "share": round(share, 4)}
        if slo.default:
            data["error_budget"] = {"error_rate": slo.limit, "default": True}
        if over.empty:
            continue
        status = Status.FAIL if share > budget else Status.WARN
        verdict = worst((verdict, status))
        top = over.sort_values(ascending=False).head(3)
        broken.append(f"{slo.text} broken in {len(over)} of {len(values)} windows ({share:.0%}; "
                      f"allowed {budget:.0%}), worst {slo.show(top.iloc[0])} at +{(top.index[0] - t0) / 60:.1f} min"
                      + (" (no --slo error_rate= given: the default error budget)" if slo.default else ""))
        evidence += [Evidence(THROUGHPUT_CSV, f"{t},{host},{column},{v:g}") for t, v in top.items()]
        unjudged = int(wide[column].isna().sum()) if column in wide else 0
        if unjudged:
            notes.append(f"{slo.text}: {unjudged} window(s) without a value (no request ended in them)")
    drift = _drift(wide, tele, th)
    symptoms = ["slo-violated"] if verdict in (Status.FAIL, Status.WARN) and broken else []
    if drift:
        symptoms.append("latency-drift")
        if verdict is Status.PASS:
            verdict = Status.WARN
    parts = broken + ([drift] if drift else []) + notes
    text = (("; ".join(parts) + "; " if parts else ("every SLO held; " if asked else "")) + _errors_text(wide, slos)
            + _goodput_text(wide) + summary)
    data.update(run_rates_of(wide))
    data.update(window_medians(wide))
    return Outcome(verdict, text, tuple(symptoms), tuple(evidence), data, host)


def window_medians(wide: pd.DataFrame) -> dict[str, float]:
    """The windows' median TTFT/TPOT P50 and P99, as figures the results store trends run after run."""
    out = {}
    for metric in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"):
        values = wide[metric].dropna() if metric in wide else pd.Series(dtype=float)
        if not values.empty:
            out[metric] = round(float(values.median()), 3)
    return out


def run_rates(rows: pd.DataFrame) -> dict[str, float]:
    """Requests/s and goodput (requests within every --goodput limit, per second) over the run:
    each window's rate weighted by its length; a metric no window has is left out."""
    return run_rates_of(windows(rows))


def request_errors(wide: pd.DataFrame) -> tuple[int, float] | None:
    """(failed requests, their share of the requests that ended) over the run; None when the
    windows do not count errors."""
    if "errors" not in wide or "requests_per_s" not in wide:
        return None
    both = wide[["errors", "requests_per_s", "span_s"]].dropna()
    if both.empty:
        return None
    errors = float(both["errors"].sum())
    ended = float((both["requests_per_s"] * both["span_s"]).sum()) + errors
    return round(errors), (errors / ended if ended > 0 else 0.0)


def _errors_text(wide: pd.DataFrame, slos: tuple[Slo, ...]) -> str:
    counted = request_errors(wide)
    if counted is None:
        return ""
    errors, share = counted
    budget = next(s for s in with_error_budget(slos) if s.key == "error_rate")
    which = "the default error budget, --slo error_rate= sets another" if budget.default else "--slo"
    return (f"{errors} request(s) failed or timed out ({share:.2%} of those that ended; error_rate "
            f"{budget.limit:.2%} per window allowed, {which}); ")


def _goodput_text(wide: pd.DataFrame) -> str:
    rates = run_rates_of(wide)
    if "goodput_requests_per_s" not in rates:
        return ""
    good, done = rates["goodput_requests_per_s"], rates.get("requests_per_s")
    share = f" ({good / done:.0%} of {done:.2f} req/s completed)" if done else ""
    return f"goodput {good:.2f} req/s{share}; "


def run_rates_of(wide: pd.DataFrame) -> dict[str, float]:
    out = {}
    for metric in ("requests_per_s", "goodput_requests_per_s"):
        both = wide[[metric, "span_s"]].dropna() if metric in wide else pd.DataFrame()
        if len(both) and both["span_s"].sum() > 0:
            out[metric] = round(float((both[metric] * both["span_s"]).sum() / both["span_s"].sum()), 4)
    return out


def _percentiles(wide: pd.DataFrame) -> str:
    def of(metric: str) -> str:
        values = wide[metric].dropna() if metric in wide else pd.Series(dtype=float)
        return f"{values.median():.0f}" if not values.empty else "-"
    return (f"window medians: TTFT p50 {of('ttft_p50_ms')} / p99 {of('ttft_p99_ms')} ms, "
            f"TPOT p50 {of('tpot_p50_ms')} / p99 {of('tpot_p99_ms')} ms over {len(wide)} windows")


def _drift(wide: pd.DataFrame, tele: pd.DataFrame | None = None, th: Thresholds | None = None) -> str | None:
    """TTFT p99 of the last quarter of the windows at least DRIFT_FACTOR x the first quarter's,
    with output tokens/s within HOLD_FRACTION of it: the same work, slower answers. With the
    host's telemetry, the GPUs' loaded SM clock over the same two quarters says whose it is: a
    clock that fell (by at least ``decay_clock_share`` of 10 %, the throughput's own margin), or
    a new thermal or power-brake reason, is the GPUs'; steady clocks leave it to the server."""
    both = wide[["ttft_p99_ms", "output_tokens_per_s"]].dropna()
    quarter = len(both) // 4
    if quarter < 2:
        return None
    first, last = both.iloc[:quarter], both.iloc[-quarter:]
    before, after = first["ttft_p99_ms"].median(), last["ttft_p99_ms"].median()
    tokens_before, tokens_after = first["output_tokens_per_s"].median(), last["output_tokens_per_s"].median()
    if before > 0 and after >= DRIFT_FACTOR * before and tokens_after >= HOLD_FRACTION * tokens_before:
        head = (f"TTFT p99 rose from {before:.0f} to {after:.0f} ms (x{after / before:.1f}) while output "
                f"tokens/s held ({tokens_before:.0f} -> {tokens_after:.0f})")
        spans = wide["span_s"]
        first_span = (float(first.index[0] - spans.loc[first.index[0]]), float(first.index[-1]))
        last_span = (float(last.index[0] - spans.loc[last.index[0]]), float(last.index[-1]))
        change = (clock_change(tele, first_span, last_span, None, th)
                  if tele is not None and th is not None and not tele.empty else None)
        if change is None:
            return f"{head}: requests queue, or the node slows (no GPU clocks to tell which)"
        if change.slowed(th.decay_clock_share * (1 - HOLD_FRACTION)):
            return f"{head}: the GPUs slowed ({change.text()}, reasons at the end: {change.reasons})"
        return f"{head}: with steady clocks ({change.text()}) the server queues requests, not the GPUs"
    return None
