"""Pure parsers: raw command output in, typed records out.

Every parser here is a function from text to frozen dataclasses, with no I/O, so it can be
tested on recorded outputs and re-run offline on a saved bundle. Parsers tolerate partial,
truncated and oddly formatted input (real captures are all three): what they cannot read
they note in the record's ``notes`` instead of raising. ``ParseError`` is raised only when
the text is not the tool's output at all, so a check can tell "garbled" from "healthy".
May import: nothing of preflight but ``preflight.model``.
"""


import math


class ParseError(ValueError):
    """The text is not recognisable as the output this parser reads."""


def is_number(text: str) -> bool:
    """Whether ``text`` is a run of ASCII digits. ``str.isdigit()`` is true of superscripts ('²')
    and other scripts' digits ('٣'), which ``int()`` refuses or reads as a number no tool printed:
    the tools these parsers read print ASCII digits only, so anything else is unreadable."""
    return text.isascii() and text.isdigit()


def finite(text: str) -> float | None:
    """``float(text)`` when that is a finite number, else None: a run of digits past the float
    range reads as infinity, and an infinite bandwidth or speed passes every threshold."""
    try:
        number = float(text)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None
