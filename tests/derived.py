"""Node outputs derived from real captures, for fleets the corpus has no capture of.

The corpus holds single-GPU `nvidia-smi -q -x` captures only (h200-vm/smi-q.xml is a real
H200 VM, driver 580.159.04). An 8-GPU HGX H200 node prints the same `<gpu>` block once per
GPU; these helpers repeat the real block with distinct bus ids and UUIDs, and change the
driver version or the GPU count where a scenario needs it. Nothing else is invented.
"""

from __future__ import annotations

import re
from pathlib import Path

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
H200_XML = CORPUS / "h200-vm" / "smi-q.xml"

# SXM slots of an HGX H200 board as the driver lists them (bus ids differ per OEM; these are
# only distinct and well-formed).
_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]


# The capture is of a VM: its GPU is passed through ("Virtualization Mode: Pass-Through"). The
# HGX node these helpers make is bare metal, and prints "None" there, as the real bare-metal
# captures in the corpus do (smi-q/a100-sxm4-80gb-drv535-q-x-dtd-v12.txt, rtx4000-sff-ada-...);
# ``vm=True`` keeps the capture's own value.
_PASSTHROUGH_XML = "<virtualization_mode>Pass-Through</virtualization_mode>"
_PASSTHROUGH_TEXT = re.compile(r"(Virtualization Mode\s+: )Pass-Through")


# The CUDA version nvidia-smi prints is its driver's (the highest CUDA its libcuda runs, without a
# forward-compatibility package), so a node put on another driver prints that branch's: R570 runs
# up to CUDA 12.8 (CUDA 12.8 needs >= 570.26, 12.9 needs >= 575.51.03, 13.0 needs >= 580.65.06:
# the driver table of the CUDA Toolkit release notes, docs.nvidia.com/cuda/cuda-toolkit-release-notes),
# and a real 570.195.03 header reads "Driver Version: 570.195.03     CUDA Version: 12.8" (public
# nvidia-smi captures of that driver); R580, the captures' own driver 580.159.04, 13.0.
CUDA_OF_BRANCH = {"570": "12.8", "580": "13.0"}


def cuda_of(driver: str) -> str | None:
    """The CUDA version a driver of this branch prints; None for a branch not listed above."""
    return CUDA_OF_BRANCH.get(driver.split(".")[0])


def h200_node_xml(gpus: int = 8, driver: str | None = None, cuda: str | None = None,
                  fabric: bool = True, vm: bool = False) -> str:
    """The real H200 capture as an ``gpus``-GPU node. ``driver`` alone keeps the capture's CUDA
    13.0 (the unit tests' drift fixtures and their golden reports were made so); the shipped
    example's edit (nodes.gpu_driver) sets the driver's own, ``cuda_of``."""
    text = H200_XML.read_text()
    if not vm:
        text = text.replace(_PASSTHROUGH_XML, "<virtualization_mode>None</virtualization_mode>")
    head, rest = text.split("\t<gpu id=", 1)
    block, tail = ("\t<gpu id=" + rest).rsplit("</gpu>", 1)
    block += "</gpu>"
    blocks = []
    for i in range(gpus):
        bus = f"00000000:{_BUSES[i]}:00.0"
        b = block.replace("00000000:00:06.0", bus)
        b = re.sub(r"<minor_number>\d+<", f"<minor_number>{i}<", b)
        b = re.sub(r"GPU-88c58391-6001-919c-8431-20f011c2056\d", f"GPU-88c58391-6001-919c-8431-20f011c2{i:04d}", b)
        blocks.append(b)
    head = re.sub(r"<attached_gpus>\d+<", f"<attached_gpus>{gpus}<", head)
    if driver:
        head = re.sub(r"<driver_version>[^<]*<", f"<driver_version>{driver}<", head)
    if cuda:
        head = re.sub(r"<cuda_version>[^<]*<", f"<cuda_version>{cuda}<", head)
    xml = head + "\n".join(blocks) + tail
    return _hgx_fabric(xml, gpus) if fabric else xml


def _hgx_fabric(smi: str, gpus: int) -> str:
    # The VM capture has no NVSwitch fabric (its Fabric fields are N/A). On an HGX board with
    # Fabric Manager running every GPU reports State Completed, Status Success, CliqueId 0 and
    # a zero ClusterUUID (docs/sources.md §2: HGX H100, driver 565.57.01), so multi-GPU nodes get that.
    if gpus < 2:
        return smi
    return with_fabric(smi, State="Completed", Status="Success", CliqueId="0",
                       ClusterUUID="00000000-0000-0000-0000-000000000000")


H200_TEXT = CORPUS / "h200-vm" / "smi-q.txt"


def h200_node_text(gpus: int = 8, driver: str | None = None, vm: bool = False) -> str:
    """The text `nvidia-smi -q` of the same node: the real GPU section repeated per GPU."""
    text = H200_TEXT.read_text()
    if not vm:
        text = _PASSTHROUGH_TEXT.sub(r"\g<1>None", text)
    head, block = text.split("GPU 00000000:00:06.0", 1)
    block = "GPU 00000000:00:06.0" + block
    blocks = []
    for i in range(gpus):
        b = block.replace("00000000:00:06.0", f"00000000:{_BUSES[i]}:00.0")
        b = re.sub(r"GPU-88c58391-6001-919c-8431-20f011c2056\d", f"GPU-88c58391-6001-919c-8431-20f011c2{i:04d}", b)
        b = re.sub(r"(Minor Number\s+: )\d+", rf"\g<1>{i}", b)
        blocks.append(b.rstrip("\n") + "\n\n")
    head = re.sub(r"(Attached GPUs\s+: )\d+", rf"\g<1>{gpus}", head)
    if driver:
        head = re.sub(r"(Driver Version\s+: )\S+", rf"\g<1>{driver}", head)
    return _hgx_fabric(head + "".join(blocks), gpus)


# ---- NVLink and fabric views of an 8-GPU HGX node (checks/nvlink.py, checks/fabric.py) ----
# The corpus holds 1-GPU `nvidia-smi nvlink --status` captures only (H200 and H100, driver
# 590, 18 links at 26.562 GB/s, UUIDs masked as zeros by the capturing exporter). An 8-GPU
# node prints the same block once per GPU, headed "GPU n: NAME (UUID: ...)"; the UUIDs below
# are the ones h200_node_xml gives the same GPUs. Faults are single edits of that text.

H200_NVLINK = CORPUS / "nvlink" / "h200-1gpu-drv590-nvlink-s.txt"
H100_NVLINK = CORPUS / "nvlink" / "h100-1gpu-vm-drv590-nvlink-s.txt"
# What nvidia-smi printed for a GPU whose links had all failed: the title of
# NVIDIA/open-gpu-kernel-modules#1150 (driver 590.48.01, after Xid 145/149). That it takes the
# place of the link lines under the GPU header, as the MIG and no-NVLink messages do, is assumed.
ALL_LINKS_INACTIVE = "NVML:Unable to retrieve Nvlink information as all links are inActive"


def node_nvlink_status(gpus: int = 8, capture: Path = H200_NVLINK) -> str:
    """`nvidia-smi nvlink --status` of a `gpus`-GPU node: the real 1-GPU block repeated."""
    block = capture.read_text()
    return "".join(
        re.sub(r"^GPU 0: (.*?)\(UUID: [^)]*\)",
               rf"GPU {i}: \g<1>(UUID: GPU-88c58391-6001-919c-8431-20f011c2{i:04d})", block, count=1)
        for i in range(gpus))


def _gpu_blocks(status: str) -> list[str]:
    return re.split(r"(?m)^(?=GPU \d+:)", status)


def set_link(status: str, gpu: int, link: int, value: str | None) -> str:
    """Set GPU `gpu`'s "Link n:" value ("<inactive>", "13.281 GB/s"), or drop the line (None)."""
    blocks = _gpu_blocks(status)
    for i, block in enumerate(blocks):
        if block.startswith(f"GPU {gpu}:"):
            line = re.compile(rf"(?m)^(\s*Link {link}: ).*\n")
            blocks[i] = line.sub(lambda m: "" if value is None else f"{m.group(1)}{value}\n", block)
    return "".join(blocks)


def links_unretrievable(status: str, gpus) -> str:
    """Replace the link lines of the listed GPUs with NVML's all-links-inactive message."""
    blocks = _gpu_blocks(status)
    for i, block in enumerate(blocks):
        head = re.match(r"GPU (\d+):.*\n", block)
        if head and int(head.group(1)) in gpus:
            blocks[i] = head.group(0) + ALL_LINKS_INACTIVE + "\n"
    return "".join(blocks)


# A real H100 `nvidia-smi -q` (driver 590.48.01, one GPU of an HGX board passed to a VM) that
# shows the fabric as a registered HGX GPU does: State Completed, Status Success, CliqueId 0,
# ClusterUUID zeros (the same values thamada/nvidia-smi records for an HGX H100, docs/sources.md §2).
H100_TEXT = CORPUS / "smi-q" / "h100-80gb-hbm3-drv590-under-load.txt"


def h100_node_text(gpus: int = 8) -> str:
    """8-GPU HGX H100 text `nvidia-smi -q`: the real GPU section repeated, bus ids and UUIDs made distinct."""
    head, block = H100_TEXT.read_text().split("GPU 00000000:00:09.0", 1)
    block = "GPU 00000000:00:09.0" + block
    blocks = []
    for i in range(gpus):
        b = block.replace("00000000:00:09.0", f"00000000:{_BUSES[i]}:00.0")
        b = b.replace("GPU-00000000-0000-0000-0000-000000000000", f"GPU-88c58391-6001-919c-8431-20f011c2{i:04d}")
        b = re.sub(r"(Minor Number\s+: )\d+", rf"\g<1>{i}", b)
        blocks.append(b.rstrip("\n") + "\n\n")
    head = re.sub(r"(Attached GPUs\s+: )\d+", rf"\g<1>{gpus}", head)
    return head + "".join(blocks)


def with_fabric(smi: str, gpus=None, **fields: str) -> str:
    """Set Fabric fields of the listed GPU indices (all when None) in `nvidia-smi -q` text or
    `-q -x` XML. Fields by their text labels: State, Status, CliqueId, ClusterUUID, Summary."""
    xml = smi.lstrip().startswith("<?xml")
    tags = {"State": "state", "Status": "status", "CliqueId": "cliqueId", "ClusterUUID": "clusterUuid",
            "Summary": "summary"}
    parts = re.split(r"(?m)^(?=\s*<gpu id=)" if xml else r"(?m)^(?=GPU [0-9A-Fa-f]{8}:)", smi)
    for i, part in enumerate(parts[1:], start=1):
        if gpus is not None and i - 1 not in gpus:
            continue
        for label, value in fields.items():
            if xml:
                fabric = re.search(r"<fabric>.*?</fabric>", part, re.S)
                section = re.sub(rf"<{tags[label]}>[^<]*<", f"<{tags[label]}>{value}<", fabric.group(0), count=1)
                part = part[:fabric.start()] + section + part[fabric.end():]
            else:
                part = re.sub(rf"(?m)^(\s+{label}\s+: ).*$", lambda m, v=value: m.group(1) + v, part, count=1)
        parts[i] = part
    return "".join(parts)


# ---- GPU health faults of one GPU of a node (checks/gpu_memory.py, gpu_reset.py, pcie_link.py) ----
# The corpus has no H200 capture with a pending remap, an uncorrectable ECC count or a
# narrow link; these scenarios set exactly those values in one GPU of the real healthy block,
# using the element names and value forms the real XML prints ("Yes", "8x", "P8").


def with_gpu_values(xml: str, gpu: int, values: dict[str, str]) -> str:
    """``xml`` with leaf values of its ``gpu``-th ``<gpu>`` block changed, for faulty variants of
    a healthy real node: ``{"remapped_row_pending": "Yes", "volatile/dram_uncorrectable": "2",
    "current_link_width": "8x", "performance_state": "P8", "gpu_recovery_action": "Reset"}``.
    "parent/leaf" picks the leaf inside that parent, for names printed more than once (ECC
    counters appear under volatile and aggregate). Only the named values of that one GPU change;
    a path the block lacks raises KeyError, so a scenario never silently tests nothing."""
    blocks = list(re.finditer(r"<gpu id=\"[^\"]*\">.*?</gpu>", xml, re.DOTALL))
    block = blocks[gpu]
    text = block.group()
    for path, value in values.items():
        parent, _, leaf = path.rpartition("/")
        start = text.find(f"<{parent}>") if parent else 0
        found = re.compile(rf"<{leaf}>[^<]*</{leaf}>").search(text, max(start, 0))
        if start < 0 or found is None:
            raise KeyError(f"GPU {gpu} has no <{path}>")
        text = text[: found.start()] + f"<{leaf}>{value}</{leaf}>" + text[found.end():]
    return xml[: block.start()] + text + xml[block.end():]


# ---- ConnectX-8 nodes on DOCA 3.1 (checks/nic_firmware.py, ib_ports.py, nic_fw_consistency.py) ----
# The corpus holds ConnectX-7 and older captures only. A B300 node's ConnectX-8 NICs print the
# ibstat block of the real CX-7 NDR capture (corpus ibv/ibstat-cx7-ndr-400g-active-ib.txt, its
# complete first CA), repeated per NIC with the CA type (MT4129 -> MT4131, docs/sources.md §1.1), the
# firmware (40.x) and the rate (400 -> 800, XDR) changed, GUIDs and LIDs made distinct.
# A Polling port takes the values of the real Down port of corpus
# ibv/ibstat-cx6-hdr-one-port-disabled-plus-cx4lx.txt (State Down, Rate 10, Base lid 65535,
# SM lid 0) with Physical state Polling in place of Disabled.
# The driver: DOCA 3.1.0's DOCA-OFED names itself OFED-internal-25.07-0.9.7 in `ofed_info -s` (a
# stored note on UCX builds lists "DOCA-OFED-3.1.0 ... (OFED-internal-25.07-0.9.7)"; the line's
# form is recorded/ofed-info-s-ofed-internal-24.07-0.3.5.0.110.txt), and its mlx5_core reports
# that release as the OFED module does (recorded/ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt,
# whose PSID, a ConnectX-7 one, is dropped). Its driver container is doca3.1.0-25.07-0.9.7.0.

CX7_NDR_IBSTAT = CORPUS / "ibv" / "ibstat-cx7-ndr-400g-active-ib.txt"
RECORDED = Path(__file__).parent / "fixtures" / "recorded"
DOCA31_OFED = "25.07-0.9.7"


def node_ibstat(nics: int, firmware: str, odd: dict[int, str] | None = None, polling: tuple[int, ...] = (),
                hca_type: str = "MT4129", rate: int = 400) -> str:
    """`ibstat` of `nics` ports: the complete first CA of the real CX-7 NDR capture per NIC, with
    GUIDs and LIDs made distinct, the CA type, rate and firmware set; `odd` gives NIC index ->
    other firmware, `polling` the NICs whose port is Down/Polling (values as described above)."""
    block = CX7_NDR_IBSTAT.read_text().split("CA 'mlx5_1'")[0]
    out = []
    for i in range(nics):
        b = (block.replace("CA 'mlx5_0'", f"CA 'mlx5_{i}'").replace("MT4129", hca_type)
             .replace("28.41.1000", (odd or {}).get(i, firmware)).replace("Rate: 400", f"Rate: {rate}")
             .replace("9c63c003005548fe", f"9c63c0030055{i:04x}").replace("Base lid: 975", f"Base lid: {975 + i}"))
        if i in polling:
            b = (b.replace("State: Active", "State: Down").replace("Physical state: LinkUp", "Physical state: Polling")
                 .replace(f"Rate: {rate}", "Rate: 10").replace(f"Base lid: {975 + i}", "Base lid: 65535")
                 .replace("SM lid: 1165", "SM lid: 0"))
        out.append(b)
    return "".join(out)


def cx8_ibstat(nics: int = 8, firmware: str = "40.46.1006", odd: dict[int, str] | None = None,
               polling: tuple[int, ...] = ()) -> str:
    """`ibstat` of a node with `nics` ConnectX-8 (MT4131) at 800 Gb/s."""
    return node_ibstat(nics, firmware, odd, polling, hca_type="MT4131", rate=800)


def doca_ethtool(firmware: str = "40.46.1006", version: str = DOCA31_OFED) -> str:
    """The `ethtool-i` probe (one `== IFACE ==` block) of a ConnectX-8 under DOCA-OFED (3.1.0 by default)."""
    text = (RECORDED / "ethtool-i-mlx5-cx7-mlnx-ofed-23.10-1.1.9.txt").read_text()
    text = text.replace("version: 23.10-1.1.9", f"version: {version}")
    text = text.replace("firmware-version: 28.39.3560 (MT_0000000838)", f"firmware-version: {firmware}")
    return "== ens4np0 ==\n" + text


def doca_ofed_info(version: str = DOCA31_OFED) -> str:
    """`ofed_info -s` of DOCA-OFED (3.1.0 by default)."""
    return (RECORDED / "ofed-info-s-ofed-internal-24.07-0.3.5.0.110.txt").read_text().replace(
        "24.07-0.3.5.0.110", version)


# Real mlx5 command-timeout lines: dmesg of a ConnectX-7 (fw 28.43.1014) quoted in a netdev mail
# (Daniel Zahka, 2025-10-17, "Re: [PATCH V7 net-next 02/11] net/mlx5: Implement cqe_compress_type
# via devlink params", Message-ID <d4ee68d6-7f57-4b24-970f-41a944a22481@gmail.com>); the mail
# client's quoting and line wrapping are undone, nothing else changed.
MLX5_CMD_TIMEOUT_DMESG = (
    "[  257.111349] mlx5_core 0000:56:00.0: wait_func_handle_exec_timeout:1159:(pid 72061): cmd[0]: "
    "ACCESS_REG(0x805) No done completion\n"
    "[  257.137072] mlx5_core 0000:56:00.0: wait_func:1189:(pid 72061): ACCESS_REG(0x805) timeout. "
    "Will cause a leak of a command resource\n"
    "[  270.871521] mlx5_core 0000:56:00.0: mlx5_cmd_comp_handler:1709:(pid 0): Command completion arrived "
    "after timeout (entry idx = 0).\n"
)


def nic_pcie_limited_dmesg() -> str:
    """A NIC on a Gen4 x8 link: the first real line of corpus
    kernel-log/h100-dmesg-pcie-bandwidth-limited-by-gen4-switch.txt (a GPU) as mlx5_core prints
    it for its NIC, with the width x16 -> x8 and the available bandwidth halved to match
    (252.048 -> 126.024 Gb/s: the kernel's figure is speed x 128/130 x lanes)."""
    line = (CORPUS / "kernel-log" / "h100-dmesg-pcie-bandwidth-limited-by-gen4-switch.txt").read_text().splitlines()[0]
    return (line.replace("pci 0000:04:00.0", "mlx5_core 0000:04:00.0")
            .replace("252.048 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe x16",
                     "126.024 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe x8") + "\n")


# ---- Multi-node all_reduce through mpirun (preflight/collect/multinode.py, checks/nccl_multinode.py) ----
# The corpus holds no complete multi-node all_reduce_perf output. Its real multi-node H200 table
# is nccl-tests/gcp-a3-ultra-h200-2node-allgather-rdma-healthy.txt (2 x 8 H200 + 8 CX-7 RoCE
# per node, all_gather up to 8 GiB, ~329-336 GB/s busbw); busbw is normalised to the link rate
# for every collective (nccl-tests doc/PERFORMANCE.md), so its rows stand for all_reduce rows
# on the same fabric with the redop none -> sum and the count made per-rank-total (size / 4).
# Around them go the header, settings and device lines of the real H200 run
# (h200-vm/all_reduce_1gpu.txt), one device line per rank, and mpirun --tag-output's "[1,0]<stdout>:"
# on every line rank 0 prints.

A3_ULTRA = CORPUS / "nccl-tests" / "gcp-a3-ultra-h200-2node-allgather-rdma-healthy.txt"
H200_RUN = CORPUS / "h200-vm" / "all_reduce_1gpu.txt"


def mpirun_all_reduce(hosts: list[str], gpus: int = 8, busbw_scale: float = 1.0, rows: int | None = None) -> str:
    """What rank 0 prints for all_reduce_perf -g 1 under mpirun over ``hosts`` x ``gpus`` ranks.
    ``busbw_scale`` scales algbw and busbw (the inter-node-only split runs one NIC per
    communicator: 1/8 of the 8-NIC figure); ``rows`` cuts the table after that many rows,
    without footer, as a run that hangs leaves it."""
    real = H200_RUN.read_text().split("\n")
    head = [line for line in real[:4] if line.startswith("#")]
    head[2] = re.sub(r"minBytes \d+ maxBytes \d+ step: \d+\(factor\)",
                     "minBytes 1024 maxBytes 8589934592 step: 2(factor)", head[2])
    device = next(line for line in real if line.startswith("#  Rank"))
    devices = [device.replace("Rank  0", f"Rank {r:2d}").replace("Pid   1183", f"Pid {4100 + r % gpus:6d}")
               .replace("        vm", f"{hosts[r // gpus]:>10}").replace("device  0", f"device {r % gpus:2d}")
               for r in range(len(hosts) * gpus)]
    table = A3_ULTRA.read_text().rstrip("\n").split("\n")
    body = []
    for line in table:
        if re.match(r"\s+\d", line):
            cells = line.split()
            cells[1], cells[3] = str(int(cells[0]) // 4), "sum"
            for i in (6, 7, 10, 11):
                cells[i] = f"{float(cells[i]) * busbw_scale:.2f}"
            line = " ".join(f"{c:>12}" for c in cells)
        body.append(line.strip())
    rows_at = [i for i, line in enumerate(body) if re.match(r"\d", line)]
    if rows is not None:
        body = body[: rows_at[rows - 1] + 1]
    else:
        body += ["#", "# Collective test concluded: all_reduce_perf"]
    lines = head + ["#", "# Using devices"] + devices + ["#"] + body
    return "".join(f"[1,0]<stdout>:{line}\n" for line in lines)


def tagged_warn(corpus_file: str, host: str, rank: int) -> str:
    """The first line of a real NCCL WARN capture (corpus nccl-tests/``corpus_file``) as rank
    ``rank`` prints it under mpirun --tag-output, with the capture's host name made ``host``."""
    line = (CORPUS / "nccl-tests" / corpus_file).read_text().split("\n")[0]
    line = re.sub(r"^(\[[^\]]*\] )?[^\s:]+:", lambda m: f"{m.group(1) or ''}{host}:", line, count=1)
    return f"[1,{rank}]<stderr>:{line}\n"
