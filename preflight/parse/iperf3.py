"""Parser for ``iperf3 -J`` reports (a client's, or a one-off server's).

iperf3's JSON holds ``start`` (the connection, the test's settings: ``test_start.duration``,
``num_streams``, ``reverse``), ``intervals`` and ``end``: ``sum_sent`` and ``sum_received``
with ``bits_per_second``, ``bytes`` and ``seconds``. A test that never connected keeps the same
document with an empty ``end`` and an ``error`` string ("unable to connect to server:
Connection refused"); iperf 3.12 still exits 0 then in some cases, so the error field, not the
exit status, says whether it measured (captures and provenance: tests/fixtures/iperf3/).
The received sum is the figure: what crossed the link, as the receiver counted it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from preflight.parse import ParseError


@dataclass(frozen=True)
class Iperf3Report:
    version: str | None
    error: str | None  # iperf3's own: it did not measure
    sent_bps: float | None
    received_bps: float | None
    seconds: float | None
    retransmits: int | None
    remote_host: str | None
    streams: int | None

    @property
    def gbits(self) -> float | None:
        """Received Gb/s (10^9 bits per second), None when it did not measure."""
        return None if self.received_bps is None else self.received_bps / 1e9


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def parse_iperf3(text: str) -> Iperf3Report:
    """Read an ``iperf3 -J`` document; ``ParseError`` when the text is not one."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"not iperf3 JSON: {exc}") from None
    if not isinstance(doc, dict) or "start" not in doc or not isinstance(doc["start"], dict):
        raise ParseError("not iperf3 JSON: no 'start' object")
    start, end = doc["start"], doc.get("end") if isinstance(doc.get("end"), dict) else {}
    received = end.get("sum_received") if isinstance(end.get("sum_received"), dict) else {}
    sent = end.get("sum_sent") if isinstance(end.get("sum_sent"), dict) else {}
    connected = start.get("connected") if isinstance(start.get("connected"), list) else []
    remote = connected[0].get("remote_host") if connected and isinstance(connected[0], dict) else None
    test = start.get("test_start") if isinstance(start.get("test_start"), dict) else {}
    error = doc.get("error") if isinstance(doc.get("error"), str) else None
    retrans = _number(sent.get("retransmits"))
    streams = _number(test.get("num_streams"))
    return Iperf3Report(start.get("version") if isinstance(start.get("version"), str) else None, error,
                        _number(sent.get("bits_per_second")), _number(received.get("bits_per_second")),
                        _number(received.get("seconds")), None if retrans is None else int(retrans), remote,
                        None if streams is None else int(streams))
