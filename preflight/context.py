"""What a check sees: one host's evidence, parsed on demand, and its profile.

Facts are ``cached_property`` attributes that parse a probe's saved output the first time a
check asks, so a host pays only for the parsers its selected checks use, and every check
reads the same parsed record. A fact whose evidence is missing raises ``EvidenceMissing``;
the runner turns that into an ERROR finding that says why (tool absent, timed out, failed),
so no check has to repeat that bookkeeping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from .model import Evidence, ProbeResult
from .parsers import ParseError
from .profiles import Profile


class EvidenceMissing(Exception):
    """A fact cannot be had from the evidence; ``symptoms`` say why, for the diagnosis."""

    def __init__(self, message: str, symptoms: tuple[str, ...] = (), evidence: tuple[Evidence, ...] = (),
                 collected: bool = True):
        super().__init__(message)
        self.symptoms = symptoms
        self.evidence = evidence
        # False when the bundle simply has no record of the probe (a bundle assembled by hand,
        # or a run that selected other checks): nothing went wrong on the node, so the check
        # is not applicable rather than in error. A live run records every probe it starts.
        self.collected = collected


def why_missing(result: ProbeResult | None, probe: str) -> EvidenceMissing:
    if result is None:
        return EvidenceMissing(f"{probe} not collected in this bundle", collected=False)
    command = " ".join(result.command) or probe
    if result.error:
        return EvidenceMissing(f"{probe}: {result.error}")
    if result.tool_missing:
        tool = result.command[0] if result.command else probe
        return EvidenceMissing(
            f"{tool} is not installed (or not on PATH)", ("tool-missing",),
            (Evidence(probe, result.stderr.strip()[-300:] or f"{command}: exit {result.exit_code}"),),
        )
    if result.timed_out:
        return EvidenceMissing(
            f"{command} did not finish within its timeout ({result.duration_s}s)", ("probe-timeout",),
            (Evidence(probe, (result.text.strip()[-300:] or "(no output)")),),
        )
    return EvidenceMissing(
        f"{command} failed with exit code {result.exit_code}", ("probe-failed",),
        (Evidence(probe, (result.stderr.strip() or result.text.strip())[-300:] or "(no output)"),),
    )


@dataclass
class HostContext:
    name: str
    probes: dict[str, ProbeResult]
    profile: Profile

    def result(self, probe: str) -> ProbeResult | None:
        return self.probes.get(probe)

    def text(self, probe: str) -> str:
        """The probe's output; raises EvidenceMissing unless it ran cleanly."""
        r = self.probes.get(probe)
        if r is None or not r.ok:
            raise why_missing(r, probe)
        return r.text

    def first_text(self, *probes: str) -> tuple[str, str]:
        """The first of several alternative probes that ran cleanly: (probe id, text)."""
        failures = []
        for p in probes:
            try:
                return p, self.text(p)
            except EvidenceMissing as exc:
                failures.append(exc)
        # Report the most telling reason: a probe that ran and failed beats one not collected.
        raise max(failures, key=lambda e: (e.collected, len(e.symptoms)))

    def excerpt(self, probe: str, pattern: str, context: int = 0, limit: int = 6) -> Evidence | None:
        """Lines of a probe's output matching ``pattern`` (a regex), as evidence."""
        r = self.probes.get(probe)
        if r is None or r.stdout is None:
            return None
        lines = r.text.splitlines()
        rx = re.compile(pattern)
        picked: list[int] = []
        for i, line in enumerate(lines):
            if rx.search(line):
                picked.extend(range(max(0, i - context), min(len(lines), i + context + 1)))
        if not picked:
            return None
        keep = sorted(set(picked))[: limit * (2 * context + 1)]
        return Evidence(probe, "\n".join(lines[i].strip() for i in keep))

    # ---- parsed facts -------------------------------------------------------------------
    # Each fact parses one probe (or the first of alternatives) once. Missing or unreadable
    # evidence raises EvidenceMissing, which the runner reports as an ERROR finding.

    def _parsed(self, parse, *probes: str):
        probe, text = self.first_text(*probes)
        try:
            return probe, parse(probe, text)
        except ParseError as exc:
            raise EvidenceMissing(f"{probe}: unreadable output ({exc})", ("probe-unreadable",),
                                  (Evidence(probe, text.strip()[:300]),)) from None

    @cached_property
    def _smi(self):
        from .parsers import nvidia_smi

        return self._parsed(
            lambda p, t: (nvidia_smi.parse_smi_xml if p == "nvidia-smi-q-x" else nvidia_smi.parse_smi_text)(t),
            "nvidia-smi-q-x", "nvidia-smi-q")

    @cached_property
    def smi_probe(self) -> str:
        """Which probe the ``smi`` fact came from, for evidence excerpts."""
        return self._smi[0]

    @cached_property
    def smi(self):
        """GPU inventory and health (``SmiReport``), from the XML probe or else the text one."""
        return self._smi[1]

    @cached_property
    def topo(self):
        """``TopoMatrix`` from ``nvidia-smi topo -m``."""
        from .parsers.topo import parse_topo

        return self._parsed(lambda p, t: parse_topo(t), "nvidia-smi-topo")[1]

    @cached_property
    def nvlink_status(self):
        """``NvlinkStatus`` from ``nvidia-smi nvlink --status``."""
        from .parsers.nvlink import parse_nvlink_status

        return self._parsed(lambda p, t: parse_nvlink_status(t), "nvidia-smi-nvlink-status")[1]

    @cached_property
    def nvlink_errors(self):
        """``NvlinkErrors`` from ``nvidia-smi nvlink -e``."""
        from .parsers.nvlink import parse_nvlink_errors

        return self._parsed(lambda p, t: parse_nvlink_errors(t), "nvidia-smi-nvlink-errors")[1]

    @cached_property
    def lspci(self):
        """PCI devices with link capability and status, from ``lspci -vvv``."""
        from .parsers.lspci import parse_lspci

        return self._parsed(lambda p, t: parse_lspci(t), "lspci")[1]

    # -- nccl: for checks/nccl_all_reduce.py --
    @cached_property
    def nccl(self):
        """``NcclProbeOutput`` (repetitions, their runs, NCCL log signatures) of the
        nccl-all-reduce probe. Output its overall timeout cut short is still read: up to the
        cut, it is the evidence of a hang."""
        from .nccl_probe import PROBE_ID, parse_probe_output

        r = self.probes.get(PROBE_ID)
        if r is not None and r.tool_missing:
            # The command is `sh -c SCRIPT`: say what the script found missing, not "sh".
            said = r.stderr.strip().splitlines()
            raise EvidenceMissing(
                said[-1] if said else "neither all_reduce_perf nor python3 with torch on the node",
                ("tool-missing",), (Evidence(PROBE_ID, r.stderr.strip()[-300:] or f"exit {r.exit_code}"),))
        if r is not None and r.timed_out and r.stdout:
            try:
                return parse_probe_output(r.text, cut_off=True)
            except ParseError:
                raise why_missing(r, PROBE_ID) from None
        return self._parsed(lambda p, t: parse_probe_output(t), PROBE_ID)[1]

    # -- kernel_log: for checks/xid.py and checks/pcie_link.py --
    @cached_property
    def kernel_log(self):
        """``KernelLog`` (Xid/SXid, GSP, mlx5, PCIe events) from ``dmesg`` / ``journalctl -k``."""
        from .parsers.kernel_log import parse_kernel_log

        return self._parsed(lambda p, t: parse_kernel_log(t), "kernel-log")[1]

    # -- NIC facts: for checks/nic_firmware.py, nic_fw_consistency.py, ib_ports.py, mlx5_log.py --
    @cached_property
    def _ib(self):
        from dataclasses import replace

        from .parsers.ibverbs import (
            IbInventory,
            parse_ib_sysfs,
            parse_ibstat,
            parse_ibv_devinfo,
        )

        failures: list[EvidenceMissing] = []
        unreadable: list[str] = []
        for probe, parse in (("ibv-devinfo", parse_ibv_devinfo), ("ibstat", parse_ibstat),
                             ("ib-sysfs", parse_ib_sysfs)):
            r = self.probes.get(probe)
            # ibv_devinfo exits 255 on a node without RDMA devices but says so (on stderr): an answer.
            if probe == "ibv-devinfo" and r is not None and "No IB devices found" in r.text + r.stderr:
                return probe, IbInventory((), ("ibv_devinfo: No IB devices found",), "ibv_devinfo")
            # The sysfs probe's glob matches nothing when no RDMA device exists.
            if probe == "ib-sysfs" and r is not None and r.ok and not r.text.strip():
                return probe, IbInventory((), ("/sys/class/infiniband holds no device",), "sysfs")
            try:
                inventory = self._parsed(lambda p, t, parse=parse: parse(t), probe)[1]
            except EvidenceMissing as exc:
                failures.append(exc)
                if "probe-unreadable" in exc.symptoms:
                    unreadable.append(str(exc))
                continue
            if unreadable:
                inventory = replace(inventory, notes=inventory.notes + tuple(
                    f"{u}; read {probe} instead" for u in unreadable))
            return probe, inventory
        raise max(failures, key=lambda e: (e.collected, len(e.symptoms)))

    @cached_property
    def ib_probe(self) -> str:
        """Which probe the ``ib`` fact came from: ibv-devinfo, else ibstat, else ib-sysfs."""
        return self._ib[0]

    @cached_property
    def ib(self):
        """RDMA devices and ports (``IbInventory``) from ``ibv_devinfo -v``, else ``ibstat``, else
        sysfs; an earlier source that was there but unreadable is named in its ``notes``."""
        return self._ib[1]

    @cached_property
    def ethtool(self):
        """``EthtoolInfo`` per mlx5 netdev, from the ``ethtool-i`` probe."""
        from .parsers.mlnx import parse_ethtool_i

        return self._parsed(lambda p, t: parse_ethtool_i(t), "ethtool-i")[1]

    @cached_property
    def mlx5_modinfo(self):
        """``ModInfo`` of ``modinfo mlx5_core``."""
        from .parsers.mlnx import parse_modinfo

        return self._parsed(lambda p, t: parse_modinfo(t), "mlx5-modinfo")[1]

    @cached_property
    def ofed_info(self):
        """``OfedInfo`` of ``ofed_info -s`` (absent on inbox-driver hosts)."""
        from .parsers.mlnx import parse_ofed_info

        return self._parsed(lambda p, t: parse_ofed_info(t), "ofed-info")[1]

    @cached_property
    def mlxfwmanager(self):
        """``FirmwareQuery`` of ``mlxfwmanager --query`` (most hosts lack the tool)."""
        from .parsers.mlnx import parse_mlxfwmanager

        return self._parsed(lambda p, t: parse_mlxfwmanager(t), "mlxfwmanager")[1]

    def _optional(self, attribute: str):
        try:
            return getattr(self, attribute)
        except EvidenceMissing:
            return None

    @cached_property
    def driver_release(self):
        """The mlx5 driver the node runs (``DriverRelease``), from whichever of ethtool -i, modinfo
        and ofed_info is there; never missing: with none of them its flavour is ``unknown``."""
        from .parsers.versions import driver_release

        infos = self._optional("ethtool") or ()
        ethtool = next((i for i in infos if i.driver == "mlx5_core"), infos[0] if infos else None)
        modinfo = self._optional("mlx5_modinfo")
        if modinfo is not None and modinfo.name not in (None, "mlx5_core"):
            modinfo = None  # another module's modinfo says nothing about mlx5
        return driver_release(modinfo, self._optional("ofed_info"), ethtool)

    @cached_property
    def nic_matrix(self):
        """The NIC firmware matrix with the profile's ``nic.policy_file`` (a path relative to the
        profile's own file) merged over it."""
        from pathlib import Path

        from .nic_matrix import NicMatrixError, load_matrix

        policy = self.profile.get("nic.policy_file")
        if policy and not Path(policy).is_absolute() and self.profile.source_file:
            policy = str(Path(self.profile.source_file).parent / policy)
        try:
            return load_matrix(policy or None)
        except NicMatrixError as exc:
            raise EvidenceMissing(f"NIC firmware policy of profile {self.profile.id}: {exc}") from None

    @cached_property
    def nics(self):
        """``Nic`` records (preflight.nic_matrix): firmware and adapter family of every ConnectX,
        from the ``ib`` fact, else ``ethtool -i``, else ``mlxfwmanager``."""
        from .nic_matrix import nics_from_ethtool, nics_from_fwquery, nics_from_ib

        sources = (("ib", lambda v: nics_from_ib(self.nic_matrix, v, self.ib_probe)),
                   ("ethtool", lambda v: nics_from_ethtool(self.nic_matrix, v)),
                   ("mlxfwmanager", lambda v: nics_from_fwquery(self.nic_matrix, v)))
        failures: list[EvidenceMissing] = []
        for attribute, build in sources:
            try:
                found = build(getattr(self, attribute))
            except EvidenceMissing as exc:
                failures.append(exc)
                continue
            if found:
                return found
        if len(failures) == len(sources):
            raise max(failures, key=lambda e: (e.collected, len(e.symptoms)))
        return ()

    def device_excerpt(self, probe: str, device: str, pattern: str, limit: int = 8) -> Evidence | None:
        """Lines matching ``pattern`` in one device's part of a multi-device listing (ibv_devinfo,
        ibstat, ibstatus, ``== IFACE ==`` ethtool blocks, ib-sysfs lines), after its header."""
        r = self.probes.get(probe)
        if r is None or r.stdout is None:
            return None
        name = re.escape(device)
        own = re.compile(rf"^\s*(?:hca_id:\s*{name}\s*$|CA '{name}'|Infiniband device '{name}'|==\s*{name}\s*==)")
        header = re.compile(r"^\s*(?:hca_id:|CA '|Infiniband device '|==\s*\S+\s*==)")
        wanted = re.compile(pattern)
        picked: list[str] = []
        inside = False
        for line in r.text.splitlines():
            if f"/infiniband/{device}/" in line:  # sysfs: every line names its device
                if wanted.search(line):
                    picked.append(line.strip())
            elif own.match(line):
                inside = True
                picked.append(line.strip())
            elif header.match(line):
                inside = False
            elif inside and wanted.search(line):
                picked.append(line.strip())
        return Evidence(probe, "\n".join(picked[:limit])) if picked else None


@dataclass
class FleetContext:
    hosts: dict[str, HostContext]  # reachable hosts only, in inventory order
    # -- nccl-multinode: for checks/nccl_multinode.py --
    # Results of runs that span hosts, saved under the bundle's pseudo-host (bundle.FLEET_HOST).
    probes: dict[str, ProbeResult] = field(default_factory=dict)

    def facts(self, attribute: str) -> dict[str, object]:
        """One fact from every host that has it; hosts where it is missing are left out
        (their own host checks already report why)."""
        out: dict[str, object] = {}
        for name, host in self.hosts.items():
            try:
                out[name] = getattr(host, attribute)
            except EvidenceMissing:
                continue
        return out
