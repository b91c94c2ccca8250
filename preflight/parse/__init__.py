"""Pure parsers: raw command output in, typed records out.

Every parser here is a function from text to frozen dataclasses, with no I/O, so it can be
tested on recorded outputs and re-run offline on a saved bundle. Parsers tolerate partial,
truncated and oddly formatted input (real captures are all three): what they cannot read
they note in the record's ``notes`` instead of raising. ``ParseError`` is raised only when
the text is not the tool's output at all, so a check can tell "garbled" from "healthy".
May import: nothing of preflight but ``preflight.model``.
"""


class ParseError(ValueError):
    """The text is not recognisable as the output this parser reads."""
