"""``SshNode``: commands on a node over SSH, with fabric for the connection.

fabric's ``Connection`` honours ``~/.ssh/config`` (HostName, User, Port, IdentityFile,
ConnectTimeout, ProxyJump) as users expect. Two of its defaults are wrong for a fleet tool and
are overridden here:
- it auto-accepts unknown host keys; known_hosts is loaded and unknown keys are rejected unless
  the user asked for ``--accept-new-host-keys``;
- its ``run`` decodes output to text; the bundle contract is byte for byte, so commands run on a
  raw paramiko channel and stdout is kept as bytes.

A command is sent as its argv quoted with ``shlex.join`` behind ``timeout -k``, so the node
itself ends the command's process group when it overruns (a hung tool does not linger after we
give up on it); the controller stops waiting a grace period later.
"""

from __future__ import annotations

import errno
import logging
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko
from fabric import Config, Connection

from preflight.collect import known_hosts
from preflight.collect.node import KILL_AFTER_S, TIMEOUT_EXIT, CommandResult, not_run, now_iso
from preflight.collect.ssh_config import DEFAULT_PATHS, IndexedSSHConfig
from preflight.model import Host

# paramiko logs a failed handshake with its traceback; with no handler configured, Python's
# last-resort handler prints that on stderr. Every failure here is a result with its reason
# (describe_connect_error), so paramiko's own log stays silent unless a caller sets one up.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# Beyond a command's own limit, how long the controller waits for the node's `timeout` to
# have ended it and the channel to close, before it gives up on the channel.
GRACE_S = 10.0


@dataclass(frozen=True)
class SshOptions:
    user: str | None = None
    port: int | None = None
    identity: Path | None = None
    ssh_config: Path | None = None
    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    connect_timeout_s: float = 10.0


def _connect(host: Host, ssh: SshOptions) -> Connection:
    # The banner wait fits inside the connect timeout: a port that accepts and then says
    # nothing (a hung sshd) costs --connect-timeout, not paramiko's own 15 s, and fails as "no
    # banner". paramiko waits for the handshake as long as the connect timeout and then goes on
    # to authenticate regardless ("No existing session"), so the banner wait ends a little first.
    banner_s = max(ssh.connect_timeout_s / 2, ssh.connect_timeout_s - 0.5)
    connect_kwargs: dict = {"allow_agent": True, "look_for_keys": True, "banner_timeout": banner_s}
    if ssh.identity:
        connect_kwargs["key_filename"] = [str(ssh.identity)]
    conn = Connection(
        host.target,
        user=host.user or ssh.user,
        port=host.port or ssh.port,
        config=_base_config(ssh.ssh_config),
        # A float: int() made 0.5 s into 0, which paramiko reads as no timeout at all.
        connect_timeout=ssh.connect_timeout_s,
        connect_kwargs=connect_kwargs,
    )
    client = conn.client
    # paramiko looks a server's key up under this name (client.connect), so only its keys are
    # handed over, as "user" keys: paramiko never writes them back (no file is set).
    lookup_name = conn.host if conn.port == 22 else f"[{conn.host}]:{conn.port}"
    store = client.get_host_keys()
    for path in known_hosts.files_for(conn.ssh_config, ssh.known_hosts):
        for found in known_hosts.load(path).keys_for(lookup_name):
            if found.keytype not in (store.lookup(lookup_name) or {}):  # the first file's key wins
                store.add(lookup_name, found.keytype, found.key)
    client.set_missing_host_key_policy(
        paramiko.AutoAddPolicy() if ssh.accept_new_host_keys else paramiko.RejectPolicy()
    )
    conn.open()
    return conn


_parsed: dict[tuple, IndexedSSHConfig] = {}
_parsed_lock = threading.Lock()


def address_of(host: Host, ssh: SshOptions) -> str:
    """The address ssh connects to for ``host``: its config's HostName, else its target. The
    collective stage writes it beside the name, since ssh's own errors name the address."""
    try:
        return _base_config(ssh.ssh_config).base_ssh_config.lookup(host.target).get("hostname", host.target)
    except OSError:
        return host.target


def _base_config(ssh_config: Path | None) -> Config:
    """A fabric Config of its own for one connection, around the ssh config parsed once per
    file (and version of it) for the whole run: parsing it per node was a measurable share of
    the controller's time.

    The fabric Config itself is never shared. A Connection writes into its Config as it is
    built (``inline_ssh_env``), which re-merges that Config from nothing; with one Config
    shared by every node's thread, a thread reading it mid-merge failed to connect with
    "No attribute or config key found for 'user'" (1 host in 64, now and then, under load).
    A new Config costs about 0.4 ms; the parsed ssh config is only read, by any thread."""
    try:
        st = ssh_config.stat() if ssh_config else None
    except OSError:
        st = None
    key = (str(ssh_config) if ssh_config else None, st and (st.st_mtime_ns, st.st_size))
    with _parsed_lock:
        if key not in _parsed:
            if ssh_config and not ssh_config.exists():
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(ssh_config))
            # The files fabric would load (a user-given file replaces ~/.ssh/config and the
            # system's), read into a config whose lookup does not walk every node's stanza.
            _parsed[key] = IndexedSSHConfig.from_paths([ssh_config] if ssh_config else DEFAULT_PATHS)
        parsed = _parsed[key]
    return Config(overrides={"load_ssh_configs": True}, ssh_config=parsed)


def describe_connect_error(exc: BaseException) -> str:
    if isinstance(exc, paramiko.SSHException) and "protocol banner" in str(exc):
        return ("no SSH banner: the port accepted the connection but no SSH server answered "
                "(sshd hung, overloaded, or another service on the port)")
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


def remote_command(argv: Sequence[str], timeout: float) -> str:
    """The line the node's shell runs: argv quoted, bounded by `timeout` on the node itself."""
    return shlex.join(["timeout", "-k", str(KILL_AFTER_S), f"{timeout:g}", *argv])


class SshNode:
    """One SSH connection to one node, opened on first use and reopened after it breaks."""

    def __init__(self, host: Host, ssh: SshOptions):
        self.name = host.name
        self.host, self.ssh = host, ssh
        self._conn: Connection | None = None
        # Several probes of one node run at once, as channels of this one connection.
        self._lock = threading.Lock()

    def connect(self) -> str | None:
        """Open the connection now; returns why it could not be opened, else None."""
        with self._lock:
            if self._conn is not None:
                return None
            try:
                self._conn = _connect(self.host, self.ssh)
            except Exception as exc:  # noqa: BLE001 - every way of not connecting is a result
                return describe_connect_error(exc)
            return None

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.is_connected

    def run(self, argv: Sequence[str], *, stdin: bytes = b"", timeout: float,
            on_stdout: Callable[[bytes], None] | None = None) -> CommandResult:
        """``Node.run``; ``on_stdout`` is handed each piece of stdout as it arrives (the node
        runner's records are delivered as they come, not when the channel ends)."""
        argv = tuple(argv)
        started, t0 = now_iso(), time.monotonic()
        why = self.connect()
        conn = self._conn
        if why or conn is None:
            return not_run(argv, why or "connection closed", started)
        command = remote_command(argv, timeout)
        if not stdin:
            # No EOF to send: a command that finishes at once can have its channel closed by
            # sshd before a late EOF of ours arrives, and sshd drops the whole connection for
            # an EOF on a channel it no longer knows ("ieof packet referred to nonexistent
            # channel"), which concurrent probes made frequent.
            command += " </dev/null"
        try:
            chan = conn.transport.open_session(timeout=timeout)
            chan.exec_command(command)
            if stdin:
                # The command reads stdin to its end, so our EOF always comes before its exit.
                chan.sendall(stdin)
                chan.shutdown_write()
            stdout, stderr, code, timed_out = _drain(chan, t0 + timeout + KILL_AFTER_S + GRACE_S, on_stdout)
        except Exception as exc:  # noqa: BLE001 - a broken channel is a result; the next run reconnects
            if not self.connected:
                self.close()
            return CommandResult(argv, None, "", None, started, round(time.monotonic() - t0, 3), False,
                                 f"ssh channel failed: {type(exc).__name__}: {exc}")
        return CommandResult(argv, stdout, stderr.decode("utf-8", "replace"), code, started,
                             round(time.monotonic() - t0, 3), timed_out or code == TIMEOUT_EXIT)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _drain(chan: paramiko.Channel, deadline: float,
           on_stdout: Callable[[bytes], None] | None = None) -> tuple[bytes, bytes, int | None, bool]:
    """Read a command's stdout and stderr to the end; (stdout, stderr, exit code, timed out).

    The exit status can arrive while output is still queued behind a full flow-control
    window (sshd sends it as soon as the process ends), so "done" means end-of-file on the
    channel *and* the exit status, not the status alone: stopping at the status truncated
    large outputs (a 160 KiB `nvidia-smi -q -x`) under load.
    """
    out, err = bytearray(), bytearray()
    # recv() wakes as soon as stdout data arrives; the timeout only bounds how long stderr waits
    # to be drained (a thousand nodes' channels polling at 20 Hz cost the controller real CPU).
    chan.settimeout(0.5)
    eof = False
    while True:
        while chan.recv_stderr_ready():
            err.extend(chan.recv_stderr(1 << 16))
        if not eof:
            try:
                data = chan.recv(1 << 16)
            except TimeoutError:
                data = None
            if data == b"":
                eof = True
            elif data:
                out.extend(data)
                if on_stdout is not None:
                    on_stdout(data)
        if eof and chan.exit_status_ready():
            while chan.recv_stderr_ready():
                err.extend(chan.recv_stderr(1 << 16))
            break
        if time.monotonic() > deadline:
            chan.close()
            return bytes(out), bytes(err), None, True
        if eof:
            chan.status_event.wait(0.5)
    status = chan.recv_exit_status()
    chan.close()
    return bytes(out), bytes(err), status, False


