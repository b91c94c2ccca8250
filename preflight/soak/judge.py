"""A soak directory judged into the same ``Analysis`` a bundle gives, so every report format
(terminal, report.json with its ``soak`` section, report.md, report.html with plots, junit.xml)
and the diagnosis work on soak results unchanged.

Besides the telemetry and throughput (``analysis.py``), a ``vllm`` soak's server log is judged:
the agent records each known failure ``vllm_engine.scan_server_log`` found as an events.csv row
(event = the symptom, data = its line in ``vllm-server.log``), and each becomes a FAIL finding
of ``soak-vllm-server`` with that symptom, what it means, what to try (its ``action``, which the
diagnosis shows) and the log line itself where the log was kept: ``soak/<host>/vllm-server.log``
in a run directory of ``preflight soak``, ``vllm-server.log`` in an agent's own directory.
"""

from __future__ import annotations

import csv
from pathlib import Path

from preflight.model import Analysis, HostVerdict
from preflight.diagnose.engine import KnowledgeBase, diagnose
from preflight.model import Evidence, Finding, Status, worst
from preflight.soak.analysis import analyze
from preflight.soak.data import read_soak
from preflight.node.vllm_engine import SERVER_LOG, describe_symptom

CHECK_SERVER_LOG = "soak-vllm-server"
EVENTS_CSV = "events.csv"


def is_soak_dir(path: Path) -> bool:
    return (path / "soak.json").is_file()


def judge_soak(soak_dir: Path, kb: KnowledgeBase, plots_dir: Path | None = None) -> Analysis:
    """Read and judge ``soak_dir``; with ``plots_dir``, draw one PNG per host there and name
    them in ``meta["soak_plots"]`` (paths relative to the plots directory's parent, the run
    directory, where report.html is written and reads them from)."""
    data = read_soak(soak_dir)  # raises SoakDataError naming file, line and field
    result = analyze(data)
    findings = list(result.findings) + server_log_findings(soak_dir, data.meta.hosts)
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
        from preflight.soak.plots import plot_soak  # matplotlib: only when plots are asked for

        plots_dir.mkdir(parents=True, exist_ok=True)
        drawn = plot_soak(data, plots_dir)
        meta["soak_plots"] = {h: str(Path(plots_dir.name) / p.name) for h, p in drawn.items()}
    return Analysis(hosts, findings, diagnose(findings, kb), [], meta)


def server_log_findings(soak_dir: Path, hosts: tuple[str, ...]) -> list[Finding]:
    """One FAIL finding per host and server-log symptom recorded in ``soak_dir/events.csv``."""
    findings = []
    for host, symptom, line in _symptom_events(soak_dir / EVENTS_CSV, set(hosts)):
        summary, suggestion = describe_symptom(symptom)
        where = f"{SERVER_LOG} line {line}" if line is not None else SERVER_LOG
        quoted = _log_line(soak_dir, host, line)
        findings.append(Finding(
            CHECK_SERVER_LOG, host, Status.FAIL, f"vLLM server: {summary} ({where}); try: {suggestion}",
            (symptom,), (Evidence(SERVER_LOG, f"line {line}: {quoted}" if quoted else where),),
            {"line": line}, suggestion))
    return findings


def _symptom_events(path: Path, hosts: set[str]) -> list[tuple[str, str, int | None]]:
    """(host, symptom, line) of the events.csv rows that are server-log symptoms, in file order,
    each once; an absent file or a row cut short reads as no event."""
    try:
        with path.open(newline="", encoding="utf-8", errors="replace") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        return []
    out: dict[tuple[str, str], int | None] = {}
    for row in rows:
        host, symptom, data = row.get("host"), row.get("event"), (row.get("data") or "").strip()
        if host in hosts and symptom and describe_symptom(symptom) and (host, symptom) not in out:
            out[(host, symptom)] = int(data) if data.isdigit() else None
    return [(host, symptom, line) for (host, symptom), line in out.items()]


def _log_line(soak_dir: Path, host: str, line: int | None) -> str | None:
    """Line ``line`` (1-based) of the host's kept server log, stripped, or None."""
    if line is None:
        return None
    for path in (soak_dir / "soak" / host / SERVER_LOG, soak_dir / SERVER_LOG):
        try:
            with path.open(encoding="utf-8", errors="replace") as f:
                for number, text in enumerate(f, 1):
                    if number == line:
                        return text.strip()[:300]
        except FileNotFoundError:
            continue
    return None
