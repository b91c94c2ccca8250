"""NCCL log lines that explain a failure: the signatures preflight knows, and finding them in
any output (nccl-tests, the multi-node stage's mpirun output, a soak's logs)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# NCCL log lines that mean something for diagnosis: (regex, symptom, meaning). The first
# matching entry names a line, so specific entries come before the catch-all NCCL WARN.
# Error 12 is IBV_WC_RETRY_EXC_ERR; NCCL up to 2.2x prints "with error 12", newer releases
# "with status=IBV_WC_RETRY_EXC_ERR(12)".
NCCL_SIGNATURES: tuple[tuple[str, str, str], ...] = (
    (
        r"Got completion (?:from peer \S+ )?with "
        r"(?:error 12\b|status=(?:IBV_WC_RETRY_EXC_ERR)?\(?12\b)",
        "nccl-ib-retry-exceeded",
        "IB/RoCE transport retry counter exceeded (completion error 12): the remote NIC never "
        "acknowledged; suspect the link, cable, switch port or routing between the two nodes",
    ),
    (
        r"Got completion (?:from peer \S+ )?with (?:error|status=)",
        "nccl-ib-completion-error",
        "IB/RoCE work completion failed with an error other than retry-exceeded "
        "(see its status and vendor err)",
    ),
    (
        r"ibv_modify_qp failed with 110\b",
        "nccl-ib-qp-timeout",
        "queue-pair connection timed out (ETIMEDOUT): the peer is not reachable over this "
        "NIC/GID; rail mismatch on a rail-only fabric (try NCCL_CROSS_NIC=0), wrong GID "
        "index, or a port down",
    ),
    (
        r"Network is unreachable",
        "nccl-net-unreachable",
        "no route to the peer (ENETUNREACH): wrong interface or subnet (NCCL_SOCKET_IFNAME), "
        "a missing route, or a RoCE GID without a route",
    ),
    (
        r"(?:Failed to open|Cou(?:ld|nt) not open) libibverbs",
        "nccl-no-ibverbs",
        "libibverbs could not be loaded, so NCCL cannot use IB/RoCE and falls back to TCP "
        "sockets (rdma-core / OFED userspace missing from the host or container)",
    ),
    (
        r"NET/IB ?: No device found",
        "nccl-no-ib-device",
        "NCCL found no usable IB/RoCE device and uses TCP sockets between nodes (expected "
        "only on a single node or a machine without RDMA NICs)",
    ),
    (
        r"GPU Direct RDMA Disabled for",
        "nccl-gdr-disabled",
        "GPUDirect RDMA is off between a GPU and this NIC, so network traffic is staged "
        "through host memory (nvidia_peermem or dma-buf not active, or PCIe topology/ACS)",
    ),
    (
        r"(?i:connect to \S+ (?:failed :|returned) Connection refused)",
        "nccl-socket-refused",
        "a TCP connection to a peer was refused: the peer process is not listening "
        "(crashed, not started yet, or the wrong address or interface was chosen)",
    ),
    (
        r"\bNCCL WARN\b",
        "nccl-warn",
        "an NCCL warning that is not in the signature table",
    ),
)

_SIGNATURE_PATTERNS = tuple((re.compile(rx), sym, meaning) for rx, sym, meaning in NCCL_SIGNATURES)

# "[1,0]<stdout>:" is prepended by mpirun --tag-output (job,rank).
MPI_TAG = re.compile(r"^\[[0-9]+,[0-9]+\]<std(?:out|err)>:")
# host:pid:tid [dev] [file:line [(func)]] NCCL LEVEL msg, with an optional "[date time] "
# timestamp in front (NCCL 2.27+ stamps WARN lines by default). Redacted logs keep host:pid.
NCCL_LOG = re.compile(
    r"^(?:\[(?P<ts>[^\]]*[0-9][^\]]*)\]\s+)?(?P<host>[^\s:\[]+):\S+\s+\[[0-9]+\]\s+"
    r"(?:\S+:[0-9]+\s+(?:\(\S+\)\s+)?)?NCCL (?P<level>WARN|INFO|TRACE)\b"
)


@dataclass(frozen=True)
class NcclSignature:
    """An NCCL log line that points at a cause."""

    symptom: str
    meaning: str
    line_number: int  # 1-based
    line: str
    level: str | None  # WARN / INFO / TRACE; None when the line is not in NCCL's log format
    host: str | None
    timestamp: str | None  # "2026-03-13 22:26:02" where NCCL stamped the line


def nccl_signatures(text: str) -> tuple[NcclSignature, ...]:
    """Every line of ``text`` that matches an entry of ``NCCL_SIGNATURES``, in order."""
    found = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = MPI_TAG.sub("", raw.rstrip("\r")).strip()
        for pattern, symptom, meaning in _SIGNATURE_PATTERNS:
            if pattern.search(line):
                log = NCCL_LOG.match(line)
                found.append(
                    NcclSignature(
                        symptom=symptom,
                        meaning=meaning,
                        line_number=number,
                        line=line,
                        level=log["level"] if log else None,
                        host=log["host"] if log else None,
                        timestamp=log["ts"] if log else None,
                    )
                )
                break
    return tuple(found)
