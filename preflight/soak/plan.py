"""A soak run's plan: what ``preflight soak`` was asked to do, kept in run.json for ``--attach``.

``SoakPlan`` is everything needed to start, and later re-attach to, one run: the hosts (or this
machine), the engine and its options as agent arguments, the SSH options, where the agents keep
their files on the nodes. ``plan_from_args`` makes one from the command line (``add_parser``
declares its options) and refuses bad input with ``SoakUsageError`` before anything runs;
``write_plan`` / ``load_plan`` keep it in ``reports/<run-id>/soak/run.json``
(``preflight-soak-run/1``), so a controller that died, or a Ctrl-C, loses nothing but the watch.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from preflight.collect.slurm_job import SlurmOptions
from preflight.collect.ssh import SshOptions
from preflight.contracts import SOAK_RUN_FORMAT
from preflight.model import Host

# The node-side files (preflight/node): the agent and its siblings, and the built-in model
# configs a vllm plan may name (shipped with the agent).
NODE_SOURCES = Path(__file__).resolve().parent.parent / "node"
MODELS_DIR = NODE_SOURCES / "models"
NODE_DIR = "~/.cache/preflight/soak"
ENGINES = ("burn", "vllm", "endpoint", "none")
POLL_S = 2.0


class SoakUsageError(ValueError):
    """Bad options or a run that cannot be attached; the CLI exits 2 with the message."""


@dataclass(frozen=True)
class SlurmJob:
    """One allocation of a ``soak --slurm``: its job id (None: not granted, ``why_not`` says
    why) and its nodes."""

    job: int | None
    nodes: tuple[str, ...]
    why_not: str | None = None


@dataclass(frozen=True)
class SlurmSoak:
    """``soak --slurm``: the Slurm options, then (once granted) the allocations and the nodes
    Slurm would not run anything on, kept in run.json so that ``--attach`` reaches the same jobs."""

    options: SlurmOptions = field(default_factory=SlurmOptions)
    jobs: tuple[SlurmJob, ...] = ()
    unusable: dict[str, str] = field(default_factory=dict)  # node -> why, from scontrol show node

    def job_of(self, node: str) -> int | None:
        return next((j.job for j in self.jobs if node in j.nodes), None)

    def why_not(self, node: str) -> str | None:
        """Why ``node`` has no running allocation (drained before, not granted), else None."""
        if node in self.unusable:
            return self.unusable[node]
        job = next((j for j in self.jobs if node in j.nodes), None)
        if job is None:
            return "not in any of the run's allocations"
        return job.why_not if job.job is None else None

    def to_json(self) -> dict:
        return {"options": {**asdict(self.options), "extra": list(self.options.extra)},
                "jobs": [{"job": j.job, "nodes": list(j.nodes), "why_not": j.why_not} for j in self.jobs],
                "unusable": dict(self.unusable)}

    @classmethod
    def from_json(cls, doc: dict) -> SlurmSoak:
        opts = dict(doc["options"])
        opts["extra"] = tuple(opts.get("extra", ()))
        return cls(SlurmOptions(**opts), tuple(SlurmJob(j["job"], tuple(j["nodes"]), j.get("why_not"))
                                               for j in doc["jobs"]), dict(doc.get("unusable", {})))


@dataclass(frozen=True)
class SoakPlan:
    """Everything needed to start, and later re-attach to, one soak run.

    ``hosts`` empty means this machine (``local_name`` names it in the files). ``python`` is the
    interpreter on the nodes (default ``python3``; locally, this one). ``agent_args`` are passed
    to every agent as they are (e.g. ``--bench 30``, ``--model tiny-llama-ci``); ``builtin_model``
    names the config in ``models/`` that goes with the agent, if the model is one of those."""

    run_id: str
    out: Path
    engine: str
    seconds: float
    interval_s: float
    hosts: tuple[Host, ...] = ()
    local_name: str = "localhost"
    ssh: SshOptions = field(default_factory=SshOptions)
    python: str | None = None
    node_dir: str = NODE_DIR
    agent_args: tuple[str, ...] = ()
    builtin_model: str | None = None
    poll_s: float = POLL_S
    created: float = field(default_factory=time.time)
    slurm: SlurmSoak | None = None  # soak --slurm: the agents run as srun tasks, one step per allocation

    @property
    def run_dir(self) -> Path:
        return self.out / self.run_id

    @property
    def node_python(self) -> str:
        """The interpreter of the node-side commands: ``python`` when given; else python3 on
        the nodes, and this interpreter when the soak runs on this machine."""
        if self.slurm is not None:
            return self.python or self.slurm.options.node_python
        return self.python or (sys.executable if not self.hosts else "python3")

    def node_subdir(self, host: str) -> str:
        """Where under ``node_dir`` a node keeps this run's files. Under Slurm the node's name
        is part of it: srun hands every task the same $HOME, which is often one shared
        directory for the whole cluster."""
        return f"{self.run_id}/{host}" if self.slurm is not None else self.run_id

    def to_json(self) -> dict:
        ssh = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.ssh).items()}
        return {"format": SOAK_RUN_FORMAT, "run_id": self.run_id, "engine": self.engine, "seconds": self.seconds,
                "interval_s": self.interval_s, "hosts": [asdict(h) for h in self.hosts],
                "local_name": self.local_name, "ssh": ssh, "python": self.python, "node_dir": self.node_dir,
                "agent_args": list(self.agent_args), "builtin_model": self.builtin_model, "poll_s": self.poll_s,
                "created": self.created, "slurm": self.slurm.to_json() if self.slurm is not None else None}

    @classmethod
    def from_json(cls, doc: dict, out: Path) -> SoakPlan:
        ssh = {k: (Path(v) if k in ("identity", "ssh_config", "known_hosts") and v else v)
               for k, v in doc["ssh"].items()}
        return cls(run_id=doc["run_id"], out=out, engine=doc["engine"], seconds=doc["seconds"],
                   interval_s=doc["interval_s"], hosts=tuple(Host(**h) for h in doc["hosts"]),
                   local_name=doc["local_name"], ssh=SshOptions(**ssh), python=doc["python"],
                   node_dir=doc["node_dir"], agent_args=tuple(doc["agent_args"]),
                   builtin_model=doc.get("builtin_model"), poll_s=doc["poll_s"], created=doc["created"],
                   slurm=SlurmSoak.from_json(doc["slurm"]) if doc.get("slurm") else None)


def run_json_path(out: Path, run_id: str) -> Path:
    return out / run_id / "soak" / "run.json"


def write_plan(plan: SoakPlan) -> Path:
    path = run_json_path(plan.out, plan.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    return path


def load_plan(out: Path, run_id: str) -> SoakPlan:
    path = run_json_path(out, run_id)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SoakUsageError(f"--attach: no soak run {run_id!r} here ({path} does not exist)") from None
    except ValueError as exc:
        raise SoakUsageError(f"--attach: {path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise SoakUsageError(f"--attach: {path}: not a JSON object")
    if doc.get("format") != SOAK_RUN_FORMAT:
        raise SoakUsageError(f"--attach: {path}: format is {doc.get('format')!r}, expected {SOAK_RUN_FORMAT!r}")
    try:
        plan = SoakPlan.from_json(doc, out)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # A hand-edited or damaged run.json: say which file, not a traceback.
        what = f"field {exc.args[0]!r} missing" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise SoakUsageError(f"--attach: {path}: not a readable soak run ({what})") from None
    bad = _bad_plan_field(plan)
    if bad:
        raise SoakUsageError(f"--attach: {path}: field {bad}")
    return plan


def _bad_plan_field(plan: SoakPlan) -> str | None:
    """The first field of a loaded plan with a value no run could have had."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0

    checks = [("seconds", number(plan.seconds)), ("interval_s", number(plan.interval_s)),
              ("poll_s", number(plan.poll_s)), ("run_id", isinstance(plan.run_id, str) and plan.run_id == Path(
                  plan.run_id).name and plan.run_id not in ("", ".", "..")),
              ("engine", isinstance(plan.engine, str)), ("node_dir", isinstance(plan.node_dir, str)),
              ("hosts", all(isinstance(h.name, str) for h in plan.hosts)),
              ("agent_args", all(isinstance(a, str) for a in plan.agent_args)),
              ("slurm", plan.slurm is None or all(j.job is None or isinstance(j.job, int) for j in plan.slurm.jobs))]
    return next((f"{name!r} has a value no soak run writes" for name, ok in checks if not ok), None)


def builtin_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))
