"""The NVIDIA driver's own failure lines that carry no Xid number, for checks/xid.py.

The driver reports some faults only as messages of its own: "GPU has fallen off the bus" (also
beside Xid 79), GSP RPC timeouts and the RPC history / falcon dumps after them, "GSP RM
heartbeat timed out", "RmInitAdapter failed! (0x62:0x65:1792)" with "Cannot initialize GSP
firmware RM", "Cannot attach gpu" or an FSP boot failure, and "installed in this system is not
supported by" the driver. Each is named as what it is. Where the log also has an Xid line for
the same fault (``xids``), checks/xid.py joins them to it; without one, the message is never
reported as that Xid (issue 33), and the catalog's entry only lends its recommended action.
"""

from __future__ import annotations

from dataclasses import replace

# kind -> (fault, the Xids that report the same fault when the driver prints one)
DRIVER_KINDS: dict[str, tuple[str, tuple[int, ...]]] = {
    "gpu-fallen-off-bus": ("fallen-off-bus", (79,)),
    "gsp-timeout": ("gsp", (119, 120)),
    "gsp-rpc-dump": ("gsp", (119, 120)),
    "gsp-coredump": ("gsp", (119, 120)),
    "gsp-heartbeat-timeout": ("gsp", (119, 120)),
    "gpu-init-failed": ("init", (143,)),
    "gsp-init-failed": ("init", (143,)),
    "gpu-attach-failed": ("init", (143,)),
    "fsp-boot-failed": ("init", (143,)),
    "gpu-unsupported": ("unsupported", ()),
}
DRIVER_CAUSES = {"fallen-off-bus": "gpu-fallen-off-bus", "gsp": "gpu-gsp-error", "init": "gpu-init-failed",
                 "unsupported": "gpu-driver-unsupported"}
_NAMES = {
    "gpu-fallen-off-bus": "GPU fell off the bus",
    "gsp-timeout": "GSP RPC timeout",
    "gsp-rpc-dump": "GSP RPC history dump (after a GSP RPC timeout or failure)",
    "gsp-coredump": "GSP core dump (GSP stopped responding)",
    "gsp-heartbeat-timeout": "GSP heartbeat timed out",
    "gpu-init-failed": "GPU initialisation failed (RmInitAdapter failed)",
    "gsp-init-failed": "GSP firmware could not be initialised",
    "gpu-attach-failed": "driver cannot attach the GPU",
    "fsp-boot-failed": "FSP boot failed",
    "gpu-unsupported": "GPU not supported by the installed driver",
}
_ACTIONS = {
    "unsupported": "install a driver that supports this GPU (the proprietary kernel module for a GPU without GSP, "
                   "or a branch whose README lists it), reboot and re-run preflight",
}
# A message that names no GPU ("Cannot initialize GSP firmware RM", "Cannot attach gpu") is
# about the GPU the driver's next message names, printed within this many lines.
_NEXT_NAMED = 4


def related_xid(fault: str) -> int | None:
    return next((xids[0] for f, xids in DRIVER_KINDS.values() if f == fault and xids), None)


def with_devices(events) -> list:
    """The events, where a driver message names no GPU, with the GPU of the NVRM message
    that follows it within ``_NEXT_NAMED`` lines."""
    events = list(events)
    out = []
    for i, e in enumerate(events):
        if e.kind in DRIVER_KINDS and e.device is None:
            following = (n for n in events[i + 1:] if n.line - e.line <= _NEXT_NAMED)
            named = next((n for n in following if n.device and n.driver == e.driver and n.host == e.host), None)
            if named is not None:
                e = replace(e, device=named.device)
        out.append(e)
    return out


def driver_summary(events, devices: str, count: str) -> str:
    names = list(dict.fromkeys(_NAMES[e.kind] for e in events))
    codes = sorted({e.detail for e in events if e.kind == "gpu-init-failed" and e.detail})
    code = f", code {', '.join(codes)}" if codes else ""
    return f"{'; '.join(names)} on {devices}, {count} (driver message without an Xid line{code})"


def driver_action(fault: str, devices: str, xid: int | None, entry) -> str:
    if entry is None:
        return f"{devices}: {_ACTIONS.get(fault, 'see the cause')}"
    return (f"{devices}: no Xid was printed; for this fault NVIDIA's Xid catalog (Xid {xid} {entry.mnemonic}) "
            f"recommends ({entry.action}): {entry.action_meaning}")
