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


@host_check("nic-fw-driver-mismatch", facts=["nics", "driver_release", "nic_matrix", "smi"],
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
    return outcomes


DRIVER_LINES = {"ethtool": ("ethtool-i", r"^\s*(?:==|driver:|version:)", 3),
                "modinfo": ("mlx5-modinfo", r"^(?:filename|version):", 2),
                "ofed_info": ("ofed-info", r"\S", 1)}


def _driver_evidence(host, driver):
    """The lines that decided the driver identity, and ofed_info's, which names the flavour."""
    sources = [driver.source] + (["ofed_info"] if driver.source != "ofed_info" else [])
    picked = [DRIVER_LINES[s] for s in sources if s in DRIVER_LINES]
    return [host.excerpt(probe, pattern, limit=limit) for probe, pattern, limit in picked
            if (r := host.result(probe)) is not None and r.ok]
