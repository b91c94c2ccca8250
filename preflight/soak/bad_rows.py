"""Rows of a soak CSV with more cells than its header: not read, and each one named.

Such a row is what a writer leaves when a line was cut off mid-write and the next one was
appended to it (an agent killed and restarted, two writers on one file): the cells of two
samples on one line, no longer telling which reading is which. It is dropped like the cut last
line the reader already drops (``preflight.soak.data``), never judged and never counted as
covered time, and a note names the file and every line of it.

pandas' C parser reports such a line as a ``ParserWarning`` ("Skipping line 40: expected 25
fields, saw 26") when asked to (``on_bad_lines="warn"``) and only when it parses every column:
with ``usecols`` it drops the extra cells without a word and reads the rest of the line as a
sample, which is how a damaged row came to be judged. The reader therefore parses every column
and keeps the ones it wants afterwards.
"""

from __future__ import annotations

import csv
import re
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

_SKIPPED = re.compile(r"Skipping line (\d+): expected (\d+) fields?, saw (\d+)")


@contextmanager
def collected(into: list[tuple[int, int, int]]) -> Iterator[None]:
    """Within the block, the parser's "Skipping line" warnings go into ``into`` as (line,
    expected, seen) and are not shown; other warnings pass through as they were."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always")
            try:
                yield
            finally:
                caught = list(recorded)
    finally:
        # Outside the recording block: a warning passed on there would be recorded again.
        for w in caught:
            found = _SKIPPED.findall(str(w.message))
            if found:
                into.extend((int(a), int(b), int(c)) for a, b, c in found)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def leading(path: Path, width: int) -> list[tuple[int, int, int]]:
    """The data lines at the top of the file, up to the first that is not, with more cells than
    the header's ``width``, as (line, expected, seen). pandas reports a long line as a bad one
    everywhere but as the first data line, where it takes the extra cell for an index column and
    shifts every column of the file by one without a word: such lines are skipped before it
    parses (``skiprows``)."""
    found: list[tuple[int, int, int]] = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        next(reader, None)  # the header
        for row in reader:
            if len(row) <= width:
                break
            found.append((reader.line_num, width, len(row)))
    return found


def file_lines(rows: np.ndarray, skipped: Iterable[int]) -> np.ndarray:
    """The file line of each parsed row (its 0-based position among the rows read, counted on
    across chunks), given the lines the parser skipped: row ``r`` is line ``r + 2`` (the header
    is line 1) plus one for every skipped line before it."""
    lines = np.asarray(rows, dtype=np.int64) + 2
    if not skipped:
        return lines
    gone = np.sort(np.fromiter(skipped, dtype=np.int64))
    # The j-th skipped line sits where the (gone[j] - j)-th line of the rows read would be.
    return lines + np.searchsorted(gone - np.arange(len(gone)), lines, side="right")


def _ranges(lines: list[int]) -> str:
    """"40, 77-80, 91": every line, consecutive ones as a range."""
    parts: list[str] = []
    start = prev = lines[0]
    for n in [*lines[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


def note(name: str, skipped: list[tuple[int, int, int]]) -> str | None:
    """The note naming every row of ``name`` not read, or None when there was none."""
    if not skipped:
        return None
    lines = sorted({line for line, _, _ in skipped})
    expected = skipped[0][1]
    seen = "/".join(str(s) for s in sorted({s for _, _, s in skipped}))
    rows = "row" if len(lines) == 1 else "rows"
    return (f"{name}: {len(lines)} {rows} not read, with more cells ({seen}) than the header's {expected} "
            f"(a line cut off mid-write with the next appended to it?): line{'s' if len(lines) > 1 else ''} "
            f"{_ranges(lines)}; not judged and not counted as covered time")
