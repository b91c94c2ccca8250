"""The listings ``preflight checks``, ``facts`` and ``explain --list`` print, as records.

One record type per listing, built from the code's own tables (the loaded checks, ``FACTS``,
``PROBES``, the knowledge base), so the terminal, ``--json``, a pipe and the generated reference
pages (``preflight.app.docsgen``) all say the same thing. Plain text for a pipe is one record per
line, tab-separated, never wrapped: a script splits on tabs and never mistakes a continued summary
for a new record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from preflight.collect import scripts
from preflight.collect.probe import Probe
from preflight.collect.probes import PROBES
from preflight.diagnose.engine import KnowledgeBase
from preflight.diagnose.explain import pointing_symptoms
from preflight.judge.facts import FACTS, probes_of
from preflight.model import Check
from preflight.shipped import checks_dir

# Facts named *_evidence are the (probe, record) pairs behind two public facts each: not for checks.
PRIVATE_FACT_SUFFIX = "_evidence"
SCRIPTS_DIR = "preflight/collect/scripts"


@dataclass(frozen=True)
class CheckRecord:
    id: str
    scope: str  # host | fleet | soak
    summary: str
    facts: tuple[str, ...]
    probes: tuple[str, ...]
    source: str  # the file it was loaded from, as the reader finds it (checks/nvlink.py)


@dataclass(frozen=True)
class FactRecord:
    name: str
    doc: str
    probes: tuple[str, ...]  # every probe behind it, through the facts it needs, in catalogue order
    needs: tuple[str, ...]


@dataclass(frozen=True)
class CauseRecord:
    id: str
    title: str
    meaning: str
    evidence: tuple[str, ...]
    actions: tuple[str, ...]
    references: tuple[str, ...]
    pointed_to_by: tuple[str, ...]  # each way a diagnosis reaches it (preflight explain's lines)


@dataclass(frozen=True)
class ProbeRecord:
    id: str
    description: str
    tool: str  # the program whose absence makes it tool-missing
    calls: tuple[str, ...]  # the other programs its script runs (a hung one passes the probe over)
    command: tuple[str, ...]  # argv; a script probe's script is named, not pasted
    script: str | None  # the script file a `sh -c` probe runs
    active: bool
    after_active: bool
    parametrised: bool  # its arguments come from the run's options


def source_of(check: Check) -> str:
    """``checks/<file>.py`` for a built-in check, else the file (or entry point) it came from."""
    path = Path(check.origin.split(":", 1)[0])
    if path.parent.resolve() == checks_dir().resolve():
        return f"checks/{path.name}"  # the package's own checks, wherever it is installed
    return check.origin


def check_records(checks: list[Check]) -> list[CheckRecord]:
    return [CheckRecord(c.id, c.scope, c.summary, tuple(c.facts), tuple(c.probes), source_of(c)) for c in checks]


def plain(doc: str) -> str:
    """A docstring's paragraph as a person reads it: its line breaks and indentation one space, and
    reStructuredText's ``code`` as `code` (also a Markdown code span, for the reference pages)."""
    return " ".join(doc.split()).replace("``", "`")


def fact_records() -> list[FactRecord]:
    out = []
    for name, fact in FACTS.items():
        if name.endswith(PRIVATE_FACT_SUFFIX):
            continue
        behind = probes_of([name])
        needs = tuple(n for n in fact.needs if not n.endswith(PRIVATE_FACT_SUFFIX))
        out.append(FactRecord(name, plain(fact.doc), tuple(p for p in PROBES if p in behind), needs))
    return out


def cause_records(kb: KnowledgeBase) -> list[CauseRecord]:
    return [CauseRecord(c.id, c.title, c.meaning, tuple(c.evidence), tuple(c.actions), tuple(c.references),
                        tuple(pointing_symptoms(c.id, kb)))
            for c in (kb.causes[cid] for cid in sorted(kb.causes))]


def _script_name(text: str) -> str | None:
    # A script probe's argv holds the script's text; the file it came from is the one it starts with
    # (nccl_all_reduce.sh has a placeholder filled in after its first line).
    first = text.splitlines()[0] if text else ""
    for path in sorted(Path(scripts.__file__).parent.glob("*.sh")):
        if scripts.read(path.name).splitlines()[0] == first:
            return path.name
    return None


def probe_record(probe: Probe) -> ProbeRecord:
    script = None
    command = probe.argv
    if probe.argv[:2] == ("sh", "-c") and len(probe.argv) > 2:
        script = _script_name(probe.argv[2])
        named = f"{SCRIPTS_DIR}/{script}" if script else "SCRIPT"
        command = ("sh", "-c", named, *probe.argv[3:])
    return ProbeRecord(probe.id, probe.description, probe.tool, probe.tools[1:], command, script, probe.active,
                       probe.after_active, probe.arguments is not None)


def probe_records() -> list[ProbeRecord]:
    return [probe_record(p) for p in PROBES.values()]


def as_json(records: list) -> list[dict]:
    return [asdict(r) for r in records]


def _cell(text: str) -> str:
    # One record per line: a tab or newline inside a field would split it.
    return " ".join(str(text).split())


def tsv(rows: list[tuple]) -> str:
    """Tab-separated lines, one per row; list fields joined with commas."""
    lines = []
    for row in rows:
        lines.append("\t".join(_cell(",".join(v) if isinstance(v, tuple) else v) for v in row))
    return "".join(line + "\n" for line in lines)


def checks_tsv(records: list[CheckRecord]) -> str:
    return tsv([(r.id, r.scope, r.facts, r.probes, r.summary) for r in records])


def facts_tsv(records: list[FactRecord]) -> str:
    return tsv([(r.name, r.probes, r.doc) for r in records])


def causes_tsv(records: list[CauseRecord]) -> str:
    return tsv([(r.id, r.title) for r in records])
