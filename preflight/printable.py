"""Stored and collected text shown as data: what a node name, a run id, a finding's summary or
a kernel-log line holds is printed so that a terminal, a pager or a Markdown reader shows it and
never acts on it. One function, used by every writer of text (the terminal summary, report.md,
``history``, ``lifecycle`` and its RMA summary); ``--json`` writers keep the text exact.

What it changes, and why:
- control characters (C0, DEL, C1): ESC starts a terminal escape sequence (colours, cursor moves,
  a window title, OSC 8 links), CR returns to the start of the line and overwrites it, BEL rings,
  NUL ends a string for C tools, a newline starts a line (or a Markdown heading) of its own. Each
  is shown as Python's escape of it: ``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\x00``, ``\\x9b``;
- the Unicode line and paragraph separators (U+2028, U+2029), which some terminals and editors
  break lines at, and the bidirectional formatting characters (U+202A..U+202E, U+2066..U+2069,
  U+200E, U+200F, U+061C), which reorder what is displayed (CVE-2021-42574, "Trojan Source"),
  shown as ``\\u202e``; so is a lone surrogate (``\\udcff``), which no encoding can print.

Emoji codes (``:ab:`` in a PCI bus id ``00000000:AB:00.0``) and rich's ``[markup]`` are the
console's to leave alone: every console that prints data is made with ``emoji=False`` and prints
with ``markup=False`` (preflight/app/cli.py), or escapes data it puts into markup.
"""

from __future__ import annotations

import re

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
# Lone surrogates too: text that is not valid Unicode (a name read with surrogateescape) would
# otherwise stop the print itself with UnicodeEncodeError.
_UNSAFE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\u2028\u2029{_BIDI}\\ud800-\\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    ch = m.group()
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def printable(value: object) -> str:
    """``value`` as text a terminal or a Markdown reader shows and never interprets; ``None``
    is shown as ``-``."""
    text = "-" if value is None else value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escape, text)


def printable_lines(value: object) -> str:
    """A block of text (a probe's output excerpt) as :func:`printable`, its own line breaks and
    tabs kept: the lines stay lines, and nothing in them reaches the terminal as a control."""
    text = "-" if value is None else value if isinstance(value, str) else str(value)
    return "\n".join("\t".join(printable(cell) for cell in line.split("\t")) for line in text.split("\n"))
