"""Raw ``nvidia-smi -q`` value strings to typed values, for ``preflight.parse.smi_fields``: numbers
with their unit ("629.45 W", "16x"), Enabled/Disabled words, and the spellings of "not available"."""

from __future__ import annotations

import re

from preflight.parse import finite
from preflight.parse.smi_text import normalise_label

_UNAVAILABLE = {
    "",
    "n/a",
    "[n/a]",
    "not supported",
    "[not supported]",
    "requested functionality has been deprecated",
}
_TRUE = {"enabled", "yes", "active", "true"}
_FALSE = {"disabled", "no", "not active", "false"}
_NUMBER = re.compile(r"^[-+]?[0-9]+(?:\.[0-9]+)?(?![0-9.])")


def to_bool(raw: str) -> bool:
    word = normalise_label(raw)
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(raw)


def to_float(raw: str) -> float:
    """Leading number of a value with its unit ("629.45 W", "16x", "639 bank(s)")."""
    match = _NUMBER.match(raw.strip())
    number = finite(match.group()) if match else None
    if number is None:
        raise ValueError(raw)
    return number


def to_int(raw: str) -> int:
    number = to_float(raw)
    if not number.is_integer():
        raise ValueError(raw)
    return int(number)


def to_str(raw: str) -> str:
    return raw


def available(raw: str | None) -> bool:
    return raw is not None and normalise_label(raw) not in _UNAVAILABLE
