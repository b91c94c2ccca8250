"""``preflight run --nccl-multinode``'s collective options, kept beside the command line.

``--collective-tool nccl|mpi`` picks the engine (preflight/collect/multinode.py): nccl-tests'
all_reduce_perf on GPUs, or the MPI all_reduce of preflight/node/mpi_allreduce.py that runs on
any fleet with python3-mpi4py (a CPU test bed). ``--mpirun-args`` reaches mpirun before the
program, split as a shell would (no shell runs it). ``--collective-expect-busbw`` sets what
"slow" means; the mpi engine without it compares runs with each other
(preflight/judge/collective.py).
"""

from __future__ import annotations

import argparse
import shlex

from preflight.app.errors import UsageError
from preflight.collect.multinode import TOOLS, MultinodeOptions
from preflight.collect.multinode_slurm import mca_env
from preflight.collect.nccl import NcclOptions, parse_size
from preflight.knowledge.datafile import LONGEST_S, positive


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive): {text}")
    return value


def add_engine(group) -> None:
    """nccl-tests' own options, which ``run`` and ``fabric --collective`` share."""
    group.add_argument("--nccl-max-bytes", type=_size, default="8G", metavar="SIZE",
                       help="largest message, e.g. 8G, 512M or bytes (default 8G)")
    group.add_argument("--nccl-timeout", type=positive(float, LONGEST_S), default=300.0, metavar="SECONDS",
                       help="limit per repetition; one that runs longer counts as hung (default 300)")
    group.add_argument("--nccl-tests-dir", metavar="DIR",
                       help="where all_reduce_perf lives on the nodes (default: PATH, else torch fallback)")


def add_launcher(group) -> None:
    group.add_argument("--nccl-node-dir", metavar="DIR", default=None,
                       help="where the multi-node run writes its hostfiles on the first host "
                            "(default ~/.cache/preflight/multinode)")


def add(group) -> None:
    group.add_argument("--collective-tool", choices=TOOLS, default="nccl",
                       help="--nccl-multinode's engine: nccl (all_reduce_perf, GPUs) or mpi (an MPI all_reduce "
                            "through mpi4py, one rank per node: runs without GPUs; needs python3-mpi4py and "
                            "openmpi-bin on every node; under --slurm srun steps with --mpi=pmix)")
    group.add_argument("--mpirun-args", metavar="ARGS", default="",
                       help="extra mpirun options before the program, e.g. \"--mca btl_tcp_if_include eth0\" "
                            "(split like a shell would; no shell runs them); under --slurm only --mca NAME VALUE "
                            "pairs, set as OMPI_MCA_NAME in the srun tasks' environment")
    group.add_argument("--collective-python", metavar="PATH", default="python3",
                       help="the mpi engine's python3 on the nodes (default python3)")
    group.add_argument("--collective-bytes", type=_size, default="1M", metavar="SIZE",
                       help="the mpi engine's all_reduce size (default 1M)")
    group.add_argument("--collective-expect-busbw", type=positive(float), metavar="GBPS",
                       help="bus bandwidth a healthy collective reaches; a run below --collective-slow-ratio of it "
                            "is slow and bisected (default: nccl judges completion and results; mpi compares runs "
                            "with each other)")
    group.add_argument("--collective-slow-ratio", type=_ratio, default=0.5, metavar="R",
                       help="slow below this fraction of the expectation (default 0.5)")
    group.add_argument("--collective-reps", type=positive(int), default=1, metavar="N",
                       help="repetitions of each fleet all_reduce; one that passes in some and fails or hangs in "
                            "others is flaky, with the hosts its failing repetitions name (default 1)")


def options_of(args: argparse.Namespace, nccl: NcclOptions, node_dir: str) -> MultinodeOptions:
    try:
        extra = tuple(shlex.split(args.mpirun_args or ""))
    except ValueError as exc:
        raise UsageError(f"--mpirun-args: {exc}") from None
    if getattr(args, "slurm", None):
        # srun starts the ranks (preflight/collect/multinode_slurm.py): no mpirun to take its options.
        try:
            mca_env(extra)
        except ValueError as exc:
            raise UsageError(f"--mpirun-args: {exc}") from None
        if getattr(args, "nccl_node_dir", None):
            raise UsageError("--nccl-node-dir: the hostfiles of mpirun over SSH: not with --slurm (srun steps "
                             "need none)")
    return MultinodeOptions.from_nccl(nccl, node_dir, tool=args.collective_tool, mpirun_args=extra,
                                      python=args.collective_python, mpi_bytes=args.collective_bytes,
                                      expect_busbw_gbs=args.collective_expect_busbw,
                                      slow_ratio=args.collective_slow_ratio, reps=args.collective_reps)
