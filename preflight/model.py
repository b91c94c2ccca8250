"""Typed records that cross module boundaries: hosts, probe results, findings, diagnoses.

Everything downstream of the executor is built from these, so they stay plain data: no I/O,
no behaviour beyond small derived properties, and a ``to_dict`` where the record is serialised
into a contract format (report.json).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    """Verdict of one check on one host.

    FAIL means the node is bad; ERROR means we could not tell (the evidence is missing or
    unreadable); SKIP means the check does not apply. They are kept distinct everywhere
    because an SRE acts differently on each.
    """

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    @property
    def severity(self) -> int:
        # Order used to fold many findings into one host verdict.
        return _SEVERITY[self]


_SEVERITY = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}


def worst(statuses) -> Status:
    """The most severe status, PASS for an empty collection."""
    return max(statuses, key=lambda s: s.severity, default=Status.PASS)


@dataclass(frozen=True)
class Host:
    """One inventory entry: ``[user@]name[:port]``.

    ``name`` is the host's key everywhere after the inventory (bundle directory, report,
    progress); ``address`` is what SSH connects to when it differs from the name: an IPv6
    literal (no ``:`` may reach a file name), or a name shared by entries that differ in user
    or port, which are different nodes (behind one bastion, say) and each get a name of their
    own (``collect/inventory.py``)."""

    name: str
    user: str | None = None
    port: int | None = None
    address: str | None = None

    @property
    def target(self) -> str:
        """What to connect to."""
        return self.address or self.name

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ProbeResult:
    """What running one probe on one host produced, as saved in the bundle.

    ``stdout`` holds the bytes exactly as the node printed them (the bundle contract is byte
    for byte), or None when there is no output to save: the probe did not run or the
    connection failed. ``error`` explains a failure around the command (connection refused,
    authentication, host key), as opposed to the command's own exit code.
    """

    probe: str
    host: str
    command: tuple[str, ...]
    stdout: bytes | None
    stderr: str = ""
    exit_code: int | None = None
    started: str | None = None
    duration_s: float | None = None
    timed_out: bool = False
    error: str | None = None

    @property
    def text(self) -> str:
        # Real captures contain stray bytes (ANSI escapes survive, invalid UTF-8 does not).
        return "" if self.stdout is None else self.stdout.decode("utf-8", errors="replace")

    @property
    def ran(self) -> bool:
        return self.error is None

    @property
    def tool_missing(self) -> bool:
        # 127 is the shell's "command not found"; 126 "found but not executable".
        return self.exit_code in (126, 127) and not self.timed_out

    @property
    def ok(self) -> bool:
        return self.stdout is not None and self.exit_code == 0 and not self.timed_out

    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "command": list(self.command),
            "exit_code": self.exit_code,
            "stderr": self.stderr,
            "started": self.started,
            "duration_s": self.duration_s,
            "timed_out": self.timed_out,
        }
        if self.error:
            meta["error"] = self.error
        return meta


@dataclass(frozen=True)
class Evidence:
    probe: str
    excerpt: str

    def to_dict(self) -> dict[str, str]:
        return {"probe": self.probe, "excerpt": self.excerpt}


@dataclass(frozen=True)
class Finding:
    """One check's verdict on one host (or on the fleet when ``host`` is None)."""

    check: str
    host: str | None
    status: Status
    summary: str
    symptoms: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    # Machine-readable figures a later stage (diff, prometheus, pytest helpers) may read.
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # The next step for an operator, when the check knows a more specific one than its cause's.
    action: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "host": self.host,
            "check": self.check,
            "status": self.status.value,
            "summary": self.summary,
            "symptoms": list(self.symptoms),
            "evidence": [e.to_dict() for e in self.evidence],
        }
        # report.json has always carried the action among the figures; readers look there.
        data = {"action": self.action, **self.data} if self.action else self.data
        if data:
            d["data"] = data
        return d


@dataclass(frozen=True)
class Diagnosis:
    """A likely cause, the hosts it explains, and what to do about it."""

    cause: str
    hosts: tuple[str, ...]
    confidence: str  # "high" | "medium" | "low"
    symptoms: tuple[str, ...]
    action: str
    title: str = ""
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "title": self.title,
            "hosts": list(self.hosts),
            "confidence": self.confidence,
            "symptoms": list(self.symptoms),
            "action": self.action,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class PastRun:
    """One earlier run of a node, as the results store remembers it."""

    run_id: str
    started: float  # seconds since the epoch
    status: str  # pass | warn | fail | error
    reachable: bool
    causes: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()  # checks that failed (fail or error) on the node
    judged: frozenset[str] = frozenset()  # checks the run judged


@dataclass(frozen=True)
class HostHistory:
    """A node's past, handed by the results store to the judgement (``host.history``), so that
    checks comparing a node with its own past are ordinary checks over plain data.

    ``figures``: the node's earlier readings of each figure (``judge.figures``), oldest first;
    ``spreads``: the fleet's run-to-run spread of each figure, as a fraction of its level;
    ``fleet_medians``: the fleet's median latest reading; ``now``: when the history was read."""

    node: str
    runs: tuple[PastRun, ...]
    figures: dict[str, tuple[float, ...]]
    spreads: dict[str, float]
    fleet_medians: dict[str, float]
    now: float
    store: str = ""  # the store it came from, as messages show it (password masked)


@dataclass(frozen=True)
class Check:
    """A check as the loader found it: what it reads, and the function that judges.

    ``facts`` are the parsed facts it declared; ``probes`` every probe it needs, those facts'
    probes and any it named itself, in catalogue order (the loader resolves them).
    """

    id: str
    probes: tuple[str, ...]
    summary: str
    func: Callable[..., Any]
    scope: str  # "host" | "fleet" | "soak"
    origin: str = ""  # where it was loaded from, for `preflight checks` and error messages
    facts: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostVerdict:
    status: str  # pass | warn | fail | error  (report contract)
    reachable: bool
    profile: str
    profile_why: str


@dataclass
class Analysis:
    """Everything a report shows: per-host verdicts, findings, diagnoses, and the run's facts."""

    hosts: dict[str, HostVerdict]
    findings: list[Finding]
    diagnoses: list[Diagnosis]
    checks: list[Check]
    meta: dict = field(default_factory=dict)

    def by_host(self) -> dict[str | None, list[Finding]]:
        """The findings grouped by host (None: the fleet's), in their order; computed once for
        every writer that walks the hosts, so a report costs O(findings), not O(hosts x findings)."""
        cached = self.__dict__.get("_by_host")
        if cached is None or cached[0] != len(self.findings):
            groups: dict[str | None, list[Finding]] = {}
            for f in self.findings:
                groups.setdefault(f.host, []).append(f)
            cached = (len(self.findings), groups)
            self.__dict__["_by_host"] = cached
        return cached[1]

    def findings_of(self, host: str | None) -> list[Finding]:
        return self.by_host().get(host, [])

    @property
    def failed(self) -> bool:
        # A fleet check's finding with no host (a multi-node run no host is blamed for) counts too.
        return (any(v.status in ("fail", "error") for v in self.hosts.values())
                or any(f.host is None and f.status in (Status.FAIL, Status.ERROR) for f in self.findings))
