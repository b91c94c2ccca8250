"""Each GPU's nearest NIC in ``nvidia-smi topo -m`` (check ``gpu-nic-affinity``).

Input: the GPU rows of the topology matrix, read at their NIC columns (PIX, PXB, PHB, NODE,
SYS; SOC is the old name of SYS). On platforms whose profile sets ``nic.gpu_nic_max_path``
(HGX H100/H200: one NIC per GPU behind the same PCIe switch, PXB in the real DGX H100 capture)
every GPU must have a NIC at that distance or closer. NCCL uses GPUDirect RDMA only up to PXB
by default (``netGdrLevel = PATH_PXB`` in NVIDIA/nccl src/graph/paths.cc), so a GPU whose
nearest NIC is PHB, NODE or SYS stages its network traffic through host memory: slower, yet
nothing errors. That is a WARN: the node works, below what its platform should do.

Causes: a NIC missing or disabled (its GPU's nearest is then another GPU's NIC, NODE or SYS),
a NIC in the wrong slot after maintenance, or a BIOS that hides the PCIe switch. The topology
is static, so there is no load effect to tell apart. Truncated captures leave some GPUs
without NIC cells; those are named and not judged.
"""

from __future__ import annotations

from preflight.check import host_check, ok, skip, warn

TOPO = "nvidia-smi-topo"
# PCIe path types from nearest to farthest, as the topo -m legend orders them.
_DISTANCE = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5, "SOC": 5}
ACTION = ("check that every NIC the platform has is present and enabled (lspci -d 15b3:, ibv_devinfo) "
          "and seated in its slot next to its GPU; compare nvidia-smi topo -m with a healthy node of the "
          "same model, then re-run nccl all_reduce across nodes")


@host_check("gpu-nic-affinity", facts=["topo"],
            summary="every GPU has a NIC behind its own PCIe switch (PIX/PXB) where the platform pairs them")
def gpu_nic_affinity(host):
    profile = host.profile
    limit = profile.get("nic.gpu_nic_max_path")
    if limit not in _DISTANCE:
        return skip(f"no GPU-NIC pairing expected on this platform: {profile.why}")
    topo = host.topo
    if not topo.gpus:
        return skip("no GPU in the topology matrix")
    if not topo.nics:
        return warn(f"no NIC in the topology matrix, though the platform pairs each GPU with a NIC "
                    f"at {limit} or closer", symptoms=["gpu-nic-affinity"],
                    evidence=[host.excerpt(TOPO, r"CPU Affinity")], action=ACTION)

    far, unread, nearest_of = [], [], {}
    for gpu in topo.gpus:
        nearest = _nearest(topo, gpu)
        if nearest is None:
            unread.append(gpu)
            continue
        cell, nic = nearest
        nearest_of[gpu] = f"{cell} {topo.nic_device(nic)}"
        if _DISTANCE[cell] > _DISTANCE[limit]:
            far.append(f"{gpu} nearest NIC {topo.nic_device(nic)} at {cell}")
    notes = f"; {', '.join(unread)}: no NIC cells in the capture" if unread else ""
    data = {"nearest": nearest_of, "limit": limit, "not_in_capture": unread}
    if far:
        rows = "|".join(item.split()[0] for item in far)
        return warn(f"{len(far)} of {len(topo.gpus)} GPUs have no NIC within {limit}: "
                    f"{'; '.join(far)} (NCCL then runs without GPUDirect RDMA){notes}",
                    symptoms=["gpu-nic-affinity"],
                    evidence=[host.excerpt(TOPO, rf"CPU Affinity|^\s*({rows})\s", limit=len(far) + 1)],
                    data=data, action=ACTION)
    if not nearest_of:
        return skip(f"no GPU row holds NIC cells (capture truncated?){notes}")
    return ok(f"{len(nearest_of)} GPUs each have a NIC within {limit} "
              f"({', '.join(f'{g} {v}' for g, v in list(nearest_of.items())[:2])}, ...){notes}", data=data)


def _nearest(topo, gpu: str) -> tuple[str, str] | None:
    """(path type, NIC column) of the GPU's closest NIC; None when no cell could be read."""
    cells = []
    for nic in topo.nics:
        cell = topo.link(gpu, nic)
        if cell in _DISTANCE:
            cells.append((_DISTANCE[cell], cell, nic))
    if not cells:
        return None
    _, cell, nic = min(cells)
    return cell, nic
