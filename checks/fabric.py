"""NVSwitch fabric registration from NVML's per-GPU fabric info (check ``fabric-manager``).

Input: the ``Fabric`` section of ``nvidia-smi -q`` / ``<fabric>`` of ``-q -x`` (State, Status,
CliqueId, ClusterUUID, Health Summary), judged only where the profile says the platform has
a fabric (``nvlink.fabric_manager`` on HGX boards, ``nvlink.check_fabric_state`` on B300 and
NVL72 trays). Healthy is State ``Completed`` with Status ``Success`` on every GPU (docs/sources.md
§2; NVML: read Status only once State is complete).

How faults show, and what each is taken to mean:

- State ``Not Started`` / ``In Progress``: Fabric Manager never registered the GPU. A dead FM
  leaves the state stuck at In Progress (NVIDIA/NVSentinel#889). DCGM's health watch rates In
  Progress a warning, as it passes during boot (DCGM 4.5.2, read in NVIDIA/NVSentinel#1380);
  a preflight gate runs on a booted node whose CUDA work would fail with "system not yet
  ready" (802), so here it fails, and the action says to restart FM and re-run.
- State Completed with any other Status (``Insufficient Resources`` in Azure/azhpc-images#506,
  ``Unknown Error`` in aws/eks-node-monitoring-agent#141): registration failed.
- ``fabric_clique_required`` (NVL72 trays): CliqueId 0 or a zero ClusterUUID means the GPU did
  not join an NVLink domain (azhpc-images#506). On HGX boards CliqueId 0 is normal.
- Health Summary other than Healthy (``Unhealthy`` with Bandwidth Full in
  kubernetes-sigs/dra-driver-nvidia-gpu#626): registered but degraded paths.
- Without a platform that expects a fabric (the generic profile), only the driver's explicit
  verdicts are judged, since they need no platform figure: State Completed with Status other
  than Success, and a Health Summary other than Healthy. In Progress, Not Started or N/A are
  left alone there: a platform without NVSwitch cannot be told from one whose FM is down.
- No fabric info (N/A, Not Supported): a lone GPU never has one (leptonai/gpud#1140), so one
  GPU is SKIP. On a multi-GPU NVL72 tray all-N/A was an unhealthy fabric (gpud#1108): FAIL.
  On an HGX board it cannot be told from an old driver that does not report it: ERROR. A GPU
  without it while its peers report one is a fault on any platform.

B300 caveat (docs/sources.md §2): all NVLinks can show Active while the fabric is unusable, so a
failing verdict says when ``nvidia-smi nvlink --status`` looked healthy, to stop the reader
from trusting it.
"""

from __future__ import annotations

import re
from dataclasses import replace

from preflight.check import error, fail, host_check, ok, skip
from preflight.judge.context import EvidenceMissing

_ZERO_UUID = re.compile(r"[0-]+")
# nvidia-smi -q label -> nvidia-smi -q -x tag, for evidence lines
_TAG = {"State": "state", "Status": "status", "CliqueId": "cliqueId", "ClusterUUID": "clusterUuid",
        "Summary": "summary"}
HEALTH_ACTION = ("drain the node, then reset the GPU (nvidia-smi -r) -> reboot -> open a service case "
                 "if the fabric health stays degraded (NVIDIA Health Validation); read the Fabric > "
                 "Health lines of nvidia-smi -q for which path is down")


@host_check("fabric-manager", facts=["smi", "smi_probe", "nvlink_status"],
            summary="NVSwitch fabric registered on every GPU (NVML fabric State Completed, Status Success)")
def fabric_manager(host):
    profile = host.profile
    has_fm = bool(profile.get("nvlink.fabric_manager"))
    if not (has_fm or profile.get("nvlink.check_fabric_state")):
        return _explicit_failures(host)
    gpus = host.smi.gpus
    partial = host.smi.partial
    if len(gpus) < 2 and partial is None:
        return skip(_lone_gpu(host.profile, len(gpus)))
    clique_required = bool(profile.get("nvlink.fabric_clique_required"))
    register_action = _register_action(host, has_fm)

    if not any(g.fabric and g.fabric.state for g in gpus):
        summary = f"NVML reports no fabric state (N/A) on any of the {len(gpus)} GPUs"
        summary += f" ({partial})" if partial else ""
        evidence = [_evidence(host, {("State", "N/A")})]
        if clique_required:
            return fail(summary + ": the GPUs did not join the NVLink fabric" + _links_note(host),
                        symptoms=["fabric-manager-down"], evidence=evidence, action=register_action)
        return error(summary + ": cannot tell whether Fabric Manager registered them; "
                     "check systemctl status nvidia-fabricmanager on the node", evidence=evidence)

    # problem text -> the GPUs showing it; and the printed lines that show it, for evidence
    unregistered: dict[str, list[str]] = {}
    degraded: dict[str, list[str]] = {}
    shown: set[tuple[str, str]] = set()  # (label, value) lines to quote
    unhealthy: set[tuple[str, str]] = set()
    for gpu in gpus:
        label = f"GPU{gpu.index}"
        fabric = gpu.fabric
        problem = None
        if fabric is None or not fabric.state:
            problem, line = "no fabric state while other GPUs report one", ("State", "N/A")
        elif fabric.state != "Completed":
            problem, line = f"fabric state {fabric.state}", ("State", fabric.state)
        elif fabric.status and fabric.status != "Success":
            problem, line = f"fabric status {fabric.status}", ("Status", fabric.status)
        elif clique_required and (fabric.clique_id in (None, "0") or _zero_uuid(fabric.cluster_uuid)):
            problem = (f"CliqueId {fabric.clique_id or 'N/A'}, ClusterUUID {fabric.cluster_uuid or 'N/A'} "
                       "(not in an NVLink domain)")
            line = ("ClusterUUID", fabric.cluster_uuid or "N/A")
        if problem:
            unregistered.setdefault(problem, []).append(label)
            shown.add(line)
        if fabric and fabric.health_summary and fabric.health_summary != "Healthy":
            degraded.setdefault(f"fabric health {fabric.health_summary}", []).append(label)
            unhealthy.add(("Summary", fabric.health_summary))

    outcomes = []
    if unregistered:
        outcomes.append(fail(_grouped(unregistered, len(gpus)) + _links_note(host),
                             symptoms=["fabric-manager-down"], evidence=[_evidence(host, shown)],
                             action=register_action, data={"problems": unregistered}))
    if degraded:
        outcomes.append(fail(_grouped(degraded, len(gpus)), symptoms=["nvlink-fabric-degraded"],
                             evidence=[_evidence(host, unhealthy)],
                             action=HEALTH_ACTION, data={"problems": degraded}))
    if outcomes:
        # A fault of a GPU listed is one whatever the others are; the summary says they were not seen.
        return [replace(o, summary=f"{o.summary}; {partial}") for o in outcomes] if partial else outcomes
    first = gpus[0].fabric
    clique = (f", CliqueId {first.clique_id}, ClusterUUID {first.cluster_uuid}"
              if clique_required else "")
    if partial:
        # The GPUs listed are not the node's: their fabric is fine, the others' unknown.
        return skip(f"fabric registered on the {len(gpus)} GPU(s) listed (State Completed, Status Success{clique}); "
                    f"the node's other GPUs not judged: {partial}")
    return ok(f"fabric registered on {len(gpus)} GPUs (State Completed, Status Success{clique})")


def _lone_gpu(profile, listed: int) -> str:
    """Why one GPU is not judged, in words that agree with the profile chosen: a platform of several
    GPUs (HGX: 8) is not called one where a lone GPU would be "not applicable"."""
    lone = "NVML reports no fabric for a lone GPU"
    expected = profile.gpu_count
    if isinstance(expected, int) and expected > listed:
        return (f"{listed} GPU listed where a {profile.name} has {expected} (gpu-inventory judges the count): "
                f"NVSwitch fabric not judged ({lone})")
    return f"{listed} GPU: NVSwitch fabric not applicable ({lone})"


EXPLICIT_ACTION = ("the driver reports the GPU's fabric registration failed: on an HGX board check "
                   "systemctl status nvidia-fabricmanager (its version must equal the driver's) and restart it; "
                   "on an NVL72 compute tray check the NVLink switch trays and nvidia-imex; then re-run preflight "
                   "(set --profile to judge the platform's full fabric expectations)")


def _explicit_failures(host):
    """Where the profile expects no fabric (the generic profile), only the driver's own verdicts
    are judged, as they need no platform figure: State Completed with a Status other than
    Success (registration failed) and a Health Summary other than Healthy. A state still In
    Progress or Not Started, or none at all, cannot be told from a platform without a fabric."""
    why = host.profile.why
    try:
        gpus = host.smi.gpus
    except EvidenceMissing:
        return skip(f"no NVSwitch fabric expected on this platform: {why}")
    failed: dict[str, list[str]] = {}
    degraded: dict[str, list[str]] = {}
    for gpu in gpus:
        fabric = gpu.fabric
        if fabric is None:
            continue
        if fabric.state == "Completed" and fabric.status and fabric.status != "Success":
            failed.setdefault(f"fabric status {fabric.status}", []).append(f"GPU{gpu.index}")
        if fabric.health_summary and fabric.health_summary not in ("Healthy", "N/A"):
            degraded.setdefault(f"fabric health {fabric.health_summary}", []).append(f"GPU{gpu.index}")
    outcomes = []
    note = " (reported by the driver; no platform profile: other fabric expectations not judged)"
    if failed:
        lines = {("Status", problem.removeprefix("fabric status ")) for problem in failed}
        outcomes.append(fail(_grouped(failed, len(gpus)) + note, symptoms=["fabric-manager-down"],
                             evidence=[_evidence(host, lines)], action=EXPLICIT_ACTION,
                             data={"problems": failed}))
    if degraded:
        lines = {("Summary", problem.removeprefix("fabric health ")) for problem in degraded}
        outcomes.append(fail(_grouped(degraded, len(gpus)) + note, symptoms=["nvlink-fabric-degraded"],
                             evidence=[_evidence(host, lines)], action=HEALTH_ACTION,
                             data={"problems": degraded}))
    if outcomes:
        return outcomes
    return skip(f"no NVSwitch fabric expected on this platform, and no failed registration reported: {why}")


def _zero_uuid(uuid: str | None) -> bool:
    return uuid is None or bool(_ZERO_UUID.fullmatch(uuid))


def _grouped(problems: dict[str, list[str]], total: int) -> str:
    return "; ".join(f"{problem} on {len(labels)} of {total} GPUs ({', '.join(labels)})"
                     for problem, labels in problems.items())


def _evidence(host, lines: set[tuple[str, str]]):
    """The Fabric lines, text or XML, that show the offending values."""
    patterns = [rf"^\s*{label}\s*:\s*{re.escape(value)}\s*$|<{_TAG[label]}>{re.escape(value)}<"
                for label, value in sorted(lines)]
    return host.excerpt(host.smi_probe, "|".join(patterns), limit=16)


def _register_action(host, has_fm: bool) -> str:
    if not has_fm:
        # NVL72 trays: FM runs on the NVLink switch trays, not here (leptonai/gpud#1106).
        return ("Fabric Manager does not run on a compute tray: check the NVLink switch trays and the "
                "rack's NVLink domain, and that nvidia-imex is configured with every node's IP; each GPU "
                "must show State Completed, Status Success and a non-zero CliqueId and ClusterUUID")
    driver = host.smi.driver_version or "the driver's"
    action = (f"systemctl status nvidia-fabricmanager (journalctl -u nvidia-fabricmanager for why); its "
              f"version must equal the driver version ({driver}) exactly; restart it and re-run preflight")
    if host.profile.get("nvlink.nvlsm"):
        action += ("; fourth-generation NVSwitch also needs NVLSM (systemctl status nvlsm) and, with "
                   "FM 570+, the ib_umad module loaded (lsmod | grep ib_umad)")
    return action


def _links_note(host) -> str:
    """Say so when nvidia-smi nvlink shows every link up: on B300 it does while P2P is dead."""
    try:
        gpus = host.nvlink_status.gpus
    except EvidenceMissing:
        return ""
    if gpus and all(g.links and g.inactive_count == 0 for g in gpus):
        return (f" (although nvidia-smi nvlink --status shows all {sum(len(g.links) for g in gpus)} links "
                "active: links train in hardware whatever the fabric state)")
    return ""
