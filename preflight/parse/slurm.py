"""What Slurm's own commands say, read into records: ``scontrol show node -o`` (state, reason)
and the error lines of ``salloc`` / ``srun`` (a task launch that failed on a node, a task that
was killed or exited, a step cancelled at its time limit, an allocation refused). Pure: text
in, records out. The formats are those of Slurm 22.05 as captured in tests/fixtures/slurm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parse import finite

# Base states in which Slurm will not start a job on a node (slurm.h node_states / flags).
_UNUSABLE_BASE = {"DOWN": "down", "FUTURE": "not in service (FUTURE)", "UNKNOWN": "state unknown to slurmctld"}
_UNUSABLE_FLAG = {"DRAIN": "drained", "FAIL": "failing (FAIL)", "POWERED_DOWN": "powered down",
                  "POWERING_DOWN": "powering down", "NOT_RESPONDING": "not responding", "MAINT": "in maintenance",
                  "REBOOT_REQUESTED": "reboot requested", "REBOOT_ISSUED": "rebooting"}


@dataclass(frozen=True)
class NodeState:
    """One node as ``scontrol show node -o`` prints it."""

    name: str
    state: str  # as printed, e.g. "IDLE+DRAIN", "DOWN*"
    reason: str | None = None  # Reason=..., with Slurm's "[user@time]" suffix
    partitions: tuple[str, ...] = ()
    boot_time: str | None = None  # BootTime=, as slurmctld prints it (its local time), None when "None"
    gpus: int = 0  # the GPUs slurm.conf gives the node (Gres=gpu:N, every type summed); 0: none

    @property
    def base(self) -> str:
        return self.state.split("+")[0].rstrip("*$~#!%@^-")

    @property
    def flags(self) -> tuple[str, ...]:
        flags = [f.rstrip("*$~#!%@^-") for f in self.state.split("+")[1:]]
        if "*" in self.state:  # the asterisk is how scontrol marks a node that does not answer
            flags.append("NOT_RESPONDING")
        return tuple(flags)

    @property
    def unusable(self) -> str | None:
        """Why Slurm will not start preflight's task on this node (None: it will, maybe after
        the jobs running there): "drained", "down", "not responding", ..."""
        why = [_UNUSABLE_BASE[self.base]] if self.base in _UNUSABLE_BASE else []
        why += [_UNUSABLE_FLAG[f] for f in self.flags if f in _UNUSABLE_FLAG]
        if "DRAIN" in self.flags and self.base in ("ALLOCATED", "MIXED", "COMPLETING"):
            why = ["draining" if w == "drained" else w for w in why]
        return ", ".join(dict.fromkeys(why)) or None

    @property
    def busy(self) -> bool:
        """Jobs run on the node (its base state)."""
        return self.base in ("ALLOCATED", "MIXED", "COMPLETING")

    def describe(self) -> str:
        return f"State={self.state}" + (f" Reason={self.reason}" if self.reason else "")


_PAIR = re.compile(r"(?:^|\s)([A-Za-z]+)=(\S*)")
_GRES_WHERE = re.compile(r"\([^)]*\)")  # "(S:0-1)": the sockets a GRES sits on, commas and all


def gpus_of(gres: str) -> int:
    """The GPU count of a ``Gres=`` value: ``gpu:8``, ``gpu:h100:8(S:0-1)``,
    ``gpu:a100:4,gpu:v100:2``, ``gpu:4,nic:2``; ``(null)`` or no gpu entry: 0. Slurm's gres.conf
    and slurm.conf pages give the NAME[:TYPE]:COUNT form (COUNT may carry K, M or G)."""
    total = 0
    for item in _GRES_WHERE.sub("", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", parts[-1])
        if m:
            total += int(m[1]) * {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}[m[2]]
    return total
_NOT_FOUND = re.compile(r"^Node (\S+) not found$")


def parse_show_node(text: str) -> tuple[dict[str, NodeState], list[str]]:
    """``scontrol show node -o NODES``: one line per node; also the names it did not know
    ("Node X not found", printed on stdout)."""
    nodes: dict[str, NodeState] = {}
    missing: list[str] = []
    for line in text.splitlines():
        if m := _NOT_FOUND.match(line.strip()):
            missing.append(m[1])
            continue
        if not line.startswith("NodeName="):
            continue
        # The reason is free text (spaces and '=' allowed) and scontrol prints it last.
        head, _, reason = line.partition(" Reason=")
        pairs = dict(_PAIR.findall(head))
        name = pairs.get("NodeName", "")
        partitions = tuple(p for p in pairs.get("Partitions", "").split(",") if p)
        boot = pairs.get("BootTime")
        nodes[name] = NodeState(name, pairs.get("State", ""), reason.strip() or None, partitions,
                                boot if boot and boot != "None" else None, gpus_of(pairs.get("Gres", "")))
    return nodes, missing


@dataclass(frozen=True)
class StepReport:
    """What srun said on stderr about a step, per node."""

    launch_failed: dict[str, str] = field(default_factory=dict)  # node -> Slurm's reason
    task_ended: dict[str, str] = field(default_factory=dict)  # node -> "Killed", "Exited with exit code 3"
    # node -> what slurmstepd on that node said ("execve(): python3: No such file or directory")
    stepd: dict[str, str] = field(default_factory=dict)
    # "DUE TO TIME LIMIT", ...: slurmstepd prints it on one node, but a step or job is
    # cancelled as a whole, so it speaks for every node of the step
    cancelled: str | None = None
    errors: tuple[str, ...] = ()  # every "error:" line, as printed

    def reason_for(self, node: str) -> str | None:
        """Slurm's own words on what happened to the node's task, if it said anything."""
        if node in self.launch_failed:
            return f"task launch failed: {self.launch_failed[node]}"
        said = [f"step cancelled {self.cancelled}"] if self.cancelled else []
        said += [f"task {self.task_ended[node]}"] if node in self.task_ended else []
        said += [self.stepd[node]] if node in self.stepd else []
        return "; ".join(said) or None


_LAUNCH = re.compile(r"Task launch for StepId=\S+ failed on node (\S+): (.+)$")
_TASK = re.compile(r"^srun: error: (\S+): tasks? [0-9,\-]+: (.+)$")
_CANCELLED = re.compile(r"\*\*\* STEP \S+ ON (\S+) CANCELLED AT \S+ (.*?)\s*\*\*\*")
_JOB_CANCELLED = re.compile(r"\*\*\* JOB \S+ ON (\S+) CANCELLED AT \S+ (.*?)\s*\*\*\*")
_STEPD = re.compile(r"^slurmstepd-(\S+): error: (.+)$")  # slurmstepd names its node


def parse_step_stderr(text: str) -> StepReport:
    launch: dict[str, str] = {}
    ended: dict[str, str] = {}
    cancelled = None
    stepd: dict[str, str] = {}
    errors = []
    for line in text.splitlines():
        line = line.strip()
        if m := _LAUNCH.search(line):
            launch[m[1]] = m[2]
        elif m := _TASK.match(line):
            ended[m[1]] = m[2]
        elif m := (_CANCELLED.search(line) or _JOB_CANCELLED.search(line)):
            cancelled = cancelled or m[2] or "(no reason given)"
        elif m := _STEPD.match(line):
            stepd.setdefault(m[1], m[2])
        if "error:" in line:
            errors.append(line)
    return StepReport(launch, ended, stepd, cancelled, tuple(errors))


_GRANTED = re.compile(r"Granted job allocation ([0-9]+)")


def granted_job(text: str) -> int | None:
    """The job id in salloc's "Granted job allocation N"."""
    m = _GRANTED.search(text)
    return int(m[1]) if m else None


def first_error(text: str) -> str | None:
    """The last "error:" line of a Slurm command, which carries the final word
    ("Unable to allocate resources: Invalid partition name specified"), without the prefix."""
    lines = [line.strip() for line in text.splitlines() if "error:" in line]
    return lines[-1] if lines else None


# Refusals that mean the request itself is wrong or Slurm cannot be asked at all (exit 2,
# nothing written), as opposed to resources not granted in time (the nodes' verdicts).
_INPUT_ERRORS = re.compile(
    r"Invalid (partition|node name|account|qos|time limit|job|feature|reservation|generic resource)"
    r"|invalid (partition|account|qos|time|feature)|not found|Unable to contact slurm controller"
    r"|Invalid user id|unrecognized option|invalid option|Access/permission denied|not a valid",
    re.IGNORECASE,
)


def is_input_error(message: str) -> bool:
    return bool(_INPUT_ERRORS.search(message))


# sbatch(1)/salloc(1) --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes", "days-hours:minutes:seconds"; 0 asks for no limit (docs/sources.md, Slurm).
_TIME = re.compile(r"^(?:([0-9]+)-([0-9]+)(?::([0-9]+)(?::([0-9]+))?)?|([0-9]+)(?::([0-9]+)(?::([0-9]+))?)?)$")


def time_limit_s(text: str) -> float | None:
    """A ``--time`` value in seconds; None for 0 (no limit). Raises ValueError naming the
    accepted formats for anything else."""
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a Slurm time limit (minutes, minutes:seconds, hours:minutes:seconds, "
                         "days-hours, days-hours:minutes or days-hours:minutes:seconds)")
    days, dh, dm, ds, a, b, c = (int(g) if g else 0 for g in m.groups())
    if m[1] is not None:
        seconds = days * 86400 + dh * 3600 + dm * 60 + ds
    elif m[7] is not None:
        seconds = a * 3600 + b * 60 + c
    else:
        seconds = a * 60 + b
    return finite(seconds) or None


_TASK_EXIT = re.compile(r"^srun: error: \S+: tasks? [0-9,\-]+: Exited with exit code ([0-9]+)\s*$", re.MULTILINE)


def task_exit_codes(text: str) -> list[int]:
    """Every task exit code srun's stderr reports ("srun: error: gpu01: task 0: Exited with exit
    code 124"), in order. srun's own exit is only the highest of them, or 128+signal of a task
    it terminated, which hides what the first task to end said."""
    return [int(m[1]) for m in _TASK_EXIT.finditer(text)]


# srun could not load the MPI plugin the step asked for (--mpi=TYPE): no task was started. Seen
# with Debian's slurm-wlm when libpmix-dev (the unversioned libpmix.so the pmix plugin opens) is
# missing: "mpi/pmix_v4: init: ... pmi/pmix: can not load PMIx library", then these lines
# (tests/fixtures/slurm/srun-mpi-pmix-library-missing.stderr).
_MPI_PLUGIN = re.compile(r"^srun: error: (?:MPI: Cannot create context for mpi/\S+|Invalid MPI type '[^']*'.*)$",
                         re.MULTILINE)
_PLUGIN_CAUSE = re.compile(r"^srun: error: +mpi/\S+: init: .*?: (\S+: can not load .*)$", re.MULTILINE)


def mpi_plugin_failure(text: str) -> str | None:
    """What srun's stderr says when it could not load the step's MPI plugin; None otherwise."""
    if not (m := _MPI_PLUGIN.search(text)):
        return None
    cause = _PLUGIN_CAUSE.search(text)
    return m[0].removeprefix("srun: error: ") + (f" ({cause[1]})" if cause else "")
