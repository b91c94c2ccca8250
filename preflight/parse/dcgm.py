"""Parsers for DCGM: ``dcgmi diag`` (JSON or the text table) and ``dcgmi discovery -l``.

The bundle's ``dcgmi-diag.txt`` holds either form, told apart by content: a JSON document
(``dcgmi diag -j``, what the probe runs) or the table people paste from a terminal. Both become
one ``DcgmDiag``, so a pasted table is judged like the probe's JSON.

JSON shapes (field names from NVIDIA/DCGM's nvvs JSON writer and testing/python3/dcgm_diag_schema.json;
real documents in tests/fixtures/corpus/dcgm):

- DCGM 3.x: ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"gpu_id" | "gpu_ids": "0,1", "status", "warnings", "info"}]}]}], "version", ...}}``;
  ``warnings`` are objects (``warning``, ``error_id``, ``error_severity``, ``error_category``) or,
  in older releases, bare strings.
- DCGM 4.x: the tree is keyed ``"DCGM Diagnostic"``; results name an ``entity_group`` and an
  ``entity_id``; each test has a ``test_summary`` with its own status, warnings and info; the
  versions move to ``"metadata"`` (``version``, ``Driver Version Detected``); a diag that could not
  run says so in ``runtime_error``.

The text table has two columns, a fixed-width name cell and a value cell, with long messages
wrapped at the cell's width, mid-word (``second`` / ``s started``): a message is rebuilt by
joining the raw cells of its rows, then collapsing whitespace. Section rows
(``|-----  Deployment  ----+...``) name the category. A test's row gives its overall word
(``Pass``, ``Fail - All``, ``Pass - GPUs: 1, 2``); DCGM 4.x adds one ``GPU3: Pass`` row per GPU,
3.x ``Fail - GPU: 0`` rows. ``Warning`` / ``Info`` / ``Error`` rows belong to the test above them;
an ``Error`` row with no test above it (a run stopped in Deployment) belongs to the run.

Statuses are kept apart as DCGM printed them, normalised to ``pass`` / ``fail`` / ``warn`` /
``skip`` / ``not-run``; a word never seen before is ``unknown``, never a pass.

The probe (``preflight/collect/dcgm.py``) frames dcgmi's output with ``# preflight:`` lines (level,
whether it was asked for, its limit, the exit code and seconds); those become ``DiagRun``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from preflight.parse import ParseError

_STATUS_WORDS = {"pass": "pass", "passed": "pass", "fail": "fail", "failed": "fail", "warn": "warn",
                 "warning": "warn", "skip": "skip", "skipped": "skip", "not run": "not-run", "notrun": "not-run"}
_RANK = {"fail": 5, "warn": 4, "unknown": 3, "not-run": 2, "pass": 1, "skip": 0}
_MARKER = re.compile(r"^# preflight: dcgmi-diag (.*)$")
_MARKER_FIELD = re.compile(r"(\w+)=(\S+)")
_SECTION = re.compile(r"^[|+]-{3,}\s+(\S.*?)\s+-+\+")
_BORDER = re.compile(r"^\+(-+)\+(-+)\+?\s*$")
_STATUS_CELL = re.compile(r"^(pass|fail|warn|warning|skip|skipped|not run)\b\s*(?:-\s*(.*))?$", re.IGNORECASE)
_GPU_ROW = re.compile(r"^GPU\s*([0-9]+)\s*:\s*(pass|fail|warn|warning|skip|skipped|not run)\s*$", re.IGNORECASE)
_GPU_LIST = re.compile(r"^GPUs?\s*:\s*([0-9,\s]+)$", re.IGNORECASE)
_LEADING_GPU = re.compile(r"^\s*GPU\s*([0-9]+)\b")
_ERROR_LINE = re.compile(r"^\s*Error:\s*(.+)$")
_BANNER = "Successfully ran diagnostic for group."
_MESSAGE_ROWS = {"warning": "warning", "info": "info", "error": "error"}


@dataclass(frozen=True)
class DiagMessage:
    """A warning, info or error line; ``code`` etc. only where the JSON gives them."""

    kind: str  # warning | info | error
    text: str
    gpu: int | None = None
    code: int | None = None  # dcgmError_t
    severity: int | None = None  # dcgmErrorSeverity_t
    category: int | None = None  # dcgmErrorCategory_t


@dataclass(frozen=True)
class GpuResult:
    gpu: int | None  # None: the row covers every GPU ("Fail - All")
    status: str


@dataclass(frozen=True)
class DiagTest:
    name: str
    category: str | None
    status: str  # the test's overall word (test_summary, or the table's test row)
    results: tuple[GpuResult, ...]
    messages: tuple[DiagMessage, ...]


@dataclass(frozen=True)
class DiagRun:
    """How the probe ran dcgmi (its ``# preflight:`` lines); absent for a pasted capture."""

    level: int | None
    asked: bool  # the user chose the level (--dcgm-level), rather than the default
    limit_s: float | None
    exit_code: int | None  # None: the output ends before the closing line (the probe was cut)
    seconds: float | None

    @property
    def timed_out(self) -> bool:
        return self.exit_code in (124, 137)


@dataclass(frozen=True)
class DcgmDiag:
    form: str  # json | text | none (no result document: only error lines, or nothing)
    version: str | None
    driver: str | None
    tests: tuple[DiagTest, ...]
    # The run's own messages, outside any test: runtime_error, dcgmi's "Error:" lines, a table's
    # Deployment "Error" row (a run stopped before its tests), rows an excerpt cut from their test.
    messages: tuple[DiagMessage, ...]
    run: DiagRun | None
    notes: tuple[str, ...] = ()


def status_word(word: str | None) -> str:
    return _STATUS_WORDS.get((word or "").strip().lower(), "unknown")


def worst(statuses) -> str:
    statuses = list(statuses)
    return max(statuses, key=lambda s: _RANK.get(s, 3)) if statuses else "unknown"


def parse_dcgmi_diag(text: str) -> DcgmDiag:
    """A ``DcgmDiag`` from the probe's output or a pasted ``dcgmi diag`` (JSON or table).

    ParseError when the text is none of those (nor dcgmi's own ``Error:`` lines)."""
    run, body = _split_markers(text)
    stripped = body.strip()
    start, end = stripped.find("{"), stripped.rfind("}")
    if start != -1 and end > start:
        try:
            doc = json.loads(stripped[start:end + 1])
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            errors = tuple(DiagMessage("error", m) for m in _error_lines(stripped[:start] + stripped[end + 1:]))
            return _from_json(doc, run, errors)
    if re.search(r"^\|.*\|", body, re.MULTILINE) or _SECTION.search(body):
        return _from_table(body, run)
    errors = tuple(DiagMessage("error", m) for m in _error_lines(body))
    if errors or not stripped:
        note = () if stripped else ("dcgmi printed nothing",)
        return DcgmDiag("none", None, None, (), errors, run, note)
    raise ParseError("not dcgmi diag output: no JSON document, no result table, no 'Error:' line")


def _split_markers(text: str) -> tuple[DiagRun | None, str]:
    fields: dict[str, str] = {}
    body: list[str] = []
    marked = False
    for line in text.splitlines():
        m = _MARKER.match(line)
        if m:
            marked = True
            fields.update(_MARKER_FIELD.findall(m.group(1)))
        else:
            body.append(line)
    if not marked:
        return None, text
    return DiagRun(_num(fields.get("level"), int), fields.get("asked") == "1", _num(fields.get("limit"), float),
                   _num(fields.get("exit"), int), _num(fields.get("seconds"), float)), "\n".join(body)


def _num(value: str | None, kind):
    try:
        return kind(value) if value is not None else None
    except ValueError:
        return None


def _error_lines(text: str) -> list[str]:
    return [m.group(1).strip() for line in text.splitlines() if (m := _ERROR_LINE.match(line))]


# ---- JSON ----------------------------------------------------------------------------------


def _from_json(doc: dict, run: DiagRun | None, errors: tuple[DiagMessage, ...]) -> DcgmDiag:
    root = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic")
    if not isinstance(root, dict):
        raise ParseError("JSON without a 'DCGM Diagnostic' (4.x) or 'DCGM GPU Diagnostic' (3.x) object")
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    version = meta.get("version") or root.get("version")
    driver = (meta.get("Driver Version Detected") or root.get("Driver Version Detected")
              or root.get("driver_version_detected"))
    runtime = [root.get("runtime_error"), doc.get("runtime_error")]
    errors = errors + tuple(DiagMessage("error", str(r)) for r in runtime if r)
    tests: list[DiagTest] = []
    for category in root.get("test_categories") or ():
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or ():
            if isinstance(test, dict):
                tests.append(_json_test(test, category.get("category")))
    return DcgmDiag("json", _str(version), _str(driver), tuple(tests), errors, run)


def _str(value) -> str | None:
    return str(value) if value not in (None, "") else None


def _json_test(test: dict, category: str | None) -> DiagTest:
    results: list[GpuResult] = []
    messages: list[DiagMessage] = []
    others: list[str] = []  # statuses of results for entities other than GPUs
    for r in test.get("results") or ():
        if not isinstance(r, dict):
            continue
        gpus = _json_gpus(r)
        status = status_word(r.get("status"))
        results.extend(GpuResult(g, status) for g in gpus)
        if not gpus:
            others.append(status)
        gpu = gpus[0] if len(gpus) == 1 else None
        messages.extend(_json_messages(r, gpu))
    summary = test.get("test_summary") if isinstance(test.get("test_summary"), dict) else {}
    for m in _json_messages(summary, None):
        # 4.5 repeats a result's warning in the summary: keep each message once.
        if not any(m.text == seen.text and m.code == seen.code for seen in messages):
            messages.append(m)
    status = (status_word(summary["status"]) if summary.get("status")
              else worst([r.status for r in results] + others))
    return DiagTest(str(test.get("name", "?")), category, status, tuple(results), tuple(messages))


def _json_gpus(result: dict) -> list[int | None]:
    group = result.get("entity_group")
    if "entity_id" in result and group in (None, "GPU"):
        return [_num(str(result["entity_id"]), int)]
    if group not in (None, "GPU"):
        return []  # a CPU or NVSwitch entity (4.x): its status counts in the test's, not as a GPU
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is None:
        return [None]
    found = [_num(x.strip(), int) for x in str(ids).split(",") if x.strip()]
    return found or [None]


def _json_messages(holder: dict, gpu: int | None) -> list[DiagMessage]:
    out: list[DiagMessage] = []
    for kind, key in (("warning", "warnings"), ("info", "info")):
        items = holder.get(key)
        if items is None:
            continue
        for item in items if isinstance(items, list) else [items]:
            if isinstance(item, dict):
                text = str(item.get("warning") or item.get("info") or item.get("message") or "")
                out.append(DiagMessage(kind, " ".join(text.split()), gpu, _int(item.get("error_id")),
                                       _int(item.get("error_severity")), _int(item.get("error_category"))))
            elif item:
                out.append(DiagMessage(kind, " ".join(str(item).split()), gpu))
    return out


def _int(value) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


# ---- text table ----------------------------------------------------------------------------


@dataclass
class _Test:
    name: str
    category: str | None
    status: str
    results: list[GpuResult]
    messages: list[list]  # [kind, raw text]


def _from_table(body: str, run: DiagRun | None) -> DcgmDiag:
    # dcgmi's widths: a 25-character name cell, and messages wrapped at 45 characters inside a
    # 46-character value cell; a border line, when there, says otherwise.
    name_w, value_w = 25, 45
    meta: dict[str, str] = {}
    tests: list[_Test] = []
    run_errors: list[list] = []
    notes: list[str] = []
    section: str | None = None
    current: _Test | None = None
    message: list | None = None  # the message rows are being appended to
    for line in body.splitlines():
        if (b := _BORDER.match(line.strip())) and not _SECTION.match(line):
            name_w, value_w = len(b.group(1)) - 2, len(b.group(2)) - 3
            continue
        if line.strip() and set(line.strip()) <= set("|=+-"):
            continue
        if s := _SECTION.match(line):
            section, current, message = s.group(1).strip(), None, None
            continue
        if not line.startswith("|"):
            if m := _ERROR_LINE.match(line):
                run_errors.append(["error", m.group(1)])
            elif line.strip() and line.strip() != _BANNER:
                notes.append(f"not a table row: {line.strip()[:80]}")
            continue
        name = line[2:2 + name_w].strip()
        raw = line[name_w + 5:name_w + 5 + value_w].rstrip("|")
        value = raw.strip()
        if name == "Diagnostic" and value == "Result":
            continue
        if section == "Metadata" and name:
            meta[name] = value
            continue
        if name.lower() in _MESSAGE_ROWS:
            message = [_MESSAGE_ROWS[name.lower()], raw]
            (current.messages if current else run_errors).append(message)
            continue
        if name:
            word = _STATUS_CELL.match(value)
            status = status_word(word.group(1)) if word else "unknown"
            current = _Test(name, section, status, [], [])
            current.results.extend(_cell_results(word.group(2) if word else None, status))
            tests.append(current)
            message = None
            continue
        if (g := _GPU_ROW.match(value)) and current:
            current.results.append(GpuResult(int(g.group(1)), status_word(g.group(2))))
            message = None
        elif (w := _STATUS_CELL.match(value)) and w.group(2) and current:
            current.results.extend(_cell_results(w.group(2), status_word(w.group(1))))
            message = None
        elif message is not None:
            message[1] += raw
        elif value:
            notes.append(f"a wrapped row with nothing above it to continue: {value[:60]}")
    # A 3.x row "Pass - GPUs: 1, 2" followed by "Fail - GPU: 0" is a failed test.
    built = tuple(DiagTest(t.name, t.category, worst([t.status] + [r.status for r in t.results]), tuple(t.results),
                           tuple(_message(k, r) for k, r in t.messages)) for t in tests)
    return DcgmDiag("text", meta.get("DCGM Version"), meta.get("Driver Version Detected"), built,
                    tuple(_message(k, r) for k, r in run_errors), run, tuple(notes))


def _cell_results(tail: str | None, status: str) -> list[GpuResult]:
    """``All`` / ``GPU: 0`` / ``GPUs: 1, 2, 3`` after a status word."""
    if not tail:
        return []
    tail = tail.strip()
    if tail.lower() == "all":
        return [GpuResult(None, status)]
    if m := _GPU_LIST.match(tail):
        return [GpuResult(int(x), status) for x in re.findall(r"[0-9]+", m.group(1))]
    return []


def _message(kind: str, raw: str) -> DiagMessage:
    text = " ".join(raw.split())
    gpu = _LEADING_GPU.match(text)
    return DiagMessage(kind, text, int(gpu.group(1)) if gpu else None)


# ---- dcgmi discovery -l --------------------------------------------------------------------


@dataclass(frozen=True)
class DiscoveredGpu:
    id: int
    name: str | None
    pci_bus_id: str | None
    uuid: str | None


@dataclass(frozen=True)
class DcgmDiscovery:
    gpus: tuple[DiscoveredGpu, ...]
    counts: dict[str, int]  # "GPUs", "NvSwitches", "ConnectX", "CPUs": DCGM's "N ... found." lines
    errors: tuple[str, ...]  # dcgmi "Error:" lines (e.g. no host engine to connect to)


_FOUND = re.compile(r"^([0-9]+)\s+(\S+)\s+found\.", re.MULTILINE)
_GPU_CELL = re.compile(r"^\|\s*([0-9]*)\s*\|\s*(Name|PCI Bus ID|Device UUID):\s*(.*?)\s*\|?\s*$")


def parse_dcgmi_discovery(text: str) -> DcgmDiscovery:
    """``dcgmi discovery -l``: the GPUs DCGM sees (and its switch/NIC/CPU counts)."""
    counts = {m.group(2): int(m.group(1)) for m in _FOUND.finditer(text)}
    errors = tuple(_error_lines(text))
    if not counts and not errors:
        raise ParseError("not dcgmi discovery output: no 'N GPUs found.' line and no 'Error:' line")
    gpus: list[dict] = []
    in_gpus = False
    for line in text.splitlines():
        if m := _FOUND.match(line):
            in_gpus = m.group(2) == "GPUs"
            continue
        cell = _GPU_CELL.match(line) if in_gpus else None
        if not cell:
            continue
        if cell.group(1):
            gpus.append({"id": int(cell.group(1))})
        if gpus:
            gpus[-1][cell.group(2)] = cell.group(3)
    return DcgmDiscovery(tuple(DiscoveredGpu(g["id"], g.get("Name"), g.get("PCI Bus ID"), g.get("Device UUID"))
                               for g in gpus), counts, errors)
