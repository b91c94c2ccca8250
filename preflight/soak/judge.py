"""A soak directory judged into the same ``Analysis`` a bundle gives, so every report format
(terminal, report.json with its ``soak`` section, report.md, report.html with plots, junit.xml)
and the diagnosis work on soak results unchanged.

The judging is the soak-scope checks' (``checks/soak.py``, loaded like every other check and
run by ``analysis.py``): the telemetry's and throughput's verdicts, and the ``vllm`` server
log's (``soak-vllm-server``: each known failure the agent recorded in events.csv, with the
symptom, what to try and the log line itself; server_log.py). Host verdicts and diagnoses are
made from their findings here, as for a bundle.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from preflight.contracts import SOAK_JSON
from preflight.diagnose.engine import KnowledgeBase, diagnose
from preflight.model import Analysis, Check, HostVerdict, Status, worst
from preflight.soak.analysis import CHECK_SERVER_LOG, analyze, soak_checks
from preflight.soak.bench_results import write_results
from preflight.soak.data import ANALYSIS_COLUMNS, SoakData, read_soak
from preflight.soak.figures import DEFAULT_THRESHOLDS, Thresholds

__all__ = ["CHECK_SERVER_LOG", "is_soak_dir", "judge_soak"]


def is_soak_dir(path: Path) -> bool:
    return (path / SOAK_JSON).is_file()


def judge_soak(soak_dir: Path, kb: KnowledgeBase, plots_dir: Path | None = None,
               checks: Sequence[Check] | None = None, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> Analysis:
    """Read and judge ``soak_dir`` with ``checks`` (default: every soak check ``soak_checks``
    finds); with ``plots_dir``, draw one PNG per host (and per swept host) there and name them in
    ``meta["soak_plots"]`` (paths relative to the plots directory's parent, the run directory,
    where report.html is written and reads them from), and write the serving agents'
    ``vllm bench serve``-shaped results to ``vllm-bench/`` beside it (bench_results.py)."""
    # Each host's rows wait on disk while another is judged (hostrows.py): a fleet's soak costs
    # about one host's memory. The scratch goes when the judging (the plots included) is done.
    with tempfile.TemporaryDirectory(prefix="preflight-soak-") as spill:
        # raises SoakDataError naming file, line and field
        data = read_soak(soak_dir, columns=ANALYSIS_COLUMNS, spill_dir=spill)
        return _judge(data, kb, plots_dir, checks, thresholds)


def _judge(data: SoakData, kb: KnowledgeBase, plots_dir: Path | None, checks: Sequence[Check] | None,
           thresholds: Thresholds) -> Analysis:
    checks = soak_checks() if checks is None else list(checks)
    result = analyze(data, checks=checks, thresholds=thresholds)
    findings = list(result.findings)
    hosts = {}
    statuses: dict[str | None, list[Status]] = {}
    for f in findings:
        statuses.setdefault(f.host, []).append(f.status)
    # The analysis's hosts: soak.json's and any only the telemetry or the agents' record names.
    for host in result.hosts:
        status = worst(statuses.get(host, ()))
        has_data = host in result.hosts
        hosts[host] = HostVerdict("pass" if status in (Status.PASS, Status.SKIP) else status.value,
                                  has_data, "soak", f"soak engine {data.meta.engine}")
    meta: dict = {"soak": result.soak_section()}
    if result.notes:
        meta["soak_notes"] = list(result.notes)
    if plots_dir is not None:
        # matplotlib: only when plots are asked for.
        from preflight.soak.plots import plot_soak, plot_sweep

        plots_dir.mkdir(parents=True, exist_ok=True)
        drawn = plot_soak(data, plots_dir)
        meta["soak_plots"] = {h: str(Path(plots_dir.name) / p.name) for h, p in drawn.items()}
        swept = result.sweeps or {}
        if swept:
            drawn = plot_sweep(swept, plots_dir)
            # Beside the telemetry plots, under "<host> sweep" (report.html shows every plot named here).
            meta["soak_plots"].update({f"{h} sweep": str(Path(plots_dir.name) / p.name) for h, p in drawn.items()})
        # The vllm bench serve results go beside the plots, in the run directory (bench_results.py).
        written = write_results(data.meta.extra, plots_dir.parent)
        if written:
            meta["vllm_bench_results"] = [str(p.relative_to(plots_dir.parent)) for p in written]
    return Analysis(hosts, findings, diagnose(findings, kb), list(checks), meta)
