"""An MPI all_reduce across nodes, for fleets without GPUs (``--collective-tool mpi``).

mpirun (or, under Slurm, srun --mpi=pmix) starts one rank per node with this file's text as
``python3 -c``; ranks meet through Open MPI and their all_reduce travels over whatever the MPI
library uses between the nodes (on the namespace test bed: TCP over the real veth links, so a
shaped or cut link shows). It needs
python3 with mpi4py on every node (Debian: ``python3-mpi4py``, ``openmpi-bin``) and imports
nothing from preflight.

What it prints (preflight/parse/mpi_allreduce.py reads it; mpirun --tag-output prefixes the lines):

    # preflight mpi all_reduce: ranks=N bytes=B iters=I
    rank R host H ready                       (each rank, before its first all_reduce)
    rank R host H done seconds S busbw G wrong W   (each rank, after its timed iterations)
    result bytes B seconds S algbw A busbw G wrong W   (rank 0, the slowest rank's time)

A rank that printed ``ready`` and never ``done`` stopped inside the collective. Each rank adds
rank+1 into every float32 element, so every element must hold N(N+1)/2 afterwards; the others
are ``wrong``. Bus bandwidth is nccl-tests' for all_reduce: bytes / time x 2(N-1)/N
(nccl-tests doc/PERFORMANCE.md), from the slowest rank's time per iteration.
"""

from __future__ import annotations

import argparse
import socket
import sys
from array import array

FIRST_LINE = "# preflight mpi all_reduce"


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an all_reduce of ``nbytes`` that took ``seconds``."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks if ranks > 1 else 0.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mpi_allreduce")
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    from mpi4py import MPI  # on the node only

    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    host = socket.gethostname()
    count = max(1, args.bytes // 4)
    if rank == 0:
        print(f"{FIRST_LINE}: ranks={ranks} bytes={count * 4} iters={args.iters}", flush=True)
    print(f"rank {rank} host {host} ready", flush=True)
    send, recv = array("f", [float(rank + 1)]) * count, array("f", bytes(count * 4))
    for _ in range(args.warmup):
        comm.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)
    start = MPI.Wtime()
    for _ in range(args.iters):
        comm.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)
    seconds = (MPI.Wtime() - start) / max(1, args.iters)
    expected = float(ranks * (ranks + 1) // 2)
    wrong = count - recv.tolist().count(expected)
    _, busbw = bus_bandwidth(count * 4, seconds, ranks)
    print(f"rank {rank} host {host} done seconds {seconds:.6f} busbw {busbw:.4f} wrong {wrong}", flush=True)
    slowest = comm.reduce(seconds, op=MPI.MAX, root=0)
    total_wrong = comm.reduce(wrong, op=MPI.SUM, root=0)
    if rank == 0:
        algbw, busbw = bus_bandwidth(count * 4, slowest, ranks)
        print(f"result bytes {count * 4} seconds {slowest:.6f} algbw {algbw:.4f} busbw {busbw:.4f} "
              f"wrong {total_wrong}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
