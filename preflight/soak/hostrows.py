"""A soak's rows one host at a time, so that judging a fleet costs about one host's memory.

A 72-hour soak of 16 eight-GPU nodes at 1 Hz is 33 million telemetry rows: held whole, even in
compact columns, its frame grows with every node (bench/RESULTS.md, "Long soaks"). The analysis
judges host by host, so it only ever needs one host's rows:

- ``HostFrames``: host -> its rows of a frame already in memory, taken when asked for (the last
  one kept), instead of splitting the whole frame at once;
- ``SpillStore``: host -> its rows of a file read chunk by chunk, each chunk's columns appended
  to one raw file per host and column under a scratch directory and read back per host, so
  that no more than a chunk and one host are in memory whatever the fleet's size.

Both give a host's rows in file order as the reader converted them; ``by_time`` sorts them as
``read_soak`` sorts a whole frame (a stable sort by time, which restricted to one host gives
that host's rows in the same order).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd


def host_rows(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """host -> the positions of its rows, in frame order."""
    if frame.empty:
        return {}
    return {str(h): idx for h, idx in frame.groupby("host", sort=False).indices.items()}


def by_time(df: pd.DataFrame) -> pd.DataFrame:
    """Sorted by time (stable), ``_line`` dropped. Rows already in time order (as the agent
    appends them) are kept as they are: a stable sort of sorted rows is the identity, and
    skipping it saves a copy."""
    df = df.drop(columns="_line", errors="ignore")
    if not df["time"].is_monotonic_increasing:
        df = df.sort_values("time", kind="stable")
    return df.reset_index(drop=True)


class _HostKeyed(Mapping[str, pd.DataFrame]):
    """A mapping over a fixed list of hosts; subclasses say how a host's frame is got."""

    def __init__(self, hosts: Iterable[str]):
        self._hosts = list(hosts)
        self._known = set(self._hosts)

    def __iter__(self) -> Iterator[str]:
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)

    def __contains__(self, host: object) -> bool:
        return host in self._known


class _OneAtATime(_HostKeyed):
    """A mapping whose frames are made on demand, the last one kept: a check goes host by host,
    so one host's copy lives at a time."""

    def __init__(self, hosts: Iterable[str]):
        super().__init__(hosts)
        self._last: tuple[str, pd.DataFrame] | None = None

    def _make(self, host: str) -> pd.DataFrame:
        raise NotImplementedError

    def __getitem__(self, host: str) -> pd.DataFrame:
        if host not in self._known:
            raise KeyError(host)
        if self._last is None or self._last[0] != host:
            self._last = None  # let the previous host's rows go before taking the next's
            self._last = (host, self._make(host))
        return self._last[1]

    def only(self, hosts: Iterable[str]) -> _Only:
        """These hosts' frames alone (those of them with rows), from this mapping and its one
        kept frame, so that two views never hold two hosts' copies."""
        return _Only(self, [h for h in hosts if h in self._known])


class _Only(_HostKeyed):
    def __init__(self, frames: _OneAtATime, hosts: list[str]):
        super().__init__(hosts)
        self._frames = frames

    def __getitem__(self, host: str) -> pd.DataFrame:
        if host not in self._known:
            raise KeyError(host)
        return self._frames[host]


class HostFrames(_OneAtATime):
    """host -> its rows of ``frame`` (frame order, index kept, as a groupby by host gives them)."""

    def __init__(self, frame: pd.DataFrame, rows: Mapping[str, np.ndarray] | None = None):
        self._frame = frame
        self._rows = host_rows(frame) if rows is None else dict(rows)
        super().__init__(self._rows)

    def _make(self, host: str) -> pd.DataFrame:
        return self._frame.take(self._rows[host])


class SpillStore:
    """Validated chunks of one file, kept on disk host by host under ``directory``.

    Numeric columns are appended raw, in the dtype the chunk has (float32 where the reader
    found it exact, else float64, int64 for the GPU index); a host's column reads back as the
    concatenation of its pieces, so its dtype is what ``pd.concat`` of the chunks would give.
    Label columns (``host``, ``metric``) are stored as codes into one list of names."""

    def __init__(self, directory: Path):
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._schema: pd.DataFrame | None = None
        self._codes: dict[str, dict[str, int]] = {}
        # host -> column -> [(dtype, rows)], in chunk order
        self._pieces: dict[str, dict[str, list[tuple[np.dtype, int]]]] = {}
        self._slot: dict[str, int] = {}

    def add(self, chunk: pd.DataFrame) -> None:
        if self._schema is None:
            self._schema = chunk.iloc[:0]
        if chunk.empty:
            return
        labels = [c for c in chunk.columns if c != "host" and not pd.api.types.is_numeric_dtype(chunk[c])]
        for host, idx in chunk.groupby("host", sort=False).indices.items():
            host = str(host)
            slot = self._slot.setdefault(host, len(self._slot))
            pieces = self._pieces.setdefault(host, {})
            for col in chunk.columns:
                if col == "host":
                    continue
                if col in labels:
                    codes = self._codes.setdefault(col, {})
                    cells = chunk[col].to_numpy(object)[idx]
                    for name in pd.unique(cells):
                        codes.setdefault(name, len(codes))
                    values = pd.Index(list(codes), dtype=object).get_indexer(cells).astype(np.int32)
                else:
                    values = chunk[col].to_numpy()[idx]
                with open(self._dir / f"{slot}-{col}", "ab") as f:
                    values.tofile(f)
                pieces.setdefault(col, []).append((values.dtype, len(values)))

    @property
    def hosts(self) -> list[str]:
        """The hosts in order of their first row."""
        return list(self._slot)

    def empty(self) -> pd.DataFrame:
        """A frame with the file's columns and no rows (``_line`` dropped)."""
        assert self._schema is not None, "no chunk added"
        return self._schema.drop(columns="_line", errors="ignore")

    def raw(self, host: str) -> pd.DataFrame:
        """The host's rows in file order, ``_line`` included."""
        assert self._schema is not None, "no chunk added"
        slot, pieces = self._slot[host], self._pieces[host]
        out: dict[str, object] = {}
        for col in self._schema.columns:
            if col == "host":
                continue
            data = np.fromfile(self._dir / f"{slot}-{col}", dtype=np.uint8)
            parts, at = [], 0
            for dtype, rows in pieces[col]:
                parts.append(data[at:at + rows * dtype.itemsize].view(dtype))
                at += rows * dtype.itemsize
            values = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
            del data
            if col in self._codes:
                names = np.array(list(self._codes[col]), dtype=object)
                out[col] = pd.array(names[values], dtype=self._schema[col].dtype)
            else:
                out[col] = values
        rows = len(next(iter(out.values())))
        out["host"] = pd.array(np.full(rows, host, dtype=object), dtype=self._schema["host"].dtype)
        return pd.DataFrame(out, columns=self._schema.columns)

    def frames(self) -> SpilledFrames:
        return SpilledFrames(self)


class SpilledFrames(_OneAtATime):
    """host -> its rows of a ``SpillStore``, sorted by time (``by_time``)."""

    def __init__(self, store: SpillStore):
        self._store = store
        super().__init__(store.hosts)

    def _make(self, host: str) -> pd.DataFrame:
        return by_time(self._store.raw(host))
