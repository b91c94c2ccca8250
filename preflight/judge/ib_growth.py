"""What grew between two readings of the RDMA port counters, and how bad it is: one pure function.

The ``ib-counters`` check (``checks/ib_counters.py``: before and after a run's active tests) and
the soak's ``soak-ib-counters`` (``preflight/soak/ib.py``: before, during and after a soak) judge
a window with the same rules, thresholds and words, so both call ``compare``. It takes two
parsed readings (``preflight.parse.ib_counters.CounterSnapshot``) and the seconds between them
and returns every ``Change`` it found; the callers add evidence from their own files.

Per port (``RULES``; where each figure comes from is in its reason and in docs/sources.md, "IB
error counters"):
- ``link_downed`` grew, or the port's state changed between the readings: the link flapped
  (``ib-link-flapping``, FAIL); a port that ended not ACTIVE also points at ``ib-port-down``.
- ``local_link_integrity_errors`` / ``excessive_buffer_overrun_errors`` grew: FAIL; ``symbol_error``
  grew faster than 120 per hour (IBTA's compliant-link bound) by at least ``MIN_FOR_RATE``
  errors: FAIL; any slower or smaller growth of it, or growth of ``link_error_recovery``,
  ``port_rcv_errors``, ``port_rcv_remote_physical_errors``: WARN (``ib-link-errors``).
- ``port_xmit_discards`` / ``local_ack_timeout_err`` grew: WARN (``ib-fabric-congestion``).
- ``out_of_buffer`` grew: WARN; ``rnr_nak_retry_err`` grew: FAIL (``ib-host-buffer-exhausted``).
- A counter at the maximum of its width in the first reading cannot show growth: WARN
  (``ib-counters-saturated``). A counter lower in the second reading was cleared in between:
  its growth is unknown, WARN (``ib-counters-nonzero``).
Ports down in both readings are left to ``ib-port-down``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from preflight.parse.ib_counters import CounterSnapshot, PortCounters

IBTA_SYMBOL_ERRORS_PER_HOUR = 120.0
# Growth below this many errors WARNs whatever its rate: over the seconds between two readings of a
# short run one error would otherwise read as thousands per hour. Chosen, not published.
MIN_FOR_RATE = 10


@dataclass(frozen=True)
class Rule:
    severity: str  # fail | warn: for any growth in the window
    cause: str
    reason: str
    fail_per_hour: float | None = None  # growth faster than this FAILs (a warn rule)
    hw: bool = False  # under hw_counters/


_LINK = "the cable, transceiver or switch port of this link"
RULES = {
    "link_downed": Rule("fail", "ib-link-flapping",
                        "the link went down and retrained during the window (NVIDIA NVSentinel's link counter "
                        "design: any link_downed growth is fatal to a running job)"),
    "local_link_integrity_errors": Rule("fail", "ib-link-errors",
                                        f"local physical errors past the link's integrity threshold: {_LINK} "
                                        "(NVSentinel: any growth is fatal)"),
    "excessive_buffer_overrun_errors": Rule("fail", "ib-link-errors",
                                            "the receive buffer overran, breaking the lossless link (NVSentinel: "
                                            "any growth is fatal)"),
    "symbol_error": Rule("warn", "ib-link-errors",
                         f"symbol errors on the wire: {_LINK}; above 120/hour the link is outside the IBTA BER bound",
                         fail_per_hour=IBTA_SYMBOL_ERRORS_PER_HOUR),
    "link_error_recovery": Rule("warn", "ib-link-errors", f"the link retrained to recover from errors: {_LINK}"),
    "port_rcv_errors": Rule("warn", "ib-link-errors", "malformed packets received (no published per-window figure: "
                                                      "any growth warns)"),
    "port_rcv_remote_physical_errors": Rule("warn", "ib-link-errors", "packets arrived marked bad by a physical "
                                                                      "error further along the path"),
    "port_xmit_discards": Rule("warn", "ib-fabric-congestion", "packets dropped on transmit: congestion, or a "
                                                               "path with a port down"),
    "local_ack_timeout_err": Rule("warn", "ib-fabric-congestion", "transport ACKs timed out: a path problem or "
                                                                  "severe congestion", hw=True),
    "out_of_buffer": Rule("warn", "ib-host-buffer-exhausted", "packets dropped because the host had no receive "
                                                              "buffer posted: host side, not the link", hw=True),
    "rnr_nak_retry_err": Rule("fail", "ib-host-buffer-exhausted",
                              "receiver-not-ready retries exhausted: a connection was dropped (NVSentinel: fatal)",
                              hw=True),
}


def value(port: PortCounters, name: str) -> int | None:
    """A counter of ``RULES`` from the directory it lives in (``counters/`` or ``hw_counters/``)."""
    rule = RULES.get(name)
    return (port.hw_counters if rule and rule.hw else port.counters).get(name)


def error_counters(port: PortCounters) -> dict[str, int]:
    """The port's non-zero error counters (those ``RULES`` judge)."""
    return {n: v for n in RULES if (v := value(port, n))}


@dataclass(frozen=True)
class Change:
    """One thing found between two readings. ``reading`` says which reading shows it (for the
    evidence): ``before`` for a saturated counter, ``after`` for growth and state changes, None
    for a port that vanished. ``counters`` names the counter files to quote; empty means the
    port's state lines."""

    level: str  # fail | warn
    symptoms: tuple[str, ...]
    phrase: str
    port: PortCounters
    reading: str | None = "after"
    counters: tuple[str, ...] = ()
    counter: str | None = None  # the counter that grew, where one did
    grew: int | None = None
    flap: bool = False  # link_downed grew, or the state changed


@dataclass(frozen=True)
class Comparison:
    changes: tuple[Change, ...]
    judged: int  # ports up in at least one reading, compared
    grew: dict[str, dict[str, int]] = field(default_factory=dict)  # port label -> counter -> growth
    lifetime: dict[str, dict[str, int]] = field(default_factory=dict)  # port label -> non-zero first values

    @property
    def failed(self) -> bool:
        return any(c.level == "fail" for c in self.changes)

    @property
    def symptoms(self) -> list[str]:
        return list(dict.fromkeys(s for c in self.changes for s in c.symptoms))


def rate_per_hour(grew: int, seconds: float | None) -> float | None:
    return grew / seconds * 3600 if seconds else None


def compare(before: CounterSnapshot, after: CounterSnapshot, seconds: float | None,
            during: str = "in between") -> Comparison:
    """Every change between two readings ``seconds`` apart (None: unknown, so no rate);
    ``during`` names the window in the words ("during the tests")."""
    changes: list[Change] = []
    grew_by: dict[str, dict[str, int]] = {}
    lifetime: dict[str, dict[str, int]] = {}
    judged = 0
    for b in before.ports:
        a = after.port(b.device, b.port)
        if a is None:
            changes.append(Change("warn", ("ib-link-flapping",), f"{b.label} missing from the second reading "
                                  f"(device reset or removed {during}?)", b, reading=None))
            continue
        if b.state not in (None, "ACTIVE") and a.state not in (None, "ACTIVE"):
            continue  # down throughout: ib-port-down's to judge
        judged += 1
        if (b.state, b.phys_state) != (a.state, a.phys_state):
            symptoms = ("ib-link-flapping",) + (("ib-port-down",) if a.state != "ACTIVE" else ())
            changes.append(Change("fail", symptoms, f"{b.label} changed state {during}: {b.state}/{b.phys_state} -> "
                                  f"{a.state}/{a.phys_state}", b, flap=True))
        saturated = b.saturated()
        if saturated:
            changes.append(Change("warn", ("ib-counters-saturated",), f"{b.label}: {', '.join(saturated)} at the "
                                  "maximum of their width, so their growth cannot be seen", b, reading="before",
                                  counters=tuple(saturated)))
        if first := error_counters(b):
            lifetime[b.label] = first
        for name, rule in RULES.items():
            v0, v1 = value(b, name), value(a, name)
            if v0 is None or v1 is None or name in saturated:
                continue
            if v1 < v0:
                changes.append(Change("warn", ("ib-counters-nonzero",), f"{b.label} {name} went from {v0} to {v1}: "
                                      f"cleared {during}, growth unknown", b, counters=(name,)))
                continue
            grew = v1 - v0
            if not grew:
                continue
            grew_by.setdefault(b.label, {})[name] = grew
            rate = rate_per_hour(grew, seconds)
            level = rule.severity
            # A handful of errors in a short window is not yet a rate: it warns.
            if rule.fail_per_hour is not None and rate is not None and rate > rule.fail_per_hour \
                    and grew >= MIN_FOR_RATE:
                level = "fail"
            pace = f", {rate:.0f}/hour" if rate is not None and rule.fail_per_hour is not None else ""
            changes.append(Change(level, (rule.cause,), f"{b.label} {name} +{grew} ({v0} -> {v1}{pace}): "
                                  f"{rule.reason}", b, counters=(name,), counter=name, grew=grew,
                                  flap=name == "link_downed"))
    return Comparison(tuple(changes), judged, grew_by, lifetime)
