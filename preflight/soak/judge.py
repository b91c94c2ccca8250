"""A soak directory judged into the same ``Analysis`` a bundle gives, so every report format
(terminal, report.json with its ``soak`` section, report.md, report.html with plots, junit.xml)
and the diagnosis work on soak results unchanged.
"""

from __future__ import annotations

from pathlib import Path

from ..analyze import Analysis, HostVerdict
from ..diagnosis import KnowledgeBase, diagnose
from ..model import Status, worst
from .analysis import analyze
from .data import read_soak


def is_soak_dir(path: Path) -> bool:
    return (path / "soak.json").is_file()


def judge_soak(soak_dir: Path, kb: KnowledgeBase, plots_dir: Path | None = None) -> Analysis:
    """Read and judge ``soak_dir``; with ``plots_dir``, draw one PNG per host there and name
    them in ``meta["soak_plots"]`` (paths relative to the plots directory's parent, the run
    directory, where report.html is written and reads them from)."""
    data = read_soak(soak_dir)  # raises SoakDataError naming file, line and field
    result = analyze(data)
    findings = list(result.findings)
    hosts = {}
    for host in data.meta.hosts:
        status = worst([f.status for f in findings if f.host == host])
        has_data = host in result.hosts
        hosts[host] = HostVerdict("pass" if status in (Status.PASS, Status.SKIP) else status.value,
                                  has_data, "soak", f"soak engine {data.meta.engine}")
    meta: dict = {"soak": result.soak_section()}
    if result.notes:
        meta["soak_notes"] = list(result.notes)
    if plots_dir is not None:
        from .plots import plot_soak

        plots_dir.mkdir(parents=True, exist_ok=True)
        drawn = plot_soak(data, plots_dir)
        meta["soak_plots"] = {h: str(Path(plots_dir.name) / p.name) for h, p in drawn.items()}
    return Analysis(hosts, findings, diagnose(findings, kb), [], meta)
