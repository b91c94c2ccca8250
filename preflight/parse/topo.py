"""Parser for ``nvidia-smi topo -m`` (probe ``nvidia-smi-topo``) and ``nvidia-smi topo -p2p <cap>``.

The output is a square matrix of GPUs and NICs followed by a legend::

    \\t\\x1b[4mGPU0\\tGPU1\\tNIC0\\tCPU Affinity\\tNUMA Affinity\\tGPU NUMA ID\\x1b[0m
    GPU0\\t X \\tNV18\\tPXB\\t0-55,112-167\\t0\\t\\tN/A
    GPU1\\tNV18\\t X \\tNODE\\t0-55,112-167\\t0\\t\\tN/A
    NIC0\\tPXB\\tNODE\\t X \\t\\t\\t\\t

    Legend:
      X    = Self
      ...
    NIC Legend:
      NIC0: mlx5_0

Real variants handled (each has a corpus file):

- ANSI underline escapes around the header row, kept even when stdout is not a terminal.
- NIC columns named ``mlx5_N`` (older drivers) or ``NICn`` with a ``NIC Legend`` mapping them
  to device names; GPU-only matrices (1-GPU VMs).
- The ``GPU NUMA ID`` column, and the empty tab-separated field nvidia-smi prints before it:
  cells are split on any whitespace, so empty fields vanish and tabs and spaces are alike.
- Cells padded inconsistently ("\\t  NV1"), NIC rows with or without trailing affinity fields.
- Pastes that lost their tabs so adjacent affinity fields ran together ("0-55,112-167 0N/A",
  "56-111,168-2231"): split back where that is unambiguous, guessed (and noted) where not.
- Truncated captures: the header, the legend, or trailing rows missing. Without a header the
  columns are inferred from the rows and named GPUn/NICn, with a note saying so.
- The ``topo -p2p`` matrices (cells OK/NS/CNS/GNS/TNS/U); ``kind`` tells them apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parse import ParseError, is_number

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_AFFINITY_LABELS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# SOC is what drivers before SYS existed printed for the same inter-socket path.
_TOPO_CELL = re.compile(r"X|NV[0-9]+|PIX|PXB|PHB|NODE|SYS|SOC")
_P2P_CELL = re.compile(r"OK|NS|CNS|GNS|TNS|U")
_GPU = re.compile(r"GPU[0-9]+")
# Row labels accepted when there is no header to name the columns.
_ROW_LABEL = re.compile(r"GPU[0-9]+|NIC[0-9]+|mlx[0-9]+_\S+")
_NVLINK = re.compile(r"NV([0-9]+)")
_CPU_LIST = re.compile(r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*")
_GLUED_NA = re.compile(r"(.+?)(N/A)")
_LEGEND_ENTRY = re.compile(r"\s*(\S+)\s*=\s*(.+?)\s*")
_NIC_LEGEND_ENTRY = re.compile(r"\s*(\S+):\s*(\S+)\s*")


@dataclass(frozen=True)
class TopoRow:
    """One matrix row: its label and its cells, in column order (shorter if truncated)."""

    name: str
    links: tuple[str, ...]


@dataclass(frozen=True)
class GpuAffinity:
    """The affinity fields at the end of a GPU row; None where absent or ``N/A``."""

    gpu: str
    cpu_affinity: str | None
    numa_affinity: str | None
    gpu_numa_id: int | None


@dataclass(frozen=True)
class TopoMatrix:
    """A parsed topology (``kind == "topology"``) or P2P capability (``"p2p"``) matrix."""

    kind: str
    gpus: tuple[str, ...]
    nics: tuple[str, ...]
    nic_legend: tuple[tuple[str, str], ...]
    rows: tuple[TopoRow, ...]
    affinity: tuple[GpuAffinity, ...]
    legend: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        return self.gpus + self.nics

    def link(self, a: str, b: str) -> str | None:
        """The cell for ``a`` to ``b`` ("X", "NV18", "PIX", "SYS", "OK", ...).

        NICs may be named by column (NIC0) or by device (mlx5_0). None when the text held no
        such cell (a truncated capture). A topology matrix is symmetric, so a missing row is
        read from its mirror; a P2P matrix need not be, so it is not. KeyError for names that
        are not in the matrix at all.
        """
        col_a, col_b = self._column(a), self._column(b)
        lookups = [(col_a, col_b)]
        if self.kind == "topology":
            lookups.append((col_b, col_a))
        for row_name, col_name in lookups:
            index = self.columns.index(col_name)
            for row in self.rows:
                if row.name == row_name and index < len(row.links):
                    return row.links[index]
        return None

    def nvlink_count(self, a: str, b: str) -> int:
        """How many NVLinks are bonded between ``a`` and ``b`` (the # in NV#), 0 otherwise."""
        match = _NVLINK.fullmatch(self.link(a, b) or "")
        return int(match.group(1)) if match else 0

    def nic_device(self, nic: str) -> str:
        """The device name of a NIC column (NIC0 -> mlx5_0 via the NIC Legend)."""
        return dict(self.nic_legend).get(nic, nic)

    def affinity_of(self, gpu: str) -> GpuAffinity | None:
        return next((a for a in self.affinity if a.gpu == gpu), None)

    def _column(self, name: str) -> str:
        if name in self.columns:
            return name
        for column, device in self.nic_legend:
            if device == name and column in self.columns:
                return column
        raise KeyError(f"{name!r} is not a column of this topology matrix")


def parse_topo(text: str) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m`` (or ``topo -p2p``) output; see the module docstring."""
    lines = _ANSI.sub("", text).splitlines()
    if not any(line.strip() for line in lines):
        raise ParseError("empty output: no topology matrix")
    matrix_lines, legend_lines, nic_legend_lines = _sections(lines)
    notes: list[str] = []

    header, body = _header(matrix_lines)
    rows, tails = _rows(body, header, notes)
    if not rows:
        first = next(line.strip() for line in lines if line.strip())
        raise ParseError(f"not nvidia-smi topo output: {first[:120]!r}")

    if header is not None:
        columns, labels = header
    else:
        columns, labels = _infer_columns(rows), None
        notes.append("header row missing: column names inferred from the rows as GPUn/NICn")
    gpus = tuple(c for c in columns if _GPU.fullmatch(c))
    nics = tuple(c for c in columns if not _GPU.fullmatch(c))

    missing = [c for c in columns if c not in {r.name for r in rows}]
    if missing:
        notes.append(f"no row for {', '.join(missing)} (output truncated?)")
    for row in rows:
        if len(row.links) < len(columns):
            notes.append(f"{row.name}: {len(row.links)} of {len(columns)} cells (row truncated?)")
    if not legend_lines:
        notes.append("no Legend section (output truncated or pasted without it)")

    # A P2P matrix, or a header without affinity columns, has no affinity to report.
    affinity = tuple(
        _affinity(row.name, tail, labels, notes)
        for row, tail in zip(rows, tails, strict=True)
        if _GPU.fullmatch(row.name) and (labels or (labels is None and tail))
    )
    p2p = any(_P2P_CELL.fullmatch(cell) for row in rows for cell in row.links)
    return TopoMatrix(
        kind="p2p" if p2p else "topology",
        gpus=gpus,
        nics=nics,
        nic_legend=_entries(nic_legend_lines, _NIC_LEGEND_ENTRY),
        rows=tuple(rows),
        affinity=affinity,
        legend=_entries(legend_lines, _LEGEND_ENTRY),
        notes=tuple(notes),
    )


def _sections(lines: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Split into matrix lines, ``Legend:`` lines and ``NIC Legend:`` lines."""
    sections: dict[str, list[str]] = {"matrix": [], "legend": [], "nic": []}
    current = "matrix"
    for line in lines:
        marker = line.strip()
        if marker == "Legend:":
            current = "legend"
        elif marker == "NIC Legend:":
            current = "nic"
        elif marker:
            sections[current].append(line)
    return sections["matrix"], sections["legend"], sections["nic"]


def _is_cell(token: str) -> bool:
    return bool(_TOPO_CELL.fullmatch(token) or _P2P_CELL.fullmatch(token))


def _header(
    lines: list[str],
) -> tuple[tuple[tuple[str, ...], tuple[str, ...]] | None, list[str]]:
    """((column names, affinity labels in order), remaining lines), or (None, lines).

    The header is the first line if none of its tokens is a cell value; every real row has
    at least its "X" on the diagonal.
    """
    if not lines:
        return None, lines
    first = lines[0]
    found = sorted((first.find(label), label) for label in _AFFINITY_LABELS if label in first)
    for _, label in found:
        first = first.replace(label, " ")
    names = tuple(first.split())
    if not names or any(_is_cell(name) for name in names):
        return None, lines
    return (names, tuple(label for _, label in found)), lines[1:]


def _rows(
    lines: list[str],
    header: tuple[tuple[str, ...], tuple[str, ...]] | None,
    notes: list[str],
) -> tuple[list[TopoRow], list[list[str]]]:
    """Matrix rows, and for each the tokens after its cells (the affinity fields)."""
    rows: list[TopoRow] = []
    tails: list[list[str]] = []
    columns = header[0] if header else None
    for line in lines:
        tokens = line.split()
        label = tokens[0]
        known = label in columns if columns else bool(_ROW_LABEL.fullmatch(label))
        if not known:
            notes.append(f"ignored line: {line.strip()[:80]!r}")
            continue
        cells: list[str] = []
        for token in tokens[1:]:
            # Affinity fields start with a digit or are N/A; cells never do. Cutting there
            # rather than at an unfamiliar code keeps a future link kind in its column.
            if is_number(token[0]) or "N/A" in token or (columns and len(cells) == len(columns)):
                break
            if not _is_cell(token):
                notes.append(f"{label}: unfamiliar cell {token!r}")
            cells.append(token)
        rows.append(TopoRow(name=label, links=tuple(cells)))
        tails.append(tokens[1 + len(cells):])
    return rows, tails


def _infer_columns(rows: list[TopoRow]) -> tuple[str, ...]:
    """Column names for a matrix whose header is missing.

    GPU-to-GPU cells cannot be told from GPU-to-NIC cells in general, so the GPU count is the
    largest of: the GPU rows seen, the diagonal positions, and the leading run of NV#/X cells
    (which covers a GPU row cut from the end of the capture when the GPUs are NVLinked).
    """
    width = max(len(row.links) for row in rows)
    gpu_rows = [row for row in rows if _GPU.fullmatch(row.name)]
    n_gpus = max((int(row.name[3:]) + 1 for row in gpu_rows), default=0)
    for row in gpu_rows:
        run = 0
        for cell in row.links:
            if cell != "X" and not _NVLINK.fullmatch(cell):
                break
            run += 1
        n_gpus = max(n_gpus, run)
    # A row's name is only a claim; the cells are the evidence. A matrix has one column per
    # device, so no more GPUs than the widest row has cells (a two-line capture naming
    # GPU9999999 would otherwise build ten million columns).
    n_gpus = min(n_gpus, width)
    nic_rows = [row.name for row in rows if not _GPU.fullmatch(row.name)]
    n_nics = width - n_gpus
    nics = nic_rows if len(nic_rows) == n_nics else [f"NIC{i}" for i in range(n_nics)]
    return tuple(f"GPU{i}" for i in range(n_gpus)) + tuple(nics)


def _affinity(
    gpu: str, tail: list[str], labels: tuple[str, ...] | None, notes: list[str]
) -> GpuAffinity:
    """Read a GPU row's affinity fields, undoing paste damage where that can be done."""
    tokens: list[str] = []
    for token in tail:
        glued = _GLUED_NA.fullmatch(token)
        if glued:
            tokens += [glued.group(1), glued.group(2)]
            notes.append(f"{gpu}: fields glued in {token!r}; read as {glued.group(1)!r} and 'N/A'")
        else:
            tokens.append(token)
    if labels is None:
        # Headerless: drivers with a GPU NUMA ID column end every GPU row with it (N/A on
        # most x86 hosts); otherwise assume the older CPU/NUMA pair.
        full = (bool(tokens) and tokens[-1] == "N/A") or len(tokens) >= 3
        labels = _AFFINITY_LABELS if full else _AFFINITY_LABELS[: len(tokens)]
    if len(tokens) == len(labels) - 1 and labels[:2] == _AFFINITY_LABELS[:2] and tokens:
        split = _split_cpu_numa(tokens[0])
        if split:
            notes.append(
                f"{gpu}: CPU and NUMA affinity glued in {tokens[0]!r}; guessed CPU {split[0]!r}"
                f" and NUMA {split[1]!r} (the split point is ambiguous)"
            )
            tokens[:1] = list(split)
    if len(tokens) != len(labels):
        notes.append(f"{gpu}: {len(tokens)} affinity fields for {len(labels)} columns: {tail}")
    values = {label: (None if value == "N/A" else value) for label, value in zip(labels, tokens, strict=False)}
    numa_id = values.get("GPU NUMA ID")
    return GpuAffinity(
        gpu=gpu,
        cpu_affinity=values.get("CPU Affinity"),
        numa_affinity=values.get("NUMA Affinity"),
        gpu_numa_id=int(numa_id) if numa_id and is_number(numa_id) else None,
    )


def _split_cpu_numa(token: str) -> tuple[str, str] | None:
    """Split "168-2231" style glue into a CPU list and a NUMA node id.

    Takes the shortest digit suffix that leaves a well-formed, ascending CPU list: NUMA ids
    are short and a CPU range never ends below its start.
    """
    for k in (1, 2):
        cpus, numa = token[:-k], token[-k:]
        if is_number(numa) and _valid_cpu_list(cpus):
            return cpus, numa
    return None


def _valid_cpu_list(text: str) -> bool:
    if not _CPU_LIST.fullmatch(text):
        return False
    previous = -1
    for part in text.split(","):
        low, _, high = part.partition("-")
        start, end = int(low), int(high or low)
        if start <= previous or end < start:
            return False
        previous = end
    return True


def _entries(lines: list[str], pattern: re.Pattern[str]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (m.group(1), m.group(2)) for m in (pattern.fullmatch(line) for line in lines) if m
    )
