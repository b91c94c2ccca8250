"""A failing node's recent past, for report.html (``run``/``analyze --history``): its last
verdicts and its key figure's readings, this run's included. Pure: the analysis and each
node's ``HostHistory`` in, a plain dict out, kept in report.json's ``history`` section so that
the page can be rendered again from the report alone."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

from preflight.judge.figures import FIGURES, readings_of
from preflight.model import Analysis, HostHistory

LAST_RUNS = 10
LAST_READINGS = 20
# The figure a node's sparkline follows: the first of these it has.
KEY_FIGURES = ("busbw_gbs", "soak_output_tokens_per_s", "soak_tflops", "soak_max_temperature_c")


def digest(analysis: Analysis, histories: Mapping[str, HostHistory]) -> dict[str, dict]:
    """``{node: {"runs": [[started, status], ...], "figure", "label", "unit", "values": [...]}}``
    for every node that did not pass, oldest first."""
    out = {}
    for node, verdict in analysis.hosts.items():
        h = histories.get(node)
        if h is None or verdict.status == "pass":
            continue
        now = readings_of(analysis.findings_of(node))
        runs = [[_iso(r.started), r.status] for r in h.runs[-LAST_RUNS:]]
        entry: dict = {"runs": runs}
        name = next((f for f in KEY_FIGURES if f in h.figures or f in now), None)
        if name is not None:
            values = list(h.figures.get(name, ())) + ([now[name]] if name in now else [])
            entry.update(figure=name, label=FIGURES[name].label, unit=FIGURES[name].unit,
                         values=values[-LAST_READINGS:])
        out[node] = entry
    return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")
