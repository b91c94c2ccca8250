"""The lifecycle's retest: ``preflight run`` on one node, over SSH, of the checks that blamed it
and its cause's acceptance (DCGM diagnostics at the retest's level, the single-node all_reduce),
recorded into the same store under the run id the controller chose.

A child process, not a call: a retest is a whole run (its report directory, its own timeouts,
its record into the store), and a child keeps a hung retest from hanging the controller, which
bounds it. The store's URL reaches the child through ``$PREFLIGHT_DB``, never its command line,
where a password would show in ``ps``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from preflight.collect.ssh import SshOptions
from preflight.lifecycle.machine import Action
from preflight.model import Host
from preflight.store.location import ENV as DB_ENV
from preflight.store.location import StoreUrl

DEFAULT_DCGM_LEVEL = 2  # the and NVSentinel's floor for a GPU's way back (docs/lifecycle.md)


@dataclass(frozen=True)
class Retest:
    hosts: Mapping[str, Host]  # node -> how to reach it
    ssh: SshOptions
    store: StoreUrl
    out: Path
    dcgm_level: int = DEFAULT_DCGM_LEVEL
    timeout_s: float = 1800.0
    extra: tuple[str, ...] = ()  # --retest-arg: more of run's options (--nccl-reps=2, --nccl-tests-dir=...)

    def argv(self, action: Action) -> list[str]:
        host = self.hosts[action.node]
        spec = f"{host.user + '@' if host.user else ''}{host.name}{f':{host.port}' if host.port else ''}"
        checks = list(action.detail.get("checks") or [])
        argv = [sys.executable, "-m", "preflight", "run", "-H", spec, "--out", str(self.out),
                "--run-id", str(action.detail["run"]), "--checks", ",".join(checks), "--no-html", "-q"]
        if "dcgm-diag" in checks:
            argv += ["--dcgm-level", str(self.dcgm_level)]
        return [*argv, *ssh_flags(self.ssh), *self.extra]

    def __call__(self, action: Action) -> str | None:
        if self.hosts[action.node].address and self.hosts[action.node].address != action.node:
            # The run would name the node by its address; its reading must carry the node's name.
            return f"{action.node} is reached at {self.hosts[action.node].address}: retest it by hand"
        env = {**os.environ, DB_ENV: self.store.target if self.store.dialect == "postgresql"
               else f"sqlite:///{self.store.target}"}
        try:
            r = subprocess.run(self.argv(action), env=env, capture_output=True, text=True, timeout=self.timeout_s,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"the retest run did not end within {self.timeout_s:g} s"
        # 0: passed, 1: a check failed; either is a reading in the store. Anything else is not.
        if r.returncode in (0, 1):
            return None
        said = (r.stderr or r.stdout).strip().splitlines()
        return f"the retest run exited {r.returncode}: {said[-1] if said else 'no message'}"


def ssh_flags(ssh: SshOptions) -> list[str]:
    """The SSH options again as ``run``'s flags."""
    flags: list[str] = []
    for flag, value in (("--user", ssh.user), ("--port", ssh.port), ("--identity", ssh.identity),
                        ("--ssh-config", ssh.ssh_config), ("--known-hosts", ssh.known_hosts)):
        if value is not None:
            flags += [flag, str(value)]
    if ssh.accept_new_host_keys:
        flags.append("--accept-new-host-keys")
    return [*flags, "--connect-timeout", f"{ssh.connect_timeout_s:g}"]


def level_of(args: argparse.Namespace, timings: Mapping) -> int:
    level = getattr(args, "dcgm_level", None)
    return int(level if level is not None else timings.get("retest_dcgm_level", DEFAULT_DCGM_LEVEL))
