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


def h200_node_xml(gpus: int = 8, driver: str | None = None, cuda: str | None = None) -> str:
    text = H200_XML.read_text()
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
    return head + "\n".join(blocks) + tail


H200_TEXT = CORPUS / "h200-vm" / "smi-q.txt"


def h200_node_text(gpus: int = 8, driver: str | None = None) -> str:
    """The text `nvidia-smi -q` of the same node: the real GPU section repeated per GPU."""
    text = H200_TEXT.read_text()
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
    return head + "".join(blocks)
