"""``report.md``: the run as a person reads it: verdicts, diagnoses, then the evidence."""

from __future__ import annotations

from collections import Counter

from preflight.model import Analysis, Status

_ICON = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "error": "ERROR", "skip": "SKIP"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(analysis: Analysis) -> str:
    meta = analysis.meta
    counts = Counter(v.status for v in analysis.hosts.values())
    out = [f"# preflight report {meta.get('run_id', '')}".rstrip(), ""]
    if meta.get("created"):
        out += [f"Created {meta['created']} by preflight {meta.get('preflight_version', '')}.", ""]
    out += ["**Hosts:** " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none", ""]

    out += ["## Diagnoses", ""]
    if not analysis.diagnoses:
        out += ["No faults diagnosed.", ""]
    for d in analysis.diagnoses:
        hosts = ", ".join(d.hosts) or "fleet"
        out += [f"### {d.title or d.cause} — `{d.cause}` ({d.confidence} confidence)", "",
                f"- **Hosts:** {hosts}", f"- **Evidence:** {d.evidence}",
                f"- **Symptoms:** {', '.join(d.symptoms)}", f"- **Action:** {d.action}", ""]

    out += ["## Hosts", "", "| host | verdict | profile | not passing |", "| --- | --- | --- | --- |"]
    for host, v in analysis.hosts.items():
        bad = [f.check for f in analysis.findings_of(host) if f.status in (Status.FAIL, Status.ERROR, Status.WARN)]
        out.append(f"| {host} | {_ICON[v.status]} | {v.profile} | {_cell(', '.join(bad)) or '-'} |")
    out.append("")

    out += ["## Findings", ""]
    for f in analysis.findings:
        if f.status in (Status.PASS, Status.SKIP):
            continue
        out += [f"### {f.host or 'fleet'} · {f.check}: {_ICON[f.status.value]}", "", _cell(f.summary), ""]
        for e in f.evidence:
            out += [f"Evidence from `{e.probe}`:", "", "```", e.excerpt, "```", ""]

    passed = [f for f in analysis.findings if f.status in (Status.PASS, Status.SKIP)]
    if passed:
        out += ["## Passed and skipped", "", "| host | check | verdict | summary |", "| --- | --- | --- | --- |"]
        out += [f"| {f.host or 'fleet'} | {f.check} | {_ICON[f.status.value]} | {_cell(f.summary)} |" for f in passed]
        out.append("")
    return "\n".join(out)
