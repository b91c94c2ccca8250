"""The node x rail picture of a ``preflight fabric`` run, for report.html: an HTML table whose
cells are coloured by the rail's state (at speed, slow, flaky, no answer, slow path, untested)
and show its median Gb/s over the pairs it was in, slow cells marked in words as well as colour.

It reads the ``fabric-rails`` fleet finding's ``data["matrix"]`` (checks/fabric_rails.py), so a
re-analysed bundle draws the same picture; no plotting library, nothing on the nodes.
"""

from __future__ import annotations

from html import escape

from preflight.model import Analysis

CHECK = "fabric-rails"
CSS = """
table.rails { width:auto; } .rails td.cell { min-width:150px; }
.rails td.cell { text-align:right; white-space:nowrap; font-variant-numeric:tabular-nums; }
.rails td.m-ok { background:#e6f4ea; } .rails td.m-slow { background:#f9d0cc; font-weight:600; }
.rails td.m-flaky { background:#fde7c4; font-weight:600; } .rails td.m-unreachable { background:#e8d2ef; }
.rails td.m-path { background:#fff4cc; } .rails td.m-untested, .rails td.m-suspect { background:#eeeeee; }
"""
_MARK = {"ok": "", "slow": "SLOW", "flaky": "FLAKY", "unreachable": "NO ANSWER", "path": "PATH", "untested": "-"}


def _finding(analysis: Analysis):
    return next((f for f in analysis.findings if f.check == CHECK and f.host is None and "matrix" in f.data), None)


def present(analysis: Analysis) -> bool:
    return _finding(analysis) is not None


def matrix_section(analysis: Analysis, host_anchor: dict) -> str:
    """The section, or "" when the run has no rail stage."""
    finding = _finding(analysis)
    if finding is None:
        return ""
    data = finding.data
    indices = data.get("rail_index") or []
    names = data.get("rail_names") or []
    head = "".join(f"<th>rail {escape(str(i))}</th>" for i in indices)
    rows = []
    for node, cells in data["matrix"].items():
        tds = []
        for cell in cells:
            state = str(cell.get("state", "untested"))
            gbps = cell.get("gbps")
            figure = "-" if gbps is None else f"{gbps:.3g} Gb/s"
            mark = _MARK.get(state, state.upper())
            tds.append(f'<td class="cell m-{escape(state)}" title="{escape(state)}">{escape(figure)}'
                       + (f" <b>{escape(mark)}</b>" if mark and mark != "-" else "") + "</td>")
        anchor = host_anchor.get(node)
        label = f'<a href="#{escape(anchor)}">{escape(node)}</a>' if anchor else escape(node)
        rows.append(f'<tr><td class="nw">{label}</td>{"".join(tds)}</tr>')
    refs = "; ".join(f"rail {escape(k)}: {escape(str(v))}" for k, v in (data.get("references") or {}).items())
    note = f'<p class="muted">{escape(str(data["line_rate"]))}</p>' if data.get("line_rate") else ""
    return (f'<section id="rails"><h2>Rails</h2><p class="muted">Every node\'s rails ({escape(", ".join(names))}) '
            f"against a partner's, {escape(str(data.get('pair_tests')))} pair test(s) in "
            f"{escape(str(data.get('rounds')))} round(s), {escape(str(data.get('tool')))}; each cell the median over "
            f"the node's pairs. Judged against: {refs}.</p>{note}"
            f'<table class="rails"><tr><th>node</th>{head}</tr>{"".join(rows)}</table></section>')
