"""The report files of a run directory, each written whole or not at all."""

from __future__ import annotations

from pathlib import Path

from preflight.evidence import atomic
from preflight.model import Analysis
from preflight.report import html as html_report
from preflight.report import json_report, junit, markdown


def write_reports(run_dir: Path, analysis: Analysis, html: bool = True) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    writers = [("report.json", json_report.render), ("report.md", markdown.render), ("junit.xml", junit.render)]
    if html:
        plots = soak_plot_bytes(run_dir, analysis.meta.get("soak_plots") or {})
        writers.append(("report.html", lambda a: html_report.render(a, plots)))
    # Every report rendered before the first is written: one that cannot be rendered leaves
    # none of them behind, rather than a report.json without its report.md.
    rendered = [(name, render(analysis)) for name, render in writers]
    for name, text in rendered:
        write_atomic(run_dir / name, text)


def write_atomic(path: Path, text: str) -> None:
    """Readers (node_exporter, a browser, CI) never see a half-written file; a write that
    fails (disk full, a directory in the way) removes its temporary file and raises."""
    # A name that was not UTF-8 (a lone surrogate, from surrogateescape) is written as the
    # escape Python prints, as the store keeps it: every report stays valid UTF-8.
    atomic.write_atomic(path, text.encode("utf-8", "backslashreplace"))


def soak_plot_bytes(run_dir: Path, named: dict[str, str]) -> dict[str, bytes]:
    """The PNGs named by ``analysis.meta["soak_plots"]`` (host -> path relative to the run
    directory, as ``preflight.soak.plots.plot_soak`` wrote them), for embedding in report.html;
    one that is gone is left out rather than failing the reports."""
    return {host: (run_dir / rel).read_bytes() for host, rel in named.items() if (run_dir / rel).is_file()}
