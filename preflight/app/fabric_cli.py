"""``preflight fabric``: every rail of every node against the same rail of a partner.

It is a run (``preflight.app.run.execute``) whose per-host probes are only the rail listing
(``ibv-devinfo`` and ``ibstat``, or ``ip-addr`` for iperf3) and whose stage is the rail stage
(``preflight.collect.fabric_rails``); its only check is ``fabric-rails``. So it writes the same
run directory, bundle and reports as ``run``, and ``analyze``, ``drain``, ``diff``, the results
store and the lifecycle read it unchanged. With ``--collective`` the run goes on, after the rails,
with the collective across the nodes and its bisection (``preflight.app.collective``), exactly as
``run --nccl-multinode`` runs it: both stages in one run directory, judged by ``fabric-rails`` and
``nccl-multinode`` alike.
"""

from __future__ import annotations

import argparse
import re

from preflight.app import collective_options, options, targets
from preflight.app.errors import UsageError
from preflight.app.run import RunRequest
from preflight.collect.fabric_rails import RailOptions, rail_stage
from preflight.collect.fanout import ExecPlan
from preflight.collect.multinode import NODE_DIR, MultinodeOptions
from preflight.collect.nccl import NcclOptions
from preflight.collect.probes import PROBES
from preflight.collect.stage import Stage
from preflight.diagnose.engine import load_knowledge
from preflight.evidence.bundle import new_run_id
from preflight.fabric.rails import IBSTAT_PROBE, IBV_PROBE, IP_ADDR_PROBE
from preflight.fabric.record import TOOLS
from preflight.judge.loader import load_checks
from preflight.knowledge.datafile import LONGEST_S, positive
from preflight.knowledge.profiles import load_profiles

CHECK_ID = "fabric-rails"
COLLECTIVE_CHECK_ID = "nccl-multinode"
SMI_PROBE = "nvidia-smi-q-x"  # the GPUs per node the nccl engine's ranks need (collect.multinode.gpus_of)
MAX_REPS = 100
MAX_SECONDS = 600.0
# iperf3's own number syntax for -b and -n (a number, then K/M/G/T): checked here so that a typo
# is a usage error before anything runs, not an iperf3 error on every node.
_SIZE = re.compile(r"[0-9]+(\.[0-9]+)?[KMGTkmgt]?")
MAX_GID_INDEX = 255  # a port's GID table: ibv_query_gid indices are below its gid_tbl_len (<= 256 on mlx5)


def add_parser(sub, report_options, store_options) -> argparse.ArgumentParser:
    fa = sub.add_parser("fabric", help="every rail of every node against a partner's: slow node, slow path, "
                                       "flaky rail (ib_write_bw, or iperf3 on a TCP test bed)",
                        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=options.examples(
                            "preflight fabric --hosts hosts.txt",
                            "preflight fabric -H gpu[001-064] --reps 5 --use-cuda",
                            "preflight fabric --slurm -w gpu[001-064] --gid-index 3",
                            "preflight fabric -H node[1-4] --pair-tool iperf3 --seconds 1"))
    options.add(fa, options.TARGETS[:2], exclusive=True)
    options.add_ssh(fa)
    g = fa.add_argument_group("rail tests")
    g.add_argument("--pair-tool", choices=TOOLS, default="ib_write_bw",
                   help="what measures a rail: perftest's ib_write_bw (RDMA, the default) or iperf3 (TCP, over "
                        "each IPv4 interface: a CPU test bed)")
    g.add_argument("--reps", type=positive(int, MAX_REPS), default=3, metavar="N",
                   help="repetitions of every test (default 3); a rail slow in only some is flaky")
    g.add_argument("--seconds", type=positive(float, MAX_SECONDS), default=5.0, metavar="S",
                   help="seconds per test (ib_write_bw -D, iperf3 -t; default 5)")
    g.add_argument("--use-cuda", action="store_true",
                   help="ib_write_bw: GPUDirect RDMA, GPU i with rail i (perftest --use_cuda)")
    g.add_argument("--gid-index", type=_gid_index, metavar="N",
                   help="ib_write_bw: the GID index for RoCE (perftest -x)")
    g.add_argument("--port-base", type=positive(int, 65000), default=18515, metavar="PORT",
                   help="first TCP port of the tests (default 18515, perftest's own); rail i uses PORT + i")
    g.add_argument("--bitrate", metavar="RATE", help="iperf3: cap each test at RATE (iperf3 -b, e.g. 500M), so "
                                                      "that tests sharing a test bed's CPUs stay comparable")
    g.add_argument("--bytes", metavar="SIZE", dest="size",
                   help="iperf3: send SIZE bytes (iperf3 -n, e.g. 2M) instead of for --seconds: short tests on a "
                        "test bed")
    c = fa.add_argument_group("the collective", "after the rails, an all_reduce across every node and, when it "
                                                 "fails, hangs or is slow, its bisection (as run --nccl-multinode)")
    c.add_argument("--collective", action="store_true",
                   help="also run the collective across the nodes: nccl-tests through mpirun on the first node "
                        "(or srun steps under --slurm), or --collective-tool mpi on a CPU test bed")
    collective_options.add_engine(c)
    collective_options.add_launcher(c)
    collective_options.add(c)
    fa.add_argument("--parallel", type=positive(int), default=64, help="hosts listed at once (default 64)")
    fa.add_argument("--timeout", type=positive(float, LONGEST_S), default=30.0,
                    help="seconds for each node's rail listing (default 30)")
    options.add_slurm(fa, "fabric --slurm: the listing as one srun task per node, the tests as srun steps of "
                          "one allocation of every node; no SSH", "default: from the rounds' budget")
    options.add_output(fa)
    report_options(fa)
    store_options(fa)
    return fa


def _gid_index(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) > MAX_GID_INDEX:
        raise argparse.ArgumentTypeError(f"a GID index is a whole number from 0 to {MAX_GID_INDEX}: {text!r}")
    return int(text)


def rail_options(args: argparse.Namespace) -> RailOptions:
    if args.pair_tool == "iperf3":
        wrong = [flag for flag, given in (("--use-cuda", args.use_cuda), ("--gid-index", args.gid_index is not None))
                 if given]
        if wrong:
            raise UsageError(f"{', '.join(wrong)}: only with --pair-tool ib_write_bw")
    else:
        wrong = [flag for flag, given in (("--bitrate", args.bitrate), ("--bytes", args.size)) if given]
        if wrong:
            raise UsageError(f"{', '.join(wrong)}: only with --pair-tool iperf3")
    for flag, value in (("--bitrate", args.bitrate), ("--bytes", args.size)):
        if value is not None and not _SIZE.fullmatch(value):
            raise UsageError(f"{flag}: {value!r} is not a number with an optional K, M, G or T suffix")
    return RailOptions(args.pair_tool, args.reps, args.seconds, args.use_cuda, args.gid_index, args.port_base,
                       args.bitrate, args.size)


def stages_for(rails: RailOptions) -> tuple[Stage, ...]:
    """The stages of a fabric run before the collective (which ``execute`` runs after every stage)."""
    return (rail_stage(rails),)


def collective_of(args: argparse.Namespace) -> MultinodeOptions | None:
    """The collective's options with ``--collective``, else None; without it, its options are refused
    rather than ignored."""
    if not args.collective:
        given = [a for a in ("mpirun_args", "collective_expect_busbw", "nccl_tests_dir", "nccl_node_dir")
                 if getattr(args, a)]
        if given or args.collective_tool != "nccl" or args.collective_reps != 1:
            named = [f"--{a.replace('_', '-')}" for a in given]
            named += ["--collective-tool"] * (args.collective_tool != "nccl")
            named += ["--collective-reps"] * (args.collective_reps != 1)
            raise UsageError(f"{', '.join(named)}: only with --collective")
        return None
    # One repetition per run: the collective's own --collective-reps repeats the fleet run.
    nccl = NcclOptions(1, args.nccl_max_bytes, args.nccl_timeout, args.nccl_tests_dir, setup_timeout_s=args.timeout)
    return collective_options.options_of(args, nccl, args.nccl_node_dir or NODE_DIR)


def fabric_request(args: argparse.Namespace) -> RunRequest:
    """Everything ``fabric`` decides before it touches a node; bad input raises a usage error."""
    rails = rail_options(args)
    slurm = targets.slurm_of(args)
    hosts = targets.slurm_hosts_of(args, slurm) if slurm else targets.hosts_of(args)
    if len(hosts) < 2:
        raise UsageError(f"fabric: {len(hosts)} node(s) named: a pairwise test needs two or more "
                         "(--hosts FILE, -H a,b or --slurm -w NODES)")
    collective = collective_of(args)
    wanted = (CHECK_ID, COLLECTIVE_CHECK_ID) if collective else (CHECK_ID,)
    checks = [c for c in load_checks() if c.id in wanted]
    if missing := sorted(set(wanted) - {c.id for c in checks}):
        raise UsageError(f"fabric: the {', '.join(missing)} check is not installed")
    listing = (IP_ADDR_PROBE,) if rails.tool == "iperf3" else (IBV_PROBE, IBSTAT_PROBE)
    if collective and collective.tool == "nccl":
        listing += (SMI_PROBE,)
    plan = ExecPlan(tuple(PROBES[p] for p in listing), args.timeout, args.parallel, targets.ssh_of(args),
                    per_node=2, node_runner=False)
    run_id = targets.run_id_of(args, new_run_id())
    return RunRequest(hosts, checks, load_profiles(()), load_knowledge(), plan, args.out, run_id, None,
                      html=args.html, slurm=slurm, stages=stages_for(rails), multinode=collective)
