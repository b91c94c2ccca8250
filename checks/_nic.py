"""When may a NIC check skip for want of RDMA evidence? Shared by the ib-port and NIC firmware checks."""

from preflight.judge.context import EvidenceMissing
from preflight.knowledge.nic_matrix import expects_nics


def nic_absence_excused(host, missing: EvidenceMissing) -> bool:
    """True when a node's missing RDMA evidence may be skipped as "no NIC expected": its
    profile, chosen from GPUs that were read, expects no NIC, and the evidence is absent rather
    than garbled or hung. A node whose nvidia-smi hung or was unreadable gets the generic
    profile for want of a GPU model, which says nothing about its NICs, so its NIC errors stay
    errors."""
    broken = missing.collected and bool({"probe-unreadable", "probe-timeout"} & set(missing.symptoms))
    return not (expects_nics(host.profile) or broken or host.optional("smi") is None)
