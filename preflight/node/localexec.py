"""Commands on this machine with a timeout that ends their whole process group: SIGTERM, then
SIGKILL after a grace (what ``timeout -k`` does on a node reached over SSH). The node runner
runs a node's probes through it, several at once from one thread (``Poller``); ``LocalNode`` on
the controller runs one command at a time (``run_local``); so a timeout means the same thing on
every transport. Stdlib only: this file is shipped to nodes.

It imports only ``os``, ``select``, ``time`` and the interpreter's own ``_signal`` (loaded
before any script runs; ``signal`` would import ``enum``). ``subprocess`` (with ``signal``,
``selectors``, ``threading`` and ``enum`` behind it) cost a node's python3 more than the rest of
the runner's start; ``os.posix_spawnp`` starts a command as cheaply as a shell does.
"""

from __future__ import annotations

import _signal
import os
import select
import time

# How long after SIGTERM a command that ignores it gets SIGKILL (the `timeout -k` grace).
KILL_AFTER_S = 5
# How long after SIGKILL to wait for the pipes to close (a child that left its session holds them).
GIVE_UP_S = 10
SIGTERM, SIGKILL = _signal.SIGTERM, _signal.SIGKILL
_READ = 1 << 16


class LocalRun:
    """What one command produced. ``stdout`` is None when nothing started."""

    __slots__ = ("argv", "stdout", "stderr", "exit_code", "started", "duration_s", "timed_out")

    def __init__(self, argv, stdout, stderr, exit_code, started, duration_s, timed_out=False):
        self.argv, self.stdout, self.stderr, self.exit_code = argv, stdout, stderr, exit_code
        self.started, self.duration_s, self.timed_out = started, duration_s, timed_out


def now_iso():
    # datetime.now(timezone.utc).isoformat(timespec="seconds"), without importing datetime on the node.
    # time.time(), not gmtime()'s own clock: that is C's time(), which glibc reads from the coarse
    # clock, up to a tick behind, so a stamp taken just after a second began could name the one before.
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time()))


def _exit_code(status):
    # As subprocess reports it: the exit status, or minus the signal that ended the command.
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)


def _spawn(argv, actions):
    # Its own session, so that a timeout ends the tool and everything it spawned, and no tool can
    # open the controller's terminal. POSIX_SPAWN_SETSID is a glibc >= 2.26 extension; elsewhere a
    # process group of its own is what killpg needs. Python ignores SIGPIPE and SIGXFSZ; a tool
    # gets them back at their default, as subprocess gives them (a `dmesg | head` in a probe
    # must end as it does from a shell, not print "Broken pipe").
    kwargs = {"file_actions": actions, "setsigdef": (_signal.SIGPIPE, _signal.SIGXFSZ)}
    try:
        return os.posix_spawnp(argv[0], argv, os.environ, setsid=True, **kwargs)
    except NotImplementedError:
        return os.posix_spawnp(argv[0], argv, os.environ, setpgroup=0, **kwargs)


class Command:
    """One command, started at once and then advanced without blocking by a ``Poller``: its
    output read as it comes, its stdin written as the command takes it, its timeout enforced.
    ``result`` is set once it is over."""

    def __init__(self, argv, stdin=b"", timeout=30.0):
        self.argv = tuple(argv)
        self.started, self.t0 = now_iso(), time.monotonic()
        self.deadline = self.t0 + timeout
        self.result = None
        self.timed_out = False
        self._stage_until = None  # after SIGTERM: when SIGKILL follows; after SIGKILL: when we give up
        self._killed = False
        self._status = None
        self._out, self._err = bytearray(), bytearray()
        self._stdin = memoryview(stdin) if stdin else None
        self.fds = {}  # fd -> its buffer (reading) or None (the stdin we write)
        self._start()

    def _start(self):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r = in_w = None
        if self._stdin is not None:
            in_r, in_w = os.pipe()
        actions = [(os.POSIX_SPAWN_DUP2, in_r, 0) if in_r is not None else
                   (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
        try:
            self.pid = _spawn(self.argv, actions)
        except OSError as exc:
            for fd in (out_r, err_r, in_w):
                if fd is not None:
                    os.close(fd)
            # What a shell would say: a missing program is exit 127, one that cannot run 126.
            if isinstance(exc, FileNotFoundError):
                self.result = LocalRun(self.argv, None, "%s: not found" % self.argv[0], 127, self.started, 0.0)
            else:
                self.result = LocalRun(self.argv, None, "%s: %s" % (self.argv[0], exc.strerror or exc), 126,
                                       self.started, 0.0)
            return
        finally:
            # The pipes are close-on-exec; the child has its own copies of these ends on 0, 1, 2.
            for fd in (out_w, err_w, in_r):
                if fd is not None:
                    os.close(fd)
        self.fds = {out_r: self._out, err_r: self._err}
        if in_w is not None:
            os.set_blocking(in_w, False)
            self.fds[in_w] = None

    def events(self, fd):
        return select.POLLOUT if self.fds[fd] is None else select.POLLIN

    def ready(self, fd):
        """``fd`` can be read or written; returns True once it is closed (end of file, all of
        stdin written, or the command stopped reading)."""
        buf = self.fds[fd]
        if buf is None:
            try:
                n = os.write(fd, self._stdin)
            except BlockingIOError:
                return False
            except OSError:  # the command exited or closed its stdin: the rest is not wanted
                n = len(self._stdin)
            self._stdin = self._stdin[n:]
            if len(self._stdin):
                return False
        else:
            data = os.read(fd, _READ)
            if data:
                buf.extend(data)
                return False
        self._close(fd)
        return True

    def _close(self, fd):
        del self.fds[fd]
        os.close(fd)

    def tick(self, now):
        """Reap, time out, or give up, as the clock says; sets ``result`` when it is over."""
        if self.result is not None:
            return
        if self._status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._status = status
        if self._status is not None and not any(buf is not None for buf in self.fds.values()):
            self._finish(None if self.timed_out else _exit_code(self._status))
        elif self._stage_until is None and now >= self.deadline:
            self.timed_out = True
            self._signal(SIGTERM)
            self._stage_until = now + KILL_AFTER_S
        elif self._stage_until is not None and now >= self._stage_until:
            if not self._killed:
                self._signal(SIGKILL)
                self._killed, self._stage_until = True, now + GIVE_UP_S
            else:  # whatever still holds the pipes is out of reach; keep what was read
                self._finish(None)

    def _signal(self, sig):
        try:
            os.killpg(self.pid, sig)
        except OSError:  # the group is gone (or, its pid reused, not ours): nothing left to stop
            pass

    def _finish(self, exit_code):
        for fd in list(self.fds):
            self._close(fd)
        self.result = LocalRun(self.argv, bytes(self._out), self._err.decode("utf-8", "replace"), exit_code,
                               self.started, round(time.monotonic() - self.t0, 3), self.timed_out)

    def wakeup(self, now):
        """Seconds until ``tick`` has something to do without any output arriving."""
        if self._status is None and not any(buf is not None for buf in self.fds.values()):
            return 0.002  # its output is closed, its exit not yet seen: it is about to be reaped
        return max(0.0, (self._stage_until or self.deadline) - now)


class Poller:
    """Advances many ``Command``s from one thread: ``wait`` returns those that ended."""

    def __init__(self):
        self._poll = select.poll()
        self._owner = {}

    def add(self, command):
        for fd in command.fds:
            self._poll.register(fd, command.events(fd))
            self._owner[fd] = command

    def wait(self, commands):
        """Blocks until at least one of ``commands`` ends (or has ended); returns the ended ones."""
        while True:
            now = time.monotonic()
            for command in commands:
                command.tick(now)
            ended = [c for c in commands if c.result is not None]
            if ended:
                for command in ended:
                    for fd in [fd for fd, owner in self._owner.items() if owner is command]:
                        self._poll.unregister(fd)
                        del self._owner[fd]
                return ended
            timeout = min(c.wakeup(now) for c in commands)
            for fd, _ in self._poll.poll(max(1, int(timeout * 1000) + 1)):
                if self._owner[fd].ready(fd):
                    self._poll.unregister(fd)
                    del self._owner[fd]


def run_local(argv, stdin=b"", timeout=30.0):
    """Run ``argv`` to completion or ``timeout`` seconds; never raises. A missing program is exit
    127, one that cannot be executed 126, as a shell would say."""
    command = Command(argv, stdin, timeout)
    if command.result is None:
        poller = Poller()
        poller.add(command)
        poller.wait([command])
    return command.result


def end_group(proc):
    """A ``subprocess.Popen`` started in a session of its own: SIGTERM to its process group,
    SIGKILL after the grace; what it printed until then."""
    import subprocess  # the controller's launchers (srun) only; not on the node runner's path

    for sig, wait in ((SIGTERM, KILL_AFTER_S), (SIGKILL, GIVE_UP_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return b"", b""
