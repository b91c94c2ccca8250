"""Xid and SXid: GPU and NVSwitch errors the NVIDIA driver wrote to the kernel log (check ``xid``).

Input is the ``kernel-log`` probe (``dmesg`` or ``journalctl -k``, whole or grep'd) as read by
``preflight/parse/kernel_log.py``. What an Xid means, how bad it is and what to do about it
comes from ``playbooks/xid.yaml`` (NVIDIA's Xid Catalog plus preflight's severity):

- catalog severity ``fatal`` -> FAIL; ``error`` -> WARN, or FAIL when the line itself says
  Fatal (the NVLink5 Xids 144-150 print Fatal/Nonfatal); ``info`` -> PASS naming the event.
- Xid 154 (recovery action changed) is judged by the action it names: None -> info,
  Drain P2P -> WARN, any reset or reboot -> FAIL.
- Xid 45 "caused by previous Xid N" (newer drivers) is the channel teardown that Xid N caused,
  so it is judged as Xid N, also when the excerpt holds no line of N itself. A bare Xid 45 is
  an aborted application (info).
- An Xid the catalog lacks warns (cause ``gpu-xid``): unknown to us is not harmless.

Driver messages that are no Xid line are never reported as an Xid the log did not print
(issue 33). Where the log has an Xid line for the same fault (the "fallen off the bus" message
beside Xid 79, GSP timeouts and their RPC / falcon dumps beside Xid 119 or 120), they join that
Xid's finding. Otherwise each is a finding of its own, named as what it is and tied to its GPU
(``_gpu_driver_messages.py``): GPU fell off the bus (``gpu-fallen-off-bus``), GSP RPC timeout,
heartbeat timeout or dump (``gpu-gsp-error``), RmInitAdapter / GSP firmware init / attach / FSP
boot failure (``gpu-init-failed``), GPU not supported by the driver (``gpu-driver-unsupported``);
all FAIL. The ``xid-N`` symptom is added only where an Xid line names N.

NVSwitch SXids have no catalog in preflight: a Fatal SXid fails the node, a Non-fatal one
warns, both as NVLink fabric errors (``nvlink-errors``). The driver prints up to three lines
per SXid (Data / description / Severity); they are kept together under their SXid number.

Time: dmesg holds everything since boot (unless the ring buffer wrapped), ``journalctl -k`` the
current boot. An Xid from earlier in this boot is judged as current, since nothing in the log
says it was dealt with; a GPU reset does not clear the log, so after one re-run preflight on a
log taken since the reset (``journalctl -k --since``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.check import fail, host_check, ok, skip, warn
from preflight.knowledge.xid_catalog import XidEntry, load_xid_catalog
from preflight.model import Evidence

from ._gpu_driver_messages import (
    DRIVER_CAUSES,
    DRIVER_KINDS,
    driver_action,
    driver_summary,
    related_xid,
    with_devices,
)
from ._pci_roles import address_key

PROBE = "kernel-log"
TEARDOWN = 45  # Xid 45: channel torn down, possibly "caused by previous Xid N"
RECOVERY = 154
_NAMES_GPU = re.compile(r"GPU (?:at PCI:)?[0-9a-fA-F]{4}:")
_STATUS = {"fatal": fail, "error": warn, "info": ok}
_ORDER = {"fatal": 0, "error": 1, "info": 2}
EVIDENCE_LINES = 8
EMPTY_JOURNAL = "journalctl reported no entries"  # the parser's note for "-- No entries --"


@dataclass
class _Group:
    """The events of one Xid (or SXid) number, however the driver reported them."""

    kind: str  # "xid" | "sxid" | "driver" (driver messages without an Xid line)
    code: int | str  # the Xid or SXid; for "driver", the fault (gsp, init, fallen-off-bus, unsupported)
    events: list = field(default_factory=list)

    def xid_lines(self):
        return [e for e in self.events if e.kind == "xid" and e.code == self.code]

    def teardowns(self):
        return [e for e in self.events if e.kind == "xid" and e.code == TEARDOWN and e.caused_by == self.code]

    def messages(self):
        return [e for e in self.events if e.kind != "xid"]

    def devices(self) -> str:
        # One GPU printed two ways ("0000:01:00" by a dump, "0000:01:00.0" by RmInitAdapter) is one.
        forms: dict[str, str] = {}
        for e in self.events:
            forms.setdefault(address_key(e.device) or e.device or "unknown device", e.device or "unknown device")
        seen = list(forms.values())
        more = f" and {len(seen) - 4} more" if len(seen) > 4 else ""
        return ", ".join(seen[:4]) + more


@host_check("xid", facts=["kernel_log"],
            summary="NVIDIA Xid / SXid and GPU driver errors in the kernel log, judged with playbooks/xid.yaml")
def xid(host):
    log = host.kernel_log
    groups = _group(log.events)
    notes = "; ".join(log.notes)
    if not groups:
        if not log.events and EMPTY_JOURNAL in log.notes:
            return skip("the kernel log is empty (journalctl: no entries): no Xid history to judge")
        if not log.of_kind("nvidia-driver-load"):
            # A log that reaches back to boot holds the NVRM load line; without it, Xids from
            # before its first line (ring buffer wrapped, or a grep'd excerpt) are not seen.
            notes = "; ".join(filter(None, [notes, "no NVRM driver-load line: the log may not reach back to boot"]))
        return ok(f"no Xid, SXid or GPU driver error in {log.line_count} kernel-log lines"
                  + (f" ({notes})" if notes else ""))
    lines = host.text(PROBE).splitlines()
    catalog = load_xid_catalog()
    judged = [_judge(g, catalog.get(g.code) if g.kind == "xid" else None) for g in groups]
    judged.sort(key=lambda j: (_ORDER[j[0]], j[1].kind, j[1].code))
    return [_outcome(severity, group, entry, lines, notes) for severity, group, entry in judged]


def _group(events) -> list[_Group]:
    """Xid lines by the Xid they report (Xid 45 by the one that caused it), SXid lines by
    number, and the driver's Xid-less messages with the Xid line of the same fault when the
    log has one, else by the fault they are (never by an Xid the log did not print)."""
    events = with_devices(events)
    printed = {e.caused_by if e.code == TEARDOWN and e.caused_by else e.code
               for e in events if e.kind == "xid" and e.code is not None}
    groups: dict[tuple[str, int | str], _Group] = {}
    for e in events:
        if e.kind == "xid" and e.code is not None:
            code = e.caused_by if e.code == TEARDOWN and e.caused_by else e.code
            key = ("xid", code)
        elif e.kind in DRIVER_KINDS:
            fault, xids = DRIVER_KINDS[e.kind]
            joined = next((x for x in xids if x in printed), None)
            key = ("xid", joined) if joined is not None else ("driver", fault)
        elif e.kind == "sxid" and e.code is not None:
            key = ("sxid", e.code)
        else:
            continue
        groups.setdefault(key, _Group(*key)).events.append(e)
    return list(groups.values())


def _judge(group: _Group, entry: XidEntry | None) -> tuple[str, _Group, XidEntry | None]:
    # Printed as "Fatal", "Non-fatal" (SXid) or "Nonfatal" (NVLink5 Xids).
    said_fatal = any((e.severity or "").casefold() == "fatal" for e in group.events)
    if group.kind == "driver":
        return "fatal", group, None  # every one of them leaves the GPU unusable until reset or reinstall
    if group.kind == "sxid":
        return ("fatal" if said_fatal else "error"), group, None
    if entry is None:
        return "error", group, None
    if group.code == RECOVERY:
        return min((_recovery_severity(e.recovery_action) for e in group.events),
                   key=_ORDER.get), group, entry
    if entry.severity == "error" and said_fatal:
        return "fatal", group, entry
    return entry.severity, group, entry


def _recovery_severity(action: str | None) -> str:
    """Xid 154's new action: None needs nothing, Drain P2P keeps the GPU usable once peer
    traffic stops, everything else (GPU Reset Required, Node Reboot Required, Drain and Reset,
    OS Reboot, PF FLR) needs a reset or reboot first."""
    words = (action or "").casefold()
    if not words:
        return "error"  # the message did not say which action: unknown, so not harmless
    if words == "none":
        return "info"
    if "drain p2p" in words:
        return "error"
    return "fatal"


def _outcome(severity: str, group: _Group, entry: XidEntry | None, lines: list[str], notes: str):
    verdict = _STATUS[severity]
    summary = _summary(severity, group, entry) + (f" ({notes})" if notes else "")
    evidence = [_evidence(group, lines)]
    data = {"code": group.code, "kind": group.kind, "events": len(group.events), "severity": severity}
    if group.kind == "driver":  # no Xid number: the fault it is, never a code the log did not print
        data = {"fault": data.pop("code"), **data}
    action = _action(severity, group, entry)
    if severity == "info":
        return verdict(summary, evidence=evidence, data=data, action=action)
    return verdict(summary, symptoms=_symptoms(group, entry), evidence=evidence, data=data, action=action)


def _summary(severity: str, group: _Group, entry: XidEntry | None) -> str:
    count = f"{len(group.events)} line{'s' if len(group.events) != 1 else ''}"
    if group.kind == "driver":
        return driver_summary(group.events, group.devices(), count)
    if group.kind == "sxid":
        links = sorted({e.link for e in group.events if e.link is not None})
        on_links = f", link{'s' if len(links) > 1 else ''} {', '.join(map(str, links))}" if links else ""
        kind = "Fatal" if severity == "fatal" else "Non-fatal"
        return f"NVSwitch SXid {group.code} ({kind}) on {group.devices()}{on_links}, {count}"
    name = f"Xid {group.code} {entry.mnemonic}" if entry else f"Xid {group.code} (not in preflight's Xid catalog)"
    how = []
    if group.teardowns() and not group.xid_lines():
        how.append(f"seen only as Xid {TEARDOWN} 'caused by previous Xid {group.code}'")
    if group.messages() and not group.xid_lines():
        how.append("driver message without an Xid line")
    if group.code == RECOVERY:
        actions = sorted({e.recovery_action for e in group.events if e.recovery_action})
        how.append(f"recovery action {', '.join(actions) or 'not printed'}")
    detail = f" ({'; '.join(how)})" if how else ""
    meaning = f": {entry.meaning}" if entry else ""
    return f"{name} on {group.devices()}, {count}{detail}{meaning}"


def _symptoms(group: _Group, entry: XidEntry | None) -> list[str]:
    if group.kind == "sxid":
        return ["nvlink-errors", f"sxid-{group.code}"]
    if group.kind == "driver":
        return [DRIVER_CAUSES[group.code]]
    symptoms = [entry.cause if entry else "gpu-xid"]
    if group.xid_lines() or group.teardowns():
        symptoms.append(f"xid-{group.code}")
    if group.teardowns():
        symptoms.append(f"xid-{TEARDOWN}")
    return symptoms


def _action(severity: str, group: _Group, entry: XidEntry | None) -> str | None:
    """The next step for this event, or None where the cause's own actions say it better: an
    Xid whose NVIDIA bucket is IGNORE but that preflight still warns about (63 pending remap,
    92 correctable-error rate, 121 C2C) needs what its cause says, not "no action"."""
    if entry is not None and entry.action == "IGNORE" and severity != "info":
        return None
    where = f" on {group.devices()}"
    if group.kind == "driver":
        xid = related_xid(group.code)
        return driver_action(group.code, group.devices(), xid, load_xid_catalog().get(xid))
    if group.kind == "sxid":
        if severity == "fatal":
            return (f"SXid {group.code}{where}: drain the node and reboot it so the NVSwitches and GPUs are "
                    "reset; if the SXid returns, open a service case with the bundle")
        return (f"SXid {group.code}{where}: non-fatal, the fabric keeps running; check nvidia-smi nvlink -e "
                "on the GPUs and watch whether the SXid recurs (dmesg | grep SXid)")
    if entry is None:
        return (f"Xid {group.code}{where}: look it up in NVIDIA's Xid Catalog "
                "(docs.nvidia.com/deploy/xid-errors) and add it to playbooks/xid.yaml")
    return f"Xid {group.code}{where} ({entry.action}): {entry.action_meaning}"


def _evidence(group: _Group, lines: list[str]) -> Evidence:
    picked: list[int] = []
    for e in group.events:
        picked.append(e.line)
        if e.kind == "gpu-fallen-off-bus" and not _NAMES_GPU.search(e.message):
            # The three-line form names the GPU two lines up; keep those lines with it.
            picked.extend(n for n in (e.line - 2, e.line - 1) if n >= 1 and "NVRM" in lines[n - 1])
    numbers = sorted(set(picked))
    shown = [lines[n - 1].strip() for n in numbers[:EVIDENCE_LINES] if n <= len(lines)]
    if len(numbers) > EVIDENCE_LINES:
        shown.append(f"... and {len(numbers) - EVIDENCE_LINES} more lines")
    return Evidence(PROBE, "\n".join(shown))
