"""nccl-tests results (``all_reduce_perf`` and siblings), text and ``-J`` JSON, and the NCCL
log lines that explain a failure.

Text input is what a ``*_perf`` binary prints, possibly several runs one after another::

    # nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809
    # Collective test starting: all_reduce_perf
    # nThread 1 nGpus 1 minBytes 8 maxBytes 4294967296 step: 4(factor) ... validation: 1 ...
    # Using devices
    #  Rank  0 Group  0 Pid   1183 on         vm device  0 [0000:00:06] NVIDIA H200
    #       size         count      type   redop    root     time   algbw   busbw  #wrong ...
               8             2     float     sum      -1     6.70    0.00    0.00       0 ...
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 0
    # Collective test concluded: all_reduce_perf

Real variants handled: builds before the ``root`` column and the ``Group`` field, whose last
column per half is a float ``error`` (max abs error, ``1e-06``) instead of the ``#wrong``
count; ``N/A`` in that column when validation is off; an empty ``redop`` cell (old alltoall),
so rows cannot be split by column position; ``%g``-style numbers (``2e+06``) once a value
outgrows its column; per-iteration (``i_min`` ...) and timestamp columns; ``[1,0]<stdout>:``
tags from ``mpirun --tag-output``; markdown indentation; NCCL INFO/WARN lines interleaved
anywhere, including inside the table; excerpts that start at the table header or at a device
line; runs cut off before their footer; and a binary built without MPI, where every rank
prints its own header and runs alone (its device lines all say ``Rank 0``).

JSON input is the ``-J FILE`` report, format version 3: ``config`` (with ``devices``),
``results`` (``out_of_place``/``in_place`` objects with ``time``, ``alg_bw``, ``bus_bw``,
``nwrong``), ``out_of_bounds``, ``average_bus_bandwidth``, ``errors``. A file cut short by a
crash is closed at its last complete value and read as far as it goes.

Bus bandwidth factors are those of nccl-tests ``doc/PERFORMANCE.md`` and its ``src/*.cu``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from preflight.parse import ParseError
from preflight.parse.nccl_signatures import MPI_TAG, NCCL_LOG

# Bus bandwidth = algbw x factor(n). Keys are collective names without underscores.
_ALL_RANKS_BUT_ONE = ("allgather", "reducescatter", "alltoall", "alltoallv", "gather", "scatter")
_FACTOR_ONE = ("broadcast", "reduce", "sendrecv", "hypercube")

_NCCL_VERSION = re.compile(r"NCCL version ([0-9]+\.[0-9]+\.[0-9]+)")
_INFO_NRANKS = re.compile(r"\bnranks ([0-9]+)", re.IGNORECASE)
_TESTS_VERSION = re.compile(r"^nccl-tests version (\S+)(?:.*\bnccl-library=([0-9]+))?")
_TEST_STARTING = re.compile(r"^Collective test starting:\s*(\S+)")
_TEST_CONCLUDED = re.compile(r"^Collective test concluded:")
_SETTINGS_LINE = re.compile(r"^nThread\s+[0-9]+\s+nGpus\s+[0-9]+")
_SETTING = re.compile(r"([A-Za-z]+(?: [A-Za-z]+)?):?\s+(-?[0-9]+)")
_DEVICE = re.compile(
    r"^Rank\s+(?P<rank>[0-9]+)\s+(?:Group\s+(?P<group>[0-9]+)\s+)?Pid\s+(?P<pid>[0-9]+)\s+on\s+(?P<host>\S+)"
    r"\s+device\s+(?P<device>[0-9]+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*)$"
)
_OUT_OF_BOUNDS = re.compile(r"^Out of bounds values\s*:\s*([0-9]+)")
_AVG_BUSBW = re.compile(r"^Avg bus bandwidth\s*:\s*(\S+)")
_REDUCED_MAX = re.compile(r"^Reducing maxBytes to ([0-9]+)")
_TEST_FAILURE = re.compile(r"Test (?:CUDA |NCCL )?failure|Test timeout")
_ROW_START = re.compile(r"^[0-9]+\s+[0-9]+\s+\S")


@dataclass(frozen=True)
class NcclDevice:
    """One ``#  Rank N ... device N [bus] NAME`` line: a rank and the GPU it ran on."""

    rank: int
    group: int | None  # absent before nccl-tests printed communicator groups
    pid: int
    host: str
    device: int
    bus_id: str  # "0000:00:06" in new builds, "0x00" in old ones
    name: str


@dataclass(frozen=True)
class NcclTiming:
    """One half (out-of-place or in-place) of a result row."""

    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int | None  # "#wrong" count; None for "N/A" (validation off) or old builds
    max_error: float | None  # old builds' "error" column (max abs error); None otherwise


@dataclass(frozen=True)
class NcclRow:
    """One message size of a run."""

    size_bytes: int
    count: int
    type: str
    redop: str  # "" where the build left the column empty (old alltoall)
    root: int | None  # None before the root column existed
    out_of_place: NcclTiming | None  # None where only in-place was measured (trace replay)
    in_place: NcclTiming


@dataclass(frozen=True)
class NcclRun:
    """One run of a test binary, from its header to its footer (or to where it stopped)."""

    collective: str | None  # "all_reduce"; None where the output does not name it
    tests_version: str | None
    nccl_version: str | None  # "2.28.9"
    nthreads: int | None
    ngpus: int | None  # GPUs per process
    min_bytes: int | None
    max_bytes: int | None
    iters: int | None
    validation: bool | None
    devices: tuple[NcclDevice, ...]
    nranks: int | None  # ranks in one communicator
    rows: tuple[NcclRow, ...]
    out_of_bounds: int | None
    avg_busbw: float | None
    complete: bool  # reached the "Avg bus bandwidth" footer
    independent_ranks: bool  # binary without MPI: each rank ran alone, nranks is per job
    errors: tuple[str, ...]  # nccl-tests failure lines ("Test NCCL failure ...", "Test timeout")
    notes: tuple[str, ...]


@dataclass(frozen=True)
class NcclOutput:
    """Everything read from one probe output: its runs in order."""

    runs: tuple[NcclRun, ...]
    notes: tuple[str, ...]  # everything noted, run notes prefixed with "run N: "


def bus_bandwidth_factor(collective: str, nranks: int) -> float:
    """busbw / algbw for a collective on ``nranks`` ranks (``all_reduce``: 2(n-1)/n)."""
    if nranks < 1:
        raise ValueError(f"nranks must be at least 1, got {nranks}")
    name = _collective_key(collective)
    if name == "allreduce":
        return 2 * (nranks - 1) / nranks
    if name in _ALL_RANKS_BUT_ONE:
        return (nranks - 1) / nranks
    if name in _FACTOR_ONE:
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def largest_row(run: NcclRun) -> NcclRow | None:
    """The row with the largest message size (the last of equals), where bandwidth is judged."""
    best: NcclRow | None = None
    for row in run.rows:
        if best is None or row.size_bytes >= best.size_bytes:
            best = row
    return best


# --------------------------------------------------------------------------- text output


@dataclass(frozen=True)
class _Layout:
    """Column structure read from a table header line."""

    has_root: bool
    error_column: str  # "#wrong" or "error"
    half_width: int  # columns per half: 4, or 8 with per-iteration statistics
    timestamp: bool


@dataclass
class _RunBuilder:
    collective: str | None = None
    tests_version: str | None = None
    nccl_version: str | None = None
    settings: dict[str, int] = field(default_factory=dict)
    devices: list[NcclDevice] = field(default_factory=list)
    info_nranks: int | None = None
    layout: _Layout | None = None
    rows: list[NcclRow] = field(default_factory=list)
    out_of_bounds: int | None = None
    avg_busbw: float | None = None
    independent_ranks: bool = False
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def in_preamble(self) -> bool:
        return self.layout is None and not self.rows and self.avg_busbw is None


def parse_nccl_tests(text: str) -> NcclOutput:
    """Runs, rows and footers of nccl-tests text output; see the module docstring."""
    if not text.strip():
        raise ParseError("empty nccl-tests output")
    if text.lstrip().startswith("{"):
        raise ParseError("this is nccl-tests -J JSON; read it with parse_nccl_json")
    runs: list[_RunBuilder] = []
    recognised = False

    def current() -> _RunBuilder:
        if not runs:
            runs.append(_RunBuilder())
        return runs[-1]

    def start_run() -> _RunBuilder:
        runs.append(_RunBuilder())
        return runs[-1]

    for number, raw in enumerate(text.split("\n"), start=1):
        line = MPI_TAG.sub("", raw.rstrip("\r")).strip()
        if not line:
            continue
        if line.startswith("#"):
            recognised |= _read_comment(line[1:].strip(), number, runs, current, start_run)
        elif NCCL_LOG.match(line):
            recognised = True
            if runs:
                _read_nccl_log(line, runs[-1])
        elif _ROW_START.match(line):
            recognised = True
            run = current()
            if run.layout is None:
                run.notes.append(f"line {number}: table row before any column header: {line!r}")
                continue
            row = _parse_row(line, run.layout)
            if row is None:
                run.notes.append(f"line {number}: could not read table row: {line!r}")
            else:
                run.rows.append(row)
        elif m := _NCCL_VERSION.search(line):
            recognised = True
            if runs:
                runs[-1].nccl_version = m.group(1)
        elif _TEST_FAILURE.search(line):
            recognised = True
            current().errors.append(line)

    if not recognised:
        raise ParseError("no nccl-tests header, table or NCCL log line in the text")
    built = tuple(_finish(run) for run in runs)
    notes = [] if built else ["no nccl-tests header or results table found (NCCL log lines only)"]
    return NcclOutput(runs=built, notes=tuple(notes) + _run_notes(built))


def _read_comment(
    body: str,
    number: int,
    runs: list[_RunBuilder],
    current: Callable[[], _RunBuilder],
    start_run: Callable[[], _RunBuilder],
) -> bool:
    """Apply one ``#`` line to the runs; False when it is not an nccl-tests line."""
    if m := _TESTS_VERSION.match(body):
        run = _preamble_run(runs, start_run, lambda r: r.tests_version is not None)
        run.tests_version = m.group(1)
        if m.group(2):
            run.nccl_version = _version_from_code(int(m.group(2)))
    elif m := _TEST_STARTING.match(body):
        run = _preamble_run(runs, start_run, lambda r: r.collective is not None)
        run.collective = _collective_name(m.group(1))
    elif _SETTINGS_LINE.match(body):
        run = _preamble_run(runs, start_run, lambda r: bool(r.settings))
        run.settings = {key.lower(): int(value) for key, value in _SETTING.findall(body)}
    elif m := _DEVICE.match(body):
        run = runs[-1] if runs and runs[-1].in_preamble else start_run()
        device = NcclDevice(
            rank=int(m["rank"]),
            group=int(m["group"]) if m["group"] is not None else None,
            pid=int(m["pid"]),
            host=m["host"],
            device=int(m["device"]),
            bus_id=m["bus"],
            name=m["name"].strip(),
        )
        if any(d.rank == device.rank for d in run.devices):
            run.independent_ranks = True
        run.devices.append(device)
    elif (layout := _parse_header(body)) is not None:
        run = runs[-1] if runs else start_run()
        if run.avg_busbw is not None or (run.rows and not run.independent_ranks):
            run = start_run()
        elif run.layout is not None and not run.rows:
            # A second table header before any row: a second process printed its own.
            run.independent_ranks = True
        run.layout = layout
    elif m := _OUT_OF_BOUNDS.match(body):
        current().out_of_bounds = int(m.group(1))
    elif m := _AVG_BUSBW.match(body):
        current().avg_busbw = _float(m.group(1))
    elif m := _REDUCED_MAX.match(body):
        current().notes.append(f"line {number}: maxBytes reduced to {m.group(1)} by GPU memory")
    elif body.startswith("error:"):
        current().errors.append(body)
    else:
        return bool(_TEST_CONCLUDED.match(body)) or body == "Using devices"
    return True


def _preamble_run(
    runs: list[_RunBuilder],
    start_run: Callable[[], _RunBuilder],
    already_set: Callable[[_RunBuilder], bool],
) -> _RunBuilder:
    """The run a header line belongs to: the open one while it is still printing its
    header, else a new one. The same header line twice before any table means each rank
    printed its own header: a binary built without MPI."""
    if runs and runs[-1].in_preamble:
        run = runs[-1]
        if already_set(run):
            run.independent_ranks = True
        return run
    return start_run()


def _read_nccl_log(line: str, run: _RunBuilder) -> None:
    if m := _NCCL_VERSION.search(line):
        run.nccl_version = m.group(1)
    if run.info_nranks is None and (m := _INFO_NRANKS.search(line)):
        run.info_nranks = int(m.group(1))


def _parse_header(body: str) -> _Layout | None:
    tokens = body.split()
    if not {"size", "count", "type", "busbw"} <= set(tokens):
        return None
    times = [i for i, t in enumerate(tokens) if t in ("time", "cputime")]
    return _Layout(
        has_root="root" in tokens,
        error_column="error" if "error" in tokens else "#wrong",
        half_width=times[1] - times[0] if len(times) >= 2 else 4,
        timestamp="timestamp" in tokens,
    )


def _parse_row(line: str, layout: _Layout) -> NcclRow | None:
    tokens = line.split()
    try:
        size, count, dtype = int(tokens[0]), int(tokens[1]), tokens[2]
        rest = tokens[3:]
        # An empty redop cell leaves no token, so the redop is whatever non-number follows.
        redop = rest.pop(0) if rest and _float(rest[0]) is None else ""
        root = int(rest.pop(0)) if layout.has_root else None
    except (IndexError, ValueError):
        return None
    if layout.timestamp and len(rest) % layout.half_width == 2:
        rest = rest[:-2]
    halves = [rest[i : i + layout.half_width] for i in range(0, len(rest), layout.half_width)]
    if len(halves) not in (1, 2) or len(halves[-1]) != layout.half_width:
        return None
    parsed = [_parse_half(half, layout.error_column) for half in halves]
    timings = [t for t in parsed if t is not None]
    if len(timings) != len(parsed):
        return None
    return NcclRow(
        size_bytes=size,
        count=count,
        type=dtype,
        redop=redop,
        root=root,
        out_of_place=timings[0] if len(timings) == 2 else None,
        in_place=timings[-1],
    )


def _parse_half(tokens: list[str], error_column: str) -> NcclTiming | None:
    time_us, algbw, busbw = (_float(t) for t in tokens[:3])
    if time_us is None or algbw is None or busbw is None:
        return None
    check = None if tokens[3] == "N/A" else _float(tokens[3])
    if tokens[3] != "N/A" and check is None:
        return None
    if error_column == "error":
        return NcclTiming(time_us, algbw, busbw, wrong=None, max_error=check)
    wrong = None if check is None else _count(check)
    if check is not None and wrong is None:
        return None  # "#wrong" of 2.5 or -1 is no count: the row is unreadable
    return NcclTiming(time_us, algbw, busbw, wrong=wrong, max_error=None)


# --------------------------------------------------------------------------- shared


def _finish(run: _RunBuilder) -> NcclRun:
    notes = list(run.notes)
    if run.devices:
        # Ranks are numbered from 0; an excerpt may show only the highest one.
        nranks: int | None = max(d.rank for d in run.devices) + 1
    else:
        nranks = run.info_nranks
    if run.independent_ranks:
        notes.append("nccl-tests not built with MPI: ranks ran as independent jobs")
    if nranks == 1 and run.rows:
        top = max(
            max(r.in_place.algbw, r.out_of_place.algbw if r.out_of_place else 0) for r in run.rows
        )
        notes.append(
            f"single rank: no inter-GPU traffic, busbw is 0 by definition and algbw (up to "
            f"{top:g} GB/s) measures a local copy, not a link"
        )
    complete = run.avg_busbw is not None
    if not complete:
        notes.append(
            "run stopped before its 'Avg bus bandwidth' footer (hang, crash or cut capture)"
        )
    validation = run.settings.get("validation")
    return NcclRun(
        collective=run.collective,
        tests_version=run.tests_version,
        nccl_version=run.nccl_version,
        nthreads=run.settings.get("nthread"),
        ngpus=run.settings.get("ngpus"),
        min_bytes=run.settings.get("minbytes"),
        max_bytes=run.settings.get("maxbytes"),
        iters=run.settings.get("iters"),
        validation=None if validation is None else bool(validation),
        devices=tuple(run.devices),
        nranks=nranks,
        rows=tuple(run.rows),
        out_of_bounds=run.out_of_bounds,
        avg_busbw=run.avg_busbw,
        complete=complete,
        independent_ranks=run.independent_ranks,
        errors=tuple(run.errors),
        notes=tuple(notes),
    )


def _run_notes(runs: tuple[NcclRun, ...]) -> tuple[str, ...]:
    return tuple(f"run {i}: {note}" for i, run in enumerate(runs, start=1) for note in run.notes)


def _collective_name(program: str) -> str:
    """``./build/all_reduce_perf`` -> ``all_reduce``."""
    return re.sub(r"_perf(?:_mpi)?$", "", PurePosixPath(program).name)


def _collective_key(collective: str) -> str:
    return _collective_name(collective.strip()).replace("_", "").lower()


def _version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE as X.Y.Z: major*10000+minor*100+patch since 2.9, *1000 before."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _float(value: Any) -> float | None:
    """A finite number, from an ASCII numeral or a JSON number; else None. ``float()`` also reads
    "nan", "inf" and other scripts' digits ('٣'), none of which nccl-tests prints for a figure: such
    a cell is unreadable, never a bandwidth or a count to judge."""
    if isinstance(value, str) and not value.isascii():
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _count(value: float | None) -> int | None:
    """A ``#wrong`` count: a whole number of at least 0, else None (unreadable)."""
    return int(value) if value is not None and value >= 0 and value.is_integer() else None
