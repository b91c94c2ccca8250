"""How every report says a count and a host that was not reached, so that the terminal,
report.md, report.html, junit.xml and the pytest plugin say them alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from preflight.contracts import CONNECTIVITY_CHECK, NOT_CHECKED
from preflight.model import Finding

# A verdict counted: "5 pass", "3 fail", "2 warn" read as what the hosts (or findings) did;
# an error is a thing they have, so it takes a plural: "1 error", "3 errors".
_NOUNS = {"error": ("error", "errors")}


def counted(n: int, status: str) -> str:
    """``n`` hosts or findings of one status, as a summary line says it."""
    one, many = _NOUNS.get(status, (status, status))
    return f"{n} {one if n == 1 else many}"


def tally(counts: Mapping[str, int], order: Iterable[str] | None = None) -> str:
    """"5 pass, 3 fail, 2 errors": the non-zero counts, in ``order`` (default: the mapping's)."""
    keys = list(order) if order is not None else list(counts)
    return ", ".join(counted(counts[s], s) for s in keys if counts.get(s))


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """"1 host", "3 hosts"."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"


def not_checked(finding: Finding) -> list[str]:
    """The host checks an unreached host's connectivity finding says did not run ([] for any
    other finding)."""
    if finding.check != CONNECTIVITY_CHECK:
        return []
    ids = finding.data.get(NOT_CHECKED)
    return [str(i) for i in ids] if isinstance(ids, (list, tuple)) else []


def not_checked_line(finding: Finding) -> str:
    """"22 checks not run: gpu-inventory, nvlink, …", or "" for a finding that lists none."""
    ids = not_checked(finding)
    return f"{plural(len(ids), 'check')} not run: {', '.join(ids)}" if ids else ""
