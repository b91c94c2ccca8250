"""The shared options of ``preflight.app.options`` read back into what a command runs on: the
hosts, the SSH settings, the run directory's name. Bad values are ``UsageError``."""

from __future__ import annotations

import argparse
import sys

from preflight.app.errors import UsageError
from preflight.collect.inventory import load_hosts_file, parse_host_list
from preflight.collect.ssh import SshOptions
from preflight.model import Host


def hosts_of(args: argparse.Namespace) -> list[Host]:
    """The inventory the target options name; empty: this machine. An empty ``-H ""`` is an
    error, not this machine. Entries folded as the same node are noted on stderr."""
    notes: list[str] = []
    if getattr(args, "hosts", None) is not None:
        hosts = load_hosts_file(args.hosts, notes)
    elif getattr(args, "host_list", None) is not None:
        hosts = parse_host_list(args.host_list, notes)
    else:
        hosts = []
    for note in notes:
        print(f"preflight: note: {note}", file=sys.stderr)
    return hosts


def ssh_of(args: argparse.Namespace) -> SshOptions:
    """``SshOptions`` from the SSH group; a named file that does not exist is a usage error."""
    for path, opt in ((args.identity, "--identity"), (args.ssh_config, "--ssh-config"),
                      (args.known_hosts, "--known-hosts")):
        if path and not path.is_file():
            raise UsageError(f"{opt}: {path}: no such file")
    return SshOptions(args.user, args.port, args.identity, args.ssh_config, args.known_hosts,
                      args.accept_new_host_keys, args.connect_timeout)


MAX_RUN_ID = 200  # a file name holds 255 bytes; the soak adds to it on the nodes


def out_dir_of(args: argparse.Namespace):
    """``--out``, refused when it names something that is not a directory."""
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out: {args.out} is a file, not a directory")
    return args.out


def run_id_of(args: argparse.Namespace, default: str) -> str:
    run_id = args.run_id if args.run_id is not None else default
    if not run_id or "/" in run_id or "\0" in run_id or run_id in (".", ".."):
        raise UsageError(f"--run-id: {run_id!r} must be a plain directory name")
    if len(run_id.encode()) > MAX_RUN_ID:
        raise UsageError(f"--run-id: longer than {MAX_RUN_ID} bytes")
    if (out_dir_of(args) / run_id).exists():
        raise UsageError(f"--run-id: {args.out / run_id} already exists; choose another id")
    return run_id
