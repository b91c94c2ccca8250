"""The fleet page (``preflight history --fleet --html FILE``): the store's answers about the
fleet over a window (``read.fleet``: repeat offenders, flapping checks, degrading figures,
failure rates) and the series read for them (``store.series.fleet_series``: the daily failure
rate, each degrading node's readings against the fleet's band, each offender's diagnosed runs).

A pure function of those two plain dicts, so this layer needs nothing of the store. It keeps
report.html's look (its CSS) and its rules: one file, no scripts, nothing fetched (a
Content-Security-Policy forbids it), and every string that came from the store HTML-escaped,
since node names, causes and check ids are whatever the fleet reported. The plots are inline
SVG written here: a line, a shaded band and a few labels need no plotting library.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape

from preflight.report.html import CSS
from preflight.report.sparkline import linear, points, sparkline_svg

DAY_S = 86400
NONE = '<p class="muted">none in the window</p>'
_CSP = "default-src 'none'; style-src 'unsafe-inline'"
FLEET_CSS = """
svg.plot { display:block; max-width:100%; height:auto; border:1px solid var(--line); border-radius:6px; }
svg text { font:11px "DejaVu Sans", sans-serif; fill:var(--muted); }
svg .grid { stroke:var(--line); } svg .axis { stroke:#9aa0a6; }
svg .rate, svg .node { fill:none; stroke:var(--fail); stroke-width:2; } svg .dot { fill:var(--fail); }
svg .band { fill:#0b57d0; fill-opacity:.15; } svg .median { fill:none; stroke:#0b57d0; stroke-dasharray:6 4; }
svg .baseline { stroke:var(--muted); stroke-dasharray:2 3; } svg .tick { stroke:var(--fail); stroke-width:2; }
.spark { color:var(--fail); vertical-align:middle; }
td.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
.key-node { color:var(--fail); font-weight:600; } .key-fleet { color:#0b57d0; font-weight:600; }
"""

Scale = Callable[[float], float]


@dataclass(frozen=True)
class Box:
    """A plot's size in pixels and the margins its axis labels sit in."""

    width: int = 760
    height: int = 220
    left: int = 64
    right: int = 16
    top: int = 12
    bottom: int = 28

    def scales(self, x_range: tuple[float, float], y_range: tuple[float, float]) -> tuple[Scale, Scale]:
        return (linear(*x_range, self.left, self.width - self.right),
                linear(*y_range, self.height - self.bottom, self.top))


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def render_fleet(result: dict, series: dict) -> str:
    """The page: counts, the daily failure rate, then one section per answer, each degrading
    node with a plot of its figure against the fleet's."""
    title = "preflight fleet history"
    body = [f"<header><h1>{title}</h1>", _window_line(result, series), "</header>", _nav(),
            _summary(result), _failure_rate(series), _offenders(result, series), _flapping(result),
            _degrading(result, series), _rates(result), _precision(result)]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{title}</title>\n<style>{CSS}{FLEET_CSS}</style>\n</head>\n"
            "<body>\n" + "\n".join(body) + "\n</body>\n</html>\n")


# ---- text ---------------------------------------------------------------------------------------

def date(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M")


def number(value: float | None) -> str:
    """A figure as a person reads it: one decimal from 100 up, three significant digits below."""
    if value is None:
        return "-"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"


def _window_line(result: dict, series: dict) -> str:
    return (f'<p class="meta">since {_e(result.get("since") or stamp(series["since"]))} until '
            f'{_e(stamp(series["until"]))} UTC · {result.get("runs", 0)} runs, {result.get("host_runs", 0)} '
            f'host-runs, {result.get("nodes", 0)} nodes, {_e(result.get("node_hours", 0))} node-hours</p>')


def _nav() -> str:
    links = [("summary", "Summary"), ("failure-rate", "Failure rate"), ("offenders", "Repeat offenders"),
             ("flapping", "Flapping"), ("degrading", "Degrading"), ("rates", "Failure rates"),
             ("precision", "Precision")]
    return "<nav>" + "".join(f'<a href="#{a}">{t}</a>' for a, t in links) + "</nav>"


def _summary(result: dict) -> str:
    tiles = [(len(result.get("repeat_offenders") or ()), "repeat offenders"),
             (len(result.get("flapping") or ()), "flapping checks"),
             (len(result.get("degrading") or ()), "degrading figures"),
             (sum(r["failures"] for r in result.get("rates") or () if "check" in r), "failing check results")]
    shown = "".join(f'<div class="tile{" fail" if n else ""}"><div class="n">{n}</div>{_e(what)}</div>'
                    for n, what in tiles)
    return f'<section id="summary"><h2>Summary</h2><div class="tiles">{shown}</div></section>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table of cells that are already HTML (escaped by the caller); ``numeric`` columns are
    right-aligned."""
    if not rows:
        return NONE
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


# ---- sections -----------------------------------------------------------------------------------

def _failure_rate(series: dict) -> str:
    days = series.get("days") or ()
    judged = [d for d in days if d["host_runs"]]
    plot = failure_rate_svg(days) if judged else NONE
    note = (f'<p class="muted">failing host-runs (verdict fail or error) over host-runs, per UTC day; '
            f'{sum(d["failing"] for d in judged)} of {sum(d["host_runs"] for d in judged)} in all</p>'
            if judged else "")
    return f'<section id="failure-rate"><h2>Failure rate per day</h2>{plot}{note}</section>'


def _offenders(result: dict, series: dict) -> str:
    found = result.get("repeat_offenders") or ()
    runs = {(o["node"], o["cause"]): o["runs"] for o in series.get("offenders") or ()}
    span = page_span(series)
    rows = [[_e(r["node"]), f"<code>{_e(r['cause'])}</code>", str(r["count"]), _e(r["first"]), _e(r["last"]),
             timeline_svg(runs[(r["node"], r["cause"])], span) if (r["node"], r["cause"]) in runs else "-"]
            for r in found]
    table = _table(["node", "cause", "incidents", "first", "last", "diagnosed runs"], rows, numeric=(2,))
    return (f'<section id="offenders"><h2>Repeat offenders</h2><p class="muted">nodes whose cause came back after '
            f'they passed in between: each incident is a streak of consecutive diagnosed runs</p>{table}</section>')


def _flapping(result: dict) -> str:
    rows = [[_e(r["node"]), f"<code>{_e(r['check'])}</code>", str(r["transitions"]), str(r["runs"]),
             str(r["failures"])] for r in result.get("flapping") or ()]
    table = _table(["node", "check", "transitions", "runs", "failing"], rows, numeric=(2, 3, 4))
    return f'<section id="flapping"><h2>Flapping</h2>{table}</section>'


def _figure_name(figure: dict, name: str) -> str:
    """The figure's label and unit, as ``fleet_series`` gave them; its name when it gave none."""
    unit = f" ({figure['unit']})" if figure.get("unit") else ""
    return _e(f"{figure.get('label', name)}{unit}")


def _degrading(result: dict, series: dict) -> str:
    found = result.get("degrading") or ()
    figures = series.get("figures") or {}
    plotted = {(t["node"], t["figure"]): (i, t) for i, t in enumerate(series.get("trends") or ())}
    rows = []
    for r in found:
        i, trend = plotted.get((r["node"], r["figure"]), (None, None))
        node = _e(r["node"]) if i is None else f'<a href="#trend-{i}">{_e(r["node"])}</a>'
        spark = sparkline_svg([v for _, v in trend["readings"]]) if trend else "-"
        rows.append([node, _figure_name(figures.get(r["figure"]) or {}, r["figure"]), number(r["baseline"]),
                     number(r["recent"]), f"{r['change_pct']:+.1f} %", f"{r['sigmas']:.1f} ×", spark])
    table = _table(["node", "figure", "baseline", "recent", "change", "× spread", "readings"], rows,
                   numeric=(2, 3, 4, 5))
    more = (f'<p class="muted">the worst {len(plotted)} of {len(found)} are plotted</p>'
            if len(found) > len(plotted) else "")
    entries = {(r["node"], r["figure"]): r for r in found}
    plots = "".join(_trend_figure(i, t, figures.get(t["figure"]) or {}, entries.get((t["node"], t["figure"])))
                    for i, t in enumerate(series.get("trends") or ()))
    return (f'<section id="degrading"><h2>Degrading</h2><p class="muted">a node\'s recent readings against its own '
            f"baseline, in units of the fleet's run-to-run spread of the figure</p>{table}{more}{plots}</section>")


def _trend_figure(i: int, trend: dict, figure: dict, entry: dict | None) -> str:
    node, label = _e(trend["node"]), _figure_name(figure, trend["figure"])
    caption = (f'<span class="key-node">{node}</span>\'s {label} against the <span class="key-fleet">fleet\'s '
               "median</span> (dashed) and its 10th–90th percentile per UTC day (shaded)"
               + ("; dotted: the node's own baseline" if entry else ""))
    return (f'<figure id="trend-{i}"><h3>{node}: {label}</h3>{trend_svg(trend, figure, entry)}'
            f"<figcaption>{caption}</figcaption></figure>")


def _rates(result: dict) -> str:
    rates = result.get("rates") or ()
    out = ['<section id="rates"><h2>Failure rates</h2>']
    for key, what in (("check", "Per check"), ("cause", "Per cause")):
        rows = [[f"<code>{_e(r[key])}</code>", str(r["failures"]), str(r["runs"]) if r["runs"] else "-",
                 f"{r['failures'] / r['runs']:.1%}" if r["runs"] else "-", str(r["incidents"]),
                 number(r["mtbf_h"])] for r in rates if key in r]
        out.append(f"<h3>{what}</h3>" + _table([key, "failures", "runs", "rate", "incidents", "MTBF h"], rows,
                                               numeric=(1, 2, 3, 4, 5)))
    out.append('<p class="muted">failures: failing host-runs; runs: host-runs that judged the check; MTBF: the '
               "fleet's node-hours in the window over the incidents</p></section>")
    return "".join(out)


def duration(seconds: float | None) -> str:
    """Seconds as a person reads them: 45 s, 12 min, 3.5 h, 2.1 d; "-" for none."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{seconds:.0f} s"


def _precision_row(name: str, p: dict) -> list[str]:
    by = p["confirmed_by"]
    why = ", ".join(f"{by[k]} {w}" for k, w in (("escalated", "escalated"), ("retest_failed", "retest failed"),
                                                ("step", "after a step"), ("returned", "returned")) if by[k])
    share = "-" if p["precision"] is None else f"{p['precision']:.1%}"
    return [name, str(p["drains"]), str(p["confirmed"]), f'<span class="muted">{_e(why)}</span>',
            str(p["unconfirmed"]), str(p["pending"]), str(p["open"]), str(p["cleared"]), share,
            duration(p["to_drain"]["p50_s"]), duration(p["to_drain"]["p90_s"]),
            duration(p["to_resume"]["p50_s"]), duration(p["to_resume"]["p90_s"])]


def _precision(result: dict) -> str:
    """How often preflight's drains were right: per cause, what each drain in the window turned
    out to be (docs/lifecycle.md, "How often preflight is wrong")."""
    p = result.get("precision")
    out = ['<section id="precision"><h2>Precision of the drains</h2>']
    if not p or not p["drains"]:
        return "".join(out) + NONE + "</section>"
    rate = p["unconfirmed_per_100_node_days"]
    out.append(f'<p class="meta"><b>{"-" if rate is None else f"{rate:g}"}</b> unconfirmed drains per 100 node-days '
               f'({p["unconfirmed"]} in {p["node_days"]:,.1f} node-days)</p>')
    rows = [_precision_row("<b>fleet</b>", p)] + [_precision_row(f"<code>{_e(c['cause'])}</code>", c)
                                                   for c in p["causes"]]
    out.append(_table(["cause", "drains", "confirmed", "because", "unconfirmed", "pending", "open", "cleared",
                       "precision", "to drain p50", "p90", "to resume p50", "p90"], rows,
                      numeric=(1, 2, *range(4, 13))))
    within = duration(p["returns_within_s"])
    out.append('<p class="muted">confirmed: escalated, a retest failed, a step (reset, restart, reboot) taken and '
               f"passed after it, or the cause back on the node within {within} of its resume; "
               f"unconfirmed: resumed with no step taken and the cause away for {within}; "
               "pending: resumed too recently to tell; open: still drained; cleared: a person cleared the node; "
               "precision: confirmed over confirmed and unconfirmed; to drain: from the first failing reading; "
               "to resume: from the drain</p></section>")
    return "".join(out)


# ---- plots --------------------------------------------------------------------------------------

def page_span(series: dict) -> tuple[float, float]:
    """The time the page's plots cover: from the first day with a run (not the start of a long
    window that holds nothing before it) to the window's end."""
    days = series.get("days") or ()
    return (days[0]["start"] if days else series["since"]), series["until"]


def _svg(box: Box, label: str, body: str, css: str = "plot") -> str:
    return (f'<svg class="{css}" xmlns="http://www.w3.org/2000/svg" width="{box.width}" height="{box.height}" '
            f'viewBox="0 0 {box.width} {box.height}" role="img" aria-label="{_e(label)}">'
            f"<title>{_e(label)}</title>{body}</svg>")


def _padded(lo: float, hi: float, share: float = 0.06) -> tuple[float, float]:
    pad = (hi - lo) * share or abs(hi) * share or 1.0
    return lo - pad, hi + pad


def _axes(box: Box, x_range: tuple[float, float], y_range: tuple[float, float],
          y_text: Callable[[float], str]) -> str:
    """Three labelled horizontal grid lines and up to six dates along the bottom."""
    x, y = box.scales(x_range, y_range)
    lo, hi = y_range
    out = []
    for v in (lo, (lo + hi) / 2, hi):
        out.append(f'<line class="grid" x1="{box.left}" x2="{box.width - box.right}" y1="{y(v):.1f}" '
                   f'y2="{y(v):.1f}"/><text x="{box.left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
                   f"{_e(y_text(v))}</text>")
    start, end = x_range
    shown = date if end - start > 2 * DAY_S else stamp
    n = 6 if box.width >= 600 else 3
    for k in range(n):
        t = start + (end - start) * k / (n - 1)
        anchor = "start" if k == 0 else "end" if k == n - 1 else "middle"
        out.append(f'<text x="{x(t):.1f}" y="{box.height - 8}" text-anchor="{anchor}">{shown(t)}</text>')
    out.append(f'<line class="axis" x1="{box.left}" x2="{box.width - box.right}" y1="{box.height - box.bottom}" '
               f'y2="{box.height - box.bottom}"/>')
    return "".join(out)


_CEILINGS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


def rate_ceiling(highest: float) -> float:
    """The top of the rate axis: the first round share above the highest day's, so the grid
    reads 0 %, 25 %, 50 % rather than 0 %, 23 %, 46 %."""
    return next((c for c in _CEILINGS if c >= highest * 1.05), 1.0)


def failure_rate_svg(days: Sequence[dict], box: Box | None = None) -> str:
    """The share of failing host-runs per UTC day, a dot at each day's middle with its counts as
    a tooltip; a day without runs breaks the line rather than reading as a day without failures."""
    box = box or Box()
    judged = [d for d in days if d["host_runs"]]
    top = rate_ceiling(max(d["failing"] / d["host_runs"] for d in judged))
    x_range, y_range = (days[0]["start"], days[-1]["start"] + DAY_S), (0.0, top)
    x, y = box.scales(x_range, y_range)
    lines, dots, segment = [], [], []
    for d in days:
        if not d["host_runs"]:
            lines.append(segment)
            segment = []
            continue
        at = (x(_middle(d)), y(d["failing"] / d["host_runs"]))
        segment.append(at)
        dots.append(f'<circle class="dot" cx="{at[0]:.1f}" cy="{at[1]:.1f}" r="3"><title>{date(d["start"])}: '
                    f'{d["failing"]} of {d["host_runs"]} host-runs failing</title></circle>')
    lines.append(segment)
    body = (_axes(box, x_range, y_range, lambda v: f"{v:.0%}" if top >= 0.1 else f"{v:.1%}")
            + "".join(f'<polyline class="rate" points="{points(s)}"/>' for s in lines if len(s) > 1)
            + "".join(dots))
    return _svg(box, "failing host-runs per day", body)


def _middle(day: dict) -> float:
    """Where a day's band is drawn: its middle, between the readings of that day."""
    return day["start"] + DAY_S / 2


def _band_days(band: Sequence[dict], first: float, last: float) -> list[dict]:
    """The band's days that overlap the node's readings: the plot follows the node."""
    return [b for b in band if b["start"] + DAY_S > first and b["start"] <= last]


def trend_svg(trend: dict, figure: dict, entry: dict | None = None, box: Box | None = None) -> str:
    """A node's readings of a figure (line and dots) over the fleet's p10–p90 band (shaded) and
    median (dashed) per UTC day, each day drawn at its middle; ``entry`` (the degrading answer)
    adds the node's own baseline (dotted)."""
    box = box or Box(height=240)
    readings = trend.get("readings") or ()
    if not readings:
        return NONE
    band = _band_days(figure.get("band") or (), readings[0][0], readings[-1][0])
    times = [t for t, _ in readings] + [_middle(b) for b in band]
    values = ([v for _, v in readings] + [b["p10"] for b in band] + [b["p90"] for b in band]
              + ([entry["baseline"]] if entry else []))
    x_range = (min(times), max(times)) if max(times) > min(times) else _padded(times[0], times[0])
    y_range = _padded(min(values), max(values))
    x, y = box.scales(x_range, y_range)

    def at(b: dict, key: str) -> tuple[float, float]:
        return x(_middle(b)), y(b[key])

    body = [_axes(box, x_range, y_range, number)]
    if band:
        outline = [at(b, "p90") for b in band] + [at(b, "p10") for b in band[::-1]]
        body.append(f'<polygon class="band" points="{points(outline)}"/>'
                    f'<polyline class="median" points="{points([at(b, "p50") for b in band])}"/>')
    if entry:
        body.append(f'<line class="baseline" x1="{box.left}" x2="{box.width - box.right}" '
                    f'y1="{y(entry["baseline"]):.1f}" y2="{y(entry["baseline"]):.1f}"/>')
    body.append(f'<polyline class="node" points="{points([(x(t), y(v)) for t, v in readings])}"/>')
    body += [f'<circle class="dot" cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.5"><title>{stamp(t)}: {number(v)}</title>'
             "</circle>" for t, v in readings]
    return _svg(box, f"{trend['node']}: {figure.get('label', trend['figure'])} against the fleet", "".join(body))


def timeline_svg(times: Sequence[float], span: tuple[float, float], box: Box | None = None) -> str:
    """A strip with a tick at each diagnosed run across the page's span: streaks and the gaps
    between incidents at a glance."""
    box = box or Box(width=220, height=18, left=2, right=2, top=2, bottom=2)
    x = linear(*span, box.left, box.width - box.right)
    ticks = "".join(f'<line class="tick" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{box.top}" '
                    f'y2="{box.height - box.bottom}"><title>{stamp(t)}</title></line>' for t in times)
    mid = box.height / 2
    return _svg(box, f"{len(times)} diagnosed runs",
                f'<line class="grid" x1="{box.left}" x2="{box.width - box.right}" y1="{mid}" y2="{mid}"/>{ticks}',
                css="spark")
