"""ConnectX firmware against the mlx5 driver release the node runs (check ``nic-fw-driver-mismatch``).

What it judges: every ConnectX the node lists (``ibv_devinfo -v``, else ``ibstat``, else sysfs,
else ``ethtool -i``, else ``mlxfwmanager``), its firmware against the firmware the running
driver release ships, as ``preflight/knowledge/nic_matrix.py`` reads it from
``playbooks/nic_firmware.yaml`` (NVIDIA release notes and legal notices, one source per row)
with the site's policy (profile field ``nic.policy_file``) merged over it.

Normal vs faulty:
- the firmware the release ships (or within the ``28.43.36xx`` range a source gives): PASS;
- older: FAIL. This is the field lesson: ping works, RDMA links come up intermittently, nccl
  all_reduce hangs now and then on one node and the kernel logs ``mlx5_0: timeout``;
- newer: WARN. It usually works, but no release tested that pair;
- ConnectX-8 under MLNX_OFED (or DOCA 2.9's LTS branch): FAIL, those releases do not drive it;
- not the site's pinned version: FAIL (the site decided);
- undecidable (inbox driver, a release the matrix lacks, an unknown adapter, a firmware string
  that is no version, no driver evidence): WARN naming the reason. A NIC that could not be
  judged is never passed.

Which firmware: the one the NIC runs, since that is what the driver talks to. The kernel's
fw_ver (ibv_devinfo, sysfs, ethtool) is the running firmware; from mlxfwmanager it is the
``FW (Running)`` row where there is one (docs/sources.md §1.3).

New firmware flashed but not running (mlxfwmanager shows ``FW (Running)`` unlike ``FW``):
FAIL ``nic-firmware-reset-pending``, whatever the pair's verdict. The NIC runs the old firmware
until ``mlxfwreset`` or a reboot / power cycle loads the new one, so what this run measured
(the firmware verdict, nccl) is not what the node will run after its next reset; the action
is the reset, then a re-run. mlxfwmanager prints that row only when the two differ, so a NIC
without it is not flagged.

Which driver: the loaded module (``ethtool -i``) before the installed one (``modinfo``), with
``ofed_info -s`` telling MLNX_OFED from DOCA (``preflight.parse.versions.driver_release``).
Firmware does not change with load, so an idle node is judged as it is.
"""

from __future__ import annotations

from preflight.check import fail, host_check, ok, skip, warn
from preflight.judge.context import EvidenceMissing
from preflight.knowledge.nic_matrix import NEWER, OK, UNDECIDED, driver_label, judge

from ._nic import nic_absence_excused

FW_LINES = r"fw_ver|Firmware version|firmware-version|hca_type|CA type|vendor_part_id|Device Type|^\s*FW\s|<FW "
# Older, unsupported and pin-mismatch verdicts carry the cause id itself.
SYMPTOM = {NEWER: "nic-fw-newer-than-driver", UNDECIDED: "nic-fw-unverified"}


RESET_LINES = r"Device Type|PCI Device Name|^\s*FW\s"


@host_check("nic-fw-driver-mismatch", facts=["nics", "driver_release", "nic_matrix", "smi", "mlxfwmanager"],
            summary="ConnectX firmware matches what the installed mlx5 driver release ships")
def nic_fw_driver_mismatch(host):
    matrix = host.nic_matrix  # a broken site policy is an error whatever the profile
    try:
        nics = host.nics
    except EvidenceMissing as exc:
        if not nic_absence_excused(host, exc):
            raise
        return skip(f"no RDMA NIC evidence and the profile expects no NIC ({host.profile.why})")
    if not nics:
        return skip("no ConnectX NIC listed: nothing to judge (ib-port-down says whether one should be)")

    driver = host.driver_release
    label = driver_label(driver)
    groups: dict[tuple, list] = {}
    for nic in nics:
        verdict = judge(matrix, driver, nic.family, nic.firmware, nic.how)
        key = (nic.family.name if nic.family else "unknown adapter", nic.firmware, verdict)
        groups.setdefault(key, []).append(nic)

    driver_note = f"driver: {label}, read from {driver.source}"
    if driver.notes:
        driver_note += "; " + "; ".join(driver.notes)
    outcomes = []
    for (family, firmware, verdict), members in groups.items():
        names = ", ".join(n.name for n in members[:4]) + (", ..." if len(members) > 4 else "")
        text = f"{len(members)} x {family} ({names}): {verdict.reason}"
        if verdict.notes:
            text += "; " + "; ".join(verdict.notes)
        flashed = sorted({n.flashed for n in members if n.flashed})
        if flashed:
            # Judged as running; the flashed one only counts once a reset loads it.
            text += f"; {', '.join(flashed)} is flashed and waits for a reset (nic-firmware-reset-pending)"
        # Per device where the listing has device headers; mlxfwmanager and a bare ethtool block have none.
        evidence = ([e for n in members[:2] if (e := host.device_excerpt(n.source, n.name, FW_LINES))]
                    or [host.excerpt(members[0].source, FW_LINES, limit=8)])
        data = {"family": family, "firmware": firmware, "expected": verdict.expected, "release": verdict.release,
                "verdict": verdict.level, "matrix_source": verdict.source, "driver": label,
                "driver_source": driver.source, "nics": [n.name for n in members], "source": members[0].source}
        if verdict.level == OK:
            outcomes.append(ok(f"{text} [{driver_note}]", evidence=evidence, data=data, action=verdict.action))
            continue
        evidence += _driver_evidence(host, driver)
        symptom = SYMPTOM.get(verdict.level, "nic-fw-driver-mismatch")
        verdict_of = warn if verdict.level in (NEWER, UNDECIDED) else fail
        outcomes.append(verdict_of(f"{text} [{driver_note}]", symptoms=[symptom], evidence=evidence, data=data,
                                   action=verdict.action))
    pending = reset_pending(host)
    return ([pending] if pending else []) + outcomes


def reset_pending(host):
    """FAIL ``nic-firmware-reset-pending`` for the NICs whose flash holds other firmware than
    they run, or None. Read from mlxfwmanager whichever tool the NICs were listed from: only a
    firmware query sees the flash."""
    query = host.optional("mlxfwmanager")
    devices = [d for d in (query.devices if query else ()) if d.reset_pending]
    if not devices:
        return None
    names = [d.pci_name or (f"device #{d.index}" if d.index is not None else "device") for d in devices]
    told = "; ".join(f"{n} ({d.device_type or 'adapter'}): flashed {d.fw_current}, running {d.fw_running}"
                     for n, d in zip(names, devices, strict=True))
    targets = " ".join(f"mlxfwreset -d {n} reset;" for n in names[:4]) + (" ..." if len(names) > 4 else "")
    return fail(f"new NIC firmware flashed, reset pending on {len(devices)} of {len(query.devices)} NICs: {told}",
                symptoms=["nic-firmware-reset-pending"],
                evidence=[host.excerpt("mlxfwmanager", RESET_LINES, limit=4 * len(devices))],
                data={"nics": names, "flashed": [d.fw_current for d in devices],
                      "running": [d.fw_running for d in devices]},
                action=f"load the flashed firmware: {targets} (mlxfwreset -d <dev> query names the reset level it "
                       "supports; where none is, reboot, and power-cycle the node if a warm reboot does not load "
                       "it), then re-run preflight: mlxfwmanager --query must show no FW (Running) row")


DRIVER_LINES = {"ethtool": ("ethtool-i", r"^\s*(?:==|driver:|version:)", 3),
                "modinfo": ("mlx5-modinfo", r"^(?:filename|version):", 2),
                "ofed_info": ("ofed-info", r"\S", 1)}


def _driver_evidence(host, driver):
    """The lines that decided the driver identity, and ofed_info's, which names the flavour."""
    sources = [driver.source] + (["ofed_info"] if driver.source != "ofed_info" else [])
    picked = [DRIVER_LINES[s] for s in sources if s in DRIVER_LINES]
    return [host.excerpt(probe, pattern, limit=limit) for probe, pattern, limit in picked
            if (r := host.result(probe)) is not None and r.ok]
