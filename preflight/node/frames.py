"""Records from many nodes over one byte stream (srun's stdout), framed so that interleaving
cannot corrupt them.

srun merges the stdout of every task into one stream. It keeps lines whole only up to its
buffer size, so a record is compressed, base64-encoded and cut into short lines, each of which
names its node, the record's sequence number, its part and a CRC of itself::

    @pf1 NODE SEQ PART/PARTS CRC32 CHUNK

A line that does not parse or whose CRC does not match is counted as damaged and dropped; a
record is complete when all its parts have arrived, in any order. The record itself is a JSON
header and an optional raw payload (a probe's stdout, byte for byte), joined by a NUL byte,
which JSON text never contains. Stdlib only: the encoder runs on nodes, and imports only
``binascii`` and ``zlib`` there: ``json`` and ``base64`` bring ``re`` (and ``enum``), which cost a
node's python3 more to import than the runner's whole work on a quiet node. A header is a flat
object of strings, numbers, booleans and nulls, which ``_json`` writes; the controller reads it
with ``json``.
"""

from __future__ import annotations

import binascii
import math
import zlib

MAGIC = "@pf1"
CHUNK = 700  # base64 characters per line: well below any pipe or srun buffer


# JSON's escapes for what a string may not hold as it is: the quote, the backslash, control characters.
_ESCAPES = {c: "\\u%04x" % c for c in range(0x20)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"})


def _json(header):
    """``header`` (a flat dict) as JSON text, keys sorted: what ``json.dumps(header,
    sort_keys=True, ensure_ascii=False)`` writes, except that a number JSON cannot hold becomes null."""
    def value(v):
        if v is None or v is True or v is False:
            return {None: "null", True: "true", False: "false"}[v]
        if isinstance(v, int):
            return str(int(v))
        if isinstance(v, float):
            return repr(v) if math.isfinite(v) else "null"
        return '"%s"' % str(v).translate(_ESCAPES)
    return "{%s}" % ", ".join('"%s": %s' % (str(k).translate(_ESCAPES), value(header[k])) for k in sorted(header))


def encode(node, seq, header, payload=b""):
    """The lines (each ending in a newline) that carry one record."""
    # "replace": a lone surrogate (a file name that is not UTF-8) must not lose the record.
    blob = _json(header).encode("utf-8", "replace") + b"\0" + (payload or b"")
    text = binascii.b2a_base64(zlib.compress(blob, 6), newline=False).decode("ascii")
    chunks = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]
    lines = []
    for part, chunk in enumerate(chunks, start=1):
        head = "%s %s %d %d/%d" % (MAGIC, node, seq, part, len(chunks))
        lines.append("%s %08x %s\n" % (head, zlib.crc32((head + " " + chunk).encode("ascii")), chunk))
    return lines


class FrameReader:
    """Reassembles records from lines in any order; ``feed`` returns the records it completed as
    ``(node, seq, header, payload)``. ``damaged`` counts lines dropped, ``noise`` keeps a few of
    the lines that were not frames at all (a node's python printing a warning, say)."""

    def __init__(self):
        self._parts = {}
        self.damaged = 0
        self.noise = []

    def feed(self, line):
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        line = line.rstrip("\r\n")
        if not line.startswith(MAGIC + " "):
            if line.strip() and len(self.noise) < 20:
                self.noise.append(line[:300])
            return []
        try:
            magic, node, seq, parts, crc, chunk = (line.split(" ", 5) + [""])[:6]
            part, count = (int(x) for x in parts.split("/"))
            head = " ".join((magic, node, seq, parts))
            if int(crc, 16) != zlib.crc32((head + " " + chunk).encode("ascii")) or not 1 <= part <= count:
                raise ValueError("crc")
            seq = int(seq)
        except (ValueError, UnicodeEncodeError):
            self.damaged += 1
            return []
        got = self._parts.setdefault((node, seq), {})
        got[part] = chunk
        if len(got) < count:
            return []
        del self._parts[(node, seq)]
        import json  # the controller's side only: see the module's docstring

        try:
            blob = zlib.decompress(binascii.a2b_base64("".join(got[i] for i in range(1, count + 1))))
            header, payload = blob.split(b"\0", 1)
            return [(node, seq, json.loads(header.decode("utf-8")), payload)]
        except (ValueError, KeyError, zlib.error, binascii.Error):
            self.damaged += count
            return []

    def incomplete(self):
        """The (node, seq) of records some of whose lines never came."""
        return sorted(self._parts)
