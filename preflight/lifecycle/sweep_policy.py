"""The site's sweep policy (``preflight sweep --slurm --site FILE``): where the sweep's jobs run,
how often each node is swept, how many at once, how long each may take and what it runs.
Checked whole on load: a bad entry is an error naming the file and the field, before Slurm is
asked anything (docs/sweep.md).

The file's own format (``preflight-sweep/1``), not a section of the lifecycle's: a sweep
submits jobs and the lifecycle drains nodes, and a site may run one without the other."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from preflight.knowledge.datafile import read_yaml

FORMAT = "preflight-sweep/1"
DEEP_CHECKS = ("dcgm-diag", "nccl-all-reduce")
# A node name, partition, QOS or account reaches sbatch as one argument; these keep it a name.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_DAY_H = 24.0
_YEAR_H = 366 * _DAY_H


class SweepPolicyError(ValueError):
    """A sweep file preflight cannot follow; the message names the file and the field."""


@dataclass(frozen=True)
class SweepPolicy:
    partition: str | None = None  # the low-priority partition any real job preempts
    qos: str | None = None  # ... or the preemptable QOS (preempt/qos)
    account: str | None = None
    period_h: float = 7 * _DAY_H  # a node is due this long after its last finished sweep
    periods: tuple[tuple[str, float], ...] = ()  # (node set, hours): per-node periods, first match wins
    max_share: float = 0.1  # at most this share of the idle nodes under a sweep at once (at least one)
    budget_min: float = 20.0  # each node's sweep: its job's time limit, everything included
    dcgm_level: int = 2
    checks: tuple[str, ...] = DEEP_CHECKS
    burn_min: float = 5.0  # the short burn (preflight soak --engine burn); 0: none
    run_args: tuple[str, ...] = ()  # more of `preflight run`'s options, as they are
    python: str = "python3"  # the nodes' Python with preflight installed
    out: str = "/var/tmp/preflight-sweep"  # report directories, on the node

    def period_of(self, node: str) -> float:
        """The node's period in seconds."""
        for nodes, hours in self.periods:
            if node in NodeSet(nodes):
                return hours * 3600
        return self.period_h * 3600


_KEYS = ("format", "partition", "qos", "account", "period_h", "periods", "max_share", "budget_minutes",
         "dcgm_level", "checks", "burn_minutes", "run_args", "python", "out")


def _number(value, where: str, low: float, high: float, whole: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SweepPolicyError(f"{where}: a number, not {value!r}")
    if not low <= value <= high:
        raise SweepPolicyError(f"{where}: from {low:g} to {high:g}, not {value!r}")
    if whole and not float(value).is_integer():
        raise SweepPolicyError(f"{where}: a whole number, not {value!r}")
    return value


def _name(value, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise SweepPolicyError(f"{where}: a Slurm name (letters, digits, '_', '.', '-'), not {value!r}")
    return value


def _texts(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SweepPolicyError(f"{where}: a list of texts")
    return tuple(value)


def load(path: Path, checks_known: set[str] | None = None) -> SweepPolicy:
    """The site's sweep file, checked whole; ``checks_known``: the check ids ``checks:`` may name."""
    if not path.is_file():
        raise SweepPolicyError(f"{path}: no such file")
    doc = read_yaml(path, SweepPolicyError)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SweepPolicyError(f"{path}: not a {FORMAT} file (its first line should be 'format: {FORMAT}')")
    unknown = [k for k in doc if k not in _KEYS]
    if unknown:
        raise SweepPolicyError(f"{path}: {unknown[0]}: unknown; known: {', '.join(_KEYS[1:])}")
    kw: dict = {}
    for key in ("partition", "qos", "account"):
        if doc.get(key) is not None:
            kw[key] = _name(doc[key], f"{path}: {key}")
    if "partition" not in kw and "qos" not in kw:
        # Without one the jobs would land in the default partition at its priority, where they
        # could hold a node a real job waits for: the one thing a sweep must never do.
        raise SweepPolicyError(f"{path}: partition or qos: name the preemptable partition or QOS the sweep's "
                               "jobs run in (docs/sweep.md)")
    if "period_h" in doc:
        kw["period_h"] = _number(doc["period_h"], f"{path}: period_h", 0.01, _YEAR_H)
    periods = doc.get("periods") or {}
    if not isinstance(periods, dict):
        raise SweepPolicyError(f"{path}: periods: a mapping of node sets to hours (\"gpu[001-032]\": 24)")
    found = []
    for nodes, hours in periods.items():
        where = f"{path}: periods.{nodes}"
        try:
            NodeSet(str(nodes))
        except NodeSetParseError as exc:
            raise SweepPolicyError(f"{where}: not a node set: {exc}") from None
        found.append((str(nodes), float(_number(hours, where, 0.01, _YEAR_H))))
    kw["periods"] = tuple(found)
    if "max_share" in doc:
        kw["max_share"] = float(_number(doc["max_share"], f"{path}: max_share", 0.0, 1.0))
    if "budget_minutes" in doc:
        kw["budget_min"] = float(_number(doc["budget_minutes"], f"{path}: budget_minutes", 1, 24 * 60))
    if "dcgm_level" in doc:
        kw["dcgm_level"] = int(_number(doc["dcgm_level"], f"{path}: dcgm_level", 1, 4, whole=True))
    if "checks" in doc:
        checks = _texts(doc["checks"], f"{path}: checks")
        unknown = [c for c in checks if checks_known is not None and c not in checks_known]
        if unknown:
            raise SweepPolicyError(f"{path}: checks: no such check: {', '.join(unknown)} (preflight checks)")
        kw["checks"] = checks
    if "burn_minutes" in doc:
        kw["burn_min"] = float(_number(doc["burn_minutes"], f"{path}: burn_minutes", 0, 24 * 60))
    if "run_args" in doc:
        kw["run_args"] = _texts(doc["run_args"], f"{path}: run_args")
    for key in ("python", "out"):
        if doc.get(key) is not None:
            if not isinstance(doc[key], str) or not doc[key].strip():
                raise SweepPolicyError(f"{path}: {key}: a path, not {doc[key]!r}")
            kw[key] = doc[key]
    policy = SweepPolicy(**kw)
    if policy.burn_min >= policy.budget_min:
        raise SweepPolicyError(f"{path}: burn_minutes: {policy.burn_min:g} leaves nothing of budget_minutes "
                               f"({policy.budget_min:g}) for the checks")
    return policy
