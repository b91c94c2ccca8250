"""Kernel-log shapes that are records rather than lines of text, turned into dmesg's own shape.

``parse_kernel_log`` reads text lines with a prefix (dmesg, ``journalctl -k`` in its text
outputs, syslog files). Two common captures hold the same messages as records:

- raw ``/dev/kmsg``, which some agents save as they read it: one record per line,
  ``PRIORITY,SEQUENCE,MICROSECONDS,FLAGS[,...];MESSAGE``, then the record's dictionary as
  continuation lines that start with a space, ``␠KEY=value`` (``SUBSYSTEM=pci``,
  ``DEVICE=+pci:0000:5e:00.0``). PRIORITY is the syslog level in its low 3 bits and the
  facility above them; MICROSECONDS is the time since boot (the kernel's
  Documentation/ABI/testing/dev-kmsg, which also allows more comma-separated fields before the
  ``;`` and escapes unprintable bytes as ``\\xNN``);
- ``journalctl -k -o json``: one JSON object per line, the message in ``MESSAGE`` (a string,
  or an array of byte values when it is not UTF-8), the time since boot in
  ``__MONOTONIC_TIMESTAMP`` (µs), the host in ``_HOSTNAME`` and the origin in ``_TRANSPORT``.

``normalised`` rewrites such lines, one for one (the line numbers stay those of the capture),
as ``<PRIORITY>[seconds] MESSAGE`` and ``[seconds] HOST kernel: MESSAGE``, the shapes dmesg -r
and ``journalctl -o short-monotonic`` print; a kmsg continuation line becomes empty, and so does
a journal record of another transport (a service's own message quoting a driver line must not
count as the kernel's). Any other line is left as it is.
"""

from __future__ import annotations

import json
import re

_KMSG = re.compile(r"(?P<prio>\d{1,4}),(?P<seq>\d+),(?P<usec>\d+),[^;,]*(?:,[^;]*)?;(?P<message>.*)")
_KMSG_DICT = re.compile(r" [A-Z_][A-Z0-9_]*=")


def normalised(lines: list[str]) -> list[str]:
    """The lines with every kmsg or journal-JSON record in dmesg's shape (see the module)."""
    if not any(_looks_like_record(line) for line in lines[:64]):
        return lines  # the common case, a text log: nothing to rewrite
    return [_one(line) for line in lines]


def _looks_like_record(line: str) -> bool:
    return line.startswith("{") or bool(_KMSG.match(line))


def _one(line: str) -> str:
    kmsg = _KMSG.match(line)
    if kmsg:
        return f"<{kmsg['prio']}>[{_seconds(int(kmsg['usec']))}] {kmsg['message']}"
    if _KMSG_DICT.match(line):
        return ""
    if line.startswith("{"):
        return _journal(line)
    return line


def _journal(line: str) -> str:
    try:
        record = json.loads(line)
    except ValueError:
        return line  # not a record after all (a text line that starts with a brace)
    if not isinstance(record, dict) or "MESSAGE" not in record:
        return line
    if record.get("_TRANSPORT", "kernel") != "kernel":
        return ""
    message = record["MESSAGE"]
    if isinstance(message, list):  # journald's form for a message that is not UTF-8
        message = bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode("utf-8", "replace")
    if not isinstance(message, str):
        return ""
    # A message of several lines stays on its record's line: the line numbers are the capture's.
    message = " ".join(message.splitlines())
    stamp = record.get("__MONOTONIC_TIMESTAMP")
    prefix = f"[{_seconds(int(stamp))}] " if isinstance(stamp, str) and stamp.isdigit() else ""
    host = record.get("_HOSTNAME")
    host = host if isinstance(host, str) and host and not any(c.isspace() or c in ":[]" for c in host) else None
    return f"{prefix}{host + ' ' if host else ''}kernel: {message}"


def _seconds(usec: int) -> str:
    """Microseconds since boot as dmesg prints them (``%5lu.%06lu``)."""
    return f"{usec // 1_000_000:5d}.{usec % 1_000_000:06d}"
