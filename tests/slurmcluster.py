"""A real Slurm cluster on top of the simulated cluster (tests/simcluster.py), for end-to-end
tests of ``preflight run --slurm`` and the other Slurm modes.

Debian 12's own daemons (``slurm-wlm`` 22.05, ``munge``), nothing mocked:
  - one ``munged`` with its own key and socket in the cluster's directory; every daemon and
    client reaches it through the filesystem (``AuthInfo=socket=``), so the machine's own
    munge (if any) is never touched;
  - ``slurmctld`` in the root namespace, on a free port, named after this machine's short
    hostname with the bridge address in parentheses (slurmctld refuses a SlurmctldHost that is
    not its own hostname; the address is where the nodes reach it);
  - one ``slurmd`` per simulated host, started with ``nsenter`` into the network, UTS and mount
    namespaces of that host's sshd, so tasks run with the node's hostname, address, command
    shims and /sys/class overlay, exactly what an SSH session on that host sees.
slurmd 22.05 will not start without cgroups, and the node's mount namespace (from ``ip netns
exec``) has a fresh /sys with an empty /sys/fs/cgroup: a tmpfs goes there with the v1
controllers this machine lists in /proc/cgroups and a ``none,name=systemd`` hierarchy (the
plugins chosen never put a process in them: proctrack/linuxproc, task/none).

Client commands (srun, sbatch, scontrol ...) find the cluster through ``SLURM_CONF``
(``env``). The daemons die with the cluster: slurmctld and munged are our children, and every
slurmd lives in a simulated host's network namespace, which the SimCluster empties on exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from simcluster import SimCluster, SimHost

DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
CLIENTS = ("srun", "sbatch", "salloc", "scontrol", "sinfo", "squeue", "scancel", "nsenter")
PARTITION = "gpu"
_UP_TIMEOUT_S = 30.0


class SlurmClusterError(RuntimeError):
    """The Slurm cluster could not be brought up; the message quotes the daemon's log."""


def why_no_slurm() -> str | None:
    """Why a Slurm cluster cannot be built here; None when it can."""
    missing = [d for d in DAEMONS if not os.access(d, os.X_OK)]
    missing += [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install slurm-wlm munge)"
    return None


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


class SlurmCluster:
    """Context manager over an entered SimCluster: munged, slurmctld and one slurmd per host that
    is not ``down``. After entering: ``conf`` (slurm.conf), ``env`` (for client commands),
    ``nodes`` (names), ``slurm(*argv)`` to run a client command."""

    def __init__(self, sim: SimCluster, workdir: Path, extra_conf: Sequence[str] = (), gpus: int = 0):
        self.sim = sim
        self.nodes = [h.name for h in sim.hosts if not h.down]
        self.workdir = Path(workdir)
        self.extra_conf = tuple(extra_conf)
        # gpus > 0: every node has that many GPUs as generic resources (GresTypes=gpu, a
        # gres.conf whose File= lines are files in the node's own directory; see _gres_conf),
        # constrained by the devices cgroup where this machine has the v1 controller
        self.gpus = gpus
        self.why_unconstrained = why_no_devices_cgroup() if gpus else "no GPUs configured"
        self._procs: dict[str, subprocess.Popen] = {}  # munged, slurmctld
        self._slurmd: dict[str, int] = {}  # node -> slurmd pid (in the node's namespaces)

    # ---- life cycle ------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        _LIVE.add(self)
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="slurm-", dir=self.workdir)).resolve()
        for sub in ("state", "spool", "log", "run", "tmp"):
            (self.dir / sub).mkdir()
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "run" / "munge.socket"
        # XDG_STATE_HOME: what runs on the nodes (srun tasks, HealthCheckProgram) records into a
        # results store of this cluster's own, never the machine's ~/.local/state.
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "XDG_STATE_HOME": str(self.dir / "state")}
        self._start_munged()
        self.port = _free_port()
        self.conf.write_text(self._slurm_conf())
        if self.gpus:
            (self.dir / "gres.conf").write_text(self._gres_conf())
        (self.dir / "cgroup.conf").write_text("# slurmcluster: the v1 hierarchy the node's tmpfs offers\n"
                                              "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"
                                              + ("ConstrainDevices=yes\n" if self.constrained else ""))
        log = self.dir / "log" / "slurmctld.log"
        self._procs["slurmctld"] = subprocess.Popen(
            ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)], env=self.env,
            stdout=subprocess.DEVNULL, stderr=open(log.with_suffix(".stderr"), "wb"), start_new_session=True)
        for node in self.nodes:
            self.start_slurmd(node)
        self.wait_for_state(self.nodes, "IDLE")

    def _start_munged(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        argv = ["/usr/sbin/munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                f"--key-file={key}", f"--pid-file={self.dir / 'run' / 'munged.pid'}",
                f"--log-file={self.dir / 'log' / 'munged.log'}", f"--seed-file={self.dir / 'run' / 'munged.seed'}",
                # Every daemon of every simulated node asks this one munged: its default two threads
                # time out under a 64-task step ("If munged is up, restart with --num-threads=10").
                "--num-threads=10"]
        self._procs["munged"] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                 start_new_session=True)
        _wait(lambda: self.munge_socket.exists() or self._procs["munged"].poll() is not None, 10)
        if not self.munge_socket.exists():
            raise SlurmClusterError(f"munged did not start: {self._procs['munged'].stderr.read().decode().strip()}")

    def _slurm_conf(self) -> str:
        d = self.dir
        bridge = self.sim.address(self.sim.hosts[0].name).rsplit(".", 1)[0] + ".254"
        lines = [
            f"# slurmcluster: {len(self.nodes)} simulated nodes, written by tests/slurmcluster.py",
            "ClusterName=preflight-test",
            f"SlurmctldHost={short_hostname()}({bridge})",
            f"SlurmctldPort={self.port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmdPidFile={d / 'run'}/slurmd-%n.pid",
            f"SlurmctldPidFile={d / 'run'}/slurmctld.pid",
            f"SlurmctldLogFile={d / 'log'}/slurmctld.log",
            f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            # With GPUs, task/cgroup: ConstrainDevices=yes (cgroup.conf) denies a step every GPU
            # it was not given, through the v1 devices controller, as on a real node.
            "TaskPlugin=" + ("task/cgroup" if self.constrained else "task/none"),
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            # Each node's temporary files on a tmpfs of its own (mounted at this path in the node's
            # mount namespace by start_slurmd), as every real node has its own /tmp: the PMIx
            # plugin makes its per-step client directory under TmpFS (/tmp by default), and nodes
            # sharing this machine's /tmp collide there ("Cannot create directory
            # /tmp/spmix_appdir_0_1.0: File exists"), so no srun --mpi=pmix step could start.
            f"TmpFS={d / 'tmp'}",
            "SwitchType=switch/none",
            "ReturnToService=2",
            # Jobs of a test start at once and a finished one frees its nodes at once.
            "SchedulerParameters=sched_interval=1",
            "MinJobAge=10",
            "KillWait=2",
            "InactiveLimit=0",
            # A launch to a dead slurmd fails after this, not the default 10 s.
            "MessageTimeout=5",
            *(["GresTypes=gpu"] if self.gpus else []),
            *self.extra_conf,
        ]
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        for node in self.nodes:
            lines.append(f"NodeName={node} NodeAddr={self.sim.address(node)} CPUs=2{gres} State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    @property
    def constrained(self) -> bool:
        """Steps see only the GPUs they were given (cgroup.conf ConstrainDevices=yes)."""
        return self.why_unconstrained is None

    def _gres_conf(self) -> str:
        """One line per node (slurmd reads gres.conf beside slurm.conf): its GPUs are files of
        its own directory standing for /dev/nvidia0.., so two nodes never claim the same one.
        slurmd stats each File= and exports the index of the ones a step gets
        (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS)."""
        lines = ["# slurmcluster: each node's GPUs, files of its own directory"]
        for node in self.nodes:
            dev = self.sim.workdir_of(node) / "dev"
            dev.mkdir(exist_ok=True)
            for i in range(self.gpus):
                # slurmd wants a character device ("is not a valid character or block device, fix
                # your gres.conf"): NVIDIA's major, 195, with no driver behind it; never opened.
                os.mknod(dev / f"nvidia{i}", stat.S_IFCHR | 0o600, os.makedev(195, i))
            lines.append(f"NodeName={node} Name=gpu File={dev}/nvidia[0-{self.gpus - 1}]")
        return "\n".join(lines) + "\n"

    def start_slurmd(self, node: str) -> None:
        """Start (or restart) the node's slurmd inside its namespaces; returns once it runs."""
        sshd_pid = int((self.sim.workdir_of(node) / "sshd.pid").read_text())
        script = (
            # a fresh cgroup tree in the node's mount namespace (see the module's docstring)
            "mountpoint -q /sys/fs/cgroup || { mount -t tmpfs -o mode=755 slurmcluster-cgroup /sys/fs/cgroup && "
            "for c in $(awk 'NR>1 && $4==1 && $2!=0 {print $1}' /proc/cgroups); do "
            "mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c; done; "
            "mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd; }\n"
            # the node's own TmpFS (see _slurm_conf)
            'mountpoint -q "$3" || mount -t tmpfs -o mode=1777 slurmcluster-tmp "$3"\n'
            'exec /usr/sbin/slurmd -D -f "$1" -N "$2"\n'
        )
        stderr = open(self.dir / "log" / f"slurmd-{node}.stderr", "wb")
        proc = subprocess.Popen(["nsenter", "-t", str(sshd_pid), "-n", "-m", "-u", "sh", "-ec", script, "sh",
                                 str(self.conf), node, str(self.dir / "tmp")], env=self.env, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
        self._slurmd[node] = proc.pid

    def stop_slurmd(self, node: str) -> None:
        """Kill the node's slurmd (SIGKILL: a crash, not a clean shutdown) and wait for it."""
        pid = self._slurmd.pop(node)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        _wait(lambda: not _alive(pid), 10)

    def _stop(self) -> None:
        for node in list(self._slurmd):
            self.stop_slurmd(node)
        if self.gpus and self.constrained:
            _remove_cgroups(self.nodes)
        for name in ("slurmctld", "munged"):
            proc = self._procs.pop(name, None)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        _LIVE.discard(self)

    # ---- using it --------------------------------------------------------------------------

    def slurm(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode:
            raise SlurmClusterError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def states(self) -> dict[str, str]:
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_for_state(self, nodes: Sequence[str], state: str, timeout: float = _UP_TIMEOUT_S) -> None:
        """Until every node in ``nodes`` reads ``state`` (sinfo's %T, e.g. IDLE, DRAINED, DOWN)."""
        deadline = time.monotonic() + timeout
        last: dict[str, str] = {}
        while time.monotonic() < deadline:
            ctld = self._procs.get("slurmctld")
            if ctld is not None and ctld.poll() is not None:
                raise SlurmClusterError(f"slurmctld exited {ctld.returncode}: {self._log('slurmctld')}")
            proc = self.slurm("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            if proc.returncode == 0:
                last = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
                # exact: "IDLE*" (not responding, e.g. just after a resume) is not IDLE yet
                if all(last.get(n, "").upper() == state for n in nodes):
                    return
            time.sleep(0.2)
        logs = "\n".join(f"{n}: {self._log(f'slurmd-{n}')}" for n in nodes if last.get(n, "").upper() != state)
        raise SlurmClusterError(f"nodes not {state} after {timeout:.0f} s: {last}\n{logs}")

    def drain(self, node: str, reason: str) -> None:
        self.slurm("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        self.wait_for_state([node], "DRAINED")

    def resume(self, node: str) -> None:
        self.slurm("scontrol", "update", f"NodeName={node}", "State=RESUME")
        self.wait_for_state([node], "IDLE")

    def wait_idle(self, timeout: float = _UP_TIMEOUT_S) -> None:
        """Until no job is left (a test's jobs must not hold nodes for the next test)."""
        _wait(lambda: not self.slurm("squeue", "-h", "-o", "%i").stdout.strip(), timeout)

    def _log(self, name: str) -> str:
        text = ""
        for path in (self.dir / "log" / f"{name}.log", self.dir / "log" / f"{name}.stderr"):
            if path.exists():
                text += path.read_text(errors="replace")
        lines = [line for line in text.splitlines() if re.search(r"error|fatal", line, re.I)]
        return "\n".join(lines[-5:]) or text.strip()[-500:]


_LIVE: set[SlurmCluster] = set()
DEVICES_CGROUP = Path("/sys/fs/cgroup/devices")


def why_no_devices_cgroup() -> str | None:
    """Why steps cannot be confined to their GPUs here; None when they can. The nodes get the
    v1 controllers /proc/cgroups lists as enabled in a hierarchy (start_slurmd), and Slurm
    22.05's cgroup/v1 plugin confines devices through the v1 ``devices`` controller. On a
    cgroup v2-only machine the controller sits in the unified hierarchy (hierarchy 0), where
    Slurm's cgroup/v2 plugin confines devices with eBPF programs and wants a systemd-delegated
    cgroup for slurmd, which the simulated nodes (no systemd) do not have."""
    try:
        rows = [line.split() for line in Path("/proc/cgroups").read_text().splitlines()[1:]]
    except OSError as exc:
        return f"cannot read /proc/cgroups: {exc}"
    if not any(r[0] == "devices" and r[1] != "0" and r[3] == "1" for r in rows if len(r) == 4):
        return "no cgroup v1 devices controller on this machine (cgroup v2 only)"
    return None


def _remove_cgroups(nodes: Sequence[str]) -> None:
    """The devices cgroups slurmd made for the nodes (slurm_<node>/uid_*/job_*/step_*) live in
    this machine's own hierarchy: removed, deepest first, once their processes are gone."""
    for node in nodes:
        top = DEVICES_CGROUP / f"slurm_{node}"
        for root, _dirs, _files in sorted(os.walk(top, topdown=False), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(root)


@atexit.register
def _stop_live() -> None:
    for cluster in list(_LIVE):
        cluster._stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child of ours that exited is a zombie until reaped.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _wait(done, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.05)
    return done()


@contextlib.contextmanager
def slurm_fleet(hosts: Sequence[SimHost], workdir: Path, extra_conf: Sequence[str] = (),
                gpus: int = 0) -> Iterator[SlurmCluster]:
    """A SimCluster of ``hosts`` with Slurm on it, for a module-scoped fixture (mark its tests
    ``root``: the simulated cluster's own requirements are checked by that marker), with
    ``SLURM_CONF`` pointing at it meanwhile. Skips with the reason where the Slurm packages are
    missing."""
    if reason := why_no_slurm():
        pytest.skip(reason)
    with SimCluster(list(hosts), workdir) as sim, SlurmCluster(sim, workdir, extra_conf, gpus) as slurm:
        saved = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(slurm.conf)  # how preflight's own salloc/srun find this cluster
        try:
            yield slurm
        finally:
            if saved is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved


EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "slurm"
STORE_FILE = "/etc/preflight/store.url"


def shipped_wrapper(name: str, path: Path, *, store_file: Path, exec_line: str, prelude: str = "") -> Path:
    """The wrapper the guide ships (examples/slurm/NAME), written to ``path`` as a test cluster
    runs it: the root-only store file at ``store_file`` instead of /etc/preflight/store.url, its
    last line (``exec preflight ...``) replaced by ``exec_line``, after ``prelude`` (the test's
    own PYTHONPATH and SLURM_CONF). Everything else is the shipped file, so the tests run it."""
    text = (EXAMPLES / name).read_text()
    assert text.count(STORE_FILE) == 1, f"examples/slurm/{name}: reads {STORE_FILE} once"
    lines = text.replace(STORE_FILE, str(store_file)).rstrip("\n").split("\n")
    assert lines[-1].startswith("exec preflight "), f"examples/slurm/{name}: ends with exec preflight"
    path.write_text("\n".join(lines[:-1] + [prelude.rstrip("\n"), exec_line]) + "\n")
    path.chmod(0o755)
    return path
