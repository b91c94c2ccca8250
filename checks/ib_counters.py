"""InfiniBand / RoCE error counters (``ib-counters``): what grew while the fabric was loaded.

Input: the ``ib_counters`` fact (sysfs ``counters/`` and ``hw_counters/`` of every RDMA port, with
its state), read before the active tests, and ``ib_counters_after``, the same reading once they
are done. The gate field guides use is "error counters must not grow across the test window", so
the verdict is on the growth between the two readings; lifetime values are reported as context.

With two readings, per port (``RULES``; where the figure comes from is in each rule's reason and
in docs/sources.md, "IB error counters"):
- ``link_downed`` grew, or the port's state changed between the readings: the link flapped under
  load (``ib-link-flapping``, FAIL); a port that ended not ACTIVE also points at ``ib-port-down``.
- ``local_link_integrity_errors`` / ``excessive_buffer_overrun_errors`` grew: FAIL; ``symbol_error``
  grew faster than 120 per hour (IBTA's compliant-link bound) by at least ``MIN_FOR_RATE`` errors:
  FAIL; any slower or smaller growth of it, or
  growth of ``link_error_recovery``, ``port_rcv_errors``, ``port_rcv_remote_physical_errors``:
  WARN. All point at the cable, transceiver or switch port (``ib-link-errors``).
- ``port_xmit_discards`` / ``local_ack_timeout_err`` grew: WARN, congestion or a path problem on the
  fabric (``ib-fabric-congestion``).
- ``out_of_buffer`` grew: WARN, the host did not post receive buffers fast enough;
  ``rnr_nak_retry_err`` grew: FAIL, a connection was dropped for it (``ib-host-buffer-exhausted``).
- A counter already at the maximum of its width in the first reading cannot show growth: WARN
  (``ib-counters-saturated``), with the way to clear it. A counter lower in the second reading
  was cleared (or the driver reloaded) in between: its growth is unknown, WARN.

With one reading (a ``--quick`` run, or a pasted capture), error counters that are non-zero since
their last clear WARN (``ib-counters-nonzero``) with that caveat: lifetime history, not growth.
Ports that are down in every reading are left to ``ib-port-down``. A node without RDMA devices
skips.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from preflight.check import fail, host_check, ok, skip, warn
from preflight.collect.probes import IB_COUNTERS, IB_COUNTERS_AFTER, PROBES
from preflight.model import Evidence

CLEAR_ACTION = ("clear the port counters (perfquery -x -R for the local port, or reboot), then re-run preflight "
                "with its active tests so their growth can be seen")
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


def _value(port, name: str) -> int | None:
    rule = RULES.get(name)
    return (port.hw_counters if rule and rule.hw else port.counters).get(name)


@host_check("ib-counters", facts=["ib_counters", "ib_counters_after"],
            summary="RDMA error counters must not grow across the active tests (before/after sysfs readings)")
def ib_counters(host):
    before = host.ib_counters
    after_result = host.result(IB_COUNTERS_AFTER)
    after = host.optional("ib_counters_after")
    if not before.ports:
        return skip(f"no RDMA port to read counters from ({'; '.join(before.notes) or 'empty reading'})")
    if not any(p.counters or p.hw_counters for p in before.ports):
        unreadable = sorted({u for p in before.ports for u in p.unreadable})
        return skip("the RDMA ports expose no readable counter"
                    + (f" ({', '.join(unreadable[:3])})" if unreadable else ""),
                    evidence=[host.excerpt(IB_COUNTERS, r"counters/", limit=3)])
    if after is None:
        return _single_reading(host, before, after_result)
    return _window(host, before, after)


# --------------------------------------------------------------------------- two readings


def _seconds(host) -> float | None:
    a, b = host.result(IB_COUNTERS), host.result(IB_COUNTERS_AFTER)
    try:
        return (datetime.fromisoformat(b.started) - datetime.fromisoformat(a.started)).total_seconds()
    except (TypeError, ValueError, AttributeError):
        return None


def _window(host, before, after):
    seconds = _seconds(host)
    ran = [p for p, r in host.probes.items() if p in PROBES and PROBES[p].active and r.stdout is not None]
    span = (f"{seconds:.0f} s" if seconds is not None else "the window") + (
        f" of {', '.join(ran)}" if ran else " (no active test ran in between)")
    fails, warns, symptoms, evidence = [], [], [], []
    data: dict = {"window_s": seconds, "active_tests": ran, "grew": {}, "lifetime": {}}

    def add(level, phrase, symptom, *ev):
        (fails if level == "fail" else warns).append(phrase)
        if symptom not in symptoms:
            symptoms.append(symptom)
        evidence.extend(e for e in ev if e)

    judged = 0
    for b in before.ports:
        a = after.port(b.device, b.port)
        if a is None:
            add("warn", f"{b.label} missing from the second reading (device reset or removed during the tests?)",
                "ib-link-flapping")
            continue
        if b.state not in (None, "ACTIVE") and a.state not in (None, "ACTIVE"):
            continue  # down throughout: ib-port-down's to judge
        judged += 1
        if (b.state, b.phys_state) != (a.state, a.phys_state):
            add("fail", f"{b.label} changed state during the tests: {b.state}/{b.phys_state} -> "
                        f"{a.state}/{a.phys_state}", "ib-link-flapping", _port_evidence(host, IB_COUNTERS_AFTER, b))
            if a.state != "ACTIVE" and "ib-port-down" not in symptoms:
                symptoms.append("ib-port-down")
        saturated = b.saturated()
        if saturated:
            add("warn", f"{b.label}: {', '.join(saturated)} at the maximum of their width, so their growth "
                        "cannot be seen", "ib-counters-saturated", _port_evidence(host, IB_COUNTERS, b, saturated))
        lifetime = {n: _value(b, n) for n in RULES if _value(b, n)}
        if lifetime:
            data["lifetime"][b.label] = lifetime
        for name, rule in RULES.items():
            v0, v1 = _value(b, name), _value(a, name)
            if v0 is None or v1 is None or name in saturated:
                continue
            if v1 < v0:
                add("warn", f"{b.label} {name} went from {v0} to {v1}: cleared during the tests, growth unknown",
                    "ib-counters-nonzero")
                continue
            grew = v1 - v0
            if not grew:
                continue
            data["grew"].setdefault(b.label, {})[name] = grew
            rate = grew / seconds * 3600 if seconds else None
            level = rule.severity
            # A handful of errors in a short window is not yet a rate: it warns.
            if rule.fail_per_hour is not None and rate is not None and rate > rule.fail_per_hour \
                    and grew >= MIN_FOR_RATE:
                level = "fail"
            pace = f", {rate:.0f}/hour" if rate is not None and rule.fail_per_hour is not None else ""
            add(level, f"{b.label} {name} +{grew} ({v0} -> {v1}{pace}): {rule.reason}", rule.cause,
                _port_evidence(host, IB_COUNTERS_AFTER, b, [name]))
    summary_tail = ("; lifetime values (context, not judged): "
                    + "; ".join(f"{p} " + ", ".join(f"{n}={v}" for n, v in c.items())
                                for p, c in list(data["lifetime"].items())[:3])) if data["lifetime"] else ""
    if fails or warns:
        action = CLEAR_ACTION if symptoms == ["ib-counters-saturated"] else None
        head = f"{len(before.ports)} port(s), counters over {span}: "
        out = fail if fails else warn
        return out(head + "; ".join(fails + warns) + summary_tail, symptoms=symptoms, evidence=evidence[:6],
                   data=data, action=action)
    if not judged:
        return skip("no ACTIVE port in either reading (see ib-port-down)", data=data)
    return ok(f"{judged} active port(s): no error counter grew over {span}{summary_tail}", data=data,
              evidence=[host.excerpt(IB_COUNTERS_AFTER, r"/(symbol_error|link_downed):", limit=2)])


# --------------------------------------------------------------------------- one reading


def _single_reading(host, snapshot, after_result):
    why = ("the second reading failed: only the first is judged" if after_result is not None
           else "one reading only (no active test ran, or a saved capture)")
    nonzero, saturated, evidence = [], [], []
    for port in snapshot.ports:
        sat = port.saturated()
        if sat:
            saturated.append(f"{port.label} {', '.join(sat)}")
            evidence.append(_port_evidence(host, IB_COUNTERS, port, sat))
        errors = {n: _value(port, n) for n in RULES if _value(port, n) and n not in sat}
        if errors:
            nonzero.append(f"{port.label} " + ", ".join(f"{n}={v}" for n, v in errors.items()))
            evidence.append(_port_evidence(host, IB_COUNTERS, port, list(errors)))
    data = {"readings": 1, "nonzero": nonzero, "saturated": saturated}
    if not nonzero and not saturated:
        return ok(f"{len(snapshot.ports)} port(s): every error counter at 0 ({why})", data=data,
                  evidence=[host.excerpt(IB_COUNTERS, r"/(symbol_error|link_downed):", limit=2)])
    parts = []
    symptoms = []
    if nonzero:
        parts.append("error counters non-zero since their last clear (history, not necessarily growth now): "
                     + "; ".join(nonzero))
        symptoms.append("ib-counters-nonzero")
    if saturated:
        parts.append("at the maximum of their width, so further errors are not counted: " + "; ".join(saturated))
        symptoms.append("ib-counters-saturated")
    return warn(f"{why}: " + "; ".join(parts), symptoms=symptoms, evidence=evidence[:6], data=data,
                action=CLEAR_ACTION)


def _port_evidence(host, probe: str, port, names: list[str] | None = None) -> Evidence | None:
    wanted = "|".join(names) if names else "state|phys_state"
    return host.excerpt(probe, rf"/infiniband/{port.device}/ports/{port.port}/(?:hw_)?(?:counters/)?(?:{wanted}):",
                        limit=4)
