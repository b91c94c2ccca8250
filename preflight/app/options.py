"""Option groups every command shares, declared once (ClusterShell's ``install_*_options``
habit): which hosts, how to reach them over SSH, where the reports go. ``run`` and ``soak``
add them to their parsers; the pytest plugin offers each as ``--preflight-NAME`` and passes it
through to ``run``. ``preflight.app.targets`` reads them back into records, so every command
refuses the same bad input with the same message. Nothing heavy is imported here: every pytest
session loads the plugin, and with it this table.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.knowledge.datafile import positive

MAX_PORT = 65535


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    kwargs: dict[str, Any]
    # Offered by the pytest plugin as --preflight-<name> (a path option is resolved against
    # where pytest was started); None: not offered there.
    pytest_name: str | None = None
    is_path: bool = False

    @property
    def dest(self) -> str:
        return self.kwargs.get("dest") or self.flags[0].lstrip("-").replace("-", "_")


TARGETS = (
    Option(("--hosts",), dict(metavar="FILE", type=Path,
                              help="hosts file: [user@]host[:port] per line, ranges like gpu[001-016]"),
           "hosts", True),
    Option(("-H",), dict(dest="host_list", metavar="HOSTS", help="hosts inline: a,b,gpu[01-04]")),
    Option(("--local",), dict(action="store_true",
                              help="this machine, without SSH (the default with no hosts)"), "local"),
)
SSH = (
    Option(("--user",), dict(help="SSH user (default: ssh config, then the current user)"), "user"),
    Option(("--port",), dict(type=positive(int, MAX_PORT), help="SSH port (default: ssh config, then 22)"), "port"),
    Option(("--identity", "-i"), dict(type=Path, metavar="KEY", help="SSH private key"), "identity", True),
    Option(("--ssh-config",), dict(type=Path, metavar="FILE", help="OpenSSH client config (default: ~/.ssh/config)"),
           "ssh-config", True),
    Option(("--known-hosts",), dict(type=Path, metavar="FILE", help="extra known_hosts file"), "known-hosts", True),
    Option(("--accept-new-host-keys",), dict(action="store_true",
                                             help="accept host keys not in known_hosts (default: reject them)"),
           "accept-new-host-keys"),
    Option(("--connect-timeout",), dict(type=positive(float, 3600.0), default=10.0, metavar="SECONDS",
                                        help="seconds to connect (default 10)"), "connect-timeout"),
)
# `run --slurm` and `soak --slurm` (ClusterShell's habit again: one group, two commands). The
# --time help differs, since the two compute their default limit from different budgets.
SLURM = (
    Option(("--slurm",), dict(action="store_true", help="run through Slurm (salloc + srun) instead of SSH")),
    Option(("-w", "--nodelist"), dict(metavar="NODELIST",
                                      help="with --slurm: the nodes, in Slurm's syntax (gpu[001-016]); default: "
                                           "--hosts, -H, else the partition's nodes")),
    Option(("--partition", "-p"), dict(metavar="P", help="with --slurm: the partition to allocate from")),
    Option(("--account", "-A"), dict(metavar="A", help="with --slurm: the account to charge")),
    Option(("--time",), dict(metavar="T", help="with --slurm: the job's time limit, in Slurm's format")),
    Option(("--max-nodes-per-job",), dict(type=positive(int), default=256, metavar="N",
                                          help="with --slurm: at most N nodes per allocation; more nodes, more jobs "
                                               "(default 256)")),
    Option(("--sbatch-arg",), dict(action="append", default=[], metavar="ARG",
                                   help="with --slurm: one more allocation option, passed to salloc as it is "
                                        "(e.g. --sbatch-arg=--qos=high; repeatable)")),
    Option(("--node-python",), dict(default="python3", metavar="PATH",
                                    help="with --slurm: the python3 that runs preflight's task on each node "
                                         "(default python3)")),
    Option(("--alloc-timeout",), dict(type=positive(int), default=300, metavar="SECONDS",
                                      help="with --slurm: how long to wait for busy nodes before they are reported "
                                           "(default 300)")),
)
def gpu_count(text: str) -> int:
    """``--gpus-per-node``: a whole number from 0 (ask for none) to 1024."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"must be 0 to 1024: {text!r}")
    return value


# `run --slurm` alone: what its jobs ask of each node, and whether its load may share a node.
SLURM_RUN = (
    Option(("--gpus-per-node",), dict(type=gpu_count, metavar="N",
                                      help="with --slurm: GPUs each job asks of a node (--gres=gpu:N); default: "
                                           "all the node has in slurm.conf (Gres=gpu:N); 0: none")),
    Option(("--exclusive",), dict(action="store_true",
                                  help="with --slurm: no other job on the nodes meanwhile (salloc --exclusive; "
                                       "waits up to --alloc-timeout for busy nodes)")),
    Option(("--allow-shared",), dict(action="store_true",
                                     help="with --slurm: run the load probes (all_reduce, DCGM diagnostic) on nodes "
                                          "where another job runs (default: such nodes are not probed)")),
)
OUTPUT = (
    Option(("--out",), dict(metavar="DIR", type=Path, default=Path("reports"),
                            help="where run directories go (default: ./reports)"), "out", True),
    Option(("--run-id",), dict(help="name of the run directory (default: a timestamp)")),
    Option(("-q", "--quiet"), dict(action="store_true", help="print one line: the verdicts counted and the "
                                                           "report's path (no progress, no table)")),
)


def add(parser: argparse.ArgumentParser, options: tuple[Option, ...], title: str | None = None,
        exclusive: bool = False) -> Any:
    """Add the options; returns the group they went into (a command may add its own to it)."""
    group: Any = parser.add_argument_group(title) if title else parser
    if exclusive:
        group = group.add_mutually_exclusive_group()
    for o in options:
        group.add_argument(*o.flags, **o.kwargs)
    return group


def add_targets(parser: argparse.ArgumentParser) -> Any:
    """--hosts, -H, --local: one of them (the returned group takes more, e.g. soak's --attach)."""
    return add(parser, TARGETS, exclusive=True)


def add_ssh(parser: argparse.ArgumentParser) -> None:
    add(parser, SSH, "SSH")


def add_slurm(parser: argparse.ArgumentParser, description: str, time_help: str) -> None:
    """The Slurm group; ``time_help`` says how the command picks its default ``--time``."""
    group = parser.add_argument_group("Slurm", description)
    for o in SLURM:
        kwargs = dict(o.kwargs, help=f"{o.kwargs['help']} ({time_help})") if o.dest == "time" else o.kwargs
        group.add_argument(*o.flags, **kwargs)


def add_output(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    add(parser, tuple(o for o in OUTPUT if o.dest not in skip))


# ---- the pytest plugin's view of the same options ----------------------------------------

PYTEST_PASSED = tuple(o for o in TARGETS + SSH + OUTPUT if o.pytest_name)


def pytest_flag(o: Option) -> str:
    return f"--preflight-{o.pytest_name}"


def pytest_dest(o: Option) -> str:
    return "preflight_" + o.pytest_name.replace("-", "_")


def examples(*lines: str) -> str:
    """A subcommand's --help epilog (with RawDescriptionHelpFormatter): the command lines an
    operator actually types, so --help ends where a new user starts."""
    return "examples:\n" + "".join(f"  {line}\n" for line in lines)
