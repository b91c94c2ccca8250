"""Parser for DCGM's background health check: the ``dcgmi-health`` probe, or a pasted ``dcgmi health -c``.

The probe (``preflight/collect/scripts/dcgmi_health.sh``) runs ``dcgmi health -s a`` (watch every
subsystem) and then ``dcgmi health -c -j``, each followed by a marker line
``# preflight: dcgmi-health set|check exit=C``. A capture without the markers (a user's
``dcgmi health -c`` or ``-c -j``) parses the same way.

The report has two forms, told apart by content (dcgmi/Health.cpp and dcgmi/DcgmiOutput.cpp of
DCGM 4.6.0 write both from one tree):
- JSON (``-j``): ``{"header": ["Health Monitor Report"], "body": {"Overall Health": {"value":
  H}, "GPU": {"children": {"0": {"value": H, "children": {"Errors": {"children": {"Memory
  system": {"value": H, "overflow": [message lines]}}}}}}}}}``;
- the text tree: ``| Overall Health | H |``, then per entity group a row ``| GPU |``, per
  entity ``| -> 0 | H |``, ``|    -> Errors |``, ``|       -> Memory system | H |`` and the
  incident's message in the value column of the rows below it, split at 54 characters.
H is ``Healthy``, ``Warning``, ``Failure`` or ``Internal error``. dcgmi prints no DCGM error code,
only the incident's message: the check finds the code from the message
(``preflight.knowledge.dcgm_errors``). dcgmi's own ``Error:`` lines (no host engine, watches
not enabled) are kept as ``errors``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from preflight.parse import ParseError

HEALTH_WORDS = {"healthy": "pass", "warning": "warn", "failure": "fail", "internal error": "error"}
_MARKER = re.compile(r"^# preflight: dcgmi-health (set|check) exit=(-?[0-9]+)\s*$")
_ERROR_LINE = re.compile(r"^\s*Error:\s*(.+?)\s*$")
_SET_OK = "Health monitor systems set successfully."
_ROW = re.compile(r"^\|\s?(?P<left>[^|]*?)\s*\|\s?(?P<right>[^|]*?)\s*\|\s*$")
_HEADER = "Health Monitor Report"


@dataclass(frozen=True)
class Incident:
    system: str  # "Memory system", "PCIe system", "NVLINK system", ... as dcgmi names it
    health: str  # pass | warn | fail | error
    message: str  # the incident message(s), lines joined


@dataclass(frozen=True)
class Entity:
    group: str  # GPU, Switch, CPU, ... (DcgmFieldsGetEntityGroupString)
    id: str
    health: str  # pass | warn | fail | error
    incidents: tuple[Incident, ...]

    @property
    def label(self) -> str:
        return f"{self.group} {self.id}"


@dataclass(frozen=True)
class DcgmHealth:
    form: str  # json | text | none (no report: only dcgmi's errors)
    overall: str | None  # pass | warn | fail | error
    entities: tuple[Entity, ...]
    errors: tuple[str, ...]  # dcgmi's "Error:" lines
    watches_set: bool | None  # "Health monitor systems set successfully." seen (None: no set step)
    exits: dict[str, int]  # marker exit codes: set, check

    @property
    def incidents(self) -> tuple[tuple[Entity, Incident], ...]:
        return tuple((e, i) for e in self.entities for i in e.incidents)


def health_word(word: str | None) -> str | None:
    return HEALTH_WORDS.get((word or "").strip().lower(), "unknown" if word and word.strip() else None)


def parse_dcgmi_health(text: str) -> DcgmHealth:
    """The probe's output or a pasted report; ParseError when it holds neither a report nor
    dcgmi's own ``Error:`` lines."""
    exits: dict[str, int] = {}
    body: list[str] = []
    for line in text.splitlines():
        if m := _MARKER.match(line):
            exits[m.group(1)] = int(m.group(2))
        else:
            body.append(line)
    rest = "\n".join(body)
    errors = tuple(m.group(1) for line in body if (m := _ERROR_LINE.match(line)))
    watches_set = True if _SET_OK in rest else (False if "set" in exits else None)
    start = rest.find("{")
    if start >= 0:
        try:
            doc = json.loads(rest[start:rest.rfind("}") + 1])
        except ValueError as exc:
            raise ParseError(f"dcgmi health JSON does not parse: {exc}") from None
        overall, entities = _from_json(doc)
        return DcgmHealth("json", overall, entities, errors, watches_set, exits)
    if _HEADER in rest:
        overall, entities = _from_text(body)
        return DcgmHealth("text", overall, entities, errors, watches_set, exits)
    if errors or exits:
        return DcgmHealth("none", None, (), errors, watches_set, exits)
    raise ParseError("not dcgmi health output: no 'Health Monitor Report', no JSON report, no 'Error:' line")


# ---- JSON ----------------------------------------------------------------------------------


def _from_json(doc) -> tuple[str | None, tuple[Entity, ...]]:
    if not isinstance(doc, dict) or not isinstance(doc.get("body"), dict):
        raise ParseError("dcgmi health JSON without a 'body' object")
    if _HEADER not in (doc.get("header") or []):
        raise ParseError(f"dcgmi health JSON whose header is not {_HEADER!r}")
    body = doc["body"]
    overall = body.get("Overall Health")
    if not isinstance(overall, dict) or "value" not in overall:
        raise ParseError("dcgmi health JSON without 'Overall Health'")
    entities = []
    for group, section in body.items():
        if group == "Overall Health" or not isinstance(section, dict):
            continue
        for eid, node in _children(section).items():
            incidents = []
            for system, inc in _children(_children(node).get("Errors", {})).items():
                lines = inc.get("overflow") if isinstance(inc.get("overflow"), list) else []
                incidents.append(Incident(system, health_word(_value(inc)) or "unknown",
                                          " ".join(str(x).strip() for x in lines)))
            entities.append(Entity(group, str(eid), health_word(_value(node)) or "unknown", tuple(incidents)))
    return health_word(_value(overall)), tuple(entities)


def _children(node) -> dict:
    kids = node.get("children") if isinstance(node, dict) else None
    return {str(k): v for k, v in kids.items() if isinstance(v, dict)} if isinstance(kids, dict) else {}


def _value(node) -> str | None:
    v = node.get("value") if isinstance(node, dict) else None
    return str(v) if v is not None else None


# ---- text tree -----------------------------------------------------------------------------


def _from_text(lines: list[str]) -> tuple[str | None, tuple[Entity, ...]]:
    overall = None
    groups: list[dict] = []  # {"group", "entities": [{"id", "health", "incidents": [...]}]}
    entity: dict | None = None
    incident: dict | None = None
    for line in lines:
        m = _ROW.match(line.rstrip())
        if not m:
            continue
        left, right = m["left"], m["right"]
        label = left.strip()
        depth = (len(left) - len(left.lstrip())) // 3 + 1 if label.startswith("->") else 0
        label = label[2:].strip() if depth else label
        if depth == 0 and label == "Overall Health":
            overall = health_word(right)
        elif depth == 0 and label and not right:
            groups.append({"group": label, "entities": []})
            entity = incident = None
        elif depth == 1 and groups:
            entity = {"id": label, "health": health_word(right) or "unknown", "incidents": []}
            groups[-1]["entities"].append(entity)
            incident = None
        elif depth >= 3 and entity is not None:
            incident = {"system": label, "health": health_word(right) or "unknown", "lines": []}
            entity["incidents"].append(incident)
        elif not label and right and incident is not None:
            incident["lines"].append(right)
    entities = tuple(Entity(g["group"], e["id"], e["health"],
                            tuple(Incident(i["system"], i["health"], " ".join(i["lines"])) for i in e["incidents"]))
                     for g in groups for e in g["entities"])
    if overall is None:
        raise ParseError("dcgmi health report without an 'Overall Health' row")
    return overall, entities
