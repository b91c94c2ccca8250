"""A simulated GPU cluster on this machine, for end-to-end tests over real SSH.

Each simulated host is a network namespace holding one end of a veth pair whose other end is a
port of a bridge in the root namespace (``eth0``; with ``rails=R``, R-1 more links ``eth1``... on
bridges of their own, each rail its own subnet 127.(77+r).K.0/24, for the fabric tests' rails). Addresses are loopback addresses: host N of a cluster is
127.77.K.N/24 and the bridge is 127.77.K.254. They are routable because both ends set
`route_localnet=1` and add `127.77.K.0/24` to the `local` routing table, where it is more specific
than `127.0.0.0/8 dev lo`; no packet can leave the machine (IPv6 is switched off on these links so
that not even link-local chatter appears).

In its namespace each host runs a real OpenSSH sshd, started under `unshare --mount --uts` with
  - /usr/local/bin (first on sshd's PATH) replaced by a directory of generated command shims,
  - /var/tmp a tmpfs of its own (what a shim writes there stays on its host),
  - /sys/class overlaid read-only with the host's own files, when it has any,
  - root's home directory moved (in a private copy of /etc/passwd) to an empty per-host directory,
    so this machine's dotfiles do not leak into the node,
  - its own hostname.
A shim answers exactly the command lines recorded for its tool and nothing else. A tool with no
recorded command line gets no shim, so the node's shell reports it missing (exit 127) as on a node
without it; note that tools this machine really has (modinfo, dmesg, lspci, ...) then run for real.
Mounts live in the hosts' private mount namespaces and vanish with their processes.

Concurrent clusters, also from other processes, each lease one subnet K: an flock on
/run/simcluster/K.json, held while the cluster lives, whose content lists what the cluster
created. A lease file that nobody holds but that lists resources belongs to a run that died
without tearing down, so those resources are provably ours: the next lease of K removes them.

Needs root, iproute2, util-linux (unshare, flock), the OpenSSH server and client, and the veth,
bridge and overlay features of the kernel.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

SSHD = "/usr/sbin/sshd"
_NET = "127.77"
_BRIDGE_HOST = 254
_MAX_HOSTS = 253
_STATE_DIR = Path("/run/simcluster")
_START_TIMEOUT_S = 10.0
# How long teardown waits for the kernel to finish destroying a deleted link. Deleting a namespace
# or a link unlists the device at once, but its sysfs entry stays until the kernel has dropped
# every reference to it (netdev_run_todo, after the namespace's cleanup work has run): milliseconds
# on an idle machine, seconds on a loaded one. The kernel itself warns only after 10 s
# ("unregister_netdevice: waiting for ... to become free").
_LINK_GONE_S = 60.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_TOOL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
# The shims and the callers' wrappers (`timeout 30 CMD`, `sh -c ...`) run these; a shim must not hide them.
_RESERVED_TOOLS = frozenset({"sh", "bash", "env", "cat", "sleep", "timeout", "flock", "hostname"})


class SimClusterError(RuntimeError):
    """The simulated cluster could not be built or torn down; the message says which command failed."""


@dataclass(frozen=True)
class Reply:
    """What one invocation of a shimmed command does."""

    stdout: str | Path = ""  # text, or a file whose bytes are written to stdout verbatim
    stderr: str = ""
    exit_code: int = 0
    sleep_s: float = 0  # before printing; longer than the caller's timeout makes a hang
    # (path relative to /sys/class, new content) files of the host's sysfs this invocation rewrites
    # after printing: a counter that grows while a benchmark runs, read again after it.
    sysfs_writes: tuple[tuple[str, str], ...] = ()
    # After this invocation the host's shims are those of the host named here: a GPU reset or a
    # service restart that clears the node's fault (it answers as that healthy host from then on).
    becomes: str | None = None
    # (absolute path on the host, file whose bytes it gets) files this invocation writes after its
    # sleep: a tool whose output is a file (nvidia-bug-report.sh --output-file). Each host has a
    # /var/tmp of its own (a tmpfs in its mount namespace), as separate machines do.
    files: tuple[tuple[str, Path], ...] = ()


@dataclass(frozen=True)
class SimHost:
    """One simulated node. `commands` maps a full command line ("nvidia-smi -q -x") to its reply,
    or to replies used in turn (cycling) on successive invocations; `sysfs` maps paths relative to
    /sys/class to file contents; a `down` host has its address but no sshd (connection refused)."""

    name: str
    commands: dict[str, Reply | list[Reply]] = field(default_factory=dict)
    sysfs: dict[str, str] = field(default_factory=dict)
    down: bool = False


@dataclass(frozen=True)
class _Resources:
    """What one cluster creates outside its files, as recorded in its lease file."""

    bridge: str
    links: tuple[str, ...]  # the hosts' eth0 ends, in host order, then each extra rail's
    netns: tuple[str, ...]
    simdir: str
    rail_bridges: tuple[str, ...] = ()  # one bridge per extra rail (eth1, eth2, ...)


class SimCluster:
    """Context manager: builds the hosts on enter, removes every trace of them on exit.

    After entering: `hosts_file` (one alias per line), `ssh_config` (OpenSSH client config, one
    block per alias), `known_hosts` (every host's real ed25519 key under its alias and address),
    `identity` (the client's private key, authorized on every host), `bridge` and `namespaces`
    (for `ip netns exec`), and `address(name)`.
    """

    def __init__(self, hosts: list[SimHost], workdir: Path, rails: int = 1):
        _check_hosts(hosts)
        if not 1 <= rails <= 8:
            raise SimClusterError(f"rails={rails}: a simulated host has 1 to 8 links")
        self.hosts = tuple(hosts)
        self.rails = rails
        self.workdir = Path(workdir)
        self._number = {host.name: n for n, host in enumerate(hosts, start=1)}
        self._lease: _Lease | None = None
        self._resources: _Resources | None = None

    def address(self, name: str, rail: int = 0) -> str:
        """The host's address on ``eth<rail>``."""
        if self._lease is None:
            raise SimClusterError("the cluster is not started: enter it first")
        return f"{_rail_net(rail)}.{self._lease.subnet}.{self._number[name]}"

    def link_of(self, name: str, rail: int = 0) -> str:
        """The root namespace's end of the host's veth pair on ``eth<rail>`` (the bridge port toward the host)."""
        if self._resources is None:
            raise SimClusterError("the cluster is not started: enter it first")
        return self._resources.links[rail * len(self.hosts) + self._number[name] - 1]

    def workdir_of(self, name: str) -> Path:
        """The host's own directory: its shims (bin/), sshd config, keys and `sshd.pid`."""
        if self._resources is None:
            raise SimClusterError("the cluster is not started: enter it first")
        return Path(self._resources.simdir) / "hosts" / name

    def __enter__(self) -> SimCluster:
        if self._lease is not None:
            raise SimClusterError("a SimCluster can be entered only once")
        _LIVE.add(self)
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        leftovers = self._stop()
        # Never mask the test's own failure; the lease file keeps the leftovers for the next run.
        if leftovers and exc_type is None:
            raise SimClusterError("teardown left behind: " + "; ".join(leftovers))

    def _start(self) -> None:
        # sshd refuses to start without its privilege separation directory, which only its service makes.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self._lease = _Lease()
        subnet, pid = self._lease.subnet, os.getpid()
        self.workdir.mkdir(parents=True, exist_ok=True)
        simdir = Path(tempfile.mkdtemp(prefix="simcluster-", dir=self.workdir)).resolve()
        if re.search(r"[\s:,\\]", str(simdir)):
            raise SimClusterError(f"workdir path {simdir} has characters overlayfs options cannot carry")
        numbers = range(1, len(self.hosts) + 1)
        self._resources = _Resources(
            bridge=f"sc{subnet}b{pid}",
            links=tuple(f"sc{subnet}v{n}" for n in numbers)
            + tuple(f"sc{subnet}r{r}v{n}" for r in range(1, self.rails) for n in numbers),
            netns=tuple(f"simcluster-{pid}-{subnet}-{n}" for n in numbers),
            simdir=str(simdir),
            rail_bridges=tuple(f"sc{subnet}c{r}{pid}" for r in range(1, self.rails)),
        )
        self._lease.record(self._resources)
        self.bridge = self._resources.bridge
        self.namespaces = dict(zip((h.name for h in self.hosts), self._resources.netns, strict=True))
        self._write_files(simdir)
        _network_up(self._resources, subnet)
        self._hosts_up(simdir)

    def _stop(self) -> list[str]:
        leftovers = _remove(self._resources) if self._resources else []
        if self._lease is not None:
            if not leftovers:
                self._lease.record(None)
            self._lease.release()
        _LIVE.discard(self)
        return leftovers

    def _write_files(self, simdir: Path) -> None:
        self.identity = simdir / "id_ed25519"
        self.known_hosts = simdir / "known_hosts"
        self.ssh_config = simdir / "ssh_config"
        self.hosts_file = simdir / "hosts.txt"
        host_dirs = {host.name: simdir / "hosts" / host.name for host in self.hosts}
        keys = [self.identity] + [d / "ssh_host_ed25519_key" for d in host_dirs.values()]
        for key in keys:
            key.parent.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(_keygen, keys))
        authorized_keys = simdir / "authorized_keys"
        shutil.copyfile(self.identity.with_suffix(".pub"), authorized_keys)
        shadow = _unlocked_shadow(simdir)
        subnet = self._lease.subnet
        for host in self.hosts:
            _write_host(host, host_dirs[host.name], self.address(host.name), subnet, authorized_keys, shadow,
                        self.rails)
        self.known_hosts.write_text("".join(
            f"{h.name},{self.address(h.name)} {_public_key(host_dirs[h.name] / 'ssh_host_ed25519_key')}\n"
            for h in self.hosts
        ))
        self.ssh_config.write_text(
            f"# simcluster: OpenSSH client config for {len(self.hosts)} simulated hosts\n"
            + "".join(self._ssh_config_block(h.name) for h in self.hosts)
        )
        self.hosts_file.write_text(
            f"# simcluster: {len(self.hosts)} simulated hosts; aliases resolve through {self.ssh_config}\n"
            + "".join(f"{h.name}\n" for h in self.hosts)
        )

    def _ssh_config_block(self, name: str) -> str:
        return (
            f"Host {name}\n"
            f"    HostName {self.address(name)}\n"
            "    Port 22\n"
            "    User root\n"
            f"    IdentityFile {self.identity}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n"
            "    ConnectTimeout 5\n"
            "    LogLevel ERROR\n"
        )

    def _hosts_up(self, simdir: Path) -> None:
        def up(host: SimHost) -> None:
            hostdir = simdir / "hosts" / host.name
            _run(
                ["ip", "netns", "exec", self.namespaces[host.name], "unshare", "--mount", "--uts",
                 "/bin/sh", "-ex", str(hostdir / "up.sh")],
                what=f"bring-up of host {host.name}",
                log=hostdir / "sshd.log",
            )

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(up, self.hosts))
        _wait_for_sshd({h.name: simdir / "hosts" / h.name for h in self.hosts if not h.down})


class _Lease:
    """Exclusive claim on subnet 127.77.K.0/24 for one cluster, also across processes."""

    def __init__(self) -> None:
        _STATE_DIR.mkdir(parents=True, exist_ok=True)
        # Sweep every dead run's leftovers, not only those under the subnet taken here.
        for path in sorted(_STATE_DIR.glob("*.json")):
            if (fd := _lock(path)) is not None:
                try:
                    _clean_stale(fd, path)
                finally:
                    os.close(fd)
        for subnet in range(256):
            path = _STATE_DIR / f"{subnet}.json"
            if (fd := _lock(path)) is not None:
                self.subnet, self._fd = subnet, fd
                try:
                    _clean_stale(fd, path)  # its run died since the sweep
                except BaseException:
                    self.release()
                    raise
                return
        raise SimClusterError(f"all 256 subnets {_NET}.0-255.0/24 are leased by running clusters")

    def record(self, resources: _Resources | None) -> None:
        """Write down what the cluster owns before creating it, so a crash leaves a cleanable trail."""
        os.ftruncate(self._fd, 0)
        if resources is not None:
            os.pwrite(self._fd, json.dumps(asdict(resources)).encode(), 0)

    def release(self) -> None:
        # The file stays: unlinking a lock file lets two processes each lock a different inode.
        os.close(self._fd)


def _lock(path: Path) -> int | None:
    """An open descriptor of a lease file, locked by us, or None when a live cluster holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _clean_stale(fd: int, path: Path) -> None:
    """Remove what a lease file we hold still lists: its owner died without tearing down."""
    stale = os.pread(fd, 1 << 20, 0)
    if not stale:
        return
    leftovers = _remove(_Resources(**json.loads(stale)))
    if leftovers:
        raise SimClusterError(f"cannot clean up the dead run's cluster listed in {path}: " + "; ".join(leftovers))
    os.ftruncate(fd, 0)


_LIVE: set[SimCluster] = set()


@atexit.register
def _stop_live_clusters() -> None:
    for cluster in list(_LIVE):
        cluster._stop()


def _check_hosts(hosts: list[SimHost]) -> None:
    if not 1 <= len(hosts) <= _MAX_HOSTS:
        raise SimClusterError(f"a cluster has 1 to {_MAX_HOSTS} hosts, not {len(hosts)}")
    names = [host.name for host in hosts]
    for name in names:
        if not _NAME.fullmatch(name):
            raise SimClusterError(f"host name {name!r} is not a valid hostname and ssh alias")
    if len(set(names)) != len(names):
        raise SimClusterError(f"host names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
    for host in hosts:
        for path in host.sysfs:
            parts = Path(path).parts
            if Path(path).is_absolute() or not parts or ".." in parts:
                raise SimClusterError(f"{host.name}: sysfs path {path!r} must be relative to /sys/class")


def _recordings(host: SimHost) -> dict[str, list[tuple[list[str], list[Reply]]]]:
    """The host's recorded command lines grouped by tool: tool -> [(arguments, replies)]."""
    by_tool: dict[str, list[tuple[list[str], list[Reply]]]] = {}
    seen: set[tuple[str, ...]] = set()
    for line, reply in host.commands.items():
        argv = shlex.split(line)
        if not argv or not _TOOL.fullmatch(argv[0]) or argv[0] in _RESERVED_TOOLS:
            raise SimClusterError(f"{host.name}: cannot shim command line {line!r}")
        if tuple(argv) in seen:
            raise SimClusterError(f"{host.name}: command line {line!r} is recorded twice")
        seen.add(tuple(argv))
        replies = reply if isinstance(reply, list) else [reply]
        if not replies:
            raise SimClusterError(f"{host.name}: command line {line!r} has an empty list of replies")
        by_tool.setdefault(argv[0], []).append((argv[1:], replies))
    return by_tool


def write_shims(host: SimHost, hostdir: Path) -> Path:
    """The host's command shims in ``hostdir/bin`` (returned), with the files they play. Put first
    on PATH, the directory makes this machine answer as the host does, without a namespace or
    sshd: how the node-side commands (healthcheck, prolog, run --local) are run on a simulated
    node by tests and bench/bench_node.py. Its /sys/class stays this machine's."""
    _check_hosts([host])
    bin_dir, replies_dir, state_dir = hostdir / "bin", hostdir / "replies", hostdir / "state"
    for directory in (bin_dir, replies_dir, state_dir):
        directory.mkdir(parents=True)
    sysfs_dir = hostdir / "sysfs"
    for tool, recordings in _recordings(host).items():
        shim = bin_dir / tool
        shim.write_text(_shim(host.name, tool, recordings, replies_dir, state_dir, sysfs_dir))
        shim.chmod(0o755)
    return bin_dir


def _write_host(host: SimHost, hostdir: Path, address: str, subnet: int, authorized_keys: Path,
                shadow: Path | None, rails: int = 1) -> None:
    write_shims(host, hostdir)
    sysfs_dir = hostdir / "sysfs"
    home = hostdir / "home"
    home.mkdir()
    (hostdir / "passwd").write_text(_passwd_with_root_home(home))
    for path, content in host.sysfs.items():
        target = sysfs_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    (hostdir / "sshd_config").write_text(_sshd_config(hostdir, address, authorized_keys))
    (hostdir / "up.sh").write_text(_up_script(host, hostdir, address, subnet, shadow, rails))


def _shim(host: str, tool: str, recordings: list[tuple[list[str], list[Reply]]],
          replies_dir: Path, state_dir: Path, sysfs_dir: Path) -> str:
    lines = [
        "#!/bin/sh",
        f"# simcluster: {tool} on host {host} answers only the command lines recorded below.",
        "turn() {  # turn COUNTER N: this invocation's turn (0..N-1, cycling) among N replies",
        '\t( flock 9; n=$(cat "$1"); echo $((${n:-0} + 1)) >"$1"; echo $((${n:-0} % $2)) ) 9>>"$1"',
        "}",
    ]
    for index, (args, replies) in enumerate(recordings):
        test = " && ".join([f'[ "$#" -eq {len(args)} ]']
                           + [f'[ "${{{i}}}" = {shlex.quote(a)} ]' for i, a in enumerate(args, start=1)])
        plays = [_play(reply, replies_dir / f"{tool}.{index}.{turn}.out", sysfs_dir)
                 for turn, reply in enumerate(replies)]
        lines.append(f"if {test}; then")
        if len(plays) == 1:
            lines.append(f"\t{plays[0]}")
        else:
            counter = shlex.quote(str(state_dir / f"{tool}.{index}.count"))
            lines.append(f"\tcase $(turn {counter} {len(plays)}) in")
            lines += [f"\t{turn}) {play} ;;" for turn, play in enumerate(plays)]
            lines.append("\tesac")
        lines.append("fi")
    lines += [
        "{ printf 'simcluster: no recorded reply for: %s' \"${0##*/}\"; printf ' %s' \"$@\"; echo; } >&2",
        "exit 64",
    ]
    return "\n".join(lines) + "\n"


def _play(reply: Reply, text_file: Path, sysfs_dir: Path) -> str:
    """One shell line that performs `reply`; text stdout is stored in `text_file`."""
    if not 0 <= reply.exit_code <= 255:
        raise SimClusterError(f"exit code {reply.exit_code} is outside 0..255")
    steps = []
    if reply.sleep_s:
        steps.append(f"sleep {reply.sleep_s:.3f}")
    if isinstance(reply.stdout, Path):
        source = reply.stdout.resolve()
        if not source.is_file():
            raise SimClusterError(f"reply file {reply.stdout} does not exist")
        steps.append(f"cat {shlex.quote(str(source))}")
    elif reply.stdout:
        text_file.write_text(reply.stdout)
        steps.append(f"cat {shlex.quote(str(text_file))}")
    if reply.stderr:
        steps.append(f"printf %s {shlex.quote(reply.stderr)} >&2")
    for path, source in reply.files:
        if not Path(path).is_absolute() or not Path(source).is_file():
            raise SimClusterError(f"file {path!r} of a reply: an absolute path on the host, from an existing file "
                                  f"(not {source})")
        steps.append(f"cat {shlex.quote(str(Path(source).resolve()))} >{shlex.quote(path)}")
    for n, (path, content) in enumerate(reply.sysfs_writes):
        # The overlay's lower layer, which the host's /sys/class shows: a file there changes in place.
        parts = Path(path).parts
        if Path(path).is_absolute() or not parts or ".." in parts:
            raise SimClusterError(f"sysfs write {path!r} must be relative to /sys/class")
        source = text_file.with_name(f"{text_file.name}.sysfs{n}")
        source.write_text(content)
        steps.append(f"cat {shlex.quote(str(source))} >{shlex.quote(str(sysfs_dir / path))}")
    if reply.becomes:
        # Each shim replaced by a new file (cp, then mv): the one running now keeps its own.
        mine, theirs = text_file.parent.parent / "bin", text_file.parent.parent.parent / reply.becomes / "bin"
        steps.append(f'for f in {shlex.quote(str(theirs))}/*; do cp "$f" {shlex.quote(str(mine))}/.becomes && '
                     f'mv {shlex.quote(str(mine))}/.becomes {shlex.quote(str(mine))}/"${{f##*/}}"; done')
    steps.append(f"exit {reply.exit_code}")
    return "; ".join(steps)


def _sshd_config(hostdir: Path, address: str, authorized_keys: Path) -> str:
    lines = [
        f"# simcluster: sshd of the simulated host at {address}",
        f"ListenAddress {address}:22",
        f"HostKey {hostdir / 'ssh_host_ed25519_key'}",
        f"PidFile {hostdir / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "UseDNS no",
        "StrictModes no",
        "LogLevel ERROR",
        # A controller opens many connections and channels at once; the defaults (10, 10) drop some.
        "MaxStartups 1024",
        "MaxSessions 1024",
        "PrintMotd no",
        "Subsystem sftp internal-sftp",
    ]
    if _sshd_version() >= (9, 8):
        # Refused host keys and unauthenticated probes would otherwise get 127.77.K.254 blocked.
        lines.append("PerSourcePenalties no")
    return "\n".join(lines) + "\n"


def _up_script(host: SimHost, hostdir: Path, address: str, subnet: int, shadow: Path | None, rails: int = 1) -> str:
    """Shell script run inside the host's network namespace, under `unshare --mount --uts`."""
    q = shlex.quote
    lines = [
        f"# simcluster: bring up {host.name} at {address}",
        "ip link set lo up",
    ]
    if Path("/proc/sys/net/ipv6").exists():
        lines.append("echo 1 >/proc/sys/net/ipv6/conf/eth0/disable_ipv6")
    lines += [
        f"ip addr add {address}/24 dev eth0",
        "echo 1 >/proc/sys/net/ipv4/conf/eth0/route_localnet",
        "ip link set eth0 up",
        f"ip route add table local {_NET}.{subnet}.0/24 dev eth0",
    ]
    number = address.rsplit(".", 1)[1]
    for r in range(1, rails):
        dev, net = f"eth{r}", _rail_net(r)
        if Path("/proc/sys/net/ipv6").exists():
            lines.append(f"echo 1 >/proc/sys/net/ipv6/conf/{dev}/disable_ipv6")
        lines += [f"ip addr add {net}.{subnet}.{number}/24 dev {dev}",
                  f"echo 1 >/proc/sys/net/ipv4/conf/{dev}/route_localnet", f"ip link set {dev} up",
                  f"ip route add table local {net}.{subnet}.0/24 dev {dev}"]
    if host.down:
        return "\n".join(lines) + "\n"
    lines.append(f"mount --bind {q(str(hostdir / 'bin'))} /usr/local/bin")
    if host.sysfs:
        lines.append(f"mount -t overlay simcluster-sysfs -o ro,lowerdir={hostdir / 'sysfs'}:/sys/class /sys/class")
    lines.append(f"mount --bind {q(str(hostdir / 'passwd'))} /etc/passwd")
    lines.append("mount -t tmpfs -o size=64m,mode=1777 simcluster-tmp /var/tmp")
    if shadow is not None:
        lines.append(f"mount --bind {q(str(shadow))} /etc/shadow")
    lines += [
        f"echo {q(host.name)} >/proc/sys/kernel/hostname",
        f"exec {SSHD} -f {q(str(hostdir / 'sshd_config'))} -E {q(str(hostdir / 'sshd.log'))}",
    ]
    return "\n".join(lines) + "\n"


def _passwd_with_root_home(home: Path) -> str:
    """/etc/passwd with root's home moved to `home`, so that sessions on a simulated host do not run
    this machine's ~/.bashrc (its PATH and its startup time would leak into every command)."""
    lines = Path("/etc/passwd").read_text().splitlines(keepends=True)
    return "".join(re.sub(r"^(root:[^:]*:[^:]*:[^:]*:[^:]*:)[^:]*:", rf"\g<1>{home}:", line) for line in lines)


def _unlocked_shadow(simdir: Path) -> Path | None:
    """sshd without PAM refuses a root whose password field starts with "!" (Ubuntu's default), even
    for key logins; such machines get a copy of /etc/shadow with "*" (no password, not locked),
    mounted only inside the simulated hosts."""
    try:
        lines = Path("/etc/shadow").read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return None
    fixed = [re.sub(r"^root:![^:]*:", "root:*:", line) for line in lines]
    if fixed == lines:
        return None
    copy = simdir / "shadow"
    copy.write_text("".join(fixed))
    copy.chmod(0o600)
    return copy


@cache
def _sshd_version() -> tuple[int, int]:
    proc = subprocess.run([SSHD, "-V"], capture_output=True, text=True, timeout=30)
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", proc.stdout + proc.stderr)
    if not match:
        raise SimClusterError(f"cannot tell the version of {SSHD}: {(proc.stdout + proc.stderr).strip()}")
    return int(match[1]), int(match[2])


def _keygen(path: Path) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"simcluster {path.parent.name}", "-f", str(path)],
         what="host key generation")


def _public_key(private_key: Path) -> str:
    """`TYPE BASE64` of the key pair's public half, without its comment."""
    kind, blob = private_key.with_name(private_key.name + ".pub").read_text().split()[:2]
    return f"{kind} {blob}"


def _network_up(res: _Resources, subnet: int) -> None:
    # Links are created down, so no frame (not even IPv6 link-local) is sent before IPv6 is off.
    bridges = (res.bridge, *res.rail_bridges)
    hosts = len(res.netns)
    create = [f"link add {bridge} type bridge" for bridge in bridges]
    create += [f"netns add {netns}" for netns in res.netns]
    for i, link in enumerate(res.links):
        create.append(f"link add {link} type veth peer name eth{i // hosts} netns {res.netns[i % hosts]}")
    _ip_batch(create)
    for dev in (*bridges, *res.links):
        ipv6 = Path(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6")
        if ipv6.exists():
            ipv6.write_text("1\n")
    for bridge in bridges:
        Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet").write_text("1\n")
    up = []
    for r, bridge in enumerate(bridges):
        net = _rail_net(r)
        up += [f"addr add {net}.{subnet}.{_BRIDGE_HOST}/24 dev {bridge}", f"link set {bridge} up",
               f"route add table local {net}.{subnet}.0/24 dev {bridge}"]
    up += [f"link set {link} master {bridges[i // hosts]} up" for i, link in enumerate(res.links)]
    _ip_batch(up)


def _rail_net(rail: int) -> str:
    """The first two octets of rail ``rail``'s subnets: 127.77 for eth0, 127.78 for eth1, ..."""
    first, second = _NET.split(".")
    return f"{first}.{int(second) + rail}"


def _wait_for_sshd(host_dirs: dict[str, Path]) -> None:
    """sshd writes its pid file after it listens; a line in its log (LogLevel ERROR) means it failed."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    pending = dict(host_dirs)
    while pending:
        for name, hostdir in list(pending.items()):
            log = hostdir / "sshd.log"
            if log.exists() and log.stat().st_size:
                raise SimClusterError(f"sshd of host {name} failed: {log.read_text().strip()}")
            pid_file = hostdir / "sshd.pid"
            if pid_file.exists() and pid_file.stat().st_size:
                del pending[name]
        if pending and time.monotonic() > deadline:
            raise SimClusterError(f"sshd did not start within {_START_TIMEOUT_S:.0f} s on: {', '.join(pending)}")
        time.sleep(0.01)


def _remove(res: _Resources) -> list[str]:
    """Remove everything `res` lists; returns what is still there afterwards."""
    survivors = _kill_processes_in(res.netns)
    # Deleting a namespace lets the kernel destroy its veth pair in one batch with the others, ten
    # times faster than deleting the links; a link still there after that (its namespace is kept
    # alive from elsewhere) is deleted by name.
    errors = _ip_force([f"netns del {netns}" for netns in res.netns if Path(f"/run/netns/{netns}").exists()]
                       + [f"link del {dev}" for dev in (res.bridge, *res.rail_bridges) if _link_exists(dev)])
    links = (*res.links, res.bridge, *res.rail_bridges)
    still = _links_gone(links, 2.0)
    if still:  # a namespace kept alive from elsewhere keeps its veth pair: delete by name, then wait again
        errors = "\n".join(filter(None, [errors, _ip_force([f"link del {link}" for link in still])]))
        _links_gone(still, _LINK_GONE_S)
    simdir = Path(res.simdir)
    if simdir.name.startswith("simcluster-"):
        shutil.rmtree(simdir, ignore_errors=True)
    leftovers = [f"process {pid}" for pid in survivors]
    leftovers += [f"link {dev}" for dev in (*res.links, res.bridge, *res.rail_bridges) if _link_exists(dev)]
    leftovers += [f"netns {netns}" for netns in res.netns if Path(f"/run/netns/{netns}").exists()]
    leftovers += [f"directory {simdir}"] if simdir.exists() else []
    if leftovers and errors:
        leftovers.append(f"ip said: {errors}")
    return leftovers


def _link_exists(dev: str) -> bool:
    return Path(f"/sys/class/net/{dev}").exists()


def _links_gone(links: tuple[str, ...], timeout_s: float) -> tuple[str, ...]:
    """Wait until none of `links` is listed any more, at most `timeout_s`; returns those still listed."""
    deadline = time.monotonic() + timeout_s
    while (still := tuple(filter(_link_exists, links))) and time.monotonic() < deadline:
        time.sleep(0.02)
    return still


def _ip_force(commands: list[str]) -> str:
    """Run ip commands, going on past failures (teardown removes what it can); returns ip's complaints."""
    if not commands:
        return ""
    return subprocess.run(["ip", "-force", "-batch", "-"], input="\n".join(commands) + "\n",
                          capture_output=True, text=True, timeout=60).stderr.strip()


def _kill_processes_in(netns: tuple[str, ...]) -> list[int]:
    """SIGKILL every process inside the named namespaces (sshd, sessions, hung shims) and wait until
    they have exited; returns any still running after a few seconds."""
    inodes = set()
    for name in netns:
        try:
            st = os.stat(f"/run/netns/{name}")
        except FileNotFoundError:
            continue
        inodes.add((st.st_dev, st.st_ino))
    deadline = time.monotonic() + 5
    while inodes and (pids := _pids_in(inodes)):
        if time.monotonic() > deadline:
            return pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    return []


def _pids_in(inodes: set[tuple[int, int]]) -> list[int]:
    """Live processes whose network namespace is one of `inodes` (a zombie has none, so it is done)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                st = os.stat(f"/proc/{entry.name}/ns/net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in inodes:
                pids.append(int(entry.name))
    return pids


def _ip_batch(commands: list[str]) -> None:
    proc = subprocess.run(["ip", "-batch", "-"], input="\n".join(commands) + "\n",
                          capture_output=True, text=True, timeout=60)
    if proc.returncode:
        failed = re.search(r"Command failed -:(\d+)", proc.stderr)
        command = commands[int(failed[1]) - 1] if failed else "; ".join(commands)
        raise SimClusterError(f"`ip {command}` failed: {proc.stderr.strip()}")


def _run(argv: list[str], what: str, log: Path | None = None) -> None:
    """Run a bring-up command; on failure raise with the command, its stderr and `log` (where a
    daemon that has detached from stderr writes its errors)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if proc.returncode:
        logged = log.read_text().strip() if log is not None and log.exists() else ""
        raise SimClusterError(
            f"{what} failed: `{shlex.join(argv)}` exited {proc.returncode}:\n{proc.stderr.strip()}"
            + (f"\n{log}: {logged}" if logged else "")
        )
