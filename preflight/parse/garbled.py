"""Evidence bytes that are not text: a value holding them is unreadable, not another value.

A NUL or another control byte inside a firmware or driver version ("28.46.1006\\x00"), or the
U+FFFD that invalid UTF-8 decodes to (``ProbeResult.text`` decodes with replacement), never comes
from the tools these parsers read: it is damage to the evidence (a flipped byte, a capture written
over). Read as a string, such a value would differ from the clean one and a fleet comparison
would call it a different version. The parsers keep it out of their records and say the field is
unreadable instead.
"""

from __future__ import annotations

import re

# Tab is the one control character real output carries (ibv_devinfo and nvidia-smi pad with it).
_NOT_TEXT = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\ufffd]")


def garbled(value: str) -> bool:
    """Whether ``value`` (one line's value, newline excluded) holds bytes that are not text."""
    return _NOT_TEXT.search(value.replace("\t", " ")) is not None


def shown(value: str, limit: int = 60) -> str:
    """``value`` as a note quotes it: its control bytes escaped, cut to ``limit`` characters."""
    return repr(value.strip()[:limit])
