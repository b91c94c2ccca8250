"""``report.html``: the run as one self-contained page that opens offline.

One file, no scripts, no external fetches: the CSS is inline, soak plots are embedded as
base64 PNG ``data:`` URIs, and a Content-Security-Policy forbids the page from loading
anything else, so a report mailed around or opened from a customer's bundle cannot phone
home. Everything taken from the evidence is HTML-escaped.

Layout, top to bottom: verdict counts; diagnoses (cause, confidence, hosts, evidence, next
action); fleet groupings of inventory figures found in the findings' ``data`` ("7 hosts on
580.159.04, 1 on 570.195.03: gpu05"); a table of hosts; the soak section and its plots when
the run has them; then one section per host with a table of its findings, each finding linked
to its evidence excerpts (``#ev-<finding>-<n>`` anchors) and each excerpt linked back. Hosts
where everything passed are folded (``<details>``) so that at 128 hosts the page leads with
the ones that need attention.

Plots are passed in as ``{host: png_bytes}`` (``preflight.soak.plots.plot_soak`` writes
them; ``preflight.app.run.write_reports`` reads the files named by ``analysis.meta
["soak_plots"]``, host -> path relative to the run directory, and hands the bytes here), so
this module stays a pure function of its inputs.
"""

from __future__ import annotations

import base64
import re
from collections import Counter
from collections.abc import Mapping
from html import escape

from preflight.model import Analysis, Finding, Status
from preflight.report import rail_matrix
from preflight.report.sparkline import sparkline_svg
from preflight.report.wording import not_checked, not_checked_line, plural, tally

_ORDER = ("fail", "error", "warn", "pass", "skip")
# Inventory-like data keys whose values group hosts: versions, firmware, models. (The
# profile is grouped from the host verdicts, which hold it for every reachable host.)
_GROUPING_KEY = re.compile(r"version|firmware|(^|_)fw(_|$)|vbios|model", re.IGNORECASE)
_LIST_HOSTS = 12

CSS = """
:root { --pass:#1e7b34; --warn:#a86400; --fail:#b3261e; --error:#7b1fa2; --skip:#6b6b6b;
        --line:#d9dce1; --muted:#5f6368; --bg-alt:#f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", "DejaVu Sans", Roboto, Helvetica, Arial, sans-serif;
       color:#1f2328; margin:0 auto; max-width:1280px; padding:16px 24px 48px; }
h1 { font-size:22px; margin:8px 0 4px; } h2 { font-size:18px; margin:28px 0 8px; padding-bottom:4px;
     border-bottom:1px solid var(--line); } h3 { font-size:15px; margin:18px 0 6px; }
.meta, .muted { color:var(--muted); }
nav a { margin-right:14px; }
a { color:#0b57d0; text-decoration:none; } a:hover { text-decoration:underline; }
table { border-collapse:collapse; width:100%; margin:6px 0 10px; }
th, td { border:1px solid var(--line); padding:5px 8px; text-align:left; vertical-align:top; }
th { background:var(--bg-alt); font-weight:600; }
tr:nth-child(even) td { background:#fbfbfc; }
.badge { display:inline-block; min-width:52px; padding:1px 7px; border-radius:10px; color:#fff;
         font-size:12px; font-weight:600; text-align:center; text-transform:uppercase; }
.b-pass { background:var(--pass); } .b-warn { background:var(--warn); } .b-fail { background:var(--fail); }
.b-error { background:var(--error); } .b-skip { background:var(--skip); }
.b-high { background:var(--fail); } .b-medium { background:var(--warn); } .b-low { background:var(--skip); }
.tiles { display:flex; gap:12px; flex-wrap:wrap; margin:10px 0; }
.tile { border:1px solid var(--line); border-radius:8px; padding:10px 16px; min-width:120px; }
.tile .n { font-size:26px; font-weight:700; } .tile.pass .n { color:var(--pass); } .tile.warn .n { color:var(--warn); }
.tile.fail .n { color:var(--fail); } .tile.error .n { color:var(--error); }
pre { background:var(--bg-alt); border:1px solid var(--line); border-radius:6px; padding:8px 10px;
      overflow-x:auto; font:12px/1.4 "DejaVu Sans Mono", Menlo, Consolas, monospace; margin:4px 0 10px;
      white-space:pre-wrap; word-break:break-word; }
.evidence { margin-left:8px; } .evidence:target pre { outline:2px solid #0b57d0; }
tr:target td { background:#e8f0fe; }
details > summary { cursor:pointer; font-weight:600; margin:10px 0 4px; }
figure { margin:10px 0 18px; } figure img { max-width:100%; border:1px solid var(--line); }
figcaption { color:var(--muted); font-size:13px; }
.action { font-weight:600; }
.nw { white-space:nowrap; }
tr.odd td { background:#fff4e5; }
"""

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _badge(status: str) -> str:
    return f'<span class="badge b-{_e(status)}">{_e(status)}</span>'


class _Ids:
    """Stable, unique, readable anchors for hosts (``host-gpu01``) and findings (``f-12``)."""

    def __init__(self, analysis: Analysis):
        self.host: dict[str | None, str] = {}
        used: set[str] = set()
        for host in list(analysis.hosts) + [f.host for f in analysis.findings]:
            if host in self.host:
                continue
            base = "host-" + (re.sub(r"[^A-Za-z0-9_.-]", "_", host) if host else "fleet")
            anchor, n = base, 2
            while anchor in used:
                anchor, n = f"{base}-{n}", n + 1
            used.add(anchor)
            self.host[host] = anchor
        self.finding = {id(f): f"f-{i}" for i, f in enumerate(analysis.findings)}


def render(analysis: Analysis, plots: Mapping[str, bytes] | None = None) -> str:
    plots = plots or {}
    ids = _Ids(analysis)
    meta = analysis.meta
    title = f"preflight report {meta.get('run_id', '')}".strip()
    body = [f"<header><h1>{_e(title)}</h1>", _meta_line(meta), "</header>", _nav(analysis, plots),
            _summary(analysis), _diagnoses(analysis, ids), _fleet(analysis, ids),
            rail_matrix.matrix_section(analysis, ids.host), _hosts_table(analysis, ids)]
    if meta.get("soak") or plots:
        body.append(_soak(meta.get("soak") or {}, plots, ids))
    if meta.get("history"):
        body.append(_history(meta["history"], ids))
    body.append(_host_sections(analysis, ids))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{_e(title)}</title>\n<style>{CSS}{rail_matrix.CSS}</style>\n</head>\n"
            "<body>\n" + "\n".join(part for part in body if part) + "\n</body>\n</html>\n")


def _meta_line(meta: dict) -> str:
    parts = []
    if meta.get("created"):
        parts.append(f"evidence collected {_e(meta['created'])}")
    if meta.get("preflight_version"):
        parts.append(f"preflight {_e(meta['preflight_version'])}")
    if meta.get("bundle"):
        parts.append(f"bundle <code>{_e(meta['bundle'])}</code>")
    return f'<p class="meta">{" · ".join(parts)}</p>' if parts else ""


def _nav(analysis: Analysis, plots: Mapping[str, bytes]) -> str:
    links = [("summary", "Summary"), ("diagnoses", "Diagnoses"), ("fleet", "Fleet")]
    if rail_matrix.present(analysis):
        links.append(("rails", "Rails"))
    links.append(("hosts", "Hosts"))
    if analysis.meta.get("soak") or plots:
        links.append(("soak", "Soak"))
    if analysis.meta.get("history"):
        links.append(("history", "History"))
    links.append(("findings", "Findings by host"))
    return "<nav>" + "".join(f'<a href="#{a}">{t}</a>' for a, t in links) + "</nav>"


def _summary(analysis: Analysis) -> str:
    counts = Counter(v.status for v in analysis.hosts.values())
    tiles = "".join(f'<div class="tile {s}"><div class="n">{counts.get(s, 0)}</div>{s}</div>'
                    for s in ("pass", "warn", "fail", "error"))
    findings = Counter(f.status.value for f in analysis.findings)
    checks = tally(findings, _ORDER)
    verdict = ("Every host passed." if not analysis.failed and not counts.get("warn")
               else "Some hosts need attention." if analysis.failed else "No host failed; some warn.")
    return (f'<section id="summary"><h2>Summary</h2><p><b>{_e(verdict)}</b> {plural(len(analysis.hosts), "host")}, '
            f'{plural(len(analysis.checks), "check")}; findings: {_e(checks or "none")}.</p>'
            f'<div class="tiles">{tiles}</div></section>')


def _host_links(hosts, ids: _Ids) -> str:
    return ", ".join(f'<a href="#{ids.host.get(h, "")}">{_e(h)}</a>' for h in hosts) or "the fleet"


def _some_hosts(hosts, ids: _Ids, limit: int = 2 * _LIST_HOSTS) -> str:
    """A fleet-wide diagnosis names every host in the Hosts table; its cell names the first few."""
    more = f' and <a href="#hosts">{len(hosts) - limit} more</a>' if len(hosts) > limit else ""
    return _host_links(hosts[:limit], ids) + more


def _diagnoses(analysis: Analysis, ids: _Ids) -> str:
    out = ['<section id="diagnoses"><h2>Diagnoses</h2>']
    if not analysis.diagnoses:
        return out[0] + "<p>No faults diagnosed.</p></section>"
    out.append("<table><tr><th>cause</th><th>confidence</th><th>hosts</th><th>evidence</th>"
               "<th>next action</th></tr>")
    for d in analysis.diagnoses:
        out.append(f"<tr><td><b>{_e(d.title or d.cause)}</b><br><code>{_e(d.cause)}</code></td>"
                   f"<td>{_badge(d.confidence)}</td>"
                   f"<td>{_some_hosts(d.hosts, ids)}</td><td>{_e(d.evidence)}"
                   f"<br><span class=\"muted\">symptoms: {_e(', '.join(d.symptoms))}</span></td>"
                   f"<td class=\"action\">{_e(d.action)}</td></tr>")
    out.append("</table></section>")
    return "".join(out)


def fleet_groupings(analysis: Analysis) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """(what, [(value, hosts), ...] largest group first) for each inventory figure the findings
    carry: versions, firmware, models, and the platform profile of each host."""
    values: dict[str, dict[str, str]] = {}
    for f in analysis.findings:
        if f.host is None:
            continue
        for key, value in f.data.items():
            if not _GROUPING_KEY.search(key):
                continue
            if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
                value = " / ".join(sorted(set(value)))
            if isinstance(value, str) and value:
                values.setdefault(f"{key} ({f.check})", {}).setdefault(f.host, value)
    values["profile"] = {h: v.profile for h, v in analysis.hosts.items() if v.reachable}
    out = []
    for what, by_host in sorted(values.items()):
        if not by_host:
            continue
        groups: dict[str, list[str]] = {}
        for host, value in by_host.items():
            groups.setdefault(value, []).append(host)
        out.append((what, sorted(((v, sorted(hs)) for v, hs in groups.items()), key=lambda g: (-len(g[1]), g[0]))))
    return out


def _fleet(analysis: Analysis, ids: _Ids) -> str:
    out = ['<section id="fleet"><h2>Fleet</h2>']
    rows = []
    for what, groups in fleet_groupings(analysis):
        parts = []
        for i, (value, hosts) in enumerate(groups):
            n = len(hosts)
            text = f"{n} host{'s' if n != 1 else ''} on {_e(value)}" if i == 0 else f"{n} on {_e(value)}"
            if i > 0 or len(groups) == 1 and n <= 3:
                shown = _host_links(hosts[:_LIST_HOSTS], ids)
                text += f": {shown}" + (f" and {n - _LIST_HOSTS} more" if n > _LIST_HOSTS else "")
            parts.append(text)
        reported = {h for _, hosts in groups for h in hosts}
        silent = [h for h in analysis.hosts if h not in reported]
        if silent:
            more = f" and {len(silent) - _LIST_HOSTS} more" if len(silent) > _LIST_HOSTS else ""
            parts.append(f"not reported by {len(silent)}: {_host_links(silent[:_LIST_HOSTS], ids)}{more}")
        odd = ' class="odd"' if len(groups) > 1 else ""
        rows.append(f"<tr{odd}><td>{_e(what)}</td><td>{'; '.join(parts)}</td></tr>")
    if rows:
        out.append("<table><tr><th>figure</th><th>hosts</th></tr>" + "".join(rows) + "</table>")
    fleet_findings = [f for f in analysis.findings if f.host is None]
    if fleet_findings:
        out.append(_findings_table(fleet_findings, ids))
    if not rows and not fleet_findings:
        out.append("<p>No inventory figures to group.</p>")
    out.append("</section>")
    return "".join(out)


def _hosts_table(analysis: Analysis, ids: _Ids) -> str:
    out = ['<section id="hosts"><h2>Hosts</h2><table><tr><th>host</th><th>verdict</th><th>profile</th>'
           + "<th>not passing</th></tr>"]
    order = {s: i for i, s in enumerate(_ORDER)}
    for host, v in sorted(analysis.hosts.items(), key=lambda kv: (order.get(kv[1].status, 9), kv[0])):
        bad = [f for f in analysis.findings_of(host) if f.status in (Status.FAIL, Status.ERROR, Status.WARN)]
        links = ", ".join(f'<a href="#{ids.finding[id(f)]}">{_e(f.check)}</a>' for f in bad) or "-"
        reach = "" if v.reachable else ' <span class="muted">(unreachable)</span>'
        out.append(f'<tr><td class="nw"><a href="#{ids.host[host]}">{_e(host)}</a>{reach}</td>'
                   f'<td>{_badge(v.status)}</td>'
                   f'<td class="nw" title="{_e(v.profile_why)}">{_e(v.profile)}</td><td>{links}</td></tr>')
    out.append("</table></section>")
    return "".join(out)


def _history(history: dict, ids: _Ids) -> str:
    """Each node that did not pass, with its past verdicts (oldest first) and a sparkline of its
    key figure, this run's reading last (report.json's ``history``, from the results store)."""
    out = ['<section id="history"><h2>History</h2><p class="muted">Nodes that did not pass, against their '
           'recent past in the results store (--history).</p><table><tr><th>host</th><th>past verdicts</th>'
           '<th>figure</th><th>readings</th></tr>']
    for host, h in sorted(history.items()):
        runs = h.get("runs") or []
        verdicts = "".join(f'<span title="{_e(t)}">{_badge(s)}</span>' for t, s in runs) or "-"
        values = [v for v in h.get("values") or () if isinstance(v, (int, float))]
        figure = (f'{_e(h.get("label", h.get("figure", "")))} ({_e(h.get("unit", ""))})' if values else "-")
        last = f' {values[-1]:g}' if values else ""
        link = f'<a href="#{ids.host[host]}">{_e(host)}</a>' if host in ids.host else _e(host)
        out.append(f'<tr><td class="nw">{link}</td><td>{verdicts}</td><td>{figure}</td>'
                   f'<td class="nw">{sparkline_svg(values) if values else "-"}{_e(last)}</td></tr>')
    out.append("</table></section>")
    return "".join(out)


_SOAK_FIELDS = (("engine", "engine"), ("duration_s", "duration (s)"), ("max_temperature_c", "max temp (°C)"),
                ("min_sm_clock_mhz", "min SM clock (MHz)"), ("throttle_reasons_seen", "throttle reasons"),
                ("throughput_baseline", "throughput baseline"), ("throughput_final", "throughput final"),
                ("throughput_decay", "decay"))


def _soak(section: dict, plots: Mapping[str, bytes], ids: _Ids) -> str:
    out = ['<section id="soak"><h2>Soak</h2>']
    if section:
        out.append("<table><tr><th>host</th>" + "".join(f"<th>{t}</th>" for _, t in _SOAK_FIELDS) + "</tr>")
        for host in sorted(section):
            row = section[host] if isinstance(section[host], dict) else {}
            cells = "".join(f"<td>{_e(_soak_value(k, row.get(k)))}</td>" for k, _ in _SOAK_FIELDS)
            out.append(f'<tr><td><a href="#{ids.host.get(host, "")}">{_e(host)}</a></td>{cells}</tr>')
        out.append("</table>")
    for host in sorted(plots):
        data = base64.b64encode(plots[host]).decode("ascii")
        out.append(f'<figure id="plot-{_e(ids.host.get(host, host))}"><img alt="soak telemetry of {_e(host)}" '
                   f'src="data:image/png;base64,{data}"><figcaption>{_e(host)}: {_caption(host)}</figcaption>'
                   "</figure>")
    out.append("</section>")
    return "".join(out)


def _caption(plot: str) -> str:
    if plot.endswith(" sweep"):  # soak/judge.py names a concurrency sweep's plot "<host> sweep"
        return "output tokens/s and P99 TTFT against the requests in flight; x the knee, o the recommended level"
    return "temperature, SM clock, power and throughput over the soak; shaded spans carry a clock-event reason"


def _soak_value(key: str, value) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    if key == "throughput_decay" and isinstance(value, (int, float)):
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _findings_table(findings: list[Finding], ids: _Ids) -> str:
    out = ["<table><tr><th>check</th><th>verdict</th><th>summary</th><th>evidence</th></tr>"]
    for f in findings:
        fid = ids.finding[id(f)]
        links = " ".join(f'<a href="#ev-{fid}-{k}">{_e(e.probe)}</a>' for k, e in enumerate(f.evidence)) or "-"
        symptoms = f'<br><span class="muted">symptoms: {_e(", ".join(f.symptoms))}</span>' if f.symptoms else ""
        if not_checked(f):
            symptoms += f'<br><span class="muted">{_e(not_checked_line(f))}</span>'

        out.append(f'<tr id="{fid}"><td class="nw">{_e(f.check)}</td><td>{_badge(f.status.value)}</td>'
                   f"<td>{_e(f.summary)}{symptoms}</td><td>{links}</td></tr>")
    out.append("</table>")
    for f in findings:
        fid = ids.finding[id(f)]
        for k, e in enumerate(f.evidence):
            out.append(f'<div class="evidence" id="ev-{fid}-{k}"><a href="#{fid}">{_e(f.check)}</a> · '
                       f"<code>{_e(e.probe)}</code><pre>{_e(e.excerpt)}</pre></div>")
    return "".join(out)


def _host_sections(analysis: Analysis, ids: _Ids) -> str:
    out = ['<section id="findings"><h2>Findings by host</h2>']
    for host, v in analysis.hosts.items():
        mine = list(analysis.findings_of(host))
        order = {s: i for i, s in enumerate(_ORDER)}
        mine.sort(key=lambda f: order[f.status.value])  # stable: the checks' order within a status
        head = f"{_e(host)} {_badge(v.status)} <span class=\"muted\">{_e(v.profile)}</span>"
        table = _findings_table(mine, ids) if mine else "<p>No findings.</p>"
        if v.status == "pass":
            out.append(f'<details id="{ids.host[host]}"><summary>{head}</summary>{table}</details>')
        else:
            out.append(f'<div id="{ids.host[host]}"><h3>{head}</h3>{table}</div>')
    out.append("</section>")
    return "".join(out)
