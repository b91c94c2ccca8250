"""``report.md``: the run as a person reads it: verdicts, diagnoses, then the evidence."""

from __future__ import annotations

import re
from collections import Counter

from preflight.model import Analysis, Status
from preflight.printable import printable, printable_lines
from preflight.report.wording import not_checked, not_checked_line, tally

_ICON = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "error": "ERROR", "skip": "SKIP"}


def _cell(text: str) -> str:
    """Text from a node or a check as one line of Markdown prose: a table's ``|`` escaped, and
    HTML tags and link syntax made literal, so a node's output cannot inject markup."""
    for ch in ("\\", "|", "<", ">", "[", "]", "`"):
        text = text.replace(ch, "\\" + ch)
    # Control characters (a newline would start a line, or a heading, of its own) shown as
    # their escapes, once the backslashes above are doubled: \\n renders as \n.
    return printable(text)


def _code(text: str) -> str:
    """A code span holding ``text`` whole (its backticks longer than any run inside it)."""
    text = printable(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    tick = "`" * (longest + 1)
    return f"{tick} {text} {tick}" if longest else f"`{text}`"


def _fenced(excerpt: str) -> list[str]:
    """A code block that holds ``excerpt`` whole: its fence is longer than any run of
    backticks (or tildes) in it, so an excerpt containing ``` cannot close the block and
    put the rest of a node's output outside it (CommonMark's fenced code blocks)."""
    excerpt = printable_lines(excerpt)
    longest = max((len(run) for run in re.findall(r"`+|~+", excerpt)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, excerpt, fence]


def render(analysis: Analysis) -> str:
    meta = analysis.meta
    counts = Counter(v.status for v in analysis.hosts.values())
    out = [f"# preflight report {meta.get('run_id', '')}".rstrip(), ""]
    if meta.get("created"):
        out += [f"Created {meta['created']} by preflight {meta.get('preflight_version', '')}.", ""]
    out += ["**Hosts:** " + (tally(counts, sorted(counts)) or "none"), ""]

    out += ["## Diagnoses", ""]
    if not analysis.diagnoses:
        out += ["No faults diagnosed.", ""]
    for d in analysis.diagnoses:
        hosts = _cell(", ".join(d.hosts)) or "fleet"
        # The playbook's title and action are Markdown of the project's own (`code` spans);
        # the evidence quotes nodes: its control characters are shown, never obeyed.
        out += [f"### {printable(d.title or d.cause)} — `{printable(d.cause)}` ({printable(d.confidence)} confidence)",
                "", f"- **Hosts:** {hosts}", f"- **Evidence:** {printable(d.evidence)}",
                f"- **Symptoms:** {_cell(', '.join(d.symptoms))}", f"- **Action:** {printable(d.action)}", ""]

    out += ["## Hosts", "", "| host | verdict | profile | not passing |", "| --- | --- | --- | --- |"]
    for host, v in analysis.hosts.items():
        bad = [f.check for f in analysis.findings_of(host) if f.status in (Status.FAIL, Status.ERROR, Status.WARN)]
        out.append(f"| {_cell(host)} | {_ICON[v.status]} | {_cell(str(v.profile))} | {_cell(', '.join(bad)) or '-'} |")
    out.append("")

    out += ["## Findings", ""]
    for f in analysis.findings:
        if f.status in (Status.PASS, Status.SKIP):
            continue
        out += [f"### {_cell(f.host or 'fleet')} · {_cell(f.check)}: {_ICON[f.status.value]}", "", _cell(f.summary), ""]
        if not_checked(f):
            out += [_cell(not_checked_line(f)), ""]
        for e in f.evidence:
            out += [f"Evidence from {_code(e.probe)}:", "", *_fenced(e.excerpt), ""]

    out += _serving(meta.get("soak") or {})

    passed = [f for f in analysis.findings if f.status in (Status.PASS, Status.SKIP)]
    if passed:
        out += ["## Passed and skipped", "", "| host | check | verdict | summary |", "| --- | --- | --- | --- |"]
        out += [f"| {_cell(f.host or 'fleet')} | {_cell(f.check)} | {_ICON[f.status.value]} | {_cell(f.summary)} |"
                for f in passed]
        out.append("")
    # What the soak's reader tolerated (a cut-off last line, time going back, fields it does not
    # know): in report.json's soak_notes, and here, where a person reads the report.
    notes = meta.get("soak_notes") or []
    if notes:
        out += ["## Notes on the soak data", "", *[f"- {_cell(str(n))}" for n in notes], ""]
    return "\n".join(out)


def _num(value, digits: int = 0) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _serving(section: dict) -> list[str]:
    """A served model's goodput beside its throughput, and each concurrency sweep's levels with
    the knee (the soak section's ``requests_per_s``, ``goodput_requests_per_s`` and ``sweep``)."""
    out: list[str] = []
    rates = [(h, s) for h, s in sorted(section.items()) if isinstance(s, dict) and s.get("requests_per_s") is not None]
    if rates:
        out += ["## Serving", "", "| host | requests/s | goodput req/s | output tokens/s at first | at the end |",
                "| --- | --- | --- | --- | --- |"]
        out += [f"| {h} | {_num(s.get('requests_per_s'), 2)} | {_num(s.get('goodput_requests_per_s'), 2)} | "
                f"{_num(s.get('throughput_baseline'))} | {_num(s.get('throughput_final'))} |" for h, s in rates]
        out.append("")
    for host, s in sorted(section.items()):
        swept = s.get("sweep") if isinstance(s, dict) else None
        if not isinstance(swept, dict):
            continue
        out += [f"### Concurrency sweep on {host}: knee {swept.get('knee') or 'not reached'}, recommended: "
                f"{swept.get('recommended') or 'none'}", "", _cell(str(swept.get("reason", ""))), "",
                "| in flight | output tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | errors "
                "| goodput req/s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for lv in swept.get("levels") or ():
            cells = [str(lv.get("concurrency")), _num(lv.get("tokens_per_s")),
                     *(_num(lv.get(k)) for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")),
                     str(lv.get("errors")), _num(lv.get("goodput_requests_per_s"), 2)]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return out
