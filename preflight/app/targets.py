"""The shared options of ``preflight.app.options`` read back into what a command runs on: the
hosts, the SSH settings, the run directory's name. Bad values are ``UsageError``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from preflight.app.errors import UsageError
from preflight.collect import slurm_job
from preflight.collect.inventory import load_hosts_file, parse_host_list
from preflight.collect.slurm_job import SlurmOptions
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
    """``--out``, refused when it names something that is not a directory or cannot be created."""
    why = unwritable_dir(args.out)
    if why:
        raise UsageError(f"--out: {why}")
    return args.out


def unwritable_dir(path: Path) -> str | None:
    """Why a directory cannot be written to (or created with its parents) at ``path``; None when
    it can. Asked before anything runs, so that a run never ends in a traceback half-way, after
    the nodes were probed, with nowhere to write (a file where a folder should be, a read-only
    mount, a folder that is not ours)."""
    if path.exists():
        if not path.is_dir():
            return f"{path} is a file, not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path}: not writable (permission denied)"
    missing = [path]
    while not missing[-1].parent.exists() and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    ancestor = missing[-1].parent
    if not ancestor.is_dir():
        return f"cannot create {path}: {ancestor} is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot create {path}: {ancestor} is not writable (permission denied or a read-only file system)"
    # Permissions do not tell everything (a pseudo file system such as /proc, a quota): create the
    # folders for real, then take them away again, so that a refused run leaves nothing behind.
    created: list[Path] = []
    try:
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except FileExistsError:
                # Made between the look and the mkdir by another run sharing this --out (srun
                # tasks of per-node runs, started together): theirs, so left to them.
                if folder.is_dir():
                    continue
                raise
            created.append(folder)
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror or exc}"
    finally:
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:
                pass
    return None


def run_id_of(args: argparse.Namespace, default: str) -> str:
    run_id = args.run_id if args.run_id is not None else default
    if not run_id or "/" in run_id or "\0" in run_id or run_id in (".", ".."):
        raise UsageError(f"--run-id: {run_id!r} must be a plain directory name")
    # The bytes of the file name: a name that was not UTF-8 reaches Python as lone surrogates.
    if len(run_id.encode("utf-8", "surrogateescape")) > MAX_RUN_ID:
        raise UsageError(f"--run-id: longer than {MAX_RUN_ID} bytes")
    if (out_dir_of(args) / run_id).exists():
        raise UsageError(f"--run-id: {args.out / run_id} already exists; choose another id")
    return run_id


def slurm_of(args: argparse.Namespace) -> SlurmOptions | None:
    """``SlurmOptions`` for ``run --slurm``; None without it (a Slurm-only option alone is a usage error)."""
    if not getattr(args, "slurm", False):
        given = [flag for flag, dest in (("-w", "nodelist"), ("--partition", "partition"), ("--account", "account"),
                                         ("--time", "time"), ("--sbatch-arg", "sbatch_arg"))
                 if getattr(args, dest, None)]
        given += [flag for flag, dest in (("--gpus-per-node", "gpus_per_node"), ("--exclusive", "exclusive"),
                                          ("--allow-shared", "allow_shared"))
                  if getattr(args, dest, None) is not None and getattr(args, dest) is not False]
        if given:
            raise UsageError(f"{', '.join(given)}: only with --slurm")
        return None
    if getattr(args, "local", False):
        raise UsageError("--slurm and --local: choose one")
    if args.nodelist and (args.hosts or args.host_list):
        raise UsageError("-w and --hosts/-H both name the nodes: choose one")
    return SlurmOptions(args.partition, args.account, args.time, args.max_nodes_per_job, tuple(args.sbatch_arg),
                        args.alloc_timeout, args.node_python, getattr(args, "gpus_per_node", None),
                        getattr(args, "exclusive", False), getattr(args, "allow_shared", False))


def slurm_hosts_of(args: argparse.Namespace, slurm: SlurmOptions) -> list[Host]:
    """The nodes of ``run --slurm``: -w, else --hosts/-H (names only: Slurm reaches them), else the
    partition's nodes as Slurm lists them."""
    if args.nodelist:
        names = slurm_job.expand(args.nodelist)
    elif args.hosts or args.host_list:
        hosts = hosts_of(args)
        odd = [f"{h.user + '@' if h.user else ''}{h.name}{f':{h.port}' if h.port else ''}"
               for h in hosts if h.user or h.port]
        if odd:
            raise UsageError(f"--slurm: nodes are Slurm node names, without user@ or :port ({', '.join(odd)})")
        names = [h.name for h in hosts]
    else:
        names = slurm_job.partition_nodes(slurm.partition)
    if slurm.partition:
        slurm_job.check_partition(slurm.partition)
    return [Host(n) for n in dict.fromkeys(names)]
