"""A concurrency sweep judged: per level figures, the knee, the level to serve at, the fleet.

``preflight soak --sweep 32,64,128,256,512 --step-minutes 10`` runs the levels one after
another on every node (the load generator stamps each window with a ``concurrency`` row). Per
level, over its windows (the first window of a level of more than two left out: it holds the
previous level's requests draining and the queue filling), the medians of output tokens/s,
TTFT and TPOT P50/P99, goodput and requests/s, and the errors summed.

**The knee** is found by the operators' procedure (double the concurrency until throughput stops
growing while P99 TTFT climbs, then back off one step): walking up the levels, the first step
from level A to level B that buys less than ``KNEE_TOKENS_GROWTH`` (10 %) more output tokens/s
while P99 TTFT grows by more than ``KNEE_TTFT_GROWTH`` (50 %) puts the knee at B; the
recommended level is A, the last level before it. Why these defaults: below saturation a
doubling of the concurrency nearly doubles tokens/s (a decode step over a larger batch costs
little more, being memory-bound), so +10 % for twice the requests in flight means the extra
requests mostly wait; at saturation Little's law (requests in flight = throughput x time in
the system) makes the time each request waits grow in proportion to the concurrency, i.e. +100
% per doubling, and +50 % is halfway between no queueing and full queueing. Both are stated in
the finding and can be changed (``Thresholds``). Without a knee the highest level is
recommended and the finding says the sweep did not reach saturation. With ``--slo``, the
recommendation is also held to the highest level at which every SLO holds (a level's windows
broken no more than ``--slo-budget``), and a level with failed requests is never recommended.

**The fleet**: with at least three nodes swept (a median of two cannot say which node is off),
a node whose tokens/s at some level is more than ``sweep_outlier_fraction`` (10 %) below the
fleet's median at that level, or whose recommended level differs from the level most nodes
got, WARNs ``sweep-curve-outlier``: its serving curve is not its peers'.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from preflight.check import Outcome
from preflight.contracts import THROUGHPUT_CSV
from preflight.model import Evidence, Status
from preflight.soak import fmt
from preflight.soak.figures import DEFAULT_THRESHOLDS
from preflight.soak.slo import windows
from preflight.soak.slo_spec import LATENCY_METRICS, Slo

# Declared once, in figures.Thresholds (the docstring above says why these values).
KNEE_TOKENS_GROWTH = DEFAULT_THRESHOLDS.knee_tokens_growth
KNEE_TTFT_GROWTH = DEFAULT_THRESHOLDS.knee_ttft_growth
SWEEP_OUTLIER_FRACTION = DEFAULT_THRESHOLDS.sweep_outlier_fraction
FLEET_MIN_HOSTS = 3
LEVEL_METRIC = "concurrency"


@dataclass(frozen=True)
class Level:
    """One sweep level's figures (medians over its settled windows; ``errors`` summed)."""

    concurrency: int
    windows: int
    tokens_per_s: float
    requests_per_s: float | None
    goodput_per_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    errors: int
    slo_broken: tuple[str, ...] = ()  # the SLOs broken in more than the budget of its windows

    def to_dict(self) -> dict:
        return {"concurrency": self.concurrency, "windows": self.windows, "tokens_per_s": self.tokens_per_s,
                "requests_per_s": self.requests_per_s, "goodput_requests_per_s": self.goodput_per_s,
                "ttft_p50_ms": self.ttft_p50_ms, "ttft_p99_ms": self.ttft_p99_ms, "tpot_p50_ms": self.tpot_p50_ms,
                "tpot_p99_ms": self.tpot_p99_ms, "errors": self.errors, "slo_broken": list(self.slo_broken)}


@dataclass(frozen=True)
class Knee:
    knee: int | None  # the first level past the bend; None: throughput still grew at the top
    recommended: int | None  # None: no level qualifies (every one broke an SLO or had errors)
    reason: str


def is_sweep(rows: pd.DataFrame) -> bool:
    return bool((rows["metric"] == LEVEL_METRIC).any()) if len(rows) else False


def levels(rows: pd.DataFrame, slos: Sequence[Slo] = (), budget: float = 0.05) -> list[Level]:
    """Per level, in the order the sweep ran them; ``rows``: one host's throughput.csv rows."""
    wide = windows(rows)  # one row a window, with its error rate (slo.py)
    if LEVEL_METRIC not in wide or "output_tokens_per_s" not in wide:
        return []
    wide = wide[wide[LEVEL_METRIC].notna()]
    out = []
    # Consecutive windows of one level make a run; a level swept twice would give two.
    run_id = (wide[LEVEL_METRIC] != wide[LEVEL_METRIC].shift()).cumsum()
    for _, w in wide.groupby(run_id, sort=False):
        settled = w.iloc[1:] if len(w) > 2 else w

        def med(metric: str, frame: pd.DataFrame = settled) -> float | None:
            values = frame[metric].dropna() if metric in frame else pd.Series(dtype=float)
            return round(float(values.median()), 3) if not values.empty else None

        broken = []
        for slo in slos:
            column = LATENCY_METRICS.get(slo.key, slo.key)  # error_rate: its own column
            values = settled[column].dropna() if column in settled else pd.Series(dtype=float)
            if not values.empty and (values > slo.limit).mean() > budget:
                broken.append(slo.text)
        out.append(Level(int(w[LEVEL_METRIC].iloc[0]), len(settled), med("output_tokens_per_s") or 0.0,
                         med("requests_per_s"), med("goodput_requests_per_s"), med("ttft_p50_ms"),
                         med("ttft_p99_ms"), med("tpot_p50_ms"), med("tpot_p99_ms"),
                         int(w["errors"].fillna(0).sum()) if "errors" in w else 0, tuple(broken)))
    return out


def find_knee(levels: Sequence[Level], tokens_growth: float = KNEE_TOKENS_GROWTH,
              ttft_growth: float = KNEE_TTFT_GROWTH) -> Knee:
    """The knee and the recommended level (see the module docstring); pure."""
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    if not ordered:
        return Knee(None, None, "no sweep levels")
    knee, top, reason = None, ordered[-1], ""
    for a, b in zip(ordered, ordered[1:], strict=False):
        if a.tokens_per_s <= 0 or not a.ttft_p99_ms or b.ttft_p99_ms is None:
            continue
        more_tokens = b.tokens_per_s / a.tokens_per_s - 1
        more_ttft = b.ttft_p99_ms / a.ttft_p99_ms - 1
        if more_tokens < tokens_growth and more_ttft > ttft_growth:
            knee, top = b.concurrency, a
            reason = (f"knee at {b.concurrency}: {a.concurrency} -> {b.concurrency} in flight bought "
                      f"{more_tokens:+.0%} output tokens/s for {more_ttft:+.0%} P99 TTFT (knee: less than "
                      f"{tokens_growth:+.0%} tokens/s while P99 TTFT grows more than {ttft_growth:+.0%})")
            break
    if knee is None:
        reason = (f"no knee up to {ordered[-1].concurrency}: every step bought {tokens_growth:.0%} more "
                  f"tokens/s or cost at most {ttft_growth:+.0%} P99 TTFT; sweep higher to find the serving point")
    fit = [lv for lv in ordered if lv.concurrency <= top.concurrency and not lv.errors and not lv.slo_broken]
    # Held to the last level before the first that broke an SLO or failed requests.
    bad = [lv.concurrency for lv in ordered if lv.errors or lv.slo_broken]
    if bad:
        fit = [lv for lv in fit if lv.concurrency < min(bad)]
    recommended = fit[-1].concurrency if fit else None
    if recommended is not None and recommended != top.concurrency:
        first_bad = next(lv for lv in ordered if lv.concurrency == min(bad))
        why = f"SLO {', '.join(first_bad.slo_broken)} broken" if first_bad.slo_broken else \
            f"{first_bad.errors} failed request(s)"
        reason += f"; held to {recommended}: at {first_bad.concurrency} {why}"
    elif recommended is None and bad:
        reason += "; no level to recommend: the lowest already broke an SLO or failed requests"
    return Knee(knee, recommended, reason)


def table(levels: Sequence[Level]) -> str:
    """One line per level, as the finding and the terminal show it."""
    def ms(v: float | None) -> str:
        return f"{v:.0f}" if v is not None else "-"

    parts = []
    for lv in levels:
        good = f", goodput {lv.goodput_per_s:.2f} req/s" if lv.goodput_per_s is not None else ""
        parts.append(f"c={lv.concurrency}: {fmt.num(lv.tokens_per_s)} tok/s, TTFT p50/p99 {ms(lv.ttft_p50_ms)}/"
                     f"{ms(lv.ttft_p99_ms)} ms, TPOT p50/p99 {ms(lv.tpot_p50_ms)}/{ms(lv.tpot_p99_ms)} ms, "
                     f"{lv.errors} errors{good}")
    return "; ".join(parts)


def sweep(host: str, levels_: Sequence[Level], knee: Knee) -> Outcome:
    """The host's own verdict: PASS with the levels, the knee and the recommendation; WARN when no
    level can be recommended."""
    if not levels_:
        return Outcome(Status.SKIP, "not a sweep (no concurrency rows)", host=host)
    status = Status.PASS if knee.recommended is not None else Status.WARN
    rec = f"recommended concurrency {knee.recommended}" if knee.recommended is not None else "no level to recommend"
    text = f"{rec}; {knee.reason}; {table(levels_)}"
    data = {"levels": [lv.to_dict() for lv in levels_], "knee": knee.knee, "recommended": knee.recommended}
    symptoms = () if status is Status.PASS else ("sweep-no-serving-point",)
    return Outcome(status, text, symptoms, (Evidence(THROUGHPUT_CSV, table(levels_)),), data, host)


def fleet(by_host: Mapping[str, tuple[Sequence[Level], Knee]],
          outlier_fraction: float = SWEEP_OUTLIER_FRACTION) -> dict[str, str]:
    """Host -> why its curve differs from the fleet's, for the hosts whose curve does."""
    swept = {h: v for h, v in by_host.items() if v[0]}
    if len(swept) < FLEET_MIN_HOSTS:
        return {}
    per_level: dict[int, list[float]] = {}
    for lvs, _ in swept.values():
        for lv in lvs:
            per_level.setdefault(lv.concurrency, []).append(lv.tokens_per_s)
    medians = {c: float(pd.Series(v).median()) for c, v in per_level.items() if len(v) >= FLEET_MIN_HOSTS}
    votes = Counter(k.recommended for _, k in swept.values())
    usual, count = votes.most_common(1)[0]
    majority = usual if count > len(swept) / 2 else None
    out = {}
    for host, (lvs, knee) in swept.items():
        why = []
        for lv in lvs:
            ref = medians.get(lv.concurrency)
            if ref and lv.tokens_per_s < (1 - outlier_fraction) * ref:
                why.append(f"at {lv.concurrency} in flight {fmt.num(lv.tokens_per_s)} tok/s, "
                           f"{1 - lv.tokens_per_s / ref:.0%} below the fleet median {fmt.num(ref)}")
        if majority is not None and knee.recommended != majority:
            why.append(f"recommended concurrency {knee.recommended}, the fleet's is {majority}")
        if why:
            out[host] = "; ".join(why)
    return out


def verdicts(by_host: Mapping[str, tuple[Sequence[Level], Knee]],
             outlier_fraction: float = SWEEP_OUTLIER_FRACTION) -> dict[str, Outcome]:
    """``soak-sweep`` for every swept host: its own verdict, WARN ``sweep-curve-outlier`` where
    its curve differs from the fleet's."""
    odd = fleet(by_host, outlier_fraction)
    out = {}
    for host, (lvs, knee) in by_host.items():
        if not lvs:
            continue
        o = sweep(host, lvs, knee)
        if host in odd:
            o = Outcome(Status.WARN, f"curve unlike the fleet's: {odd[host]}; {o.summary}",
                        (*o.symptoms, "sweep-curve-outlier"), o.evidence, {**(o.data or {}), "fleet": odd[host]}, host)
        out[host] = o
    return out
