"""The literal text every match of a regex must contain, for a cheap test before the search.

A kernel log is thousands of lines and the signature table dozens of patterns, nearly none of
which match a given line; ``needle in line`` rejects most of them in a fraction of what a regex
search costs. The needle is read from the pattern itself (Python's own regex parser), so the
table stays the one place a signature is written: the longest run of plain characters at the
pattern's top level, or inside a group that must match. Anything uncertain (case-insensitive
matching, a run inside an alternative or an optional part) yields no needle, which only means
the search always runs.
"""

from __future__ import annotations

import re

try:  # Python 3.11+ moved the parser; 3.10 has it under its old name
    from re import _constants as _c
    from re import _parser as _sre
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _sre  # type: ignore[no-redef]


def needle(pattern: re.Pattern[str]) -> str:
    """The longest literal every match of ``pattern`` contains, or "" when none is certain."""
    if pattern.flags & re.IGNORECASE:
        return ""
    try:
        tree = _sre.parse(pattern.pattern, pattern.flags)
    except Exception:  # noqa: BLE001 - a parser change in a new Python only costs the shortcut
        return ""
    if tree.state.flags & re.IGNORECASE:
        return ""
    runs: list[str] = []
    current: list[str] = []
    _walk(tree, runs, current)
    runs.append("".join(current))
    return max(runs, key=len)


def _walk(items, runs: list[str], current: list[str]) -> None:
    for op, arg in items:
        if op is _c.LITERAL:
            current.append(chr(arg))
        elif op is _c.SUBPATTERN and not (arg[1] & re.IGNORECASE):
            _walk(arg[3], runs, current)  # a group that must match: its text is in line
        else:
            runs.append("".join(current))
            current.clear()
