"""InfiniBand / RoCE port state and rate (checks ``ib-port-down`` and ``ib-link-degraded``).

Input: the ``ib`` fact, i.e. ``ibv_devinfo -v``, else ``ibstat``, else the sysfs probe (all read
into one ``IbInventory``; the finding names the one used).

``ib-port-down``: a healthy port is logical state ACTIVE and physical state LinkUp. Faulty:
- physical Polling: the port looks for a link partner and finds none (cable, transceiver,
  switch port);
- physical Disabled: switched off, by the driver, an admin or the switch;
- LinkUp but not ACTIVE: the cable is fine but the logical link is not up; on InfiniBand a
  LID of 65535 (or INIT) means no subnet manager has configured the port;
- a state not reported (an output cut short): cannot be told, a warning.
Ports of the platform's fabric NIC (profile ``nic.family``) fail; ports of other adapters (a
storage or management NIC, an unused second port) only warn, since the profile does not say
they must be up. A profile that expects NICs on a node listing no RDMA device fails
(``nic-missing``: the driver did not bind, or the NICs are gone), and so does one listing fewer
of the fabric NIC than the profile's ``nic.count`` (counted over every device when the adapter
families cannot be told): an ACTIVE port on each of 7 NICs is no pass of an 8-NIC node. A
profile that expects none skips. When the tools are missing altogether the check cannot tell (ERROR).

``ib-link-degraded``: every ACTIVE port of the fabric NIC must run at the profile's
``nic.rate_gbps`` or above (400 NDR / 400GbE on ConnectX-7 HGX nodes, 800 XDR on ConnectX-8;
sources in the profile). The rate is lanes x lane speed, so a link trained at fewer lanes or a
lower speed shows as a lower rate; an idle link does not downshift, so load does not matter.
A port of an unknown adapter is judged with a warning; other adapters are not judged.
"""

from __future__ import annotations

from preflight.check import fail, host_check, ok, skip, warn
from preflight.judge.context import EvidenceMissing
from preflight.knowledge.nic_matrix import expects_nics

from ._nic import nic_absence_excused

FACTS = ["ib", "ib_probe", "nics", "smi"]  # smi: whether the platform (and so its NICs) is known
PORT_LINES = r"[Ss]tate|[Rr]ate:|lid|[Ll]ink[ _]layer|active_width|active_speed"
NO_LID = 65535  # the LID a port keeps until a subnet manager assigns one


def _inventory(host, missing_fails: bool):
    """(inventory, None), or (None, the outcome) when there is no device to judge."""
    try:
        inventory = host.ib
    except EvidenceMissing as exc:
        if not nic_absence_excused(host, exc):
            raise
        return None, skip(f"no RDMA evidence and the profile expects no NIC ({host.profile.why})")
    if not inventory.devices:
        why = "; ".join(inventory.notes) or f"{host.ib_probe} lists no device"
        if expects_nics(host.profile) and missing_fails:
            family = host.profile.get("nic.family") or "RDMA NICs"
            return None, fail(f"no RDMA device on a {host.profile.name} node, which has {family} ({why})",
                              symptoms=["nic-missing"], evidence=[host.excerpt(host.ib_probe, r"\S", limit=3)],
                              action="check lspci -d 15b3: for the NICs and dmesg | grep mlx5 for a driver "
                                     "that failed to bind; load mlx5_ib (or restart openibd), then re-run")
        if expects_nics(host.profile):
            return None, skip(f"no RDMA device ({why}): see ib-port-down")
        return None, skip(f"no RDMA device ({why}) and the profile expects none ({host.profile.why})")
    return inventory, None


def _role(host, family) -> bool | None:
    """True: a port of the platform's fabric NIC; False: another adapter; None: cannot tell."""
    wanted = host.profile.get("nic.family")
    if wanted is None or family is None:
        return None
    return family.name == wanted


def _families(host) -> dict:
    try:
        return {n.name: n.family for n in host.nics if n.source == host.ib_probe}
    except EvidenceMissing:  # a broken NIC policy must not hide the port state
        return {}


def _port_label(device, port) -> str:
    return f"{device.name} port {port.number}"


def _down_reason(port) -> str | None:
    """Why a port is not up, or None for a healthy one."""
    state, phys = port.state, port.phys_state
    if state == "ACTIVE" and phys in ("LINKUP", None):
        return None
    if state is None:
        return f"state not reported (output cut short?), physical {phys or 'not reported'}"
    if phys == "POLLING":
        return f"{state}/Polling: no link partner (cable, transceiver or switch port)"
    if phys == "DISABLED":
        return f"{state}/Disabled: port switched off (driver, admin or switch)"
    no_sm = port.lid == NO_LID or state == "INIT"
    if phys == "LINKUP":
        if no_sm:
            return f"{state}/LinkUp with lid {port.lid}: no subnet manager has configured it"
        return f"{state}/LinkUp: physical link up, logical link not active"
    if phys is None:  # ibv_devinfo without -v prints no physical state
        return state + (f" with lid {port.lid}: no subnet manager has assigned a LID" if no_sm else "")
    return f"{state}/{phys}"


@host_check("ib-port-down", facts=FACTS, summary="every InfiniBand/RoCE port ACTIVE and LinkUp")
def ib_port_down(host):
    inventory, outcome = _inventory(host, missing_fails=True)
    if outcome:
        return outcome
    families = _families(host)
    bad: dict[bool | None, list[str]] = {True: [], False: [], None: []}
    evidence = {True: [], False: [], None: []}
    ports = 0
    for device in inventory.devices:
        role = _role(host, families.get(device.name))
        for port in device.ports:
            ports += 1
            reason = _down_reason(port)
            if reason is None:
                continue
            layer = f", {port.link_layer}" if port.link_layer else ""
            bad[role].append(f"{_port_label(device, port)} {reason}{layer}")
            evidence[role].append(host.device_excerpt(host.ib_probe, device.name, PORT_LINES))

    source = f"from {host.ib_probe}"
    fabric = host.profile.get("nic.family")
    outcomes = []
    short = _too_few(host, inventory, families)
    if short:
        outcomes.append(short)
    if bad[True]:
        outcomes.append(fail(f"{len(bad[True])} {fabric} port(s) down: {'; '.join(bad[True])} ({source})",
                             symptoms=["ib-port-down"], evidence=evidence[True][:4],
                             data={"ports": bad[True], "source": host.ib_probe}))
    other = bad[False] + bad[None]
    if other:
        scope = (f"not the platform's {fabric}" if fabric else "the profile names no fabric NIC")
        outcomes.append(warn(f"{len(other)} port(s) down ({scope}): {'; '.join(other)} ({source})",
                             symptoms=["ib-port-down"], evidence=(evidence[False] + evidence[None])[:4],
                             data={"ports": other, "source": host.ib_probe}))
    if inventory.notes:
        outcomes.append(warn(f"{host.ib_probe} output incomplete or unreadable: {'; '.join(inventory.notes)}; what "
                             "it did not list was not judged", symptoms=["probe-unreadable"],
                             evidence=[host.excerpt(host.ib_probe, r"ibpanic|ibwarn|hca_id|^CA '", limit=4)]))
    if not outcomes:
        outcomes.append(ok(f"{ports} port(s) on {len(inventory.devices)} device(s) ACTIVE/LinkUp ({source})",
                           evidence=[host.excerpt(host.ib_probe, r"State:|state:|PORT_ACTIVE", limit=2)]))
    return outcomes


def _too_few(host, inventory, families):
    """A FAIL when the node lists fewer fabric NICs than its profile's ``nic.count``, else None."""
    want = host.profile.get("nic.count")
    if not want:
        return None
    fabric = host.profile.get("nic.family")
    known = fabric is not None and any(f is not None for f in families.values())
    if known:
        listed = [d.name for d in inventory.devices if _role(host, families.get(d.name))]
        what = f"{fabric} NIC(s)"
    else:
        listed = [d.name for d in inventory.devices]
        what = "RDMA device(s)"
    if len(listed) >= want:
        return None
    return fail(f"{len(listed)} {what} listed, the {host.profile.name} has {want} (from {host.ib_probe}: "
                f"{', '.join(listed) or 'none'})", symptoms=["nic-missing"],
                evidence=[host.excerpt(host.ib_probe, r"hca_id|^CA '|Infiniband device '", limit=want)],
                data={"expected_nics": want, "nics": listed, "source": host.ib_probe},
                action="check lspci -d 15b3: for every NIC and dmesg | grep mlx5 for one the driver did not "
                       "bind; reseat or replace a NIC missing from the bus, then re-run")


@host_check("ib-link-degraded", facts=FACTS,
            summary="active fabric ports at the platform's rate (NDR 400 / XDR 800 / 200-400 GbE)")
def ib_link_degraded(host):
    want = host.profile.get("nic.rate_gbps")
    if not want:
        return skip(f"no NIC rate expected for this platform ({host.profile.why})")
    inventory, outcome = _inventory(host, missing_fails=False)
    if outcome:
        return outcome
    families = _families(host)
    fabric = host.profile.get("nic.family")
    slow, unknown, unread, fine, others = [], [], [], [], 0
    evidence: dict[str, list] = {"slow": [], "unknown": [], "unread": []}
    for device in inventory.devices:
        role = _role(host, families.get(device.name))
        for port in device.ports:
            if port.state != "ACTIVE":
                continue
            if role is False:
                others += 1
                continue
            label = _port_label(device, port)
            excerpt = host.device_excerpt(host.ib_probe, device.name, PORT_LINES)
            if port.rate_gbps is None:
                unread.append(label)
                evidence["unread"].append(excerpt)
                continue
            shape = " ".join(x for x in (port.width, port.speed, port.link_layer) if x)
            line = f"{label} at {port.rate_gbps:g} Gb/s" + (f" ({shape})" if shape else "")
            if port.rate_gbps >= want:
                fine.append(line)
            elif role is None:
                unknown.append(line)
                evidence["unknown"].append(excerpt)
            else:
                slow.append(line)
                evidence["slow"].append(excerpt)

    source = f"from {host.ib_probe}"
    outcomes = []
    if slow:
        outcomes.append(fail(f"{len(slow)} {fabric} port(s) below {want:g} Gb/s: {'; '.join(slow)} ({source})",
                             symptoms=["ib-link-degraded"], evidence=evidence["slow"][:4],
                             data={"expected_gbps": want, "ports": slow},
                             action="reseat or replace the cable/transceiver of those ports and check the "
                                    "switch port's speed settings, then re-run nccl all_reduce"))
    if unknown:
        outcomes.append(warn(f"{len(unknown)} port(s) below {want:g} Gb/s on an adapter not identified as the "
                             f"platform's {fabric or 'fabric NIC'}: {'; '.join(unknown)} ({source}); slow if they "
                             "carry the fabric", symptoms=["ib-link-degraded"], evidence=evidence["unknown"][:4],
                             data={"expected_gbps": want, "ports": unknown}))
    if unread:
        outcomes.append(warn(f"rate not reported for {', '.join(unread)} ({source}: output cut short, or "
                             "ibv_devinfo run without -v, which prints no width or speed)",
                             symptoms=["probe-unreadable"],
                             evidence=evidence["unread"][:4]))
    if outcomes:
        return outcomes
    if not fine:
        return skip(f"no active {fabric} port to judge ({others} port(s) of other adapters; see ib-port-down)")
    return ok(f"{len(fine)} port(s) at >= {want:g} Gb/s ({source})" + (f"; {others} port(s) of other adapters "
              "not judged" if others else ""),
              evidence=[host.excerpt(host.ib_probe, r"Rate:|rate:|active_speed", limit=2)])
