"""The terminal summary (rich): a verdict per host, then each diagnosis with its action.

Passing hosts are counted, not listed, once there are many: at 128 hosts the screen is for
the ones that need attention.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from preflight.model import Analysis, Status
from preflight.printable import printable
from preflight.report.wording import counted, not_checked, plural

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "error": "magenta", "skip": "dim"}
_LIST_PASSING_UP_TO = 16


def _data(value) -> str:
    """Text from a node, a check or the store, put into this module's markup as data: control
    characters escaped (preflight.printable), rich's ``[`` escaped."""
    return escape(printable(value))


def _markup(text: str) -> Text:
    """This module's own markup, with emoji codes left as they are: ``:AB:`` in a PCI bus id is
    no emoji, whatever console prints it."""
    return Text.from_markup(text, emoji=False)


def show(analysis: Analysis, console: Console, report_dir: str | None = None) -> None:
    table = Table(title="preflight", show_lines=False)
    table.add_column("host")
    table.add_column("verdict")
    table.add_column("profile")
    table.add_column("findings")
    passing = [h for h, v in analysis.hosts.items() if v.status == "pass"]
    for host, v in analysis.hosts.items():
        if v.status == "pass" and len(passing) > _LIST_PASSING_UP_TO:
            continue
        bad = [f for f in analysis.findings_of(host) if f.status in (Status.FAIL, Status.ERROR, Status.WARN)]
        text = "; ".join(f"[{_STYLE[f.status.value]}]{_data(f.check)}[/]: {_data(f.summary)}{_unchecked(f)}"
                         for f in bad[:4])
        if len(bad) > 4:
            text += f"; and {len(bad) - 4} more"
        table.add_row(_markup(_data(host)), _markup(f"[{_STYLE[v.status]}]{v.status.upper()}[/]"),
                      _markup(_data(v.profile)), _markup(text or "all checks passed"))
    if len(passing) > _LIST_PASSING_UP_TO:
        table.add_row(f"{len(passing)} hosts", "[green]PASS[/]", "", "all checks passed")
    console.print(table)
    _serving(analysis.meta.get("soak") or {}, console)
    for f in analysis.findings:
        if f.host is None and f.status in (Status.FAIL, Status.ERROR, Status.WARN):
            console.print(_markup(f"[{_STYLE[f.status.value]}]fleet {_data(f.check)}[/]: {_data(f.summary)}"))
    for d in analysis.diagnoses:
        console.print(_markup(
            f"\n[bold]{_data(d.cause)}[/] ({_data(d.confidence)}) on {_data(', '.join(d.hosts)) or 'the fleet'}: "
            f"{_data(d.title)}\n  evidence: {_data(d.evidence)}\n  [bold]action:[/] {_data(d.action)}"
        ))
    console.print()
    show_line(analysis, console, report_dir)


def verdict_line(analysis: Analysis, report_dir: str | None = None) -> Text:
    """The run in one line: the hosts' verdicts counted, and where the report is (all that
    ``-q`` prints)."""
    counts = {s: sum(v.status == s for v in analysis.hosts.values()) for s in ("pass", "warn", "fail", "error")}
    fleet = [f for f in analysis.findings if f.host is None and f.status in (Status.FAIL, Status.ERROR)]
    text = ", ".join(f"[{_STYLE[s]}]{counted(n, s)}[/]" for s, n in counts.items() if n) or "no host"
    if fleet:
        # A fleet finding no host is blamed for still fails the run (exit 1): the line says so.
        text += f", [{_STYLE['fail']}]{plural(len(fleet), 'fleet finding')} failing[/]"
    return _markup(text + (f" — report in {_data(report_dir)}" if report_dir else ""))


def show_line(analysis: Analysis, console: Console, report_dir: str | None = None) -> None:
    """``verdict_line`` on one line of the console, never wrapped (a path stays whole)."""
    console.print(verdict_line(analysis, report_dir), soft_wrap=True)


def _unchecked(f) -> str:
    ids = not_checked(f)
    return f" ({plural(len(ids), 'check')} not run)" if ids else ""


def _ms(value) -> str:
    return f"{value:.0f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _serving(section: dict, console: Console) -> None:
    """Each concurrency sweep's levels, knee and recommendation; a served model's goodput."""
    for host, s in sorted(section.items()):
        if not isinstance(s, dict):
            continue
        swept = s.get("sweep")
        if isinstance(swept, dict):
            table = Table(title=_markup(f"concurrency sweep on {_data(host)}: recommended "
                                        f"{_data(swept.get('recommended') or 'none')}"
                                        f" (knee {_data(swept.get('knee') or 'not reached')})"))
            for column in ("in flight", "output tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "errors",
                           "goodput req/s"):
                table.add_column(column, justify="right")
            for lv in swept.get("levels") or ():
                good = lv.get("goodput_requests_per_s")
                mark = " ◀" if lv.get("concurrency") == swept.get("recommended") else ""
                table.add_row(f"{lv.get('concurrency')}{mark}", _ms(lv.get("tokens_per_s")),
                              f"{_ms(lv.get('ttft_p50_ms'))}/{_ms(lv.get('ttft_p99_ms'))}",
                              f"{_ms(lv.get('tpot_p50_ms'))}/{_ms(lv.get('tpot_p99_ms'))}", str(lv.get("errors")),
                              f"{good:.2f}" if isinstance(good, (int, float)) else "-")
            console.print(table)
            console.print(printable(swept.get("reason", "")), highlight=False, markup=False, emoji=False)
        elif s.get("goodput_requests_per_s") is not None:
            console.print(f"{printable(host)}: goodput {s['goodput_requests_per_s']:.2f} req/s of "
                          f"{s.get('requests_per_s') or 0:.2f} req/s completed", highlight=False, markup=False,
                          emoji=False)
