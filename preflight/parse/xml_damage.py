"""XML read as far as it goes: a capture cut short or corrupted still gives what came before.

``nvidia-smi -q -x`` and ``mlxfwmanager --query-format XML`` arrive truncated in bundles users
send (an excerpt, a probe killed at its timeout). The pull parser reports some damage while it
is fed or closed and some only while its events are read; ``pull_events`` catches both and
returns the events up to the damage with the error, so each parser decides what to keep.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET


def pull_events(text: str, events: tuple[str, ...]) -> tuple[list[tuple[str, ET.Element]], ET.ParseError | None]:
    """The parser's ``events`` ("start", "end") before the XML broke off, and the error it broke
    with (None when the text is whole)."""
    parser = ET.XMLPullParser(events=events)
    error = None
    try:
        parser.feed(text)
        parser.close()
    except ET.ParseError as exc:
        error = exc
    got: list[tuple[str, ET.Element]] = []
    stream = parser.read_events()
    while True:
        try:
            got.append(next(stream))
        except StopIteration:
            break
        except ET.ParseError as exc:
            error = error or exc
            break
    return got, error
