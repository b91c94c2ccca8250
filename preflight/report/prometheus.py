"""``--prometheus FILE``: verdicts and key figures in node_exporter's textfile-collector format.

Point node_exporter's ``--collector.textfile.directory`` at the file's directory (the file
name must end in ``.prom``) and the fleet's last preflight run becomes scrapeable:

    preflight_host_status{host="gpu017",status="fail"} 1
    preflight_check_status{host="gpu017",check="nccl-all-reduce",status="fail"} 1
    preflight_check_figure{host="gpu017",check="nccl-all-reduce",figure="busbw_gbs"} 362.1

Statuses are one series per host (and per host and check) carrying the current status as a
label with the value 1: an alert is ``preflight_host_status{status=~"fail|error"} == 1``, and
a status that changes makes the old series disappear at the next write. Figures are the
numeric scalars of each finding's ``data`` (booleans and lists left out; nested dicts
flattened one level as ``outer.inner``), plus the soak section's per-host figures. Fleet-wide
findings (no host) carry no ``host`` label. Label values are escaped as the exposition format
requires (backslash, double quote, newline), so host names and figure keys cannot break the
file. The caller writes it atomically (node_exporter may read it at any moment).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime

from preflight.model import Analysis, Status, worst

_METRICS = (
    ("preflight_run_timestamp_seconds", "When the evidence of this run was collected (Unix time)."),
    ("preflight_hosts", "Hosts per verdict in this run."),
    ("preflight_host_status", "The host's verdict, as the status label; the value is always 1."),
    ("preflight_host_reachable", "1 when the controller reached the host, 0 when it could not."),
    ("preflight_check_status", "A check's verdict on a host, as the status label; the value is always 1."),
    ("preflight_check_figure", "A figure a check measured on a host (its finding's data)."),
    ("preflight_diagnosis", "A diagnosed cause on a host, with its confidence; the value is always 1."),
    ("preflight_soak_figure", "A figure of the host's soak (report.json soak section)."),
)
_HOST_STATUSES = ("pass", "warn", "fail", "error")


def escape(value: str) -> str:
    """A label value as the text exposition format wants it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str | None) -> str:
    inner = ",".join(f'{k}="{escape(str(v))}"' for k, v in labels.items() if v is not None)
    return "{" + inner + "}" if inner else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def _figures(data: dict, prefix: str = "") -> Iterable[tuple[str, float]]:
    for key, value in data.items():
        if isinstance(value, dict) and not prefix:
            yield from _figures(value, f"{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield prefix + str(key), value


def render(analysis: Analysis) -> str:
    samples: dict[str, list[str]] = {name: [] for name, _ in _METRICS}
    created = analysis.meta.get("created")
    if created:
        try:
            stamp = datetime.fromisoformat(str(created)).timestamp()
            samples["preflight_run_timestamp_seconds"].append(_number(stamp))
        except ValueError:
            pass  # a malformed timestamp costs only this metric
    for status in _HOST_STATUSES:
        n = sum(v.status == status for v in analysis.hosts.values())
        samples["preflight_hosts"].append(f"{_labels(status=status)} {n}")
    for host, verdict in analysis.hosts.items():
        samples["preflight_host_status"].append(f"{_labels(host=host, status=verdict.status)} 1")
        samples["preflight_host_reachable"].append(f"{_labels(host=host)} {int(verdict.reachable)}")
    # A check may return several findings for one host: the worst status and the first value
    # of a figure stand, since a series may appear only once in the file.
    status_of: dict[tuple[str | None, str], Status] = {}
    figures: dict[tuple[str | None, str, str], float] = {}
    for f in analysis.findings:
        key = (f.host, f.check)
        status_of[key] = worst([status_of[key], f.status]) if key in status_of else f.status
        for name, value in _figures(f.data):
            figures.setdefault((f.host, f.check, name), value)
    for (host, check), status in status_of.items():
        samples["preflight_check_status"].append(f"{_labels(host=host, check=check, status=status.value)} 1")
    for (host, check, name), value in figures.items():
        samples["preflight_check_figure"].append(f"{_labels(host=host, check=check, figure=name)} {_number(value)}")
    for d in analysis.diagnoses:
        for host in d.hosts or (None,):
            samples["preflight_diagnosis"].append(f"{_labels(host=host, cause=d.cause, confidence=d.confidence)} 1")
    for host, section in (analysis.meta.get("soak") or {}).items():
        if isinstance(section, dict):
            for name, value in _figures(section):
                samples["preflight_soak_figure"].append(f"{_labels(host=host, figure=name)} {_number(value)}")

    out = []
    for name, help_text in _METRICS:
        if samples[name]:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            out += [f"{name}{line}" if line.startswith("{") else f"{name} {line}" for line in samples[name]]
    return "\n".join(out) + "\n"
