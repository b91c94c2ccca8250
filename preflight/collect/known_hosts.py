"""Reading OpenSSH known_hosts files one line at a time, so that one bad line costs one line.

paramiko's own loader skips lines it recognises as unparsable but lets others through as
exceptions (a key whose base64 is broken raises ``InvalidHostKey``), and one such line made
every host "unreachable". OpenSSH skips a line it cannot read and goes on; so does this: each
skipped line is reported once per file on stderr as ``FILE:LINE: skipped: why``, and every
other line's keys are used.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

from paramiko.hostkeys import HostKeyEntry


def entries(path: Path) -> tuple[HostKeyEntry, ...]:
    """The readable entries of ``path``; the skipped lines are reported the first time a
    version of the file is read (the controller connects to many hosts with the same files)."""
    stat = path.stat()
    found, skipped = _parse(str(path), stat.st_mtime_ns, stat.st_size)
    return found


@lru_cache(maxsize=32)
def _parse(path: str, _mtime_ns: int, _size: int) -> tuple[tuple[HostKeyEntry, ...], tuple[str, ...]]:
    found: list[HostKeyEntry] = []
    skipped: list[str] = []
    for number, raw in enumerate(Path(path).read_bytes().split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            skipped.append(f"{path}:{number}: skipped: not UTF-8 text")
            continue
        if not line or line.startswith("#"):
            continue
        try:
            entry = HostKeyEntry.from_line(line, number)
        except Exception as exc:  # noqa: BLE001 - InvalidHostKey, binascii.Error, ValueError ...
            entry, why = None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            why = "not a known_hosts entry (unknown key type or too few fields)"
        if entry is None or entry.key is None:
            skipped.append(f"{path}:{number}: skipped: {why}")
            continue
        found.append(entry)
    for message in skipped:
        print(f"preflight: warning: {message}", file=sys.stderr)
    return tuple(found), tuple(skipped)


def skipped_lines(path: Path) -> tuple[str, ...]:
    """What ``entries`` skipped in ``path``, for tests and callers that report it themselves."""
    stat = path.stat()
    return _parse(str(path), stat.st_mtime_ns, stat.st_size)[1]
