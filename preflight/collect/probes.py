"""Probe catalogue: what runs on a node, under which id, with which command.

A probe is one command whose stdout is saved verbatim in the bundle under its id. The ids
and commands marked in DESIGN.md are a contract; more may be added. Parsing happens on the
controller, so a node needs nothing but its own tools.

Commands are argv tuples. The few probes that must glob or loop (sysfs, per-interface
ethtool, dmesg with a journald fallback) are fixed ``sh -c`` scripts written here: no host
name, option or user input is ever pasted into them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from preflight.collect.nccl_probe import PROBE_ID as _NCCL_ID
from preflight.collect.nccl_probe import SCRIPT as _NCCL_SCRIPT

# Exit status the remote `timeout` uses when it had to stop the command.
TIMEOUT_EXIT = 124


@dataclass(frozen=True)
class Probe:
    id: str
    argv: tuple[str, ...]
    description: str
    tool: str  # the program whose absence means "tool-missing"
    timeout_s: float | None = None  # None: the run's --timeout
    active: bool = False  # loads the node (a benchmark); `run --quick` leaves its checks out

    def with_args(self, *args: str, timeout_s: float | None) -> "Probe":
        """A copy whose argv ends with ``args``: for ``sh -c SCRIPT sh ARG...`` probes the
        options reach the script as positional parameters, never pasted into its text."""
        return replace(self, argv=self.argv + tuple(args), timeout_s=timeout_s)

    def shell_command(self, timeout_s: float) -> str:
        """The command line sent to the node's shell: argv quoted, bounded by `timeout`.

        The remote `timeout` kills the command on the node itself when it overruns, so a
        hung tool does not linger after we give up on it; `-k` follows up with SIGKILL for
        tools that ignore SIGTERM (nvidia-smi stuck in the driver does).
        """
        limit = f"{timeout_s:g}"
        return shlex.join(["timeout", "-k", "5", limit, *self.argv])


def _sh(script: str) -> tuple[str, ...]:
    return ("sh", "-c", script)


_IB = "/sys/class/infiniband"
_IB_SYSFS = (
    f"grep -Hs . {_IB}/*/fw_ver {_IB}/*/board_id {_IB}/*/hca_type {_IB}/*/node_desc "
    f"{_IB}/*/ports/*/state {_IB}/*/ports/*/phys_state {_IB}/*/ports/*/rate "
    f"{_IB}/*/ports/*/link_layer; true"
)
# Every netdev bound to mlx5_core, each block headed so the parser can split them.
_ETHTOOL = (
    "command -v ethtool >/dev/null || exit 127; "
    "for d in /sys/class/net/*; do "
    'drv=$(readlink "$d/device/driver" 2>/dev/null) || continue; '
    '[ "${drv##*/}" = mlx5_core ] || continue; '
    'echo "== ${d##*/} =="; ethtool -i "${d##*/}"; '
    "done; true"
)
# dmesg may be restricted to root (kernel.dmesg_restrict); journald keeps the same lines.
_KERNEL_LOG = (
    "dmesg 2>/dev/null || journalctl -k -b --no-pager -o short-monotonic 2>/dev/null "
    "|| { echo 'neither dmesg nor journalctl -k is readable' >&2; exit 126; }"
)

PROBES: dict[str, Probe] = {
    p.id: p
    for p in [
        Probe("nvidia-smi-q-x", ("nvidia-smi", "-q", "-x"), "GPU inventory and health (XML)", "nvidia-smi"),
        Probe("nvidia-smi-q", ("nvidia-smi", "-q"), "GPU inventory and health (text)", "nvidia-smi"),
        Probe("nvidia-smi-topo", ("nvidia-smi", "topo", "-m"), "GPU/NIC topology matrix", "nvidia-smi"),
        Probe("nvidia-smi-nvlink-status", ("nvidia-smi", "nvlink", "--status"), "NVLink links and speeds", "nvidia-smi"),
        Probe("nvidia-smi-nvlink-errors", ("nvidia-smi", "nvlink", "-e"), "NVLink error counters", "nvidia-smi"),
        Probe("ibv-devinfo", ("ibv_devinfo", "-v"), "RDMA devices and ports (verbs)", "ibv_devinfo"),
        Probe("ibstat", ("ibstat",), "InfiniBand port state and rate", "ibstat"),
        Probe("mlx5-modinfo", ("modinfo", "mlx5_core"), "mlx5 driver module identity", "modinfo"),
        Probe("ofed-info", ("ofed_info", "-s"), "MLNX_OFED / DOCA-OFED release", "ofed_info"),
        Probe("mlxfwmanager", ("mlxfwmanager", "--query"), "NIC firmware query (MFT)", "mlxfwmanager", timeout_s=120),
        Probe("ib-sysfs", _sh(_IB_SYSFS), "RDMA firmware and port state from sysfs", "sh"),
        Probe("ethtool-i", _sh(_ETHTOOL), "mlx5 netdev driver and firmware versions", "ethtool"),
        Probe("kernel-log", _sh(_KERNEL_LOG), "kernel ring buffer (XID, mlx5, PCIe)", "dmesg"),
        Probe("lspci", ("lspci", "-vvv"), "PCIe link capability and status", "lspci"),
        Probe("uname", ("uname", "-a"), "kernel release (the inbox mlx5 driver's version)", "uname"),
        # Arguments (repetitions, sizes, timeouts) are appended per run: nccl_probe.with_options.
        Probe(_NCCL_ID, _sh(_NCCL_SCRIPT) + ("sh",), "nccl-tests all_reduce_perf, repeated (active)",
              "all_reduce_perf", active=True),
    ]
}


def get(probe_id: str) -> Probe:
    return PROBES[probe_id]
