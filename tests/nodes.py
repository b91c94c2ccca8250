"""Complete simulated HGX H200 nodes, healthy and faulty, for end-to-end runs over SSH.

``healthy_h200(name)`` is a ``SimHost`` (tests/simcluster.py) that answers every command line a
default ``preflight run`` sends (preflight/collect/probes.py, and the nccl probe's script in
preflight/collect/nccl.py) as one coherent HGX H200 node: 8 x H200 on driver 580.159.04 with the
NVSwitch fabric registered, NV18 between every GPU pair, 18 NVLinks per GPU at 26.562 GB/s with
zero error counters, 8 ConnectX-7 NDR 400G ports Active on DOCA 3.1.0 with the 28.46.1006
firmware that release ships (playbooks/nic_firmware.yaml, DOCA 3.1.0 row), GPUs and NICs at
PCIe Gen5 x16, a clean kernel log and an all_reduce_perf that reaches the 475 GB/s the hgx-h200
profile expects. The fault functions take such a node and return it with one fault seeded.

Every output is a real capture, or is derived from one by the edits its function's docstring
names (tests/derived.py holds the derivations shared with the unit tests):

- ``nvidia-smi -q -x`` / ``-q``: derived.h200_node_xml / h200_node_text (the real H200 VM
  capture repeated per GPU, fabric Completed/Success). ``nvidia-smi -L``: one line per GPU of
  that XML, in nvidia-smi's ``GPU n: NAME (UUID: ...)`` form.
- ``nvidia-smi topo -m``: the GPU rows of the real DGX H100 capture (corpus topo/dgx-h100-...).
- ``nvidia-smi nvlink --status``: derived.node_nvlink_status (real H200 block per GPU);
  ``nvidia-smi nvlink -e``: the real H100 zero-counter excerpt, every link written out.
- ``ibstat``, ``ibv_devinfo -v``, the ib-sysfs files, ``mlxfwmanager --query``: real ConnectX-7
  captures repeated per NIC with the firmware set to 28.46.1006.
- ``modinfo mlx5_core``, ``ofed_info -s``: the recorded MLNX_OFED modinfo and OFED-internal
  ofed_info with the DOCA 3.1.0 OFED version (as derived.doca_ofed_info does).
- ``dmesg``: the real kernel log of the H200 bundle (tests/fixtures/h200-device); ``uname -a``:
  the real uname of that machine.
- ``lspci -vvv``: the real ConnectX-7 Gen5 x16 LnkCap/LnkSta lines under each device's line.
- ``all_reduce_perf``: the real 8-GPU A100 table scaled to H200 bandwidth, in the layout the real
  H200 run printed (``nccl_table``).

- ``dcgmi diag -r 1 -j`` / ``dcgmi discovery -l``: the real DCGM 4.1.1 level-1 table and the
  discovery listing of an 8-GPU node (corpus dcgm/v100-*: V100s; no check reads the model from
  them). dcgmi prints the table where the probe asks for JSON: the parser tells them apart.
- ``dcgmi health -s a`` / ``dcgmi health -c -j``: the real "set successfully" line and Healthy
  report of NVIDIA/DCGM issue 263 (tests/fixtures/recorded).
- the ib-counters files (``ports/1/counters/*`` of each NIC): the real mlx5 capture of
  corpus ibcounters/mlx5-sysfs-counters-saturated-...-gpud943.txt with its three saturated
  counters at 0, as they read after a clear (``ib_counters_cleared``; constructed, named here).

Not modelled: the ethtool-i probe prints nothing, as on an InfiniBand-only node: it lists
netdevs bound to mlx5_core through /sys/class/net/*/device/driver symlinks, which SimHost's
sysfs files cannot make. ethtool itself is installed (a shim answering ``ethtool --version``
with Ubuntu 24.04's 6.7, the real H200 machine's OS per its probe.log), so the probe runs and
finds no such netdev; the driver is read from modinfo and ofed_info instead.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from derived import (
    CORPUS,
    DOCA31_OFED,
    MLX5_CMD_TIMEOUT_DMESG,
    RECORDED,
    cuda_of,
    doca_ofed_info,
    h200_node_text,
    h200_node_xml,
    node_ibstat,
    node_nvlink_status,
    set_link,
    with_fabric,
    with_gpu_values,
)
from simcluster import Reply, SimHost

H200_BUNDLE = Path(__file__).parent / "fixtures" / "h200-device" / "bundle" / "hosts" / "vm"

# The command lines preflight sends (preflight/collect/probes.py; the nccl script's own calls).
SMI_X, SMI_Q, SMI_L = "nvidia-smi -q -x", "nvidia-smi -q", "nvidia-smi -L"
TOPO, NVLINK_S, NVLINK_E = "nvidia-smi topo -m", "nvidia-smi nvlink --status", "nvidia-smi nvlink -e"
IBV, IBSTAT, MODINFO, OFED = "ibv_devinfo -v", "ibstat", "modinfo mlx5_core", "ofed_info -s"
MLXFW, DMESG, LSPCI, UNAME = "mlxfwmanager --query", "dmesg", "lspci -vvv", "uname -a"
ETHTOOL = "ethtool --version"

# DOCA 3.1.0 ships ConnectX-7 firmware 28.46.1006 (playbooks/nic_firmware.yaml).
CX7_FW = "28.46.1006"
NICS = 8
# A NIC next to each GPU, behind the same PCIe switch (the GPU's bus minus one); only distinct
# and well-formed, like derived.py's GPU bus ids.
NIC_BUSES = ["17", "29", "39", "5c", "99", "aa", "b9", "da"]


def all_reduce_command(max_bytes: int = 8 << 30) -> str:
    """The line the nccl probe runs all_reduce_perf with on 8 GPUs (preflight/collect/nccl.py SCRIPT)."""
    return f"all_reduce_perf -b 8 -e {max_bytes} -f 2 -g 8 -c 1 -n 20"


# ---------------------------------------------------------------------------------- GPUs


def gpu_buses(xml: str) -> list[str]:
    """'00000000:18:00.0' per GPU, in the order nvidia-smi lists them."""
    return re.findall(r"<pci_bus_id>([^<]+)</pci_bus_id>", xml)


def smi_list(xml: str) -> str:
    """`nvidia-smi -L`: "GPU n: NAME (UUID: GPU-...)" per GPU of the XML (what the nccl probe counts)."""
    blocks = re.findall(r"<gpu id=.*?</gpu>", xml, re.DOTALL)
    return "".join(f"GPU {i}: {re.search(r'<product_name>([^<]*)<', b).group(1)} "
                   f"(UUID: {re.search(r'<uuid>([^<]*)<', b).group(1)})\n" for i, b in enumerate(blocks))


DGX_H100_TOPO = CORPUS / "topo" / "dgx-h100-8gpu-12nic-nv18-drv580-truncated-by-report.txt"
# Of the capture's 12 NIC columns, the one PXB NIC per GPU (the compute NICs; NIC1/2 and NIC7/8
# are the dual-port storage cards of a DGX H100).
_COMPUTE_NIC_COLUMNS = [0, 3, 4, 5, 6, 9, 10, 11]


def node_topo(gpus: int = 8, pairs: dict[tuple[int, int], str] | None = None) -> str:
    """`nvidia-smi topo -m` of the node: the real DGX H100 GPU rows (NV18 pairs, one PXB NIC
    per GPU, NUMA 0/1 halves) restricted to the 8 compute NIC columns, renamed NIC0..7 and
    named mlx5_0..7 in a NIC Legend; the header with the ANSI underline and the Legend as the
    real H200 capture (driver 580) prints them. The capture lacks NIC rows 6-11: NIC rows are
    the transpose of the GPU cells, NIC-NIC cells NODE within a NUMA node and SYS across, as the
    capture's NIC0-5 rows show. ``gpus`` < 8 drops the last GPUs (one fell off the bus);
    ``pairs`` sets GPU-pair cells ({(2, 5): "NV17"}, both directions)."""
    rows = [line.split("\t") for line in DGX_H100_TOPO.read_text().splitlines() if line.startswith("GPU")]
    cells = {}
    numa = {}
    for row in rows[:gpus]:
        g = int(row[0][3:])
        cells[g] = [row[1 + k] for k in range(gpus)] + [row[9 + c] for c in _COMPUTE_NIC_COLUMNS]
        numa[g] = row[21:]  # CPU affinity, NUMA affinity, "", GPU NUMA ID
    for (a, b), value in (pairs or {}).items():
        cells[a][b] = cells[b][a] = value
    nic_numa = [int(numa[min(n, gpus - 1)][1]) for n in range(NICS)]
    header = [f"GPU{g}" for g in range(gpus)] + [f"NIC{n}" for n in range(NICS)]
    out = ["\t\x1b[4m" + "\t".join(header + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]
    out += [f"GPU{g}\t" + "\t".join(cells[g] + numa[g]) for g in range(gpus)]
    for n in range(NICS):
        to_gpus = [cells[g][gpus + n] for g in range(gpus)]
        to_nics = [" X " if m == n else ("NODE" if nic_numa[m] == nic_numa[n] else "SYS") for m in range(NICS)]
        out.append(f"NIC{n}\t" + "\t".join(to_gpus + to_nics + ["", "", "", ""]))
    legend = (CORPUS / "h200-vm" / "topo.txt").read_text().split("\n\n", 1)[1]
    nic_legend = "NIC Legend:\n\n" + "".join(f"  NIC{n}: mlx5_{n}\n" for n in range(NICS))
    return "\n".join(out) + "\n\n" + legend.rstrip("\n") + "\n\n" + nic_legend + "\n"


H100_NVLINK_E = CORPUS / "nvlink" / "h100-nvlink-e-error-counters-zero-excerpt.txt"


def node_nvlink_errors(xml: str) -> str:
    """`nvidia-smi nvlink -e`: the real H100 zero-counter excerpt, whose author elided links
    2-16 with "[...]", written out for all 18 links in its own form, under a header per GPU of
    the XML (the `nvidia-smi -L` line, the same "GPU n: NAME (UUID: ...)" form)."""
    link0 = re.search(r"(?m)(^ +Link 0: .*\n)+", H100_NVLINK_E.read_text()).group(0)
    links = "\n".join(link0.replace("Link 0:", f"Link {k}:") for k in range(18))
    return "".join(f"{head}\n{links}" for head in smi_list(xml).splitlines())


# ---------------------------------------------------------------------------------- NICs

def nic_ibstat(firmware: str = CX7_FW, odd: dict[int, str] | None = None, polling: tuple[int, ...] = ()) -> str:
    """`ibstat` of 8 ConnectX-7 NDR ports: the complete first CA of the real capture (MT4129,
    Active/LinkUp, Rate 400, InfiniBand) per NIC, GUIDs and LIDs made distinct, the firmware
    set. A Polling port takes the real Down port values derived.cx8_ibstat uses (State Down,
    Rate 10, Base lid 65535, SM lid 0) with Physical state Polling."""
    return node_ibstat(NICS, firmware, odd, polling)


CX7_DEVINFO = CORPUS / "ibv" / "ibv-devinfo-cx7-ndr-port-down-lid65535.txt"
SPARK_PORT_LINES = RECORDED / "ibv-devinfo-v-port-lines-cx7-dgx-spark.txt"


def nic_devinfo(firmware: str = CX7_FW, odd: dict[int, str] | None = None, polling: tuple[int, ...] = ()) -> str:
    """`ibv_devinfo -v` of the same 8 NICs: the real CX-7 NDR block (corpus ibv-devinfo-cx7-ndr-...,
    whose mlx5_0 port is down) with the port brought up as ibstat shows it (PORT_ACTIVE (4), the
    port and SM lids of the ibstat capture) and the -v port lines of the recorded DGX Spark
    excerpt (phys_state, active_width, active_speed) set to NDR 4X: 4X (2), 100.0 Gbps (128).
    -v's many device attributes (max_qp, ...) are left out: no capture holds them and no check
    reads them. A Polling port keeps the real capture's down values (PORT_DOWN (1), lid 65535,
    SM lid 0) with phys_state POLLING (2) at 4X SDR, the Rate 10 ibstat shows for it."""
    block = CX7_DEVINFO.read_text().split("\nhca_id: mlx5_1")[0].rstrip("\n") + "\n"
    indent = "\n" + re.search(r"\n( +)state:", block).group(1)
    spark = dict(line.split(":", 1) for line in SPARK_PORT_LINES.read_text().splitlines())
    out = []
    for i in range(NICS):
        down = i in polling
        width, speed = ("4X (2)", "2.5 Gbps (1)") if down else ("4X (2)", spark["active_speed"].strip())
        phys = "POLLING (2)" if down else spark["phys_state"].strip()
        b = (block.replace("hca_id: mlx5_0", f"hca_id: mlx5_{i}").replace("28.39.2048", (odd or {}).get(i, firmware))
             .replace("58a2:e103:002a:09b8", f"58a2:e103:002a:{i:04x}"))
        if not down:
            b = (b.replace("PORT_DOWN (1)", "PORT_ACTIVE (4)").replace("sm_lid:                 0",
                                                                      "sm_lid:                 1165")
                 .replace("port_lid:               65535", f"port_lid:               {975 + i}"))
        b = b.replace(f"{indent}max_mtu:", f"{indent}phys_state:             {phys}{indent}max_mtu:", 1)
        b = b.replace(f"{indent}link_layer:", f"{indent}active_width:           {width}"
                                              f"{indent}active_speed:           {speed}{indent}link_layer:", 1)
        out.append(b)
    return "\n".join(out)


def nic_sysfs(name: str, firmware: str = CX7_FW, odd: dict[int, str] | None = None,
              polling: tuple[int, ...] = ()) -> dict[str, str]:
    """/sys/class/infiniband files of the same NICs, as the kernel prints them: fw_ver, board_id
    (the PSID of the real CX-7 captures), hca_type, node_desc ("<host> <device>", rdma-ndd's
    form), ports/1/{state,phys_state,rate,link_layer} ("4: ACTIVE", "5: LinkUp",
    "400 Gb/sec (4X NDR)", "InfiniBand"; a Polling port "1: DOWN", "2: Polling", "10 Gb/sec (4X)")."""
    files = {}
    for i in range(NICS):
        d = f"infiniband/mlx5_{i}"
        down = i in polling
        files.update({
            f"{d}/fw_ver": (odd or {}).get(i, firmware) + "\n", f"{d}/board_id": "MT_0000000838\n",
            f"{d}/hca_type": "MT4129\n", f"{d}/node_desc": f"{name} mlx5_{i}\n",
            f"{d}/ports/1/state": "1: DOWN\n" if down else "4: ACTIVE\n",
            f"{d}/ports/1/phys_state": "2: Polling\n" if down else "5: LinkUp\n",
            f"{d}/ports/1/rate": "10 Gb/sec (4X)\n" if down else "400 Gb/sec (4X NDR)\n",
            f"{d}/ports/1/link_layer": "InfiniBand\n",
        })
    return files


MLXFW_CX7 = RECORDED / "mlxfwmanager-query-cx7-device13-fw28.44.1036-no-matching-image.txt"


def nic_mlxfwmanager(firmware: str = CX7_FW, odd: dict[int, str] | None = None) -> str:
    """`mlxfwmanager --query`: the recorded CX-7 device block once per NIC (Device #1..8,
    /dev/mst/mt4129_pciconf0..7, distinct base MACs), firmware set. Its part number and
    description are the capture's (a dual-port HHHL card, where HGX nodes carry single-port
    OSFP NICs); no check reads them."""
    block = MLXFW_CX7.read_text()
    return "\n".join(
        block.replace("Device #13:", f"Device #{i + 1}:").replace("mt4129_pciconf0", f"mt4129_pciconf{i}")
        .replace("605e65fd5b72", f"605e65fd5b{0x72 + i:02x}").replace("28.44.1036", (odd or {}).get(i, firmware))
        for i in range(NICS))


MODINFO_OFED = RECORDED / "modinfo-mlx5_core-mlnx-ofed-24.10-2.1.8-debian12.txt"
KERNEL = "6.18.44-fc-v657-gpu"  # the real H200 machine's kernel (its kernel log and uname)


def nic_modinfo(ofed: str = DOCA31_OFED) -> str:
    """`modinfo mlx5_core` of DOCA-OFED: the recorded MLNX_OFED module (/updates/dkms/, version
    24.10-2.1.8) with the version DOCA's mlx5_core reports (its OFED release, as derived.py
    documents) and the node's kernel release in the path and vermagic."""
    return MODINFO_OFED.read_text().replace("24.10-2.1.8", ofed).replace("6.1.0-31-amd64", KERNEL)


def _uname(name: str) -> str:
    line = next(line for line in (CORPUS / "h200-vm" / "probe.log").read_text().splitlines()
                if line.startswith("Linux vm "))
    return line.replace("Linux vm ", f"Linux {name} ", 1) + "\n"


# ---------------------------------------------------------------------------------- lspci

CX7_LNK = (CORPUS / "lspci" / "cx7-gen5-x16-lnkcap-lnksta-ok-grep.txt").read_text()


def node_lspci(gpus: list[str], slow: dict[str, str] | None = None) -> str:
    """`lspci -vvv` reduced to what it says of the links: per GPU and NIC its device line and
    the real CX-7 LnkCap/LnkSta/LnkCap2/LnkSta2 lines (Gen5 x16, "(ok)"); H200 SXM and CX-7
    are both Gen5 x16 devices. GPUs appear as "Device 2335" (lspci without the id in its
    pci.ids), the NICs under pci.ids' ConnectX-7 name in InfiniBand mode. ``slow`` maps a GPU
    bus id to the LnkSta line it trained at instead."""
    blocks = []
    for bus in gpus:
        bdf = bus[4:].lower()  # 00000000:18:00.0 -> 0000:18:00.0
        lnk = CX7_LNK if bus not in (slow or {}) else re.sub(r"LnkSta: .*", slow[bus], CX7_LNK, count=1)
        blocks.append(f"{bdf} 3D controller: NVIDIA Corporation Device 2335 (rev a1)\n{lnk}")
    for nic in NIC_BUSES:
        blocks.append(f"0000:{nic}:00.0 Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n"
                      + CX7_LNK)
    return "\n".join(blocks)


# ---------------------------------------------------------------------------------- nccl

H200_NCCL = H200_BUNDLE / "nccl-all-reduce.txt"
A100_8GPU = CORPUS / "nccl-tests" / "a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt"
# 475 GB/s: the hgx-h200 profile's all_reduce figure (8 x H200, NVIDIA/nccl-tests#272); 235.26
# GB/s: the A100 capture's busbw at 8 GiB. Times shrink and bandwidths grow by this factor.
H200_SCALE = 475 / 235.26


def nccl_table(host: str, buses: list[str], scale: float = H200_SCALE) -> str:
    """One all_reduce_perf run on the node's 8 GPUs.

    The layout is the real run on the H200 (the first repetition of the H200 bundle's
    nccl-all-reduce.txt: nccl-tests 2.19.6, NCCL 2.28.9, root and #wrong columns, validation on),
    the GPU count and rank lines set to 8 GPUs on this host's bus ids. The figures are the real
    8-GPU all_reduce of the A100 capture (the corpus has no 8-GPU Hopper table), row by row for
    the same sizes: times divided and algbw/busbw multiplied by ``scale``, which by default
    makes the 8 GiB busbw the profile's 475 GB/s. Small messages get the same factor, so their
    latencies are shorter than a real run's; no check judges sizes below 1 GiB. ``scale=1`` keeps
    the A100's own figures: 235 GB/s, half of what an H200 board should do."""
    run = H200_NCCL.read_text().split("# preflight: repetition 1")[0]
    run = "\n".join(line for line in run.splitlines() if not line.startswith("# preflight:")) + "\n"
    a100 = {int(t[0]): t for line in A100_8GPU.read_text().splitlines()
            if (t := line.split()) and t[0].isdigit() and len(t) == 12}
    run = run.replace("nGpus 1 ", f"nGpus {len(buses)} ")
    rank = re.search(r"^#  Rank  0 .*\n", run, re.MULTILINE).group(0)
    ranks = "".join(_rank_line(rank, i, host, bus) for i, bus in enumerate(buses))
    run = run.replace(rank, ranks)
    busbws = []
    lines = []
    for line in run.splitlines():
        tokens = line.split()
        if tokens and tokens[0].isdigit() and len(tokens) == 13:
            row = a100[int(tokens[0])]
            new = tokens[:5] + [_time(float(row[4]) / scale), _bw(float(row[5]) * scale), _bw(float(row[6]) * scale),
                                "0", _time(float(row[8]) / scale), _bw(float(row[9]) * scale),
                                _bw(float(row[10]) * scale), "0"]
            busbws += [float(row[6]) * scale, float(row[10]) * scale]
            line = _aligned(line, new)
        lines.append(line)
    run = "\n".join(lines) + "\n"
    return re.sub(r"# Avg bus bandwidth    : \S+", f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f}", run)


def _rank_line(template: str, i: int, host: str, bus: str) -> str:
    line = template.replace("device  0 ", f"device {i:2d} ").replace("[0000:00:06]", f"[{bus[4:-2].lower()}]")
    line = line.replace("Rank  0 ", f"Rank {i:2d} ")
    return re.sub(r"on +vm ", lambda m: f"on {host.rjust(len(m.group(0)) - 4)} ", line)


# nccl-tests' number forms as the two captures print them: two decimals, whole microseconds
# from 10 ms on (the A100 capture), one decimal for bandwidths from 1000 GB/s on (the H200 one).
def _time(us: float) -> str:
    return f"{us:.0f}" if us >= 10000 else f"{us:.2f}"


def _bw(gbs: float) -> str:
    return f"{gbs:.1f}" if gbs >= 1000 else f"{gbs:.2f}"


def _aligned(line: str, tokens: list[str]) -> str:
    """``line`` with its whitespace-separated fields replaced, each right-aligned where the old one ended."""
    fields = re.findall(r"\s*\S+", line)
    return "".join(new.rjust(len(old)) for old, new in zip(fields, tokens, strict=True))


# ---------------------------------------------------------------------------------- the node

def _kernel_log() -> str:
    return (H200_BUNDLE / "kernel-log.txt").read_text()


def healthy_h200(name: str, nccl_max_bytes: int = 8 << 30) -> SimHost:
    """A healthy 8-GPU HGX H200 node answering every probe of a default `preflight run` (with
    ``--nccl-max-bytes`` equal to ``nccl_max_bytes``)."""
    xml = h200_node_xml(8)
    buses = gpu_buses(xml)
    commands = {
        SMI_X: xml, SMI_Q: h200_node_text(8), SMI_L: smi_list(xml),
        TOPO: node_topo(8), NVLINK_S: node_nvlink_status(8), NVLINK_E: node_nvlink_errors(xml),
        IBV: nic_devinfo(), IBSTAT: nic_ibstat(), MLXFW: nic_mlxfwmanager(),
        MODINFO: nic_modinfo(), OFED: doca_ofed_info(),
        DMESG: _kernel_log(), LSPCI: node_lspci(buses), UNAME: _uname(name), ETHTOOL: "ethtool version 6.7\n",
        all_reduce_command(nccl_max_bytes): nccl_table(name, buses),
        DCGM_DIAG: DCGM_PASS_R1.read_text(), DCGM_DISCOVERY: DCGM_DISCOVERY_8.read_text(),
        DCGM_HEALTH_SET: DCGM_HEALTH_SET_OK.read_text(), DCGM_HEALTH_CHECK: DCGM_HEALTHY.read_text(),
    }
    return SimHost(name, {line: Reply(text) for line, text in commands.items()},
                   sysfs={**nic_sysfs(name), **nic_counters()})


# DCGM (issue 16): what the dcgmi-diag probe's script runs at the default level, and discovery.
DCGM_DIAG, DCGM_DISCOVERY = "dcgmi diag -r 1 -j", "dcgmi discovery -l"
DCGM_PASS_R1 = CORPUS / "dcgm" / "v100-dcgm4.1.1-drv570-diag-deployment-pass.txt"
DCGM_DISCOVERY_8 = CORPUS / "dcgm" / "v100-dcgmi-discovery-l-8gpus-0cpus.txt"
# The two commands of the dcgmi-health probe, and what a healthy node answers (NVIDIA/DCGM issue 263).
DCGM_HEALTH_SET, DCGM_HEALTH_CHECK = "dcgmi health -s a", "dcgmi health -c -j"
_RECORDED = Path(__file__).parent / "fixtures" / "recorded"
DCGM_HEALTH_SET_OK = _RECORDED / "dcgmi-health-s-a-set-successfully-dcgm-263.txt"
DCGM_HEALTHY = _RECORDED / "dcgmi-health-c-j-healthy-gpu-recovery-reset-pending-dcgm-263.txt"
IB_COUNTERS_CAPTURE = CORPUS / "ibcounters" / "mlx5-sysfs-counters-saturated-link-downed-xmit-discards-gpud943.txt"
CLEARED = ("link_downed", "port_xmit_discards", "excessive_buffer_overrun_errors")


def ib_counters_cleared() -> dict[str, str]:
    """counter name -> value of the real mlx5 capture, its saturated counters at 0 (as after a clear)."""
    values = {}
    for line in IB_COUNTERS_CAPTURE.read_text().splitlines():
        path, _, value = line.rpartition(":")
        name = path.rsplit("/", 1)[-1]
        values[name] = "0" if name in CLEARED else value
    return values


def nic_counters(values: dict[int, dict[str, str]] | None = None) -> dict[str, str]:
    """/sys/class/infiniband/mlx5_N/ports/1/counters/* of every NIC (``values``: NIC -> counters
    that differ from ib_counters_cleared)."""
    base = ib_counters_cleared()
    return {f"infiniband/mlx5_{i}/ports/1/counters/{name}": f"{(values or {}).get(i, {}).get(name, v)}\n"
            for i in range(NICS) for name, v in base.items()}


# Where each recorded output of healthy_h200 comes from (examples/build_examples.py writes it to
# the example's SOURCES.tsv); the functions' docstrings say how it was derived.
_FIX = "tests/fixtures/"
ORIGIN = {
    SMI_X: f"tests/derived.py h200_node_xml(8) from {_FIX}corpus/h200-vm/smi-q.xml",
    SMI_Q: f"tests/derived.py h200_node_text(8) from {_FIX}corpus/h200-vm/smi-q.txt",
    SMI_L: f"tests/nodes.py smi_list() from the GPUs of {_FIX}corpus/h200-vm/smi-q.xml as derived",
    TOPO: f"tests/nodes.py node_topo() from {_FIX}corpus/topo/dgx-h100-8gpu-12nic-nv18-drv580-truncated-by-report.txt"
          f" and {_FIX}corpus/h200-vm/topo.txt",
    NVLINK_S: f"tests/derived.py node_nvlink_status(8) from {_FIX}corpus/nvlink/h200-1gpu-drv590-nvlink-s.txt",
    NVLINK_E: f"tests/nodes.py node_nvlink_errors() from {_FIX}corpus/nvlink/h100-nvlink-e-error-counters-zero-excerpt.txt",
    IBV: f"tests/nodes.py nic_devinfo() from {_FIX}corpus/ibv/ibv-devinfo-cx7-ndr-port-down-lid65535.txt and "
         f"{_FIX}recorded/ibv-devinfo-v-port-lines-cx7-dgx-spark.txt",
    IBSTAT: f"tests/nodes.py nic_ibstat() from {_FIX}corpus/ibv/ibstat-cx7-ndr-400g-active-ib.txt",
    MLXFW: f"tests/nodes.py nic_mlxfwmanager() from {_FIX}recorded/mlxfwmanager-query-cx7-device13-fw28.44.1036-no-matching-image.txt",
    MODINFO: f"tests/nodes.py nic_modinfo() from {_FIX}recorded/modinfo-mlx5_core-mlnx-ofed-24.10-2.1.8-debian12.txt",
    OFED: f"tests/derived.py doca_ofed_info() from {_FIX}recorded/ofed-info-s-ofed-internal-24.07-0.3.5.0.110.txt",
    DMESG: f"{_FIX}h200-device/bundle/hosts/vm/kernel-log.txt (real H200 kernel log)",
    LSPCI: f"tests/nodes.py node_lspci() from {_FIX}corpus/lspci/cx7-gen5-x16-lnkcap-lnksta-ok-grep.txt",
    UNAME: f"{_FIX}corpus/h200-vm/probe.log (uname -a, host name replaced)",
    ETHTOOL: "tests/nodes.py: ethtool installed, no netdev bound to mlx5_core (InfiniBand-only node)",
    DCGM_DIAG: f"{_FIX}corpus/dcgm/v100-dcgm4.1.1-drv570-diag-deployment-pass.txt",
    DCGM_DISCOVERY: f"{_FIX}corpus/dcgm/v100-dcgmi-discovery-l-8gpus-0cpus.txt",
    DCGM_HEALTH_SET: f"{_FIX}recorded/dcgmi-health-s-a-set-successfully-dcgm-263.txt",
    DCGM_HEALTH_CHECK: f"{_FIX}recorded/dcgmi-health-c-j-healthy-gpu-recovery-reset-pending-dcgm-263.txt",
    "sysfs": "tests/nodes.py nic_sysfs(): the ConnectX-7 values of ibstat, in the kernel's sysfs form",
    "all_reduce_perf": f"tests/nodes.py nccl_table() from {_FIX}corpus/nccl-tests/a100-sxm4-40gb-8gpu-allreduce-old-"
                       f"format-validation0.txt scaled to 475 GB/s, in the layout of "
                       f"{_FIX}h200-device/bundle/hosts/vm/nccl-all-reduce.txt",
}


# ---------------------------------------------------------------------------------- faults
# Each takes a node (healthy_h200's, or one already faulty) and returns it with one more fault.

def _text(node: SimHost, line: str) -> str:
    return node.commands[line].stdout


def _set(node: SimHost, changes: dict[str, str | Reply | list[Reply]]) -> SimHost:
    commands = dict(node.commands)
    for line, value in changes.items():
        commands[line] = Reply(value) if isinstance(value, str) else value
    return replace(node, commands=commands)


def _nccl_line(node: SimHost) -> str:
    return next(line for line in node.commands if line.startswith("all_reduce_perf "))


def _log_lines(node: SimHost, lines: str) -> SimHost:
    """Append kernel log lines to the node's dmesg."""
    return _set(node, {DMESG: _text(node, DMESG) + lines})


def _gpu_text(smi_text: str, gpu: int, edit) -> str:
    """``edit`` applied to the ``gpu``-th GPU section of text `nvidia-smi -q`."""
    parts = re.split(r"(?m)^(?=GPU [0-9A-Fa-f]{8}:)", smi_text)
    parts[gpu + 1] = edit(parts[gpu + 1])
    return "".join(parts)


def _nic_outputs(firmware: str = CX7_FW, odd: dict[int, str] | None = None,
                 polling: tuple[int, ...] = ()) -> dict[str, str]:
    return {IBSTAT: nic_ibstat(firmware, odd, polling), IBV: nic_devinfo(firmware, odd, polling),
            MLXFW: nic_mlxfwmanager(firmware, odd)}


def nic_firmware(node: SimHost, firmware: str, odd: dict[int, str] | None = None) -> SimHost:
    """Every ConnectX-7 on ``firmware`` (``odd``: NIC index -> another version), in every view
    (ibv_devinfo, ibstat, sysfs, mlxfwmanager). 28.45.1020 (what DOCA 3.0.0 ships) under the
    node's DOCA 3.1.0 is firmware older than the driver expects."""
    node = _set(node, _nic_outputs(firmware, odd))
    return replace(node, sysfs={**node.sysfs, **nic_sysfs(node.name, firmware, odd)})


def mlx5_timeouts(node: SimHost, nic: int = 0) -> SimHost:
    """mlx5 command timeouts in the kernel log (the field lesson's `mlx5_0: timeout`): the real
    ConnectX-7 lines of derived.MLX5_CMD_TIMEOUT_DMESG, at NIC ``nic``'s PCI address."""
    return _log_lines(node, MLX5_CMD_TIMEOUT_DMESG.replace("0000:56:00.0", f"0000:{NIC_BUSES[nic]}:00.0"))


def port_polling(node: SimHost, nic: int = 3) -> SimHost:
    """NIC ``nic``'s port Down/Polling (no link partner) in every view; firmware as before."""
    firmware = re.search(r"Firmware version: (\S+)", _text(node, IBSTAT)).group(1)
    node = _set(node, _nic_outputs(firmware, polling=(nic,)))
    return replace(node, sysfs={**node.sysfs, **nic_sysfs(node.name, firmware, polling=(nic,))})


# DOCA 3.2.0: OFED 25.10-1.2.8, ConnectX-7 firmware 28.47.1026 (playbooks/nic_firmware.yaml).
DOCA32_OFED, DOCA32_CX7_FW = "25.10-1.2.8", "28.47.1026"


def doca_upgraded(node: SimHost) -> SimHost:
    """The node moved to DOCA 3.2.0 with the firmware it ships: a matching pair on its own, but
    firmware (and driver) different from the rest of a DOCA 3.1.0 fleet."""
    node = nic_firmware(node, DOCA32_CX7_FW)
    return _set(node, {MODINFO: nic_modinfo(DOCA32_OFED), OFED: doca_ofed_info(DOCA32_OFED)})


def gpu_driver(node: SimHost, version: str = "570.195.03") -> SimHost:
    """The node on another GPU driver: the driver version in the XML and the text, with the CUDA
    version that driver prints (derived.cuda_of: 12.8 for R570; the edits derived.h200_node_xml /
    h200_node_text make for it), and in the kernel log's NVRM load line."""
    xml = re.sub(r"<driver_version>[^<]*<", f"<driver_version>{version}<", _text(node, SMI_X))
    text = re.sub(r"(Driver Version\s+: )\S+", rf"\g<1>{version}", _text(node, SMI_Q))
    if cuda_of(version):
        xml = re.sub(r"<cuda_version>[^<]*<", f"<cuda_version>{cuda_of(version)}<", xml)
        text = re.sub(r"(CUDA Version\s+: )\S+", rf"\g<1>{cuda_of(version)}", text)
    log = _text(node, DMESG).replace("x86_64  580.159.04  Release Build", f"x86_64  {version}  Release Build")
    return _set(node, {SMI_X: xml, SMI_Q: text, DMESG: log})


def nvlink_inactive(node: SimHost, gpu: int = 2, link: int = 5) -> SimHost:
    """One NVLink of GPU ``gpu`` `<inactive>` (derived.set_link), and in the topology every pair
    with that GPU at NV17: on an NVSwitch board each GPU reaches every peer over all its links,
    so one link down lowers all its pairs (preflight's reading; no capture shows it)."""
    status = set_link(_text(node, NVLINK_S), gpu, link, "<inactive>")
    pairs = {(gpu, other): "NV17" for other in range(8) if other != gpu}
    return _set(node, {NVLINK_S: status, TOPO: node_topo(8, pairs)})


def fabric_insufficient(node: SimHost) -> SimHost:
    """Fabric State Completed with Status "Insufficient Resources" on every GPU (the value
    Azure/azhpc-images#506 shows), in the XML and the text."""
    fields = {"Status": "Insufficient Resources"}
    return _set(node, {SMI_X: with_fabric(_text(node, SMI_X), **fields),
                       SMI_Q: with_fabric(_text(node, SMI_Q), **fields)})


def gpu_fallen_off_bus(node: SimHost, stamp: str = "[ 8127.332410] ") -> SimHost:
    """GPU7 fell off the bus: the Xid 79 line of docs/sources.md §5.1 (leptonai/gpud) at its PCI
    address in the kernel log, and the GPU gone from every nvidia-smi view (the driver lists 7:
    derived.h200_node_xml(7) drops the last GPU; topology and NVLink views likewise; these
    views are rebuilt, so apply this fault before others that edit them). all_reduce is not
    modelled here: the nccl probe now asks for 7 GPUs, which the node has no recording for, so
    each repetition fails (the shim exits 64)."""
    xml = h200_node_xml(7)
    lost = gpu_buses(h200_node_xml(8))[7][4:-2].lower()  # 0000:db:00
    node = _set(node, {SMI_X: xml, SMI_Q: h200_node_text(7), SMI_L: smi_list(xml), TOPO: node_topo(7),
                       NVLINK_S: node_nvlink_status(7), NVLINK_E: node_nvlink_errors(xml)})
    return _log_lines(node, f"{stamp}NVRM: Xid (PCI:{lost}): 79, pid='<unknown>', name=<unknown>, "
                            "GPU has fallen off the bus.\n")


A100_XID63 = CORPUS / "kernel-log" / "a100-xid63-row-remapper-pending.txt"


def row_remap_pending(node: SimHost, gpu: int = 5, stamp: str = "[ 6342.118023] ") -> SimHost:
    """GPU ``gpu`` with a row remap pending: the real Xid 63 line (corpus a100-xid63-...) at its
    PCI address with a dmesg timestamp, and Remapped Rows Pending: Yes with one row remapped for
    an uncorrectable error in the XML and the text."""
    xml = _text(node, SMI_X)
    bus = gpu_buses(xml)[gpu][4:-2].lower()
    xml = with_gpu_values(xml, gpu, {"remapped_row_pending": "Yes", "remapped_row_unc": "1"})

    def pending(section: str) -> str:
        section = re.sub(r"(?m)^(\s+Pending\s+: )No$", r"\g<1>Yes", section, count=1)
        return re.sub(r"(?m)^(\s+Uncorrectable Error\s+: )0$", r"\g<1>1", section, count=1)

    line = A100_XID63.read_text().strip().replace("PCI:0000:10:1c", f"PCI:{bus}")
    node = _set(node, {SMI_X: xml, SMI_Q: _gpu_text(_text(node, SMI_Q), gpu, pending)})
    return _log_lines(node, f"{stamp}{line}\n")


def pcie_gen4_x8(node: SimHost, gpu: int = 1) -> SimHost:
    """GPU ``gpu`` trained at Gen4 x8 while in P0: current link generation 4 and width 8x in
    the XML and text, and lspci's LnkSta "Speed 16GT/s (downgraded), Width x8 (downgraded)"
    (the form of the real downgraded capture, corpus lspci/quadro-...)."""
    xml = _text(node, SMI_X)
    buses = gpu_buses(xml)
    xml = with_gpu_values(xml, gpu, {"current_link_gen": "4", "device_current_link_gen": "4",
                                     "current_link_width": "8x"})

    def narrow(section: str) -> str:
        section = re.sub(r"(?m)^(\s+Current\s+: )5$", r"\g<1>4", section, count=1)
        section = re.sub(r"(?m)^(\s+Device Current\s+: )5$", r"\g<1>4", section, count=1)
        return re.sub(r"(?m)^(\s+Current\s+: )16x$", r"\g<1>8x", section, count=1)

    lspci = node_lspci(buses, {buses[gpu]: "LnkSta: Speed 16GT/s (downgraded), Width x8 (downgraded)"})
    return _set(node, {SMI_X: xml, SMI_Q: _gpu_text(_text(node, SMI_Q), gpu, narrow), LSPCI: lspci})


def nccl_flaky(node: SimHost, hang_s: float = 60) -> SimHost:
    """all_reduce_perf alternating between the node's good table and a hang: every other call
    sleeps ``hang_s`` (past the run's --nccl-timeout) before printing anything."""
    line = _nccl_line(node)
    good = node.commands[line]
    return _set(node, {line: [good, Reply("", sleep_s=hang_s)]})


def nccl_low_busbw(node: SimHost) -> SimHost:
    """all_reduce_perf at the real A100 figures (nccl_table with scale 1): 235 GB/s at 8 GiB,
    49.5% of the 475 GB/s an HGX H200 board should reach."""
    return _set(node, {_nccl_line(node): nccl_table(node.name, gpu_buses(_text(node, SMI_X)), scale=1)})
