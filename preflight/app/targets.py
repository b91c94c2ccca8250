"""The shared options of ``preflight.app.options`` read back into what a command runs on: the
hosts, the SSH settings, the run directory's name. Bad values are ``UsageError``."""

from __future__ import annotations

import argparse

from preflight.app.errors import UsageError
from preflight.collect.inventory import load_hosts_file, parse_host_list
from preflight.collect.ssh import SshOptions
from preflight.model import Host


def hosts_of(args: argparse.Namespace) -> list[Host]:
    """The inventory the target options name; empty: this machine."""
    if getattr(args, "hosts", None):
        return load_hosts_file(args.hosts)
    if getattr(args, "host_list", None):
        return parse_host_list(args.host_list)
    return []


def ssh_of(args: argparse.Namespace) -> SshOptions:
    """``SshOptions`` from the SSH group; a named file that does not exist is a usage error."""
    for path, opt in ((args.identity, "--identity"), (args.ssh_config, "--ssh-config"),
                      (args.known_hosts, "--known-hosts")):
        if path and not path.is_file():
            raise UsageError(f"{opt}: {path}: no such file")
    return SshOptions(args.user, args.port, args.identity, args.ssh_config, args.known_hosts,
                      args.accept_new_host_keys, args.connect_timeout)


def run_id_of(args: argparse.Namespace, default: str) -> str:
    run_id = args.run_id or default
    if "/" in run_id or run_id in (".", ".."):
        raise UsageError(f"--run-id: {run_id!r} must be a plain directory name")
    if (args.out / run_id).exists():
        raise UsageError(f"--run-id: {args.out / run_id} already exists; choose another id")
    return run_id
