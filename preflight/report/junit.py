"""``junit.xml``: one testcase per host x check, as CI systems render them.

A FAIL is a <failure>, an ERROR an <error>, a SKIP <skipped>; the message carries the
summary, and for failures the diagnosed cause and its action, so the CI page alone says
what to do.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from preflight.model import Analysis, Status
from preflight.report.wording import not_checked, not_checked_line


def render(analysis: Analysis) -> str:
    cause_of: dict[tuple[str, str], str] = {}
    for d in analysis.diagnoses:
        for h in d.hosts:
            for s in d.symptoms:
                cause_of.setdefault((h, s), f"cause: {d.cause} ({d.confidence}); action: {d.action}")

    suites = ET.Element("testsuites", name="preflight")
    for host in analysis.hosts:
        mine = analysis.findings_of(host)
        suite = ET.SubElement(suites, "testsuite", name=host, tests=str(len(mine)),
                              failures=str(sum(f.status is Status.FAIL for f in mine)),
                              errors=str(sum(f.status is Status.ERROR for f in mine)),
                              skipped=str(sum(f.status is Status.SKIP for f in mine)))
        for f in mine:
            case = ET.SubElement(suite, "testcase", classname=f"preflight.{host}", name=f.check)
            message = f.summary
            causes = sorted({cause_of[(host, s)] for s in f.symptoms if (host, s) in cause_of})
            if causes:
                message += " | " + " | ".join(causes)
            body = "\n\n".join([f"[{e.probe}]\n{e.excerpt}" for e in f.evidence]
                               + ([not_checked_line(f)] if not_checked(f) else []))
            if f.status is Status.FAIL:
                ET.SubElement(case, "failure", message=message).text = body
            elif f.status is Status.ERROR:
                ET.SubElement(case, "error", message=message).text = body
            elif f.status is Status.SKIP:
                ET.SubElement(case, "skipped", message=message)
            elif f.status is Status.WARN:
                ET.SubElement(case, "system-out").text = f"WARN: {message}"
    fleet = [f for f in analysis.findings if f.host is None]
    if fleet:
        suite = ET.SubElement(suites, "testsuite", name="fleet", tests=str(len(fleet)))
        for f in fleet:
            case = ET.SubElement(suite, "testcase", classname="preflight.fleet", name=f.check)
            if f.status in (Status.FAIL, Status.ERROR):
                ET.SubElement(case, "failure" if f.status is Status.FAIL else "error", message=f.summary)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
