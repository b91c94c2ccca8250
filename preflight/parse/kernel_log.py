"""Kernel log parser: GPU, NVSwitch, ConnectX and PCIe trouble in ``dmesg`` / ``journalctl -k``.

Input is the probe ``kernel-log``: the kernel ring buffer as printed by ``dmesg`` or
``journalctl -k``, whole or as an excerpt (``dmesg | grep ...``). Each line may carry a prefix,
which is stripped before matching; the timestamp text and the host are kept:

- plain dmesg ``[12345.678901] ``; ``dmesg -H`` deltas ``[  +0.000844] ``;
  ``dmesg -T`` ``[Sun Nov 29 10:00:00 2026] ``;
  ``dmesg --time-format iso`` ``2026-11-29T10:00:00,123456+00:00 ``;
  ``dmesg -x`` facility/level ``kern  :warn  : ``; ``dmesg -r`` priority ``<4>``
- journald / syslog ``Nov 29 10:00:00 host kernel: `` and
  ``2026-11-29T10:00:00+0000 host kernel: ``, also followed by a dmesg ``[seconds]`` stamp
  (``/var/log/kern.log``), or a bare ``kernel: ``
- ``talosctl dmesg`` ``192.168.11.119: kern: warning: [2026-04-22T21:27:51.291660856Z]: ``
- raw ``/dev/kmsg`` records ``6,1873,38174242,-;message`` (with their `` KEY=value``
  continuation lines) and ``journalctl -k -o json`` records, rewritten line for line into the
  shapes above first (kernel_log_shapes.py)
- pdsh / clush ``host: `` in front of any of the above. A bare ``host: message`` with nothing
  after the colon that looks like a prefix is indistinguishable from a driver tag such as
  ``mlx5_vdpa: ``, so there the host is left unset (the line is still matched).

Lines with no prefix at all (copied from an issue or a doctest) are read the same way.

The symptom vocabulary (``KernelEvent.kind``) and the signature table live in
``kernel_signatures.py``; this module strips prefixes, matches and folds.

Some messages span several lines. A signature is a START (always a new event), MORE (folded into
the latest event of its kind from the same host when that event grew within the last
``_FOLD_WINDOW`` lines and names no other device; else a new event) or CONTEXT (no event; it
remembers the device for the next lines of the same driver, for messages that name the GPU on an
earlier line). Matching is one pass over the lines; for each line the first signature that
matches wins, so the more specific ones come first in ``SIGNATURES``.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, replace
from itertools import accumulate

from preflight.parse import ParseError, kernel_log_shapes
from preflight.parse.kernel_signatures import (  # noqa: F401 - PcieLimit: a record this module returns
    _BDF,
    _CONTEXT,
    _FOLD_WINDOW,
    _MORE,
    SIGNATURES,
    KernelEvent,
    PcieLimit,
    Signature,
)
from preflight.parse.kernel_signatures import typed as _typed


@dataclass(frozen=True)
class KernelLog:
    """The events of one kernel log, in line order; notes say what limits the reading."""

    events: tuple[KernelEvent, ...]
    line_count: int
    notes: tuple[str, ...] = ()
    # The timestamps of the log's first and last lines that carry one, as printed: the span a
    # rate of events is counted over.
    first_timestamp: str | None = None
    last_timestamp: str | None = None

    def of_kind(self, *kinds: str) -> tuple[KernelEvent, ...]:
        return tuple(e for e in self.events if e.kind in kinds)


_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_ISO = (r"[0-9]{4}-[0-9][0-9]-[0-9][0-9][T ][0-9][0-9]:[0-9][0-9]:[0-9][0-9](?:[.,][0-9]+)?"
        r"(?:Z|[+-][0-9][0-9]:?[0-9][0-9])?")
_PRIORITY = re.compile(r"<[0-9]+>")
_FACILITY = re.compile(
    r"(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])\s*:\s*"
    r"(?:emerg|alert|crit|err|warn|warning|notice|info|debug)\s*:\s*")
_TIMESTAMPS = (
    re.compile(r"\[(?P<ts>\s*[0-9]+\.[0-9]+)\]:?\s*"),
    re.compile(r"\[(?P<ts>\s*\+[0-9]+\.[0-9]+)\]:?\s*"),  # dmesg -H: time since the line before
    re.compile(r"\[(?P<ts>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MONTH
               + r"\s+[0-9]{1,2} [0-9][0-9]:[0-9][0-9]:[0-9][0-9] [0-9]{4})\]:?\s*"),
    re.compile(r"\[(?P<ts>" + _ISO + r")\]:?\s*"),
    re.compile(r"(?P<ts>" + _ISO + r")\s+"),
    re.compile(r"(?P<ts>" + _MONTH + r"\s+[0-9]{1,2} [0-9][0-9]:[0-9][0-9]:[0-9][0-9])\s+"),
)
_SYSLOG_HOST = re.compile(r"(?P<host>[^\s:\[\]]+) kernel: ")
_KERNEL_TAG = re.compile(r"kernel: ")
_PDSH_HOST = re.compile(r"(?P<host>[A-Za-z0-9][\w.-]*): ")
# dev_printk style "driver 0000:03:00.0[ netdev]: " or a bare "driver: " tag.
_ORIGIN = re.compile(r"(?P<driver>[\w.-]+)(?: (?P<device>" + _BDF + r"|mlx5_[0-9]+)(?: [\w.-]+)?)?: ")

# Output that is a shell or tool error rather than a kernel log.
_TOOL_ERROR = re.compile(
    r"^(?:(?:ba|z|da)?sh|sudo|dmesg|journalctl)(?:: line [0-9]+)?: |command not found$")
_JOURNALD_MARKER = re.compile(r"^-- .* --$")
_ELISION = re.compile(r"^(?:\[\.\.\.\]|\.\.\.|…)$")
_SUPPRESSED = re.compile(r"([0-9]+) callbacks suppressed|printk messages dropped")


@dataclass(frozen=True)
class _Prefix:
    host: str | None
    timestamp: str | None
    message: str


_PREFIXES = (_PRIORITY, _FACILITY, *_TIMESTAMPS, _KERNEL_TAG)
# The prefixes as one alternation, tried in the same order: one match per step of a line instead
# of one per prefix (every line ends with a step that matches none). Each alternative is a named
# group of its own, so ``lastgroup`` says which matched; that one is matched again for its groups.
_ANY_PREFIX = re.compile("|".join(
    f"(?P<_p{i}>{re.sub(r'[(][?]P<[a-z_]+>', '(?:', p.pattern)})" for i, p in enumerate(_PREFIXES)))


def _match_prefix(text: str, after_timestamp: bool) -> re.Match[str] | None:
    """The first of the log prefixes that starts ``text`` (then a syslog host after a
    timestamp), or None."""
    which = _ANY_PREFIX.match(text)
    if which:
        return _PREFIXES[int(which.lastgroup[2:])].match(text)
    return _SYSLOG_HOST.match(text) if after_timestamp else None


def _split_prefix(line: str) -> _Prefix:
    text = line.strip()
    host = timestamp = None
    pdsh = _PDSH_HOST.match(text)
    # A leading "name: " is a pdsh/clush host only when a log prefix follows it; otherwise
    # it is the driver tag of the message ("mlx5_vdpa: ...", "kernel: ...").
    if pdsh and pdsh["host"] != "kernel" and _match_prefix(text[pdsh.end():], False):
        host, text = pdsh["host"], text[pdsh.end():]
    while match := _match_prefix(text, timestamp is not None):
        groups = match.groupdict()
        timestamp = timestamp or (groups.get("ts") or "").strip() or None
        host = host or groups.get("host")
        text = text[match.end():]
    return _Prefix(host, timestamp, text.strip())


def _match(message: str) -> tuple[Signature, dict[str, object]] | None:
    for signature in SIGNATURES:
        if signature.needle not in message:
            continue
        match = signature.pattern.search(message)
        if not match:
            continue
        raw = {k: v for k, v in match.groupdict().items() if v is not None}
        for extra in signature.extras:
            found = extra.search(message)
            if found:
                for name, value in found.groupdict().items():
                    if value is not None:
                        raw.setdefault(name, value)
        return signature, _typed(raw)
    return None


def _check_not_a_log(lines: list[str]) -> None:
    content = [line.strip() for line in lines if line.strip()]
    if not content:
        raise ParseError("empty kernel log")
    if all(_TOOL_ERROR.search(line) for line in content):
        raise ParseError(f"not a kernel log: {content[0][:200]}")


# Text a line must contain to be more than "a line of the log": the journal's "-- ... --"
# markers, an elision, the kernel's rate-limit notes. With the signatures' needles, these are
# every line that can change a reading once one line has shown this is a kernel log.
_SPECIAL_NEEDLES = ("--", "...", "\u2026", "callbacks suppressed", "printk messages dropped")


def _candidate_lines(lines: list[str]) -> set[int] | None:
    """The (1-based) numbers of the lines holding a needle, found by searching the whole log once
    per needle (``str.find`` over one string) rather than every line for every needle; None
    when a signature has no needle, so that every line is read."""
    needles = {s.needle for s in SIGNATURES}
    if "" in needles:
        return None
    # Lines hold no line break (splitlines removed them all), so in the "\n"-joined text a
    # needle's hit lies inside one line, found from the offsets where lines start.
    joined = "\n".join(lines)
    starts = list(accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
    found: set[int] = set()
    for needle in needles.union(_SPECIAL_NEEDLES):
        at = joined.find(needle)
        while at >= 0:
            number = bisect_right(starts, at)  # the 1-based number of the line holding `at`
            found.add(number)
            end = starts[number] if number < len(starts) else len(joined)
            at = joined.find(needle, end)
    return found


def _distance(lines: list[str], captured: list[str]):
    """``apart(a, b)``: how many lines of the log lie from line a to line b, counting only lines
    that were not blanked by the normalising (plain line numbers where nothing was rewritten)."""
    if lines is captured:
        return lambda a, b: b - a
    kept = [0, *accumulate(1 if line or not captured[i] else 0 for i, line in enumerate(lines))]
    return lambda a, b: kept[b] - kept[a]


def parse_kernel_log(text: str) -> KernelLog:
    """Read ``dmesg`` / ``journalctl -k`` output into the symptoms it shows."""
    captured = text.splitlines()
    # Raw /dev/kmsg records and journalctl's JSON, line for line in dmesg's shape (kernel_log_shapes.py).
    lines = kernel_log_shapes.normalised(captured)
    _check_not_a_log(lines)
    # Records apart, for folding: a kmsg record's continuation lines (empty once normalised) do
    # not count, so a multi-line message folds as it does in dmesg.
    apart = _distance(lines, captured)

    events: list[KernelEvent] = []
    notes: list[str] = []
    # (host, kind) -> (index into events, last line that added to it), for MORE lines.
    open_records: dict[tuple[str | None, str], tuple[int, int]] = {}
    # (host, driver) -> (line, device) from CONTEXT lines.
    context: dict[tuple[str | None, str | None], tuple[int, str]] = {}
    suppressed = 0
    # Lines that carry a log prefix (timestamp, priority, facility, "kernel:") or a known
    # message: a text with neither is not a kernel log (random bytes, another tool's output),
    # and reading it as "no errors in N lines" would pass a node on no evidence.
    recognised = 0
    candidates = _candidate_lines(lines)

    for number, raw in enumerate(lines, start=1):
        if recognised and candidates is not None and number not in candidates:
            continue
        prefix = _split_prefix(raw)
        message = prefix.message
        if not message:
            continue
        if message != raw.strip():
            recognised += 1
        if _JOURNALD_MARKER.match(message):
            recognised += 1
            if "No entries" in message:
                notes.append("journalctl reported no entries")
            continue
        if _ELISION.match(message):
            notes.append(f"line {number}: {message!r} marks an elided part; the log is an excerpt")
            continue
        drop = _SUPPRESSED.search(message)
        if drop:
            suppressed += int(drop.group(1) or 0) or 1

        found = _match(message)
        if found is None:
            continue
        recognised += 1
        signature, values = found
        origin = _ORIGIN.match(message)
        base: dict[str, object] = {}
        if origin:
            base = {k: v for k, v in origin.groupdict().items() if v is not None}
        if base.get("device") and values.get("device") not in (None, base["device"]):
            values["origin"] = base["device"]
        values = {**base, **values}
        driver = values.get("driver")

        if signature.role == _CONTEXT:
            context[(prefix.host, driver)] = (number, str(values["device"]))
            continue
        if "device" not in values:
            remembered = context.get((prefix.host, driver))
            if remembered and apart(remembered[0], number) <= _FOLD_WINDOW:
                values["device"] = remembered[1]

        key = (prefix.host, signature.kind)
        if signature.role == _MORE and key in open_records:
            index, last = open_records[key]
            current = events[index]
            conflict = current.device is not None and values.get("device") not in (
                None, current.device)
            if apart(last, number) <= _FOLD_WINDOW and not conflict:
                missing = {k: v for k, v in values.items() if getattr(current, k) is None}
                events[index] = replace(current, **missing)
                open_records[key] = (index, number)
                continue

        events.append(KernelEvent(kind=signature.kind, line=number, message=message, raw=captured[number - 1],
                                  timestamp=prefix.timestamp, host=prefix.host, **values))
        open_records[key] = (len(events) - 1, number)

    if not recognised:
        first = next(line.strip() for line in lines if line.strip())
        raise ParseError(f"not a kernel log: none of its {len(lines)} lines has a dmesg or journal prefix "
                         f"(timestamp, priority, 'kernel:') or a known kernel message; it starts {first[:80]!r}")
    if suppressed:
        notes.append(f"the kernel rate-limited at least {suppressed} messages; "
                     "counts of repeated events are lower bounds")
    stamped = (_split_prefix(line).timestamp for line in lines if line.strip())
    first = next(filter(None, stamped), None)
    last = next(filter(None, (_split_prefix(line).timestamp for line in reversed(lines) if line.strip())), None)
    return KernelLog(events=tuple(events), line_count=len(lines), notes=tuple(notes),
                     first_timestamp=first, last_timestamp=last)
