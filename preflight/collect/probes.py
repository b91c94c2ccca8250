"""Probe catalogue: what runs on a node, under which id, with which command.

A probe is one command whose stdout is saved verbatim in the bundle under its id. The ids
and commands listed in docs/contracts.md are a contract; more may be added. Parsing happens
on the controller, so a node needs nothing but its own tools.

The few probes that must glob or loop (sysfs, per-interface ethtool, dmesg with a journald
fallback) are fixed ``sh -c`` scripts in ``scripts/``: no host name, option or user input is
ever pasted into them. A parametrised probe lives in a module of its own (``nccl.py``).
"""

from __future__ import annotations

from preflight.collect import dcgm, nccl, scripts
from preflight.collect.probe import Probe

IB_COUNTERS, IB_COUNTERS_AFTER = "ib-counters", "ib-counters-after"


def _sh(script: str) -> tuple[str, ...]:
    return ("sh", "-c", script)


PROBES: dict[str, Probe] = {
    p.id: p
    for p in [
        Probe("nvidia-smi-q-x", ("nvidia-smi", "-q", "-x"), "GPU inventory and health (XML)", "nvidia-smi"),
        Probe("nvidia-smi-q", ("nvidia-smi", "-q"), "GPU inventory and health (text)", "nvidia-smi"),
        Probe("nvidia-smi-topo", ("nvidia-smi", "topo", "-m"), "GPU/NIC topology matrix", "nvidia-smi"),
        Probe("nvidia-smi-nvlink-status", ("nvidia-smi", "nvlink", "--status"), "NVLink links and speeds",
              "nvidia-smi"),
        Probe("nvidia-smi-nvlink-errors", ("nvidia-smi", "nvlink", "-e"), "NVLink error counters", "nvidia-smi"),
        Probe("ibv-devinfo", ("ibv_devinfo", "-v"), "RDMA devices and ports (verbs)", "ibv_devinfo"),
        Probe("ibstat", ("ibstat",), "InfiniBand port state and rate", "ibstat"),
        Probe("mlx5-modinfo", ("modinfo", "mlx5_core"), "mlx5 driver module identity", "modinfo"),
        Probe("ofed-info", ("ofed_info", "-s"), "MLNX_OFED / DOCA-OFED release", "ofed_info"),
        Probe("mlxfwmanager", ("mlxfwmanager", "--query"), "NIC firmware query (MFT)", "mlxfwmanager",
              timeout_factor=4.0),
        Probe("ib-sysfs", _sh(scripts.read("ib_sysfs.sh")), "RDMA firmware and port state from sysfs", "sh",
              calls=("grep",)),
        Probe("ethtool-i", _sh(scripts.read("ethtool_i.sh")), "mlx5 netdev driver and firmware versions", "ethtool",
              calls=("readlink",)),
        Probe("kernel-log", _sh(scripts.read("kernel_log.sh")), "kernel ring buffer (XID, mlx5, PCIe)", "dmesg",
              calls=("journalctl",)),
        Probe("lspci", ("lspci", "-vvv"), "PCIe link capability and status", "lspci"),
        Probe(IB_COUNTERS, _sh(scripts.read("ib_counters.sh")), "RDMA port error counters, before the active tests",
              "sh", calls=("grep",)),
        Probe("uname", ("uname", "-a"), "kernel release (the inbox mlx5 driver's version)", "uname"),
        # `preflight fabric --pair-tool iperf3`: the node's IPv4 interfaces are its rails on a TCP test bed.
        Probe("ip-addr", ("ip", "-o", "-4", "addr", "show"), "IPv4 interfaces and addresses (the TCP rails)", "ip"),
        dcgm.DISCOVERY,
        dcgm.HEALTH,
        # Active probes run after the static ones, one at a time, in this order: the diagnostic
        # first, so a GPU it fails is named before all_reduce loads every GPU.
        dcgm.PROBE,  # parametrised: the run's DcgmOptions (--dcgm-level) become its arguments
        nccl.PROBE,  # parametrised: the run's NcclOptions become its arguments
        # The same reading once the active probes are done: the error counters' growth under load.
        Probe(IB_COUNTERS_AFTER, _sh(scripts.read("ib_counters.sh")),
              "RDMA port error counters, after the active tests", "sh", calls=("grep",), after_active=True),
    ]
}


def get(probe_id: str) -> Probe:
    return PROBES[probe_id]
