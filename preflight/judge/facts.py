"""Every parsed fact a check can read, declared once with the probes it comes from.

A fact is a function of a host's evidence (``HostEvidence``; in a run, the ``HostContext``)
marked with ``@fact(name, probes=..., needs=...)``: ``probes`` are the raw outputs it parses,
``needs`` the other facts it builds on. A check names the facts it reads
(``@host_check(..., facts=["smi"])``) and the run derives from this table which probes to
collect, so no probe list is written twice. ``reads`` names facts used only when the bundle
already holds their evidence; a run does not collect them for it. Adding a tool's evidence is a
probe (``preflight.collect.probes``), a parser (``preflight.parse``) and a fact here.

A fact whose evidence is missing or unreadable raises ``EvidenceMissing``; the analysis turns
that into the check's ERROR (or SKIP, when the bundle never held the probe) with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from preflight.collect.dcgm import DISCOVERY_PROBE_ID as DCGM_DISCOVERY_PROBE
from preflight.collect.dcgm import HEALTH_PROBE_ID as DCGM_HEALTH_PROBE
from preflight.collect.dcgm import PROBE_ID as DCGM_PROBE
from preflight.collect.nccl import PROBE_ID as NCCL_PROBE
from preflight.collect.probes import IB_COUNTERS, IB_COUNTERS_AFTER
from preflight.judge.census import GpuCensus, gpu_census
from preflight.judge.evidence_view import HostEvidence
from preflight.judge.missing import EvidenceMissing, why_missing
from preflight.knowledge import nic_matrix
from preflight.model import Evidence
from preflight.parse import (
    ParseError,
    dcgm,
    dcgm_health,
    ib_counters,
    ibverbs,
    kernel_log,
    lspci,
    mlnx,
    nvidia_smi,
    nvlink,
    topo,
    versions,
)
from preflight.parse.nccl_probe import parse_probe_output
from preflight.parse.smi_records import SmiReport


@dataclass(frozen=True)
class Fact:
    name: str
    probes: tuple[str, ...]  # read directly, in order of preference
    needs: tuple[str, ...]  # facts it builds on
    derive: Callable[[HostEvidence], Any]
    doc: str
    # Facts read only when the bundle already holds their evidence: not planned for a run.
    reads: tuple[str, ...] = ()


FACTS: dict[str, Fact] = {}


def fact(name: str, *, probes: Iterable[str] = (), needs: Iterable[str] = (), reads: Iterable[str] = ()):
    def declare(derive: Callable[[HostEvidence], Any]) -> Callable[[HostEvidence], Any]:
        if name in FACTS:
            raise ValueError(f"fact {name!r} declared twice")
        doc = (derive.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        FACTS[name] = Fact(name, tuple(probes), tuple(needs), derive, doc, tuple(reads))
        return derive

    return declare


def probes_of(names: Iterable[str]) -> set[str]:
    """Every probe behind these facts, through the facts they need. Unknown names: KeyError."""
    seen: set[str] = set()
    probes: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        f = FACTS[name]
        probes.update(f.probes)
        stack.extend(f.needs)
    return probes


def _parsed(ctx: HostEvidence, parse: Callable[[str], Any], *probes: str) -> tuple[str, Any]:
    probe, text = ctx.first_text(*probes)
    return probe, _read(probe, text, parse)


def _read(probe: str, text: str, parse: Callable[[str], Any]) -> Any:
    try:
        return parse(text)
    except ParseError as exc:
        raise EvidenceMissing(f"{probe}: unreadable output ({exc})", ("probe-unreadable",),
                              (Evidence(probe, text.strip()[:300]),)) from None


def _strongest(failures: list[EvidenceMissing]) -> EvidenceMissing:
    # A probe that ran and failed says more than one the bundle never held.
    return max(failures, key=lambda e: (e.collected, len(e.symptoms)))


# ---- GPUs ------------------------------------------------------------------------------

@fact("smi_evidence", probes=("nvidia-smi-q-x", "nvidia-smi-q"))
def _smi_evidence(ctx: HostEvidence) -> tuple[str, SmiReport, str | None]:
    """(probe, SmiReport, what cut the XML short or None): the XML probe, else the text one. An
    XML that is there but unreadable, or that broke off before its last GPU, gives way to a
    whole text report when there is one, its reason kept in the report's notes; a cut XML with
    no text to stand in is the report, holding the GPUs it showed (``SmiReport.cut``)."""
    probe, text = ctx.first_text("nvidia-smi-q-x", "nvidia-smi-q")
    if probe == "nvidia-smi-q":
        report = _smi_read(ctx, probe, text)
        return probe, report, report.cut
    fallback = ctx.result("nvidia-smi-q")
    try:
        report = _smi_read(ctx, probe, text)
    except EvidenceMissing as unreadable:
        if fallback is None or not fallback.ok:
            raise
        report = _smi_read(ctx, "nvidia-smi-q", fallback.text)
        return "nvidia-smi-q", replace(report, notes=report.notes + (f"{unreadable}; read nvidia-smi-q instead",)), None
    if report.cut is None or fallback is None or not fallback.ok:
        return probe, report, report.cut
    try:
        whole = _smi_read(ctx, "nvidia-smi-q", fallback.text)
    except EvidenceMissing:
        return probe, report, report.cut
    if len(whole.gpus) <= len(report.gpus):
        return probe, report, report.cut  # the text shows no more than the cut XML did
    return "nvidia-smi-q", replace(whole, notes=whole.notes + (f"{report.cut}; read nvidia-smi-q instead",)), report.cut


def _smi_read(ctx: HostEvidence, probe: str, text: str) -> SmiReport:
    """The report of one nvidia-smi probe. A whole output that lists fewer GPUs than its header
    counts is a selection (``-i``) when nothing says what command printed it (a pasted file); when
    the recorded command asked for every GPU, it is what that command could show
    (``nvidia_smi.asked_for_every_gpu``)."""
    xml = probe == "nvidia-smi-q-x"
    report = _read(probe, text, nvidia_smi.parse_smi_xml if xml else nvidia_smi.parse_smi_text)
    r = ctx.result(probe)
    return nvidia_smi.asked_for_every_gpu(report, xml) if r is not None and _every_gpu(r.command) else report


def _every_gpu(command: tuple[str, ...]) -> bool:
    """Whether a recorded command is nvidia-smi asked about every GPU (no ``-i``/``--id``)."""
    if not command or Path(command[0]).name != "nvidia-smi":
        return False
    return not any(a in ("-i", "--id") or a.startswith("--id=") for a in command[1:])


@fact("smi", needs=("smi_evidence",))
def _smi(ctx: HostEvidence) -> SmiReport:
    """GPU inventory and health (``SmiReport``), from ``nvidia-smi -q -x``, else ``-q``."""
    return ctx.smi_evidence[1]


@fact("smi_probe", needs=("smi_evidence",))
def _smi_probe(ctx: HostEvidence) -> str:
    """Which probe the ``smi`` fact came from, for evidence excerpts."""
    return ctx.smi_evidence[0]


@fact("smi_cut", needs=("smi_evidence",))
def _smi_cut(ctx: HostEvidence) -> str | None:
    """What cut the nvidia-smi report short (the tool died mid-way, or the capture was cut), in
    words: the XML's, even when a whole ``-q`` stood in for it, else the text's; None when whole."""
    return ctx.smi_evidence[2]


@fact("topo", probes=("nvidia-smi-topo",))
def _topo(ctx: HostEvidence) -> topo.TopoMatrix:
    """``TopoMatrix`` from ``nvidia-smi topo -m``."""
    return _parsed(ctx, topo.parse_topo, "nvidia-smi-topo")[1]


@fact("nvlink_status", probes=("nvidia-smi-nvlink-status",))
def _nvlink_status(ctx: HostEvidence) -> nvlink.NvlinkStatus:
    """``NvlinkStatus`` from ``nvidia-smi nvlink --status``."""
    return _parsed(ctx, nvlink.parse_nvlink_status, "nvidia-smi-nvlink-status")[1]


@fact("nvlink_errors", probes=("nvidia-smi-nvlink-errors",))
def _nvlink_errors(ctx: HostEvidence) -> nvlink.NvlinkErrors:
    """``NvlinkErrors`` from ``nvidia-smi nvlink -e``."""
    return _parsed(ctx, nvlink.parse_nvlink_errors, "nvidia-smi-nvlink-errors")[1]


@fact("lspci", probes=("lspci",))
def _lspci(ctx: HostEvidence):
    """PCI devices with link capability and status, from ``lspci -vvv``."""
    return _parsed(ctx, lspci.parse_lspci, "lspci")[1]


# Only -q is planned: a live run always has it, and collecting three more probes for a count it
# already has would slow every run. The other views are read when the bundle holds them, which
# is the case this fact exists for (a user's bundle without -q).
@fact("gpu_census", needs=("smi_evidence",), reads=("nvlink_status", "topo", "lspci", "dcgm_discovery"))
def _gpu_census(ctx: HostEvidence) -> GpuCensus:
    """``GpuCensus``: how many GPUs, and which model, from nvidia-smi -q, else (when the bundle
    has them) nvidia-smi nvlink --status, topo -m, dcgmi discovery -l and lspci
    (preflight.judge.census); missing
    only when none of them is there."""
    readings, failures = {}, []
    for name in ("smi_evidence", "nvlink_status", "topo", "lspci", "dcgm_discovery"):
        try:
            readings[name] = getattr(ctx, name)
        except EvidenceMissing as exc:
            failures.append(exc)
    if not readings:
        raise _strongest(failures)
    smi = readings.get("smi_evidence")
    return gpu_census(smi[:2] if smi else None, readings.get("nvlink_status"),
                      readings.get("topo"), readings.get("lspci"), readings.get("dcgm_discovery"))


@fact("kernel_log", probes=("kernel-log",))
def _kernel_log(ctx: HostEvidence) -> kernel_log.KernelLog:
    """``KernelLog`` (Xid/SXid, GSP, mlx5, PCIe events) from ``dmesg`` / ``journalctl -k``."""
    return _parsed(ctx, kernel_log.parse_kernel_log, "kernel-log")[1]


@fact("nccl", probes=(NCCL_PROBE,))
def _nccl(ctx: HostEvidence):
    """``NcclProbeOutput`` (repetitions, their runs, NCCL log signatures) of the nccl-all-reduce
    probe. Output its overall timeout cut short is still read: up to the cut, it is the
    evidence of a hang."""
    r = ctx.result(NCCL_PROBE)
    if r is not None and r.tool_missing:
        # The command is `sh -c SCRIPT`: say what the script found missing, not "sh".
        said = r.stderr.strip().splitlines()
        raise EvidenceMissing(
            said[-1] if said else "neither all_reduce_perf nor python3 with torch on the node",
            ("tool-missing",), (Evidence(NCCL_PROBE, r.stderr.strip()[-300:] or f"exit {r.exit_code}"),))
    if r is not None and r.timed_out and r.stdout:
        try:
            return parse_probe_output(r.text, cut_off=True)
        except ParseError:
            raise why_missing(r, NCCL_PROBE, ctx.answered_by_tool(NCCL_PROBE)) from None
    return _parsed(ctx, parse_probe_output, NCCL_PROBE)[1]


# ---- NICs ------------------------------------------------------------------------------

_IB_SOURCES = (("ibv-devinfo", ibverbs.parse_ibv_devinfo), ("ibstat", ibverbs.parse_ibstat),
               ("ib-sysfs", ibverbs.parse_ib_sysfs))


@fact("ib_evidence", probes=tuple(p for p, _ in _IB_SOURCES))
def _ib_evidence(ctx: HostEvidence) -> tuple[str, ibverbs.IbInventory]:
    """(probe, IbInventory) from the first of ibv_devinfo, ibstat, sysfs that reads."""
    failures: list[EvidenceMissing] = []
    unreadable: list[str] = []
    for probe, parse in _IB_SOURCES:
        r = ctx.result(probe)
        # ibv_devinfo exits 255 on a node without RDMA devices but says so (on stderr): an answer.
        if probe == "ibv-devinfo" and r is not None and "No IB devices found" in r.text + r.stderr:
            return probe, ibverbs.IbInventory((), ("ibv_devinfo: No IB devices found",), "ibv_devinfo")
        # The sysfs probe's glob matches nothing when no RDMA device exists.
        if probe == "ib-sysfs" and r is not None and r.ok and not r.text.strip():
            return probe, ibverbs.IbInventory((), ("/sys/class/infiniband holds no device",), "sysfs")
        try:
            inventory = _parsed(ctx, parse, probe)[1]
        except EvidenceMissing as exc:
            inventory = _failed_part_way(r, parse) if probe in ("ibstat", "ibv-devinfo") else None
            if inventory is None:
                failures.append(exc)
                if "probe-unreadable" in exc.symptoms:
                    unreadable.append(str(exc))
                continue
        if unreadable:
            inventory = replace(inventory, notes=inventory.notes + tuple(
                f"{u}; read {probe} instead" for u in unreadable))
        return probe, inventory
    raise _strongest(failures)


def _failed_part_way(r, parse: Callable[[str], Any]) -> ibverbs.IbInventory | None:
    """What a tool that exited with an error after listing some devices had listed (ibstat stops
    with ``ibpanic: ... stat of IB device 'mlx5_8' failed`` and exit 255, its devices before
    that on stdout), with the failure said; None when it listed none, or did not fail so."""
    if r is None or r.stdout is None or r.ok or r.timed_out or r.tool_missing or r.error:
        return None
    try:
        inventory = parse(r.text)
    except ParseError:
        return None
    if not inventory.devices:
        return None
    said = (r.stderr.strip().splitlines() or [""])[-1][:200]
    cut = (f"{' '.join(r.command) or inventory.source} exited with code {r.exit_code} after listing "
           f"{', '.join(d.name for d in inventory.devices)}" + (f" ({said})" if said else "")
           + ": the devices after them were not listed")
    return replace(inventory, notes=(*inventory.notes, cut), cut=cut)


@fact("ib", needs=("ib_evidence",))
def _ib(ctx: HostEvidence) -> ibverbs.IbInventory:
    """RDMA devices and ports (``IbInventory``) from ``ibv_devinfo -v``, else ``ibstat``, else
    sysfs; an earlier source that was there but unreadable is named in its ``notes``."""
    return ctx.ib_evidence[1]


@fact("ib_probe", needs=("ib_evidence",))
def _ib_probe(ctx: HostEvidence) -> str:
    """Which probe the ``ib`` fact came from: ibv-devinfo, else ibstat, else ib-sysfs."""
    return ctx.ib_evidence[0]


@fact("ethtool", probes=("ethtool-i",))
def _ethtool(ctx: HostEvidence):
    """``EthtoolInfo`` per mlx5 netdev, from the ``ethtool-i`` probe."""
    return _parsed(ctx, mlnx.parse_ethtool_i, "ethtool-i")[1]


@fact("mlx5_modinfo", probes=("mlx5-modinfo",))
def _mlx5_modinfo(ctx: HostEvidence) -> mlnx.ModInfo:
    """``ModInfo`` of ``modinfo mlx5_core``."""
    return _parsed(ctx, mlnx.parse_modinfo, "mlx5-modinfo")[1]


@fact("ofed_info", probes=("ofed-info",))
def _ofed_info(ctx: HostEvidence) -> mlnx.OfedInfo:
    """``OfedInfo`` of ``ofed_info -s`` (absent on inbox-driver hosts)."""
    return _parsed(ctx, mlnx.parse_ofed_info, "ofed-info")[1]


@fact("mlxfwmanager", probes=("mlxfwmanager",))
def _mlxfwmanager(ctx: HostEvidence):
    """``FirmwareQuery`` of ``mlxfwmanager --query`` (most hosts lack the tool)."""
    return _parsed(ctx, mlnx.parse_mlxfwmanager, "mlxfwmanager")[1]


@fact("driver_release", needs=("ethtool", "mlx5_modinfo", "ofed_info"))
def _driver_release(ctx: HostEvidence) -> versions.DriverRelease:
    """The mlx5 driver the node runs (``DriverRelease``), from whichever of ethtool -i, modinfo
    and ofed_info is there; never missing: with none of them its flavour is ``unknown``."""
    infos = ctx.optional("ethtool") or ()
    ethtool = next((i for i in infos if i.driver == "mlx5_core"), infos[0] if infos else None)
    modinfo = ctx.optional("mlx5_modinfo")
    if modinfo is not None and modinfo.name not in (None, "mlx5_core"):
        modinfo = None  # another module's modinfo says nothing about mlx5
    return versions.driver_release(modinfo, ctx.optional("ofed_info"), ethtool)


@fact("nic_matrix")
def _nic_matrix(ctx: HostEvidence) -> nic_matrix.NicMatrix:
    """The NIC firmware matrix with the profile's ``nic.policy_file`` (a path relative to the
    profile's own file) merged over it."""
    policy = ctx.profile.get("nic.policy_file")
    if policy and not Path(policy).is_absolute() and ctx.profile.source_file:
        policy = str(Path(ctx.profile.source_file).parent / policy)
    try:
        return nic_matrix.load_matrix(policy or None)
    except nic_matrix.NicMatrixError as exc:
        raise EvidenceMissing(f"NIC firmware policy of profile {ctx.profile.id}: {exc}") from None


@fact("nics", needs=("ib", "ib_probe", "ethtool", "mlxfwmanager", "nic_matrix"))
def _nics(ctx: HostEvidence):
    """``Nic`` records (preflight.knowledge.nic_matrix): firmware and adapter family of every
    ConnectX, from the ``ib`` fact, else ``ethtool -i``, else ``mlxfwmanager``."""
    matrix = ctx.nic_matrix
    sources = (("ib", lambda v: nic_matrix.nics_from_ib(matrix, v, ctx.ib_probe)),
               ("ethtool", lambda v: nic_matrix.nics_from_ethtool(matrix, v)),
               ("mlxfwmanager", lambda v: nic_matrix.nics_from_fwquery(matrix, v)))
    failures: list[EvidenceMissing] = []
    for name, build in sources:
        try:
            found = build(getattr(ctx, name))
        except EvidenceMissing as exc:
            failures.append(exc)
            continue
        if found:
            return found
    if len(failures) == len(sources):
        raise _strongest(failures)
    return ()


# ---- DCGM ------------------------------------------------------------------------------

@fact("dcgm_diag", probes=(DCGM_PROBE,))
def _dcgm_diag(ctx: HostEvidence) -> dcgm.DcgmDiag:
    """``DcgmDiag`` (tests, per-GPU results, messages with DCGM error codes, how the probe ran)
    of ``dcgmi diag``: the probe's JSON, or a pasted text table saved as ``dcgmi-diag.txt``.
    Output the probe's overall limit cut short is still read: it is the evidence of a hang."""
    r = ctx.result(DCGM_PROBE)
    if r is not None and r.stdout is not None and not r.tool_missing and (r.ok or r.timed_out):
        return _read(DCGM_PROBE, r.text, dcgm.parse_dcgmi_diag)
    raise why_missing(r, DCGM_PROBE, ctx.answered_by_tool(DCGM_PROBE))


@fact("dcgm_discovery", probes=(DCGM_DISCOVERY_PROBE,))
def _dcgm_discovery(ctx: HostEvidence) -> dcgm.DcgmDiscovery:
    """``DcgmDiscovery`` of ``dcgmi discovery -l``: the GPUs DCGM's host engine sees, or the
    error dcgmi printed when it could not reach the host engine (it exits non-zero then)."""
    r = ctx.result(DCGM_DISCOVERY_PROBE)
    if r is not None and r.stdout is not None and not r.tool_missing and not r.timed_out:
        if r.ok or "Error:" in r.text:
            return _read(DCGM_DISCOVERY_PROBE, r.text, dcgm.parse_dcgmi_discovery)
    raise why_missing(r, DCGM_DISCOVERY_PROBE, ctx.answered_by_tool(DCGM_DISCOVERY_PROBE))


@fact("dcgm_health", probes=(DCGM_HEALTH_PROBE,))
def _dcgm_health(ctx: HostEvidence) -> dcgm_health.DcgmHealth:
    """``DcgmHealth`` of DCGM's background health check (``dcgmi health -s a`` then ``-c -j``), or
    a pasted ``dcgmi health -c`` report: overall and per-entity Healthy/Warning/Failure with each
    watched subsystem's incident messages, and dcgmi's ``Error:`` lines (no host engine)."""
    r = ctx.result(DCGM_HEALTH_PROBE)
    if r is not None and r.stdout is not None and not r.tool_missing and not r.timed_out:
        return _read(DCGM_HEALTH_PROBE, r.text, dcgm_health.parse_dcgmi_health)
    raise why_missing(r, DCGM_HEALTH_PROBE, ctx.answered_by_tool(DCGM_HEALTH_PROBE))


# ---- RDMA port counters ------------------------------------------------------------------

@fact("ib_counters", probes=(IB_COUNTERS,))
def _ib_counters(ctx: HostEvidence) -> ib_counters.CounterSnapshot:
    """``CounterSnapshot`` of the RDMA port counters (sysfs counters/ and hw_counters/, with port
    state), read before the active tests (the only reading of a ``--quick`` run)."""
    return _parsed(ctx, ib_counters.parse_ib_counters, IB_COUNTERS)[1]


@fact("ib_counters_after", probes=(IB_COUNTERS_AFTER,))
def _ib_counters_after(ctx: HostEvidence) -> ib_counters.CounterSnapshot:
    """The same reading taken after the active tests: what grew while the fabric was loaded."""
    return _parsed(ctx, ib_counters.parse_ib_counters, IB_COUNTERS_AFTER)[1]


@fact("history")
def _history(ctx: HostEvidence):
    """``HostHistory``: the node's earlier runs, causes, failed checks and figures from the
    results store, with the fleet's run-to-run spread of each figure (``run``/``analyze
    --history``); this run's own figures are ``host.readings``."""
    if ctx.past is None:
        raise EvidenceMissing("no history of this node in the results store (judged with --history?)",
                              collected=False)
    return ctx.past
