"""report.md: a node's output cannot break out of its code block or inject markup
(preflight/report/markdown.py). The finding is rendered from a real capture's line with a
hostile tail appended, as a compromised or buggy node could print it."""

from __future__ import annotations

import re

from preflight.model import Analysis, Evidence, Finding, HostVerdict, Status
from preflight.report import markdown

HOSTILE = ("[  12.345] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n"
           "```\n<img src=x onerror=alert(1)> [click](http://evil.example)\n````\n~~~")


def _report(excerpt: str, summary: str = "fine") -> str:
    f = Finding("xid", "gpu01", Status.FAIL, summary, ("gpu-fallen-off-bus",), (Evidence("kernel-log", excerpt),))
    return markdown.render(Analysis({"gpu01": HostVerdict("fail", True, "hgx-h200", "t")}, [f], [], []))


def _code_blocks(text: str) -> list[tuple[str, str]]:
    """(fence, body) of each fenced block, CommonMark style: closed by a fence at least as long."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^(`{3,}|~{3,})", lines[i])
        if m:
            fence, body, i = m.group(1), [], i + 1
            while i < len(lines) and not (lines[i].startswith(fence[0] * len(fence))
                                          and set(lines[i].strip()) == {fence[0]}):
                body.append(lines[i])
                i += 1
            blocks.append((fence, "\n".join(body)))
        i += 1
    return blocks


def test_an_excerpt_with_code_fences_stays_inside_its_block():
    text = _report(HOSTILE)
    [(fence, body)] = _code_blocks(text)
    assert body == HOSTILE and len(fence) == 5
    outside = text.replace(body, "")
    assert "<img" not in outside and "http://evil.example" not in outside


def test_html_and_links_in_a_summary_are_literal():
    text = _report("ok", summary="<script>x</script> see [here](http://evil.example) | col")
    assert "\\<script\\>" in text and "\\[here\\]" in text and "\\| col" in text
    assert "<script>" not in text
