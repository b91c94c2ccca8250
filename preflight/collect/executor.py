"""Run probes on hosts, over SSH or on this machine, and hand back every result.

Failures are results, never exceptions: an unreachable host, refused authentication, an
unknown host key, a command that hangs past its timeout all come back as ``ProbeResult``
records, and one slow or dead host never holds up the others (a thread per host, bounded by
``parallel``).

Connections are fabric ``Connection`` objects, so ``~/.ssh/config`` (HostName, User, Port,
IdentityFile, ConnectTimeout, ProxyJump) is honoured as users expect. Two things fabric does
by default are wrong for a fleet tool and are overridden here:
- it auto-accepts unknown host keys; we load known_hosts and reject unknown keys unless the
  user asked for ``--accept-new-host-keys``;
- its ``run`` decodes output to text; the bundle contract is byte for byte, so commands run
  on a raw paramiko channel and stdout is kept as bytes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import paramiko
from fabric import Config, Connection

from preflight.model import Host, ProbeResult
from preflight.collect.probes import TIMEOUT_EXIT, Probe

# Extra seconds the controller waits beyond a probe's own limit before it gives up on the
# channel; the node's `timeout -k 5` should have ended the command by then.
_GRACE_S = 10.0


@dataclass(frozen=True)
class SshOptions:
    user: str | None = None
    port: int | None = None
    identity: Path | None = None
    ssh_config: Path | None = None
    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    connect_timeout_s: float = 10.0


@dataclass(frozen=True)
class ExecPlan:
    probes: tuple[Probe, ...]
    timeout_s: float = 30.0
    parallel: int = 64
    ssh: SshOptions = field(default_factory=SshOptions)

    def limit_for(self, probe: Probe) -> float:
        return probe.timeout_s if probe.timeout_s is not None else self.timeout_s


OnResult = Callable[[ProbeResult], None]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_fleet(hosts: Iterable[Host], plan: ExecPlan, on_result: OnResult) -> None:
    """Run every probe on every host; ``on_result`` gets each result as soon as it exists.

    ``on_result`` is called from worker threads; it must be thread-safe for distinct
    (host, probe) pairs (writing one file per result is).
    """
    hosts = list(hosts)
    if not hosts:
        return
    workers = max(1, min(plan.parallel, len(hosts)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="preflight-host") as pool:
        futures = [pool.submit(_run_host_safely, h, plan, on_result) for h in hosts]
        for f in futures:
            f.result()


def run_local(plan: ExecPlan, on_result: OnResult, host_name: str) -> None:
    for probe in plan.probes:
        on_result(_run_local_probe(probe, plan.limit_for(probe), host_name))


def _run_host_safely(host: Host, plan: ExecPlan, on_result: OnResult) -> None:
    delivered: set[str] = set()

    def deliver(result: ProbeResult) -> None:
        delivered.add(result.probe)
        on_result(result)

    try:
        _run_host(host, plan, deliver)
    except Exception as exc:  # noqa: BLE001 - a host's failure must never stop the fleet
        for probe in plan.probes:
            if probe.id not in delivered:
                on_result(_failed(probe, host.name, f"internal error: {type(exc).__name__}: {exc}"))


def _run_host(host: Host, plan: ExecPlan, on_result: OnResult) -> None:
    started = now_iso()
    try:
        conn = _connect(host, plan.ssh)
    except Exception as exc:  # noqa: BLE001 - every way of not connecting is a result
        reason = describe_connect_error(exc)
        for probe in plan.probes:
            on_result(_failed(probe, host.name, reason, started))
        return
    try:
        for i, probe in enumerate(plan.probes):
            result = _run_remote_probe(conn, probe, plan.limit_for(probe), host.name)
            on_result(result)
            if result.error and not conn.is_connected:
                # The transport died mid-run: the rest cannot run on this connection.
                for rest in plan.probes[i + 1 :]:
                    on_result(_failed(rest, host.name, f"connection lost: {result.error}"))
                return
    finally:
        conn.close()


def _connect(host: Host, ssh: SshOptions) -> Connection:
    overrides: dict = {"load_ssh_configs": True}
    if ssh.ssh_config:
        overrides["ssh_config_path"] = str(ssh.ssh_config)
    config = Config(overrides=overrides)
    if ssh.ssh_config:
        # Config only loads the file when asked to; a user-given file replaces ~/.ssh/config.
        config.set_runtime_ssh_path(str(ssh.ssh_config))
        config.load_ssh_config()
    connect_kwargs: dict = {"allow_agent": True, "look_for_keys": True}
    if ssh.identity:
        connect_kwargs["key_filename"] = [str(ssh.identity)]
    conn = Connection(
        host.name,
        user=host.user or ssh.user,
        port=host.port or ssh.port,
        config=config,
        connect_timeout=int(ssh.connect_timeout_s),
        connect_kwargs=connect_kwargs,
    )
    client = conn.client
    _load_known_hosts(client, conn.ssh_config, ssh.known_hosts)
    client.set_missing_host_key_policy(
        paramiko.AutoAddPolicy() if ssh.accept_new_host_keys else paramiko.RejectPolicy()
    )
    conn.open()
    return conn


def _load_known_hosts(client: paramiko.SSHClient, host_config: dict, extra: Path | None) -> None:
    files = []
    if extra:
        files.append(extra)
    for name in str(host_config.get("userknownhostsfile", "")).split():
        files.append(Path(os.path.expanduser(name)))
    if not files:
        files.append(Path.home() / ".ssh" / "known_hosts")
    files.append(Path("/etc/ssh/ssh_known_hosts"))
    for path in files:
        if path.is_file():
            # "system" keys are read-only to paramiko: it never rewrites the user's file.
            client.load_system_host_keys(str(path))


def describe_connect_error(exc: BaseException) -> str:
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return f"host key unknown: {exc} (add it to known_hosts, or pass --accept-new-host-keys)"
    if isinstance(exc, paramiko.BadHostKeyException):
        return f"host key mismatch: {exc}"
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication failed: {exc}"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "connect timed out"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return f"connection refused: {exc}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host name: {exc.strerror}"
    if isinstance(exc, OSError):
        return f"connect failed: {exc.strerror or exc}"
    return f"connect failed: {type(exc).__name__}: {exc}"


def open_connection(host: Host, ssh: SshOptions) -> Connection:
    """An open connection with this module's host-key policy, for callers that run their own
    commands (the soak controller); raises on failure, ``describe_connect_error`` says why."""
    return _connect(host, ssh)


def run_on_connection(conn: Connection, command: str, stdin: bytes, timeout_s: float,
                      ) -> tuple[bytes, bytes, int | None, bool]:
    """Run one already-quoted command line, feeding it ``stdin``; returns (stdout, stderr,
    exit code, timed out). Channel failures raise; the caller decides whether to reconnect."""
    chan = conn.transport.open_session(timeout=timeout_s)
    chan.settimeout(timeout_s)
    chan.exec_command(command)
    if stdin:
        chan.sendall(stdin)
    chan.shutdown_write()
    return _drain(chan, deadline=time.monotonic() + timeout_s)


def _run_remote_probe(conn: Connection, probe: Probe, limit_s: float, host: str) -> ProbeResult:
    started = now_iso()
    t0 = time.monotonic()
    command = probe.shell_command(limit_s)
    try:
        chan = conn.transport.open_session(timeout=limit_s)
        chan.exec_command(command)
        stdout, stderr, exit_code, timed_out = _drain(chan, deadline=t0 + limit_s + _GRACE_S)
    except Exception as exc:  # noqa: BLE001 - channel failures are results too
        return ProbeResult(
            probe.id, host, probe.argv, None, "", None, started,
            round(time.monotonic() - t0, 3), False, f"ssh channel failed: {type(exc).__name__}: {exc}",
        )
    timed_out = timed_out or exit_code == TIMEOUT_EXIT
    return ProbeResult(
        probe.id, host, probe.argv, stdout, stderr.decode("utf-8", "replace"),
        exit_code, started, round(time.monotonic() - t0, 3), timed_out,
    )


def _drain(chan: paramiko.Channel, deadline: float) -> tuple[bytes, bytes, int | None, bool]:
    """Read a command's stdout and stderr to the end; (stdout, stderr, exit code, timed out).

    The exit status can arrive while output is still queued behind a full flow-control
    window (sshd sends it as soon as the process ends), so "done" means end-of-file on the
    channel *and* the exit status, not the status alone: stopping at the status truncated
    large outputs (a 160 KiB `nvidia-smi -q -x`) under load.
    """
    out, err = bytearray(), bytearray()
    chan.settimeout(0.05)  # recv() wakes as soon as data arrives; the timeout bounds a poll
    eof = False
    while True:
        while chan.recv_stderr_ready():
            err.extend(chan.recv_stderr(1 << 16))
        if not eof:
            try:
                data = chan.recv(1 << 16)
            except socket.timeout:
                data = None
            if data == b"":
                eof = True
            elif data:
                out.extend(data)
        if eof and chan.exit_status_ready():
            while chan.recv_stderr_ready():
                err.extend(chan.recv_stderr(1 << 16))
            break
        if time.monotonic() > deadline:
            chan.close()
            return bytes(out), bytes(err), None, True
        if eof:
            chan.status_event.wait(0.05)
    status = chan.recv_exit_status()
    chan.close()
    return bytes(out), bytes(err), status, False


def _run_local_probe(probe: Probe, limit_s: float, host: str) -> ProbeResult:
    started = now_iso()
    t0 = time.monotonic()
    try:
        # A new session so that a timeout can kill the tool and everything it spawned.
        proc = subprocess.Popen(
            probe.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
    except FileNotFoundError:
        return ProbeResult(probe.id, host, probe.argv, None, f"{probe.argv[0]}: not found", 127,
                           started, 0.0, False)
    except OSError as exc:
        return ProbeResult(probe.id, host, probe.argv, None, str(exc), 126, started, 0.0, False)
    try:
        stdout, stderr = proc.communicate(timeout=limit_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        timed_out = True
    return ProbeResult(
        probe.id, host, probe.argv, stdout, stderr.decode("utf-8", "replace"),
        None if timed_out else proc.returncode, started,
        round(time.monotonic() - t0, 3), timed_out,
    )


def _failed(probe: Probe, host: str, reason: str, started: str | None = None) -> ProbeResult:
    return ProbeResult(probe.id, host, probe.argv, None, "", None, started or now_iso(), 0.0, False, reason)
