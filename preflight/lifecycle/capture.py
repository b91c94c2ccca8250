"""Evidence kept before a remediation destroys it: before the lifecycle resets a GPU, restarts a
service or reboots a node, it collects the node's state into the incident (NVSentinel ADR-061
does the same with a bug report before its remediations).

Where the driver's ``nvidia-bug-report.sh`` exists, that report: run with ``--safe-mode`` (the
script's own help: it disables "certain queries that might hang the system", and the node is
being remediated because something in it is failing; its ``nvidia-smi -q`` is in the bundle of
the run that blamed it) and ``--output-file`` on the node, then read back at most the size limit
and removed. The script appends each section to that file as one more gzip member, so a report
cut at the time limit still reads back as far as it got. Otherwise the fallback set: the kernel
log since boot (``dmesg``, else ``journalctl -k -b``, as the kernel-log probe reads it),
``nvidia-smi -q``, the fabric manager's and the persistence daemon's journals since boot (their
last ``JOURNAL_LINES``), ``ibstat``, and each InfiniBand device's port state (``mlxlink -d DEV``
where MFT is installed, else its sysfs port state and counters).

Every command is an argv list over the collect layer's ``Node`` (no shell, a node name never
reaches one), bounded by what is left of the capture's time limit, so the whole capture ends
within the limit plus the transport's kill grace; a part the limit cuts is recorded as such and
what came before it is kept. Nothing here raises: a capture that fails is a record that says
why, and the remediation goes on. No environment is collected or printed."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from preflight.collect.node import KILL_AFTER_S, CommandResult, Node, now_iso
from preflight.collect.ssh import GRACE_S

# Where the node writes its bug report; the script adds ".gz" when gzip is there (its --output-file
# help), and moves an older one to ".old.gz" first. One capture of a node runs at a time (the
# lifecycle's lock), so a fixed name does not collide, and it is removed once read.
BUG_REPORT = "/var/tmp/preflight-nvidia-bug-report.log"
BUG_REPORT_SCRIPT = "nvidia-bug-report.sh"
JOURNAL_LINES = 2000
NOT_FOUND = 127  # the node's shell, or `timeout`, when the command does not exist there
# A command needs this much more than its own limit before the transport gives up on it.
OVERRUN_S = KILL_AFTER_S + GRACE_S
DEVICE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MAX_BYTES = 128 << 20


@dataclass(frozen=True)
class Limits:
    timeout_s: float = DEFAULT_TIMEOUT_S  # the whole capture's; 0: no capture
    max_bytes: int = DEFAULT_MAX_BYTES  # kept in all, over every part


@dataclass(frozen=True)
class Part:
    """One command's share of a capture, as the manifest and the event keep it."""

    name: str  # what it is; where it printed something, its file in the capture's directory
    argv: tuple[str, ...]
    exit_code: int | None
    bytes: int
    seconds: float
    truncated: bool = False
    timed_out: bool = False
    error: str | None = None  # the transport's, or why the part did not run
    said: str = ""  # the first line of its stderr (a tool's own complaint), at most 200 characters

    @property
    def missing(self) -> bool:
        return self.exit_code == NOT_FOUND


@dataclass
class Capture:
    node: str
    step: str
    started: str
    outcome: str = "failed"  # complete | partial | timed-out | failed | skipped
    why: str = ""
    directory: str | None = None
    seconds: float = 0.0
    bytes: int = 0
    source: str = ""  # nvidia-bug-report | fallback; empty until the node said which (or skipped)
    parts: list[Part] = field(default_factory=list)

    def record(self) -> dict:
        """The event's detail: what the RMA summary names (never the content)."""
        out = asdict(self)
        # A part's empty fields are left out (an exit code of 0 is not empty).
        out["parts"] = [{k: v for k, v in asdict(p).items() if v is not None and v != "" and v is not False}
                        | {"argv": list(p.argv)} for p in self.parts]
        return out


class _Budget:
    """What is left of the capture's time and size."""

    def __init__(self, limits: Limits, clock: Callable[[], float]):
        self.limits, self.clock = limits, clock
        self.start = clock()
        self.kept = 0

    def time_left(self) -> float:
        return self.limits.timeout_s - (self.clock() - self.start)

    def command_s(self) -> float:
        """The limit of the next command: what is left, less the transport's grace after it."""
        return self.time_left() - OVERRUN_S

    def bytes_left(self) -> int:
        return max(0, self.limits.max_bytes - self.kept)


def _said(r: CommandResult) -> str:
    lines = (r.stderr or "").strip().splitlines()
    return lines[0][:200] if lines else ""


TIME_SPENT = "not run: the capture's time limit was spent"
SIZE_SPENT = "not run: the capture's size limit was reached"


def _run(node: Node, budget: _Budget, argv: list[str]) -> CommandResult | None:
    """``argv`` within what is left of the limits; None when nothing is left to run it in."""
    limit = budget.command_s()
    if limit < 1 or budget.bytes_left() <= 0:
        return None
    return node.run(argv, timeout=limit)


def _keep(budget: _Budget, directory: Path, name: str, r: CommandResult | None, argv: list[str],
          parts: list[Part]) -> bytes:
    """Write what ``r`` printed (up to the size left) as ``name``; note the part either way."""
    if r is None:
        parts.append(Part(name, tuple(argv), None, 0, 0.0, error=SIZE_SPENT if budget.bytes_left() <= 0
                          else TIME_SPENT))
        return b""
    data = r.stdout or b""
    room = budget.bytes_left()
    truncated = len(data) > room
    data = data[:room]
    if data:
        (directory / name).write_bytes(data)
    budget.kept += len(data)
    parts.append(Part(name, tuple(argv), r.exit_code, len(data), r.duration_s, truncated, r.timed_out, r.error,
                      _said(r)))
    return data


def _bug_report(node: Node, budget: _Budget, directory: Path, parts: list[Part], cap: Capture) -> bool:
    """The driver's report; False when the node has no such script (the fallback set follows)."""
    argv = [BUG_REPORT_SCRIPT, "--safe-mode", "--output-file", BUG_REPORT]
    # Leave room to read back what it wrote if the limit cuts it: a fifth of what the commands may
    # take, 2 s at least (the read-back's own 1 s and the channel's close) and 30 s at most.
    limit = budget.command_s()
    limit -= max(2.0, min(30.0, limit / 5))
    r = node.run(argv, timeout=limit) if limit >= 1 else None
    if r is not None and r.exit_code == NOT_FOUND:
        parts.append(Part(BUG_REPORT_SCRIPT, tuple(argv), r.exit_code, 0, r.duration_s, said=_said(r)))
        return False
    cap.source = "nvidia-bug-report"
    if r is None:
        parts.append(Part(BUG_REPORT_SCRIPT, tuple(argv), None, 0, 0.0, error=TIME_SPENT))
        return True
    parts.append(Part(BUG_REPORT_SCRIPT, tuple(argv), r.exit_code, 0, r.duration_s, False, r.timed_out,
                      r.error, _said(r)))
    for suffix in (".gz", ""):  # without gzip on the node, the script writes the plain log
        path = BUG_REPORT + suffix
        read = ["head", "-c", str(budget.bytes_left() + 1), path]
        got = _run(node, budget, read)
        if got is not None and got.exit_code == 0 and got.stdout:
            _keep(budget, directory, f"nvidia-bug-report.log{suffix}", got, read, parts)
            break
    else:
        parts.append(Part("nvidia-bug-report.log.gz", (), None, 0, 0.0,
                          error=f"the report was not found on the node at {BUG_REPORT}.gz"))
    cleanup = ["rm", "-f", BUG_REPORT + ".gz", BUG_REPORT, BUG_REPORT + ".old.gz", BUG_REPORT + ".old"]
    if budget.command_s() >= 1:
        node.run(cleanup, timeout=min(10.0, budget.command_s()))
    return True


def _fallback(node: Node, budget: _Budget, directory: Path, parts: list[Part]) -> None:
    kernel = ["dmesg"]
    r = _run(node, budget, kernel)
    if r is not None and not r.ok and not r.timed_out:
        kernel = ["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic", "-n", str(JOURNAL_LINES * 10)]
        r = _run(node, budget, kernel)
    _keep(budget, directory, "kernel-log.txt", r, kernel, parts)
    for name, argv in (
            ("nvidia-smi-q.txt", ["nvidia-smi", "-q"]),
            ("nvidia-fabricmanager.journal.txt",
             ["journalctl", "-u", "nvidia-fabricmanager", "-b", "--no-pager", "-n", str(JOURNAL_LINES)]),
            ("nvidia-persistenced.journal.txt",
             ["journalctl", "-u", "nvidia-persistenced", "-b", "--no-pager", "-n", str(JOURNAL_LINES)]),
            ("ibstat.txt", ["ibstat"])):
        _keep(budget, directory, name, _run(node, budget, argv), argv, parts)
    listing = ["ls", "/sys/class/infiniband"]
    r = _run(node, budget, listing)
    devices = [d for d in (r.stdout or b"").decode("utf-8", "replace").split() if DEVICE.fullmatch(d)] \
        if r is not None and r.ok else []
    mlxlink = True
    for dev in devices:
        if mlxlink:
            argv = ["mlxlink", "-d", dev]
            got = _run(node, budget, argv)
            if got is None or got.exit_code != NOT_FOUND:
                _keep(budget, directory, f"mlxlink-{dev}.txt", got, argv, parts)
                continue
            mlxlink = False  # MFT is not installed: the port state from sysfs, for this and the rest
            parts.append(Part("mlxlink", tuple(argv), got.exit_code, 0, got.duration_s, said=_said(got)))
        base = f"/sys/class/infiniband/{dev}/ports"
        ports = _run(node, budget, ["ls", base])
        names = [p for p in (ports.stdout or b"").decode().split() if p.isdigit()] if ports is not None and ports.ok \
            else []
        argv = ["grep", "-rHs", "."] + [f"{base}/{p}/{leaf}" for p in names
                                        for leaf in ("state", "phys_state", "rate", "counters")]
        if names:
            _keep(budget, directory, f"ib-port-{dev}.txt", _run(node, budget, argv), argv, parts)


def collect(node: Node, step: str, directory: Path, limits: Limits,
            clock: Callable[[], float] = time.monotonic) -> Capture:
    """The node's state, into ``directory`` (created), before ``step``; never raises, and returns
    within the limit. Each command is bounded already; what is not (the SSH handshake of a node,
    or a machine so loaded that paramiko's own waits run long: a 20 s capture once took 68 s) is
    cut by a watchdog: the capture is recorded with what it had by then, and its worker, left
    behind, starts no command after the limit."""
    if limits.timeout_s <= 0:
        return skipped(getattr(node, "name", ""), step, "capture_timeout_s is 0 in the site file: no capture")
    cap = Capture(node.name, step, now_iso())
    budget = _Budget(limits, clock)
    parts: list[Part] = []
    failed: list[str] = []
    worker = threading.Thread(target=_gather, args=(node, budget, directory, parts, cap, failed), daemon=True,
                              name=f"capture-{node.name}")
    worker.start()
    worker.join(max(0.0, limits.timeout_s - (clock() - budget.start)))
    cap.parts = list(parts)  # a worker left behind appends no more to what is recorded
    cap.bytes = sum(p.bytes for p in cap.parts)
    if failed:
        cap.outcome, cap.why = "failed", failed[0]
    elif worker.is_alive():
        running = "the SSH connection" if not cap.parts else "the command after " + cap.parts[-1].name
        cap.outcome, cap.why = "timed-out", (f"the capture's time limit ({limits.timeout_s:g} s) passed in {running}; "
                                             "what came before is kept")
    else:
        cap.outcome, cap.why = _judge(cap.parts)
    cap.seconds = round(clock() - budget.start, 3)
    if cap.directory and not failed:
        try:
            (directory / "capture.json").write_text(json.dumps(cap.record(), indent=1) + "\n")
        except OSError as exc:
            cap.outcome, cap.why = "failed", f"could not write the capture under {directory}: {exc}"
    return cap


def _gather(node: Node, budget: _Budget, directory: Path, parts: list[Part], cap: Capture,
            failed: list[str]) -> None:
    try:
        # A host report holds the node's configuration and logs (ADR-061's caution): its owner's only.
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        cap.directory = str(directory)
        if not _bug_report(node, budget, directory, parts, cap):
            cap.source = "fallback"
            _fallback(node, budget, directory, parts)
    except OSError as exc:  # the controller's disk, not the node: recorded, the step goes on
        failed.append(f"could not write the capture under {directory}: {exc}")


def _judge(parts: list[Part]) -> tuple[str, str]:
    cut = [p for p in parts if p.timed_out or p.error == TIME_SPENT]
    if cut:
        return "timed-out", f"the time limit cut {', '.join(p.name for p in cut)}; what came before is kept"
    got = [p for p in parts if p.bytes]
    if not got:
        errors = [p.error or p.said or f"exit code {p.exit_code}" for p in parts]
        return "failed", f"nothing came back: {'; '.join(dict.fromkeys(errors)) or 'no part ran'}"
    if any(p.error == SIZE_SPENT for p in parts):
        skipped = [p.name for p in parts if p.error == SIZE_SPENT]
        return "partial", f"cut at the size limit: {', '.join(p.name for p in parts if p.truncated)}; not run " \
                          f"after it: {', '.join(skipped)}"
    bad = [p for p in parts if p.error or (p.exit_code not in (0, None) and not p.missing) or p.truncated]
    if bad:
        return "partial", "; ".join(f"{p.name}: " + (p.error or ("cut at the size limit" if p.truncated else
                                                                 p.said or f"exit code {p.exit_code}"))
                                    for p in bad)
    missing = [p.argv[0] for p in parts if p.missing]
    return "complete", f"not on the node: {', '.join(dict.fromkeys(missing))}" if missing else ""


def skipped(node: str, step: str, why: str) -> Capture:
    return Capture(node, step, now_iso(), "skipped", why)


def directory_name(node: str, stamp: float) -> str:
    """``capture-NODE-TIME``: beside the retests' ``retest-NODE-TIME`` under ``--out``."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", node)[:64]
    t = time.strftime("%Y%m%dT%H%M%S", time.gmtime(stamp)) + f".{int(stamp * 1000) % 1000:03d}"
    return f"capture-{safe}-{t}"
