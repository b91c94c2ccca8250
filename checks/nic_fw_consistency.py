"""One firmware per NIC model: on a node (``nic-fw-inconsistent``) and across the fleet
(``nic-fw-fleet-consistency``).

What it judges: the firmware of every ConnectX (the ``nics`` fact: ibv_devinfo/ibstat/sysfs,
else ethtool -i, else mlxfwmanager), grouped by adapter model (ConnectX-7, ConnectX-8, ...;
an adapter the matrix does not know is grouped by its hca_type). Different models are meant
to differ, so only NICs of one model are compared.

Normal vs faulty: within a node, two firmware versions on one model almost always mean a
flash that stopped half way (or a replaced card never updated); across nodes, the minority
version is the node someone forgot. Both fail: NCCL runs across every NIC of every node, and
a mix is how "one node hangs now and then" starts. A firmware string with bytes that are not
text in it (a NUL) is not another version: the parser leaves it unknown, and the node WARNs
that it is unreadable (``probe-unreadable``) instead of failing a mismatch or passing without
it. The fleet report is grouped, majority first ("ConnectX-8: 3 hosts on 40.46.1006, 1 on
40.44.1036 (gpu03)"); with no majority every host of the model is named. Whether the majority
itself is right is ``nic-fw-driver-mismatch``'s question, and the action names the version the
driver ships where the matrix knows it.
"""

from __future__ import annotations

from collections import Counter

from preflight.check import fail, fleet_check, host_check, ok, skip, warn
from preflight.judge.context import EvidenceMissing
from preflight.knowledge.nic_matrix import judge
from preflight.parse.versions import parse_version

from ._nic import nic_absence_excused

FACTS = ["nics", "driver_release", "nic_matrix", "smi"]  # smi: whether the platform (and so its NICs) is known
FW_LINES = r"fw_ver|Firmware version|firmware-version|^\s*FW\s|<FW "


def _model(nic) -> str:
    if nic.family is not None:
        return nic.family.name
    version = parse_version(nic.firmware)
    return nic.hca_type or (f"adapter with firmware {version.major}.x" if version else "unidentified adapter")


def _by_model(nics) -> dict[str, list]:
    groups: dict[str, list] = {}
    for nic in nics:
        if nic.firmware:
            groups.setdefault(_model(nic), []).append(nic)
    return groups


def _unreadable_firmware(host) -> list[str]:
    """The RDMA parser's notes on firmware strings it could not read (bytes that are not text)."""
    inventory = host.optional("ib")
    return [n for n in (inventory.notes if inventory else ()) if ": fw_ver unreadable" in n]


def _evidence(host, nic):
    # Per device where the listing has device headers; mlxfwmanager and a bare ethtool block have none.
    return host.device_excerpt(nic.source, nic.name, FW_LINES) or host.excerpt(nic.source, FW_LINES, limit=8)


def _target(host, matrix, members, fallback: str) -> str:
    """The version to flash to: what the driver ships when the matrix knows, else ``fallback``."""
    nic = members[0]
    verdict = judge(matrix, host.driver_release, nic.family, nic.firmware, nic.how)
    if verdict.expected and verdict.release:
        return f"{verdict.expected} (what {verdict.release} ships)"
    return fallback


@host_check("nic-fw-inconsistent", facts=FACTS, summary="one firmware version per NIC model on the node")
def nic_fw_inconsistent(host):
    matrix = host.nic_matrix  # first: a broken site policy is an error whatever the profile
    try:
        nics = host.nics
    except EvidenceMissing as exc:
        if not nic_absence_excused(host, exc):
            raise
        return skip(f"no NIC evidence and the profile expects no NIC ({host.profile.why})")
    groups = _by_model(nics)
    garbled = _unreadable_firmware(host)
    if not groups and not garbled:
        return skip("no NIC with a readable firmware version")
    outcomes, same = [], []
    if garbled:
        outcomes.append(warn(f"firmware unreadable, not compared: {'; '.join(garbled)} (from {host.ib_probe})",
                             symptoms=["probe-unreadable"],
                             evidence=[host.excerpt(host.ib_probe, FW_LINES, limit=8)]))
    for model, members in groups.items():
        counts = Counter(n.firmware for n in members).most_common()
        if len(counts) == 1:
            same.append(f"{len(members)} x {model} on {counts[0][0]}")
            continue
        majority = counts[0][0]
        view = ", ".join(f"{n} on {fw} ({', '.join(m.name for m in members if m.firmware == fw)})"
                         for fw, n in counts)
        odd = [m for m in members if m.firmware != majority]
        target = _target(host, matrix, members, f"{majority} (what the other {counts[0][1]} run)")
        outcomes.append(fail(
            f"{model} NICs on {len(counts)} firmware versions: {view} (from {members[0].source})",
            symptoms=["nic-fw-inconsistent"],
            evidence=[_evidence(host, m) for m in [members[0], *odd][:4]],
            data={"model": model, "versions": dict(counts)},
            action=f"flash {', '.join(m.name for m in odd)} ({model}) to {target} with mlxfwmanager -u, "
                   "reboot, re-run nccl all_reduce"))
    if not any(o.status.value == "fail" for o in outcomes) and same:
        outcomes.append(ok(f"one firmware per model: {'; '.join(same)} (from {nics[0].source})"
                           + (" among the NICs whose firmware could be read" if garbled else ""),
                           evidence=[host.excerpt(nics[0].source, FW_LINES, limit=4)]))
    return outcomes


@fleet_check("nic-fw-fleet-consistency", facts=FACTS,
             summary="NIC firmware identical across hosts for each NIC model")
def nic_fw_fleet_consistency(fleet):
    per_host = {h: nics for h, nics in fleet.facts("nics").items() if _by_model(nics)}
    if len(per_host) < 2:
        return None
    values: dict[str, dict[str, str]] = {}
    for host, nics in per_host.items():
        for model, members in _by_model(nics).items():
            values.setdefault(model, {})[host] = ",".join(sorted({m.firmware for m in members}))
    odd: dict[str, list[str]] = {h: [] for h in per_host}
    actions: dict[str, list[str]] = {h: [] for h in per_host}
    shown: dict[str, object] = {}  # host -> a NIC of its first odd model, for evidence
    views = []
    for model, by_host in values.items():
        counts = Counter(by_host.values()).most_common()
        if len(by_host) < 2 or len(counts) == 1:
            continue
        tie = counts[0][1] == counts[1][1]
        majority = None if tie else counts[0][0]
        views.append(_fleet_view(model, by_host, counts, tie))
        for host, fw in by_host.items():
            if fw == majority:
                continue
            shown.setdefault(host, _by_model(per_host[host])[model][0])
            odd[host].append(f"{model} on {fw}" + (f", the fleet runs {majority}" if majority else
                                                    ", no version has a majority"))
            actions[host].append(f"bring {host}'s {model} NICs to {majority} as on the other hosts" if majority else
                                 f"choose one {model} firmware for the fleet and flash {host}'s NICs to it")
    fleet_view = f" [{'; '.join(views)}]" if views else ""
    outcomes = []
    for host in per_host:
        if not odd[host]:
            outcomes.append(ok(f"same NIC firmware per model as the other hosts{fleet_view}", host=host))
            continue
        outcomes.append(fail(f"{'; '.join(odd[host])}{fleet_view}", host=host,
                             symptoms=["nic-fw-inconsistent"],
                             evidence=[_evidence(fleet.hosts[host], shown[host])],
                             action="; ".join(actions[host]) + ", with the driver release that ships it "
                                    "(nic-fw-driver-mismatch judges the pair); mlxfwmanager -u, reboot, "
                                    "re-run nccl all_reduce"))
    return outcomes


def _fleet_view(model: str, by_host: dict[str, str], counts, tie: bool) -> str:
    parts = []
    for i, (fw, n) in enumerate(counts):
        hosts = sorted(h for h, v in by_host.items() if v == fw)
        named = f" ({', '.join(hosts[:8])}{', ...' if len(hosts) > 8 else ''})"
        if i == 0:
            parts.append(f"{n} host{'s' if n != 1 else ''} on {fw}" + (named if tie else ""))
        else:
            parts.append(f"{n} on {fw}{named}")
    return f"{model}: " + ", ".join(parts)
