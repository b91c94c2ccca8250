"""The kernel-log parser's records and its signature table (what ``parse_kernel_log`` looks for).

Symptom vocabulary (``KernelEvent.kind``), the contract between this parser and the checks:

NVIDIA GPU and NVSwitch
- ``xid``: ``NVRM: Xid (PCI:0000:05:00): 79, pid=..., name=..., text`` (and the older
  ``NVRM: Xid (0000:03:00): 14, ...``). ``code`` is the Xid; pid, process, ``caused_by``
  (Xid 45 "caused by previous Xid N"), ``recovery_action`` (Xid 154 "... to 0x1 (GPU Reset
  Required)"), ``link`` and ``severity`` (NVLink5 Xids say Fatal/Nonfatal) when printed.
  What an Xid means and what to do lives in ``playbooks/xid.yaml``.
- ``sxid``: NVSwitch ``SXid (PCI:...): 12028, Non-fatal, Link 61 ...``. The driver prints up to
  three lines per error (``Data {...}``, ``Non-fatal, Link N ...``, ``Severity N Engine
  instance ...``); each is an event, and only the descriptive one has ``severity`` and ``link``.
- ``gpu-fallen-off-bus``: the NVRM fallen-off-the-bus message that is not an Xid line, one-line
  or the three-line ``The NVIDIA GPU <bdf>`` / ``installed in this system has`` / ``fallen off
  the bus and is not responding to commands.`` form (device taken from the first line).
- ``gpu-init-failed``: ``NVRM: GPU <bdf>: RmInitAdapter failed! (0x62:0x65:1792)`` with its
  ``rm_init_adapter failed, device minor number N`` line; ``detail`` is the code triple.
- ``gsp-init-failed``: ``RmInitAdapter: Cannot initialize GSP firmware RM`` (names no GPU).
- ``gpu-attach-failed``: ``osInitNvMapping: *** Cannot attach gpu`` (names no GPU).
- ``gpu-unsupported``: ``The NVIDIA GPU <bdf> (PCI ID: ...)`` / ``installed in this system is not
  supported by open nvidia.ko ...`` (or ``by the 280.13 NVIDIA Linux`` driver release).
- ``fsp-boot-failed``: ``kfspPollForQueueEmpty: Timed out waiting for FSP command queue`` or a
  check failure ``returned from kfspSendBootCommands_HAL``, with the ``kfsp...`` dump lines;
  ``device`` from the dump's ``kfspDumpDebugState_GH100: GPU <bdf>`` line.
- ``gsp-heartbeat-timeout``: ``NVRM: GPU0 _kgspIsHeartbeatTimedOut: Heartbeat timed out, ...``
  and ``_kgspRpcRecvPoll: GSP RM heartbeat timed out``; ``device`` is ``GPU<n>``.
- ``gsp-timeout``: the ``*** GSP Timeout ***`` banner or "Timeout ... waiting for RPC ... GSP"
  outside an Xid line.
- ``gsp-rpc-dump``: the RPC history tables the driver dumps after a GSP RPC timeout or failed RPC
  (``GPU6 RPC event history (CPU <- GSP):``); one event per dump, device ``GPU<n>``.
- ``gsp-coredump``: ``kflcnCoreDumpNondestructive`` register/TRACE lines the driver prints when
  GSP stops responding; one event per dump.
- ``nvidia-driver-load``: ``NVRM: loading NVIDIA UNIX ... Kernel Module ... <version>``.

Mellanox / NVIDIA ConnectX (mlx5)
- ``mlx5-cmd-timeout``: firmware command timeouts (``... timeout. Will cause a leak of a command
  resource``, ``wait_func_handle_exec_timeout``); ``detail`` is the command when printed.
- ``mlx5-health-compromised``: ``health compromised - reached miss count`` (firmware hang).
- ``mlx5-fw-syndrome``: health dump ``synd 0x7: irisc not responding``; ``code`` is the syndrome.
- ``mlx5-fw-unresponsive``: ``FW is unable to respond to initialization segment reads``.
- ``mlx5-fw-init-timeout``: ``Waiting for FW initialization, timeout abort in Ns``.
- ``mlx5-fatal-error``: ``Fatal error N detected``; ``code`` is N.
- ``mlx5-probe-failed``: ``handle_hca_cap failed``, ``mlx5_load_one failed with error code -22``,
  ``mlx5_core: probe of <bdf> failed with error -22``; ``code`` is the errno when printed.
- ``mlx5-fw-version``: ``firmware version: 28.39.1002`` at probe, or ``fw_ver`` in a health dump.
- ``mlx5-pcie-power-insufficient``: ``Detected insufficient power on the PCIe slot (27W).``
  (mlx5 ``events.c`` ``mlx5_pcie_event``, printed as a warning); ``detail`` is the wattage the
  slot advertised. The info-level siblings ``PCIe slot advertised sufficient power (75W).`` and
  ``PCIe slot power capability was not advertised.`` are no fault and not matched.
- ``mlx5-module-error``: ``Port module event[error]: module 0, Cable error, High Temperature``
  (``events.c`` ``port_module``, printed as an error); ``code`` is the module (cage) number and
  ``detail`` the firmware's error text (``Power budget exceeded``, ``Bus stuck (I2C or data
  shorted)``, ``Bad or shorted cable/module``, ``One or more network ports have been powered
  down due to insufficient/unadvertised power on the PCIe slot``, ...). ``Port module event:
  module 0, Cable plugged`` (no ``[error]``) is not matched.
- ``module-symbol-mismatch``: ``disagrees about version of symbol X`` / ``Unknown symbol X (err
  -22)``: a module built against another kernel or driver stack (inbox vs OFED/DOCA, DKMS).
  ``driver`` is the module that failed to load.

PCIe and platform
- ``pcie-bandwidth-limited``: ``... Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe x16
  link at <bdf> (capable of ... with 32.0 GT/s PCIe x16 link)``; see ``KernelEvent.pcie``.
- ``aer``: native AER ``AER: Corrected error received: <bdf>`` / ``... error message received
  from <bdf>`` / ``... received: id=00e5`` (older kernels); ``severity`` as printed, ``device``
  the error's source, ``origin`` the port that received it. The lines that follow are events of
  their own, grouped by ``pcie_incidents.py``: ``aer-bus-error`` (``PCIe Bus Error:
  severity=..., type=...``; ``device`` is the device that logged the error), ``aer-status``
  (``device [10de:2330] error status/mask=00004020/00000000``: ``pci_id``, and the registers in
  ``detail``, whose set bits name the errors: CmpltTO, RxErr, ...), ``aer-no-recovery`` (``AER:
  can't recover (no error_detected callback)``: that device's driver has no error handler) and
  ``aer-recovery`` (``AER: device recovery failed`` / ``successful``, ``detail`` says which).
- ``pcie-dpc``: ``DPC: containment event, status:0x1f01 source:0x0000`` (or ``, ERR_FATAL
  received from <bdf>``): downstream port containment took a link down.
- ``pcie-link-down`` / ``pcie-card-removed``: pciehp ``Slot(N): Link Down`` / ``Slot(N): Card
  not present`` (a surprise removal); ``Link Down/Up ignored (recovered by DPC)`` is not one.
- ``ghes``: a firmware-first ``[Hardware Error]`` record (APEI GHES); ``severity``, ``detail``
  (the section type) and ``device`` come from the record's following lines.
- ``mce``: ``mce: [Hardware Error]: ...`` (consecutive lines are one event).
- ``edac-ue`` / ``edac-ce``: EDAC uncorrectable / correctable memory errors; ``device`` is the
  DIMM location as printed.

Some messages span several lines; ``Signature.role`` says how a line joins a record (see
``kernel_log.py``). For each line the first signature that matches wins, so the more specific
ones come first in ``SIGNATURES``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from preflight.parse import finite, regex_needle

_START, _MORE, _CONTEXT = "start", "more", "context"

# PCI addresses as the kernel prints them (domain:bus:dev.fn), and as NVRM prints them
# (often without the function: "PCI:0000:10:1c").
_BDF = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_NVPCI = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"

# A record's lines are folded together only while they keep coming within this many lines:
# GHES records and falcon dumps are contiguous except for the odd interleaved line.
_FOLD_WINDOW = 16


@dataclass(frozen=True)
class PcieLimit:
    """The kernel's "available PCIe bandwidth, limited by ..." report for one device."""

    available_gbps: float
    speed_gts: float | None  # None where the kernel printed "Unknown"
    width: int
    limited_at: str  # the upstream device whose link is the bottleneck
    capable_gbps: float
    capable_speed_gts: float | None
    capable_width: int


@dataclass(frozen=True)
class KernelEvent:
    """One symptom found in the log. Fields the line did not print are None."""

    kind: str
    line: int  # 1-based line number in the probe output
    message: str  # the line without its timestamp / host prefix
    raw: str
    timestamp: str | None = None  # as printed, without brackets
    host: str | None = None
    driver: str | None = None  # driver or subsystem tag: NVRM, mlx5_core, nvidia-nvswitch3, pci
    device: str | None = None  # PCI address as printed, mlx5_<n>, GPU<n>, or a DIMM label
    code: int | None = None  # Xid / SXid, mlx5 syndrome or fatal-error number, errno
    detail: str | None = None  # the descriptive text of the message
    severity: str | None = None  # as printed: Non-fatal, Fatal, Corrected, recoverable, ...
    link: int | None = None
    pid: int | None = None
    process: str | None = None
    caused_by: int | None = None  # Xid 45: the Xid that made the driver tear the channel down
    recovery_action: str | None = None  # Xid 154: the new action, e.g. "GPU Reset Required"
    version: str | None = None  # mlx5 firmware or NVIDIA driver version the line reports
    pcie: PcieLimit | None = None
    # The device whose driver printed the line ("pcieport 0000:00:03.1: AER: ... received from
    # 0000:03:00.0") where the message itself names another one (``device``).
    origin: str | None = None
    pci_id: str | None = None  # vendor:device as the kernel printed it, "10de:2330"


@dataclass(frozen=True)
class Signature:
    """One row of the signature table: a regex whose named groups are KernelEvent fields."""

    kind: str
    pattern: re.Pattern[str]
    meaning: str
    role: str = _START
    # Optional fields searched for in the message once the pattern matched, for values that
    # appear in some variants of a message and not in others.
    extras: tuple[re.Pattern[str], ...] = ()
    # Text every match contains (regex_needle): most lines fail this test, which costs far less
    # than the search (a 2,300-line dmesg on the 2-core development machine: 51 -> 30 ms per
    # node; 15 ms once the prefixes became one alternation, _ANY_PREFIX).
    needle: str = ""


_PCIE_FIELDS = frozenset(f.name for f in fields(PcieLimit))
_EVENT_FIELDS = frozenset(f.name for f in fields(KernelEvent)) - {
    "kind", "line", "message", "raw", "timestamp", "host", "pcie"}
_INT_FIELDS = frozenset({"code", "link", "pid", "caused_by", "width", "capable_width"})
_FLOAT_FIELDS = frozenset({"available_gbps", "speed_gts", "capable_gbps", "capable_speed_gts"})


def _rx(pattern: str) -> re.Pattern[str]:
    compiled = re.compile(pattern.replace("<BDF>", _BDF).replace("<NVPCI>", _NVPCI))
    unknown = set(compiled.groupindex) - _EVENT_FIELDS - _PCIE_FIELDS
    if unknown:  # a typo in the table would otherwise only show when that line turns up
        raise ValueError(f"signature groups {sorted(unknown)} are not KernelEvent fields")
    return compiled


def _sig(kind: str, pattern: str, meaning: str, role: str = _START,
         extras: tuple[str, ...] = ()) -> Signature:
    compiled = _rx(pattern)
    return Signature(kind, compiled, meaning, role, tuple(_rx(e) for e in extras), regex_needle.needle(compiled))


_XID_EXTRAS = (
    r"caused by previous Xid (?P<caused_by>[0-9]+)",
    r"recovery action changed from \S+ \([^)]*\) to \S+ \((?P<recovery_action>[^)]*)\)",
    r"\b[Ll]ink (?P<link>[0-9]+)",
    r"\b(?P<severity>(?i:non-?fatal|fatal))\b",
)

SIGNATURES: tuple[Signature, ...] = (
    # --- NVIDIA GPU ---------------------------------------------------------------------
    _sig("xid",
         r"NVRM: Xid \((?:PCI:)?(?P<device><NVPCI>)\): (?P<code>[0-9]+),\s*"
         r"(?:pid=(?P<pid>[^,]*), )?(?:name=(?P<process>[^,]*), )?(?P<detail>.*)",
         "GPU error reported by the NVIDIA driver; the Xid number says which",
         extras=_XID_EXTRAS),
    _sig("gpu-fallen-off-bus",
         r"NVRM: (?:The NVIDIA )?GPU (?:at PCI:)?(?P<device><NVPCI>)\b.*?fallen off the bus",
         "the GPU stopped answering on PCIe"),
    _sig("gpu-fallen-off-bus",
         r"NVRM: .*\bfallen off the bus and is not responding to commands",
         "the GPU stopped answering on PCIe (last line of the multi-line message)"),
    _sig("nvrm-gpu", r"NVRM: The NVIDIA GPU (?P<device><NVPCI>)",
         "first line of a multi-line NVRM message naming the GPU", role=_CONTEXT),
    _sig("nvrm-gpu", r"NVRM: GPU at PCI:(?P<device><NVPCI>): GPU-",
         "the GPU UUID line NVRM prints ahead of an error report", role=_CONTEXT),
    _sig("gpu-init-failed",
         r"NVRM: (?:GPU (?P<device><NVPCI>): )?RmInitAdapter failed!?(?: \((?P<detail>[0-9a-fA-Fx:]+)\))?",
         "the driver could not initialise the GPU; the code triple says where init stopped"),
    _sig("gpu-init-failed", r"NVRM: GPU (?P<device><NVPCI>): rm_init_adapter failed, device minor number",
         "the same failure as the kernel interface reports it", role=_MORE),
    _sig("gsp-init-failed", r"RmInitAdapter: Cannot initialize GSP firmware RM",
         "the driver could not start the GSP firmware while initialising the GPU"),
    _sig("gpu-attach-failed", r"osInitNvMapping: \*\*\* Cannot attach gpu",
         "the driver could not map the GPU it was asked to initialise"),
    _sig("gpu-unsupported", r"NVRM: (?:installed )?in this system is not supported by",
         "the installed driver does not support this GPU (open module without GSP, or a legacy GPU)"),
    _sig("nvrm-gpu", r"NVRM: kfspDumpDebugState\w*: GPU (?P<device><NVPCI>)\s*$",
         "the GPU the FSP debug dump is about", role=_CONTEXT),
    _sig("fsp-boot-failed", r"kfspPollForQueueEmpty\w*: Timed out waiting for FSP command queue",
         "the GPU's FSP (the boot security processor) did not take the driver's boot commands"),
    _sig("fsp-boot-failed", r"returned from kfspSendBootCommands",
         "the driver's FSP boot commands failed"),
    _sig("fsp-boot-failed", r"NVRM: kfsp\w+: ", "a line of the FSP boot report and debug dump", role=_MORE),
    _sig("gsp-heartbeat-timeout",
         r"NVRM: (?:(?P<device>GPU[0-9]+) )?_kgspIsHeartbeatTimedOut: Heartbeat timed out",
         "the GSP firmware stopped updating its heartbeat"),
    _sig("gsp-heartbeat-timeout", r"NVRM: (?:(?P<device>GPU[0-9]+) )?\w+: GSP RM heartbeat timed out",
         "the driver gave up waiting on an RPC because the GSP heartbeat stopped", role=_MORE),
    _sig("gsp-timeout", r"\*{5,} GSP Timeout \*{5,}",
         "the GSP firmware stopped answering driver RPCs"),
    _sig("gsp-timeout",
         r"Timeout after (?P<detail>[0-9]+s) of waiting for RPC response from (?P<device>GPU[0-9]+) GSP",
         "the GSP firmware did not answer an RPC in time"),
    _sig("gsp-timeout", r"Timeout waiting for RPC from GSP",
         "the GSP firmware did not answer an RPC in time (older drivers)"),
    _sig("gsp-rpc-dump", r"(?P<device>GPU[0-9]+) GSP RPC buffer contains function",
         "start of the RPC debug dump printed after a GSP RPC timeout or failure"),
    _sig("gsp-rpc-dump", r"(?P<device>GPU[0-9]+) RPC (?:event )?history \(CPU (?:->|<-) GSP\)",
         "an RPC history table of that dump", role=_MORE),
    _sig("gsp-coredump", r"kflcnCoreDumpNondestructive\w*: PRI: riscvPc",
         "start of the GSP falcon core dump printed when GSP stops responding"),
    _sig("gsp-coredump", r"kflcnCoreDumpNondestructive\w*: (?:PRI|TRACE):",
         "a register or trace line of that dump", role=_MORE),
    _sig("nvidia-driver-load",
         r"NVRM: loading NVIDIA UNIX (?:\w+ )??(?P<detail>(?:Open )?Kernel Module)"
         r".*?\s(?P<version>[0-9]+\.[0-9]+(?:\.[0-9]+)?)\s",
         "the NVIDIA kernel module loaded; its version"),
    # --- NVSwitch -----------------------------------------------------------------------
    _sig("sxid", r"SXid \(PCI:(?P<device><NVPCI>)\): (?P<code>[0-9]+), (?P<detail>.*)",
         "NVSwitch error reported by the nvswitch driver; the SXid number says which",
         extras=(r"SXid \([^)]*\): [0-9]+, (?P<severity>Non-fatal|Fatal),",
                 r"\bLink (?P<link>[0-9]+)\b")),
    # --- ConnectX / mlx5 ----------------------------------------------------------------
    _sig("mlx5-cmd-timeout",
         r"(?P<detail>[A-Z][A-Z0-9_]*\(0x[0-9a-fA-F]+\)) timeout\. "
         r"Will cause a leak of a command resource",
         "a firmware command timed out: firmware hung or older than the driver expects"),
    _sig("mlx5-cmd-timeout", r"wait_func_handle_exec_timeout",
         "a firmware command timed out and the driver tried to recover it",
         extras=(r"(?P<detail>[A-Z][A-Z0-9_]*\(0x[0-9a-fA-F]+\))",)),
    _sig("mlx5-health-compromised", r"health compromised - reached miss count",
         "the NIC firmware stopped updating its health counter"),
    _sig("mlx5-fw-syndrome", r"\bsynd (?P<code>0x[0-9a-fA-F]+): (?P<detail>.+)",
         "the firmware health syndrome from the health dump"),
    _sig("mlx5-fw-unresponsive", r"FW is unable to respond to initialization segment reads",
         "the NIC firmware does not answer at all"),
    _sig("mlx5-fw-init-timeout",
         r"Waiting for FW initialization, timeout abort in (?P<detail>[0-9]+s)",
         "the NIC firmware did not finish initialising"),
    _sig("mlx5-fatal-error", r"Fatal error (?P<code>[0-9]+) detected",
         "the driver saw a fatal NIC error sensor"),
    _sig("mlx5-probe-failed", r"handle_hca_cap failed",
         "the driver could not set the NIC's capabilities at probe"),
    _sig("mlx5-probe-failed", r"mlx5_load_one failed with error code (?P<code>-?[0-9]+)",
         "the driver could not bring the NIC up"),
    _sig("mlx5-probe-failed",
         r"^mlx5_core: probe of (?P<device><BDF>) failed with error (?P<code>-?[0-9]+)",
         "the NIC is left without a driver"),
    _sig("mlx5-fw-version",
         r"^mlx5_core (?P<device><BDF>): (?:firmware version:|fw_ver) "
         r"(?P<version>[0-9]+\.[0-9]+\.[0-9]+)\b",
         "the NIC firmware version the driver read"),
    _sig("mlx5-pcie-power-insufficient",
         r"Detected insufficient power on the PCIe slot \((?P<detail>[0-9]+W)\)",
         "the PCIe slot advertises less power than the NIC needs"),
    _sig("mlx5-module-error",
         r"Port module event\[error\]: module (?P<code>[0-9]+), [^,]+, (?P<detail>.+?)\s*$",
         "the NIC firmware reports an error on a port's cable or transceiver module"),
    _sig("module-symbol-mismatch",
         r"^(?P<driver>[\w-]+): disagrees about version of symbol (?P<detail>\S+)",
         "a module built for another kernel or driver stack"),
    _sig("module-symbol-mismatch",
         r"^(?P<driver>[\w-]+): Unknown symbol (?P<detail>\S+) \(err (?P<code>-?[0-9]+)\)",
         "a module needs a symbol the loaded stack does not export"),
    # --- PCIe and platform --------------------------------------------------------------
    _sig("pcie-bandwidth-limited",
         r"(?P<available_gbps>[0-9]+\.[0-9]+) Gb/s available PCIe bandwidth, limited by "
         r"(?:(?P<speed_gts>[0-9]+(?:\.[0-9]+)?) GT/s|Unknown)(?: PCIe)? x(?P<width>[0-9]+) link "
         r"at (?P<limited_at>\S+) "
         r"\(capable of (?P<capable_gbps>[0-9]+\.[0-9]+) Gb/s with "
         r"(?:(?P<capable_speed_gts>[0-9]+(?:\.[0-9]+)?) GT/s|Unknown)(?: PCIe)? x(?P<capable_width>[0-9]+) link\)",
         "a link on the path trained below what the device can do"),
    _sig("aer",
         r"AER: (?:Multiple )?(?P<severity>(?:Un)?[Cc]orrect(?:ed|able)(?: \((?:Non-)?Fatal\))?) "
         r"error (?:message )?received(?::| from) (?:(?P<device><BDF>)|id=)",
         "a PCIe Advanced Error Reporting message"),
    _sig("aer-bus-error", r"PCIe Bus Error: severity=(?P<severity>[^,]+), type=(?P<detail>[^,]+)",
         "the severity and layer of an AER error, printed by (or for) the device that logged it"),
    _sig("aer-status",
         r"device \[(?P<pci_id>[0-9a-fA-F]{4}:[0-9a-fA-F]{4})\] error status/mask="
         r"(?P<detail>[0-9a-fA-F]{8}/[0-9a-fA-F]{8})",
         "that device's vendor:device id and its AER status and mask registers"),
    _sig("aer-recovery", r"AER: [Dd]evice recovery (?P<detail>failed|successful)",
         "the outcome of the kernel's recovery (reset) after an uncorrectable error"),
    _sig("aer-no-recovery", r"AER: can't recover \(no error_detected callback\)",
         "the device's driver has no PCIe error handler, so the device cannot be recovered"),
    _sig("aer-no-recovery", r"device has no AER-aware driver",
         "the device's driver has no PCIe error handler (older kernels)"),
    _sig("pcie-dpc",
         r"DPC:? containment event, status:(?P<detail>0x[0-9a-fA-F]+)(?:,? \w+ received from (?P<device><BDF>))?",
         "downstream port containment took a PCIe link down"),
    _sig("pcie-link-down", r"pciehp: Slot\((?P<detail>[^)]*)\): Link Down\s*$",
         "the hot-plug port saw the link to its device go down"),
    _sig("pcie-card-removed", r"pciehp: Slot\((?P<detail>[^)]*)\): Card not present",
         "the hot-plug port no longer sees a device in its slot (surprise removal)"),
    _sig("ghes",
         r"^(?:\{[0-9]+\})?\[Hardware Error\]: Hardware error from APEI Generic Hardware Error Source",
         "a hardware error record reported by the platform firmware"),
    _sig("ghes", r"^(?:\{[0-9]+\})?\[Hardware Error\]:\s+event severity: (?P<severity>\w+)",
         "that record's severity", role=_MORE),
    _sig("ghes", r"^(?:\{[0-9]+\})?\[Hardware Error\]:\s+section_type: (?P<detail>.+)",
         "that record's section type", role=_MORE),
    _sig("ghes", r"^(?:\{[0-9]+\})?\[Hardware Error\]:\s+device_id: (?P<device><BDF>)",
         "the PCI device of that record", role=_MORE),
    _sig("mce", r"^mce: \[Hardware Error\]: (?P<detail>.+)",
         "a CPU machine check", role=_MORE),
    _sig("edac-ue", r"^(?P<driver>EDAC (?:\S+ )?MC[0-9]+): [0-9]+ UE (?P<detail>.*?) on (?P<device>\S+)",
         "an uncorrectable host memory error"),
    _sig("edac-ce", r"^(?P<driver>EDAC (?:\S+ )?MC[0-9]+): [0-9]+ CE (?P<detail>.*?) on (?P<device>\S+)",
         "a corrected host memory error"),
)


def _to_int(value: str) -> int:
    return int(value, 16) if value.lower().lstrip("-").startswith("0x") else int(value)


def typed(raw: dict[str, str]) -> dict[str, object]:
    """Convert matched text to field values; drop what the driver printed as unknown."""
    values: dict[str, object] = {}
    for name, text in raw.items():
        text = text.strip()
        if not text or text == "<unknown>":
            continue
        try:
            if name in _INT_FIELDS:
                values[name] = _to_int(text)
            elif name in _FLOAT_FIELDS:
                number = finite(text)
                if number is None:
                    continue
                values[name] = number
            else:
                values[name] = text
        except ValueError:
            continue  # pid='<unknown>': the driver did not know it either
    pcie = {k: values.pop(k) for k in list(values) if k in _PCIE_FIELDS}
    if pcie:
        pcie.setdefault("speed_gts", None)
        pcie.setdefault("capable_speed_gts", None)
        values["pcie"] = PcieLimit(**pcie)
    return values
