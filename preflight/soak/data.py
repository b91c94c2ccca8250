"""Reading, validating and writing a soak directory (contract ``preflight-soak/1``).

The directory looks like this (docs/contracts.md §6)::

    SOAK_DIR/soak.json        {"format": "preflight-soak/1", "engine": str, "started": ISO-8601, "hosts": [...]}
    SOAK_DIR/telemetry.csv    time, host, gpu, temperature_c, memory_temperature_c, sm_clock_mhz,
                              memory_clock_mhz, power_w, power_limit_w, utilization_pct,
                              memory_used_mib, clocks_event_reasons
    SOAK_DIR/throughput.csv   time, host, metric, value
    SOAK_DIR/events.csv       time, host, gpu, event, data (optional; ``read_events``)

Every contract column must be in the header (in any order; more may follow), but any cell
other than ``time``, ``host`` and ``gpu`` may be empty, meaning "not available". ``N/A``,
``[N/A]`` and ``[Not Supported]`` (what nvidia-smi and DCGM dumps print) read as empty too.
``clocks_event_reasons`` is NVML's bitmask as an integer; hex (``0x4``, as
``nvidia-smi --query-gpu=clocks_event_reasons.active`` prints it) is accepted as well.

Two optional extra columns are understood: ``slowdown_temperature_c`` in telemetry.csv, the
GPU's slowdown threshold in °C as NVML reports it (``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``),
which the analysis uses to judge "temperature at the slowdown threshold"; and ``gpu`` in
throughput.csv, set on rows that measure one GPU and empty on rows for the whole node (the
soak agent writes ``tflops`` per node and ``gpu_tflops`` per GPU that way).

The agent appends rows as it samples, so a crash or a cut connection can leave the last line
half written: a file that does not end in a newline has its last row dropped, with a note, and a
row with more cells than the header (a cut line with the next one appended to it) is not read,
each named by its line in a note (bad_rows.py).
``throughput.csv`` is optional (telemetry converted from a DCGM dump has none); its absence
is a note. Anything else that breaks the contract raises ``SoakDataError`` naming the file,
the line and the field.

A long soak is millions of rows (72 h of 16 eight-GPU nodes at 1 Hz: 33 million), so the files
are parsed ``CHUNK_ROWS`` at a time, each chunk validated as it comes (the first bad cell of the
file still names its line), and kept in compact columns: a reading becomes float32 only where
every cell of the chunk survives the round trip (whole degrees, MHz, MiB, percent; not
milliwatt-precision watts or the time), labels are interned. The figures work in float64, so
the verdicts are those of a float64 frame. ``read_soak(..., columns=ANALYSIS_COLUMNS)`` reads
only the columns the analysis judges; with ``spill_dir`` each host's rows wait on disk and come
back one host at a time (hostrows.py), which is how ``preflight analyze`` reads a soak.

``frames_from_samples`` converts a list of NVML sample dicts (the shape of
tests/fixtures/corpus/h200-vm/burn_samples.json: ``{t, temp, sm, mem, power_w, util,
reasons}``) into the two tables, and ``write_soak`` writes a directory; together they turn a
capture into a soak directory that ``preflight analyze`` reads.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from preflight.contracts import (
    AGENT_TELEMETRY_COLUMNS,
    AGENT_THROUGHPUT_COLUMNS,
    EVENTS_CSV,
    SLOWDOWN_COLUMN,
    SOAK_FORMAT,
    SOAK_JSON,
    SOAK_JSON_KEYS,
    TELEMETRY_COLUMNS,
    TELEMETRY_CSV,
    THROUGHPUT_COLUMNS,
    THROUGHPUT_CSV,
)
from preflight.soak import bad_rows
from preflight.soak.hostrows import HostFrames, SpilledFrames, SpillStore, by_time, host_rows
from preflight.soak.order import StepBack, host_order, order_of

# Numeric telemetry columns whose cells may be empty; `time` and `gpu` may not.
_OPTIONAL_NUMERIC = tuple(c for c in TELEMETRY_COLUMNS if c not in ("time", "host", "gpu"))
# The telemetry columns the built-in analysis reads (``read_soak(..., columns=ANALYSIS_COLUMNS)``):
# the contract's and the slowdown threshold; the agent's counters after them are not judged.
ANALYSIS_COLUMNS: tuple[str, ...] = (*TELEMETRY_COLUMNS, SLOWDOWN_COLUMN)
_NOT_AVAILABLE = ["", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "nan", "NaN"]
# What a reading can physically be. A value outside is a corrupt file or a broken converter,
# not a measurement: refused with its line, rather than judged (an infinite temperature would
# pass into report.json as "Infinity", which is not JSON) or silently clipped.
_TEMPERATURE = (-100.0, 250.0)
BOUNDS: dict[str, tuple[float, float]] = {
    "time": (0.0, 1e11),  # seconds since the epoch: until the year 5138
    "gpu": (0.0, 4095.0),  # a GPU index (NVML counts devices with an unsigned int; no node has more)
    "temperature_c": _TEMPERATURE, "memory_temperature_c": _TEMPERATURE, SLOWDOWN_COLUMN: _TEMPERATURE,
    "sm_clock_mhz": (0.0, 100_000.0), "memory_clock_mhz": (0.0, 100_000.0),
    "power_w": (0.0, 100_000.0), "power_limit_w": (0.0, 100_000.0),
    "utilization_pct": (0.0, 100.0), "memory_used_mib": (0.0, float(1 << 40)),
}


# The largest clocks-event bitmask read: NVML's published reasons end at 0x100 (docs/sources.md
# 4.1), and every bit up to 2**53 survives the float64 the analysis holds the column in, so an
# unknown bit is still reported as itself (``unknown_bit_0x...``). A larger value is no reading:
# it would wrap in the analysis's int64 mask (numpy's "invalid value in cast" warning).
MAX_BITMASK = float(2**53 - 1)


class SoakDataError(ValueError):
    """The directory breaks the contract; the message reads ``file:line: field: problem``."""

    def __init__(self, path: Path, problem: str, *, line: int | None = None, field: str | None = None):
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {field}: {problem}" if field else f"{where}: {problem}")


@dataclass(frozen=True)
class SoakMeta:
    """The contents of ``soak.json``; ``extra`` keeps keys beyond the contract's."""

    engine: str
    started: str
    hosts: tuple[str, ...]
    extra: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"format": SOAK_FORMAT, "engine": self.engine, "started": self.started,
                "hosts": list(self.hosts), **(self.extra or {})}


@dataclass(frozen=True, eq=False)
class SoakData:
    """A validated soak directory.

    ``telemetry`` has the contract columns (plus any extra ones), ``time`` float seconds,
    ``host`` str, ``gpu`` int, every other numeric column float with NaN for "not available".
    ``throughput`` has ``time``, ``host``, ``metric``, ``value`` (empty when the file is absent),
    and ``gpu`` (float, NaN on node-wide rows) when the file has that column.
    Both are sorted by time. Readings may be float32 where that holds every value exactly
    (module docstring). ``notes`` say what was tolerated while reading. ``telemetry_by_host``
    and ``throughput_by_host`` give one host's rows at a time, the only way to them when the
    soak was read with ``spill_dir`` (the two frames are then empty, with the files' columns).
    """

    path: Path
    meta: SoakMeta
    telemetry: pd.DataFrame
    throughput: pd.DataFrame
    notes: tuple[str, ...] = ()
    # Read with ``spill_dir``: each host's rows kept on disk, ``telemetry`` and ``throughput``
    # then empty frames with the files' columns (hostrows.py).
    spilled: tuple[SpilledFrames, SpilledFrames] | None = field(default=None, repr=False)
    # Every GPU whose time went backwards in the file's order (order.py), which the sorted rows
    # no longer show.
    steps_back: tuple[StepBack, ...] = ()

    @cached_property
    def telemetry_by_host(self) -> HostFrames | SpilledFrames:
        """Each host's telemetry rows, sorted by time, taken one host at a time (hostrows.py)."""
        return self.spilled[0] if self.spilled else HostFrames(self.telemetry)

    @cached_property
    def throughput_by_host(self) -> HostFrames | SpilledFrames:
        return self.spilled[1] if self.spilled else HostFrames(self.throughput)


def read_soak(soak_dir: str | Path, *, columns: Sequence[str] | None = None,
              spill_dir: str | Path | None = None) -> SoakData:
    """Read and validate ``soak_dir``. ``columns``: the telemetry columns to keep beyond the
    contract's (default: every column the file has); ``ANALYSIS_COLUMNS`` is what the built-in
    analysis reads, which keeps a long fleet soak's rows small (the agent's extra counters are
    a dozen more columns a row). ``spill_dir``: keep each host's rows on disk there (it must
    outlive the returned SoakData), so that the memory holds a chunk and one host at a time
    rather than the fleet; the frames are then reached through ``telemetry_by_host`` and
    ``throughput_by_host`` only, and hold ``ANALYSIS_COLUMNS`` (throughput: its contract
    columns and ``gpu``)."""
    soak_dir = Path(soak_dir)
    if not soak_dir.is_dir():
        raise SoakDataError(soak_dir, "not a directory")
    meta = _read_meta(soak_dir / SOAK_JSON)
    notes: list[str] = _unknown_fields(SOAK_JSON, (meta.extra or {}).keys(), SOAK_JSON_KEYS, "fields")
    tele_path = soak_dir / TELEMETRY_CSV
    # Spilled, only the columns the reader converts to numbers (a column left as the parser
    # found it may be text in one chunk and numbers in the next, which one raw file cannot hold).
    columns = ANALYSIS_COLUMNS if spill_dir is not None else columns
    keep = None if columns is None else frozenset(TELEMETRY_COLUMNS) | frozenset(columns)
    thr_keep = frozenset((*THROUGHPUT_COLUMNS, "gpu")) if spill_dir is not None else None
    tele_chunks = _chunks(tele_path, TELEMETRY_COLUMNS, notes, lambda df: _telemetry_chunk(df, tele_path), keep,
                          known=AGENT_TELEMETRY_COLUMNS)
    throughput_path = soak_dir / THROUGHPUT_CSV
    thr_chunks = (_chunks(throughput_path, THROUGHPUT_COLUMNS, notes,
                          lambda df: _throughput_chunk(df, throughput_path), thr_keep, known=AGENT_THROUGHPUT_COLUMNS)
                  if throughput_path.exists() else None)
    if spill_dir is None:
        telemetry = _join(list(tele_chunks))
        throughput = _join(list(thr_chunks)) if thr_chunks is not None else _no_throughput(notes)
        rows = host_rows(telemetry)
        back, late = order_of(telemetry, rows)
        notes += [b.note() for b in back] + late + _unknown_hosts(rows, meta)
        return SoakData(soak_dir, meta, by_time(telemetry), by_time(throughput), tuple(notes), steps_back=tuple(back))

    tele_store, thr_store = SpillStore(Path(spill_dir) / "telemetry"), SpillStore(Path(spill_dir) / "throughput")
    for chunk in tele_chunks:
        tele_store.add(chunk)
    for chunk in thr_chunks if thr_chunks is not None else (_no_throughput(notes),):
        thr_store.add(chunk)
    back, late = [], []
    for host in sorted(tele_store.hosts):
        raw = tele_store.raw(host)
        b, lt = host_order(host, raw["time"].to_numpy(float), raw["gpu"].to_numpy(), raw["_line"].to_numpy())
        back += b
        late += lt
        del raw
    notes += [b.note() for b in back] + late + _unknown_hosts(tele_store.hosts, meta)
    return SoakData(soak_dir, meta, tele_store.empty(), thr_store.empty(), tuple(notes),
                    spilled=(tele_store.frames(), thr_store.frames()), steps_back=tuple(back))


def _unknown_fields(name: str, present: Iterable[str], known: Sequence[str], what: str) -> list[str]:
    """One note naming every field of a file that the contract and preflight's own writers do
    not have: kept and not read, not refused (a newer writer may add them; contracts are
    extended by adding)."""
    unknown = [str(k) for k in present if str(k).strip() not in known]
    if not unknown:
        return []
    return [f"{name}: {what} not in {SOAK_FORMAT} or preflight's writers, kept but not read "
            f"(a newer writer's?): {', '.join(unknown)}"]


def _no_throughput(notes: list[str]) -> pd.DataFrame:
    notes.append(f"{THROUGHPUT_CSV} absent: throughput not judged")
    return pd.DataFrame({"time": pd.Series(dtype=float), "host": pd.Series(dtype=str),
                         "metric": pd.Series(dtype=str), "value": pd.Series(dtype=float)})


def _unknown_hosts(hosts: Iterable[str], meta: SoakMeta) -> list[str]:
    unknown = sorted(set(hosts) - set(meta.hosts))
    return [f"{TELEMETRY_CSV} has hosts not listed in {SOAK_JSON}: {', '.join(unknown)}"] if unknown else []


def _telemetry_chunk(df: pd.DataFrame, path: Path) -> None:
    _to_numeric(df, path, "time", required=True)
    _to_gpu_index(df, path)
    _to_label(df, path, "host")
    for col in _OPTIONAL_NUMERIC + ((SLOWDOWN_COLUMN,) if SLOWDOWN_COLUMN in df else ()):
        if col == "clocks_event_reasons":
            _to_bitmask(df, path)
        else:
            _to_numeric(df, path, col, required=False)
    # Readings, not the time: a float32 holds them exactly where the chunk's values allow
    # (whole degrees, MHz, MiB, percent, bitmasks below 2**24), checked cell by cell, else
    # they stay float64. The figures work in float64 (to_numpy(float)), so the verdicts are
    # those of the float64 frame.
    _compact(df, [c for c in df.columns if c not in ("time", "host", "gpu", "_line")])


def _throughput_chunk(df: pd.DataFrame, path: Path) -> None:
    _to_numeric(df, path, "time", required=True)
    _to_label(df, path, "host")
    _to_label(df, path, "metric")
    _to_numeric(df, path, "value", required=False)
    if "gpu" in df:
        _to_gpu_index(df, path, required=False)
        _compact(df, ["gpu"])  # values stay float64: the verdicts sum and average them


def _compact(df: pd.DataFrame, columns: Iterable[str]) -> None:
    """float64 columns to float32 where every cell (NaN included) survives the round trip."""
    for col in columns:
        values = df[col].to_numpy()
        if values.dtype != np.float64:
            continue
        small = values.astype(np.float32)
        if np.array_equal(small.astype(np.float64), values, equal_nan=True):
            df[col] = small


def read_events(soak_dir: str | Path, notes: list[str] | None = None) -> tuple[dict[str, str], ...]:
    """events.csv's rows as they are, in file order. The file is optional and read, not
    validated: the agent writes it as things happen, so an absent file reads as no events and
    a row cut short as the cells it has. A row with more cells than the header (a cut line with
    the next appended to it) is not read: ``notes``, where given, gains one naming its lines."""
    rows: list[dict[str, str]] = []
    skipped: list[tuple[int, int, int]] = []
    try:
        with (Path(soak_dir) / EVENTS_CSV).open(newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.DictReader(f)
            for row in reader:
                extra = row.get(None)  # DictReader's key for the cells past the header's
                if extra:
                    width = len(reader.fieldnames or ())
                    skipped.append((reader.line_num, width, width + len(extra)))
                    continue
                rows.append(row)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return ()
    said = bad_rows.note(EVENTS_CSV, skipped)
    if said and notes is not None:
        notes.append(said)
    return tuple(rows)


def _read_meta(path: Path) -> SoakMeta:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SoakDataError(path, "missing (every soak directory starts with one)") from None
    except json.JSONDecodeError as exc:
        raise SoakDataError(path, f"invalid JSON ({exc.msg})", line=exc.lineno) from None
    except UnicodeDecodeError as exc:
        raise SoakDataError(path, f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise SoakDataError(path, f"cannot read ({exc.strerror or exc})") from None
    if not isinstance(raw, dict):
        raise SoakDataError(path, "must be a JSON object")
    if raw.get("format") != SOAK_FORMAT:
        raise SoakDataError(path, f"expected {SOAK_FORMAT!r}, got {raw.get('format')!r}", field="format")
    for key in ("engine", "started"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise SoakDataError(path, "must be a non-empty string", field=key)
    try:
        datetime.fromisoformat(raw["started"])
    except ValueError:
        raise SoakDataError(path, f"{raw['started']!r} is not ISO-8601", field="started") from None
    hosts = raw.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise SoakDataError(path, "must be a list of host names", field="hosts")
    extra = {k: v for k, v in raw.items() if k not in ("format", "engine", "started", "hosts")}
    return SoakMeta(raw["engine"], raw["started"], tuple(hosts), extra or None)


# Rows parsed at a time: the parser's own buffers and the string cells of one chunk stay a few
# tens of MB whatever the file's length; only the converted, compact columns are kept.
CHUNK_ROWS = 250_000


def _chunks(path: Path, columns: Sequence[str], notes: list[str],
            convert: Callable[[pd.DataFrame], None], keep: frozenset[str] | None = None,
            known: Sequence[str] = ()) -> Iterator[pd.DataFrame]:
    """The file, validated and converted chunk by chunk (``convert`` raises on the chunk's
    first bad cell, naming its line); at least one chunk, empty for a header alone. ``keep``:
    the columns to read (default: all); ``known``: the columns not to note as unknown."""
    if not path.exists():
        raise SoakDataError(path, "missing")
    if not path.is_file():
        raise SoakDataError(path, "not a file")
    try:
        # The "not available" spellings apply to every column but the labels, those after the
        # contract's too (e.g. the agent's clock-event time counters): an extra column of
        # numbers with empty cells then reads as numbers, not as one string a cell, which held
        # more than half of a long soak's memory.
        header = pd.read_csv(path, nrows=0, encoding="utf-8").columns
        if known:
            notes += _unknown_fields(path.name, header, known, "columns")
        numeric_na = {c: _NOT_AVAILABLE for c in header if c not in ("host", "metric")}
        wanted = None if keep is None else [c for c in header if str(c).strip() in keep]
        # Blank lines are kept (as all-empty rows) so that row i is line i + 2, less the lines
        # skipped for having more cells than the header (bad_rows.py). Every column is parsed, as
        # only then does the parser find those lines; the ones not wanted go chunk by chunk.
        skipped = bad_rows.leading(path, len(header))
        options = dict(dtype={"host": str, "metric": str}, keep_default_na=False, encoding="utf-8",
                       na_values=numeric_na, skip_blank_lines=False, on_bad_lines="warn", index_col=False,
                       skiprows=[line - 1 for line, _, _ in skipped] or None)
        with pd.read_csv(path, chunksize=CHUNK_ROWS, **options) as reader:
            pending = None
            while True:
                with bad_rows.collected(skipped):  # around the parse alone, not the consumer's work
                    chunk = next(reader, None)
                if chunk is None:
                    break
                chunk = chunk if wanted is None else chunk[wanted]
                if pending is not None:
                    yield _checked(pending, path, columns, notes, convert, skipped, last=False)
                pending = chunk
        if pending is None:  # a header alone
            pending = pd.read_csv(path, **options)
            pending = pending if wanted is None else pending[wanted]
        yield _checked(pending, path, columns, notes, convert, skipped, last=True)
    except pd.errors.EmptyDataError:
        raise SoakDataError(path, "empty file (expected a header line)", line=1) from None
    except pd.errors.ParserError as exc:
        raise SoakDataError(path, f"not readable as CSV ({exc})") from None
    except UnicodeDecodeError as exc:
        raise SoakDataError(path, f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise SoakDataError(path, f"cannot read ({exc.strerror or exc})") from None


def _checked(df: pd.DataFrame, path: Path, columns: Sequence[str], notes: list[str],
             convert: Callable[[pd.DataFrame], None], skipped: list[tuple[int, int, int]], *,
             last: bool) -> pd.DataFrame:
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise SoakDataError(path, "required column missing from the header (a column with no data "
                            "stays, with empty cells)", line=1, field=missing[0])
    # The parser numbers rows on across chunks; the lines it skipped (bad_rows.py) are counted in.
    df["_line"] = bad_rows.file_lines(df.index.to_numpy(), [line for line, _, _ in skipped])
    if last:
        said = bad_rows.note(path.name, skipped)
        if said:
            notes.append(said)
    cut_line_skipped = bool(skipped) and len(df) and max(line for line, _, _ in skipped) > df["_line"].iloc[-1]
    if last and len(df) and not cut_line_skipped and not _ends_with_newline(path):
        notes.append(f"{path.name}: last line {int(df['_line'].iloc[-1])} has no newline "
                     "(cut off while being written); ignored")
        df = df.iloc[:-1]
    blank = np.ones(len(df), bool)
    for c in columns:
        col = df[c]
        empty = col.isna() if pd.api.types.is_numeric_dtype(col) else col.isna() | (col == "")
        blank &= empty.to_numpy(bool)
    df = df[~blank].copy() if blank.any() else df
    convert(df)
    return df


def _join(chunks: list[pd.DataFrame]) -> pd.DataFrame:
    """The chunks as one frame, built a column at a time and each chunk's column let go once
    copied, so joining needs little more than the result."""
    if len(chunks) == 1:
        return chunks[0]
    names = list(chunks[0].columns)
    out = {}
    for name in names:
        parts = [c.pop(name) for c in chunks]
        out[name] = pd.concat(parts, ignore_index=True)
        del parts
    return pd.DataFrame(out)


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def _first_bad(df: pd.DataFrame, bad: pd.Series) -> tuple[int, Any]:
    row = df[bad].iloc[0]
    return int(row["_line"]), row


def _to_numeric(df: pd.DataFrame, path: Path, col: str, *, required: bool) -> None:
    values = df[col]
    if not pd.api.types.is_numeric_dtype(values):
        stripped = values.fillna("").astype(str).str.strip()
        converted = pd.to_numeric(stripped.where(~stripped.isin(_NOT_AVAILABLE)), errors="coerce")
        bad = converted.isna() & ~stripped.isin(_NOT_AVAILABLE)
        if bad.any():
            line, row = _first_bad(df, bad)
            raise SoakDataError(path, f"{row[col]!r} is not a number", line=line, field=col)
        values = converted
    df[col] = values.astype(float)
    if required and df[col].isna().any():
        line, _ = _first_bad(df, df[col].isna())
        raise SoakDataError(path, "empty (this column is required on every row)", line=line, field=col)
    present = df[col].notna()
    infinite = present & ~np.isfinite(df[col].to_numpy(float, na_value=np.nan))
    if infinite.any():
        line, row = _first_bad(df, infinite)
        raise SoakDataError(path, f"{row[col]:g} is not a finite number", line=line, field=col)
    low, high = BOUNDS.get(col, (-math.inf, math.inf))
    outside = present & ((df[col] < low) | (df[col] > high))
    if outside.any():
        line, row = _first_bad(df, outside)
        raise SoakDataError(path, f"{row[col]:g} is outside what a reading can be ({low:g} to {high:g})",
                            line=line, field=col)


def _to_gpu_index(df: pd.DataFrame, path: Path, *, required: bool = True) -> None:
    _to_numeric(df, path, "gpu", required=required)
    bad = df["gpu"].notna() & ((df["gpu"] != df["gpu"].round()) | (df["gpu"] < 0))
    if bad.any():
        line, row = _first_bad(df, bad)
        raise SoakDataError(path, f"{row['gpu']:g} is not a GPU index", line=line, field="gpu")
    if required:
        df["gpu"] = df["gpu"].astype(int)


def _to_label(df: pd.DataFrame, path: Path, col: str) -> None:
    # Looked at once per distinct label, not per row: millions of rows, a handful of names. Only
    # a chunk with a label to strip or an empty one is rewritten (labels interned, so every row
    # of a host refers to one string).
    names = pd.unique(df[col].to_numpy(object))
    if all(isinstance(n, str) and n and n == n.strip() for n in names):
        if df[col].dtype != "str":
            df[col] = df[col].astype(str)
        return
    raw = df[col].astype(object).where(df[col].notna(), "")
    labels = {text: sys.intern(str(text).strip()) for text in pd.unique(raw.to_numpy())}
    values = raw.map(labels)
    empty = values == ""
    if empty.any():
        line, _ = _first_bad(df, empty)
        raise SoakDataError(path, "empty (this column is required on every row)", line=line, field=col)
    df[col] = values.astype(str)


def _to_bitmask(df: pd.DataFrame, path: Path) -> None:
    col = "clocks_event_reasons"
    values = df[col]
    if not pd.api.types.is_numeric_dtype(values):
        # Few distinct values in practice, so parsing the unique strings is cheap.
        keys = values.fillna("").astype(str).str.strip()
        parsed: dict[str, float] = {}
        for text in keys.unique():
            if text in _NOT_AVAILABLE:
                parsed[text] = math.nan
                continue
            try:
                parsed[text] = float(int(text, 0)) if text.lower().startswith("0x") else float(text)
            except ValueError:
                line, _ = _first_bad(df, keys == text)
                raise SoakDataError(path, f"{text!r} is not a bitmask", line=line, field=col) from None
        values = keys.map(parsed)
    values = values.astype(float)
    present = values.notna()
    infinite = present & ~np.isfinite(values.to_numpy(float, na_value=np.nan))
    if infinite.any():
        line, row = _first_bad(df, infinite)
        raise SoakDataError(path, f"{_cell(row[col])} is not a bitmask (not a finite number)", line=line, field=col)
    bad = present & ((values < 0) | (values != values.round()))
    if bad.any():
        line, row = _first_bad(df, bad)
        raise SoakDataError(path, f"{row[col]!r} is not a bitmask", line=line, field=col)
    huge = present & (values > MAX_BITMASK)
    if huge.any():
        line, row = _first_bad(df, huge)
        raise SoakDataError(path, f"{_cell(row[col])} sets bits no reading has (above 2**53; NVML's reasons "
                            "end at 0x100, docs/sources.md 4.1)", line=line, field=col)
    df[col] = values


def _cell(value: object) -> str:
    """A cell as the message quotes it: the file's text, or a number as a number (not numpy's repr)."""
    return repr(value) if isinstance(value, str) else f"{float(value):g}"


def write_soak(soak_dir: str | Path, meta: SoakMeta, telemetry: pd.DataFrame,
               throughput: pd.DataFrame | None = None) -> Path:
    """Write a ``preflight-soak/1`` directory; contract columns first, extra columns after."""
    soak_dir = Path(soak_dir)
    soak_dir.mkdir(parents=True, exist_ok=True)
    (soak_dir / SOAK_JSON).write_text(json.dumps(meta.to_dict(), indent=2) + "\n")
    tele = telemetry.reindex(columns=list(TELEMETRY_COLUMNS)
                             + [c for c in telemetry.columns if c not in TELEMETRY_COLUMNS])
    # Nullable integers so the bitmask and the index are written as integers, not "4.0".
    tele["gpu"] = tele["gpu"].astype("Int64")
    tele["clocks_event_reasons"] = tele["clocks_event_reasons"].astype("Float64").round().astype("Int64")
    tele.to_csv(soak_dir / TELEMETRY_CSV, index=False, na_rep="")
    if throughput is not None:
        thr = throughput.reindex(columns=list(THROUGHPUT_COLUMNS)
                                 + [c for c in throughput.columns if c not in THROUGHPUT_COLUMNS])
        if "gpu" in thr:
            thr["gpu"] = thr["gpu"].astype("Float64").round().astype("Int64")
        thr.to_csv(soak_dir / THROUGHPUT_CSV, index=False, na_rep="")
    return soak_dir


def frames_from_samples(samples: Iterable[Mapping[str, Any]], *, host: str, start_epoch: float,
                        power_limit_w: float | None, gpu: int = 0,
                        slowdown_temperature_c: float | None = None,
                        tflops_windows: Sequence[float] = (), window_s: float = 5.0,
                        throughput_start_s: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Telemetry and throughput tables from NVML sample dicts ``{t, temp, sm, mem, power_w, util, reasons}``.

    ``t`` is seconds since the capture began and becomes ``start_epoch + t``. A key missing
    from a sample, and the columns such a capture never records (memory temperature, memory
    used), become empty cells. ``tflops_windows`` are back-to-back per-window figures of the
    burn (the capture logs only their values), placed from ``throughput_start_s`` (default:
    the first sample at full utilisation) one ``window_s`` apart, each stamped at its end.
    """
    rows = list(samples)
    tele = pd.DataFrame({
        "time": [start_epoch + float(s["t"]) for s in rows],
        "host": host,
        "gpu": gpu,
        "temperature_c": [s.get("temp") for s in rows],
        "memory_temperature_c": None,
        "sm_clock_mhz": [s.get("sm") for s in rows],
        "memory_clock_mhz": [s.get("mem") for s in rows],
        "power_w": [s.get("power_w") for s in rows],
        "power_limit_w": power_limit_w,
        "utilization_pct": [s.get("util") for s in rows],
        "memory_used_mib": None,
        "clocks_event_reasons": [s.get("reasons") for s in rows],
    }, columns=list(TELEMETRY_COLUMNS))
    if slowdown_temperature_c is not None:
        tele[SLOWDOWN_COLUMN] = slowdown_temperature_c
    for col in _OPTIONAL_NUMERIC:
        tele[col] = pd.to_numeric(tele[col], errors="coerce").astype(float)
    if throughput_start_s is None:
        busy = [float(s["t"]) for s in rows if (s.get("util") or 0) >= 100]
        throughput_start_s = busy[0] if busy else (float(rows[0]["t"]) if rows else 0.0)
    thr = pd.DataFrame({
        "time": [start_epoch + throughput_start_s + window_s * (i + 1) for i in range(len(tflops_windows))],
        "host": host, "metric": "tflops", "value": [float(v) for v in tflops_windows],
    }, columns=list(THROUGHPUT_COLUMNS))
    return tele, thr
