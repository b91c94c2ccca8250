"""Every rich Console the project prints through is made here, with rich's automatic
highlighting off.

rich colours what *looks* like a number, a path or a UUID in any plain string it prints
(``ReprHighlighter``): a driver version ``570.195.03`` came out as two cyan numbers around a
white dot, a run id and a report's path in three colours. What preflight prints is data, and
the only colours wanted are the ones its own markup gives (a verdict's), so no console
guesses. Emoji codes are off for the same reason (a PCI bus id ``00000000:AB:00.0`` holds no
``:ab:`` emoji). tests/report/test_consoles.py keeps every ``Console(`` of the package here."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def make(stderr: bool = False, **options: Any) -> Console:
    """A console with highlighting and emoji codes off (``options``: rich's others, e.g.
    ``soft_wrap``, ``file``, ``force_terminal``, ``width``)."""
    return Console(stderr=stderr, highlight=False, emoji=False, **options)


def errors() -> Console:
    """stderr for messages that name files and options: never folded inside a path."""
    return make(stderr=True, soft_wrap=True)
