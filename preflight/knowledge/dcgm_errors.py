"""DCGM's diagnostic error codes (``playbooks/dcgm_errors.yaml``) as typed records, read once.

The YAML quotes, per ``dcgmError_t`` code, NVIDIA's message, next step, severity and category
(dcgm_errors.h / dcgm_errors.c, version in its header) and adds the preflight cause id a failure
with that code points to. ``identify`` finds the code of a message from the text table, which
prints no codes: each ``message`` format string becomes a pattern (its %-placeholders match any
run of text), the longest literal wins, and a few older wordings are listed under
``text_signatures``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from preflight.knowledge.datafile import read_yaml
from preflight.shipped import playbooks_dir

TABLE_PATH = playbooks_dir() / "dcgm_errors.yaml"
FORMAT = "preflight-dcgm-errors/1"
# A template with less literal text than this would match unrelated prose ("%s", "Test %s ...").
MIN_LITERAL = 12
_PLACEHOLDER = re.compile(r"%[-#+ 0-9.]*(?:ll|l|z|h)?[diuxXfegsc%]")


class DcgmErrorTableError(ValueError):
    pass


@dataclass(frozen=True)
class DcgmError:
    code: int
    name: str
    brief: str
    message: str  # NVIDIA's format string
    next: str  # NVIDIA's next step ("" when DCGM gives none)
    severity: str  # none | monitor | isolate | unknown | triage | config | reset
    severity_meaning: str
    category: str
    cause: str  # a preflight cause id
    possible: str | None = None  # a cause that may explain it, offered with low confidence


@dataclass(frozen=True)
class DcgmErrorTable:
    errors: dict[int, DcgmError]
    version: str
    source: str
    patterns: tuple[tuple[re.Pattern[str], int], ...]  # longest literal first

    def get(self, code: int | None) -> DcgmError | None:
        return self.errors.get(code) if code is not None else None

    def identify(self, text: str) -> DcgmError | None:
        """The code whose message this text carries (a table row's joined warning), or None."""
        flat = " ".join(text.split())
        for pattern, code in self.patterns:
            if pattern.search(flat):
                return self.errors[code]
        return None


def _template(message: str) -> tuple[re.Pattern[str], int] | None:
    parts = _PLACEHOLDER.split(" ".join(message.split()))
    literal = sum(len(p.strip()) for p in parts)
    if literal < MIN_LITERAL:
        return None
    # The table wraps text at a fixed width and joins with spaces, so any literal space may
    # have become several or none at a wrap: match whitespace loosely.
    body = r".+?".join(r"\s*".join(re.escape(w) for w in p.split(" ")) for p in parts)
    return re.compile(body, re.IGNORECASE), literal


@cache
def load_dcgm_errors(path: Path = TABLE_PATH) -> DcgmErrorTable:
    data = read_yaml(path, DcgmErrorTableError)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DcgmErrorTableError(f"{path}: not a {FORMAT} file")
    meanings = {name: str(body.get("meaning", "")) for name, body in (data.get("severities") or {}).items()}
    errors: dict[int, DcgmError] = {}
    for code, body in (data.get("errors") or {}).items():
        severity = body.get("severity")
        if severity not in meanings:
            raise DcgmErrorTableError(f"{path}: code {code}: severity {severity!r} is not under 'severities:'")
        if not body.get("cause"):
            raise DcgmErrorTableError(f"{path}: code {code}: no cause")
        errors[int(code)] = DcgmError(int(code), str(body["name"]), str(body.get("brief", "")),
                                      str(body.get("message", "")), str(body.get("next", "")), severity,
                                      meanings[severity], str(body.get("category", "")), str(body["cause"]),
                                      str(body["possible"]) if body.get("possible") else None)
    ranked: list[tuple[int, re.Pattern[str], int]] = []
    for code, err in errors.items():
        if code == 0:
            continue
        made = _template(err.message)
        if made:
            ranked.append((made[1], made[0], code))
    for sig in data.get("text_signatures") or ():
        if int(sig["code"]) not in errors:
            raise DcgmErrorTableError(f"{path}: text signature {sig['pattern']!r}: unknown code {sig['code']}")
        ranked.append((len(sig["pattern"]), re.compile(sig["pattern"], re.IGNORECASE), int(sig["code"])))
    ranked.sort(key=lambda t: -t[0])
    return DcgmErrorTable(errors, str(data.get("dcgm_version", "")), str(data.get("source", "")),
                          tuple((p, c) for _, p, c in ranked))
