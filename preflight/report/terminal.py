"""The terminal summary (rich): a verdict per host, then each diagnosis with its action.

Passing hosts are counted, not listed, once there are many: at 128 hosts the screen is for
the ones that need attention.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from preflight.model import Analysis, Status

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "error": "magenta", "skip": "dim"}
_LIST_PASSING_UP_TO = 16


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
        if not v.reachable:
            # Its checks all say "not checked: host unreachable"; the reason is the one line.
            bad = [f for f in bad if f.symptoms] or bad[:1]
        text = "; ".join(f"[{_STYLE[f.status.value]}]{f.check}[/]: {f.summary}" for f in bad[:4])
        if len(bad) > 4:
            text += f"; and {len(bad) - 4} more"
        table.add_row(host, f"[{_STYLE[v.status]}]{v.status.upper()}[/]", v.profile, text or "all checks passed")
    if len(passing) > _LIST_PASSING_UP_TO:
        table.add_row(f"{len(passing)} hosts", "[green]PASS[/]", "", "all checks passed")
    console.print(table)
    _serving(analysis.meta.get("soak") or {}, console)
    for f in analysis.findings:
        if f.host is None and f.status in (Status.FAIL, Status.ERROR, Status.WARN):
            console.print(f"[{_STYLE[f.status.value]}]fleet {f.check}[/]: {f.summary}")
    for d in analysis.diagnoses:
        console.print(
            f"\n[bold]{d.cause}[/] ({d.confidence}) on {', '.join(d.hosts) or 'the fleet'}: {d.title}\n"
            f"  evidence: {d.evidence}\n  [bold]action:[/] {d.action}"
        )
    counts = {s: sum(v.status == s for v in analysis.hosts.values()) for s in ("pass", "warn", "fail", "error")}
    console.print("\n" + ", ".join(f"[{_STYLE[s]}]{n} {s}[/]" for s, n in counts.items() if n)
                  + (f" — report in {report_dir}" if report_dir else ""))


def _ms(value) -> str:
    return f"{value:.0f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _serving(section: dict, console: Console) -> None:
    """Each concurrency sweep's levels, knee and recommendation; a served model's goodput."""
    for host, s in sorted(section.items()):
        if not isinstance(s, dict):
            continue
        swept = s.get("sweep")
        if isinstance(swept, dict):
            table = Table(title=f"concurrency sweep on {host}: recommended {swept.get('recommended') or 'none'}"
                                f" (knee {swept.get('knee') or 'not reached'})")
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
            console.print(str(swept.get("reason", "")), highlight=False, markup=False)
        elif s.get("goodput_requests_per_s") is not None:
            console.print(f"{host}: goodput {s['goodput_requests_per_s']:.2f} req/s of "
                          f"{s.get('requests_per_s') or 0:.2f} req/s completed", highlight=False, markup=False)
