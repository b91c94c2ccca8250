"""InfiniBand / RoCE error counters (``ib-counters``): what grew while the fabric was loaded.

Input: the ``ib_counters`` fact (sysfs ``counters/`` and ``hw_counters/`` of every RDMA port, with
its state), read before the active tests, and ``ib_counters_after``, the same reading once they
are done. The gate field guides use is "error counters must not grow across the test window", so
the verdict is on the growth between the two readings; lifetime values are reported as context.

With two readings, per port (``preflight.judge.ib_growth``, whose ``compare`` the soak's
``soak-ib-counters`` also uses; where the figure comes from is in each rule's reason and
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

from datetime import datetime

from preflight.check import fail, host_check, ok, skip, warn
from preflight.collect.probes import IB_COUNTERS, IB_COUNTERS_AFTER, PROBES
from preflight.judge.ib_growth import compare, error_counters
from preflight.model import Evidence

CLEAR_ACTION = ("clear the port counters (perfquery -x -R for the local port, or reboot), then re-run preflight "
                "with its active tests so their growth can be seen")


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
    found = compare(before, after, seconds, during="during the tests")
    data: dict = {"window_s": seconds, "active_tests": ran, "grew": found.grew, "lifetime": found.lifetime}
    fails = [c.phrase for c in found.changes if c.level == "fail"]
    warns = [c.phrase for c in found.changes if c.level != "fail"]
    probe = {"before": IB_COUNTERS, "after": IB_COUNTERS_AFTER}
    evidence = [_port_evidence(host, probe[c.reading], c.port, list(c.counters) or None)
                for c in found.changes if c.reading]
    evidence = [e for e in evidence if e]
    symptoms = found.symptoms
    summary_tail = ("; lifetime values (context, not judged): "
                    + "; ".join(f"{p} " + ", ".join(f"{n}={v}" for n, v in c.items())
                                for p, c in list(data["lifetime"].items())[:3])) if data["lifetime"] else ""
    if fails or warns:
        action = CLEAR_ACTION if symptoms == ["ib-counters-saturated"] else None
        head = f"{len(before.ports)} port(s), counters over {span}: "
        out = fail if fails else warn
        return out(head + "; ".join(fails + warns) + summary_tail, symptoms=symptoms, evidence=evidence[:6],
                   data=data, action=action)
    if not found.judged:
        return skip("no ACTIVE port in either reading (see ib-port-down)", data=data)
    return ok(f"{found.judged} active port(s): no error counter grew over {span}{summary_tail}", data=data,
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
        errors = {n: v for n, v in error_counters(port).items() if n not in sat}
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
