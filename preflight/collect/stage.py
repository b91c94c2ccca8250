"""A stage that runs after the per-host probes of a run: what it is handed, and its type.

``preflight.app.run.execute`` calls each of a request's stages in turn, once the hosts' own
probes are saved, with the inventory, the evidence of the hosts it reached, the way to save a
result into the bundle, and how the run reaches nodes (SSH options, or Slurm's). The rail stage
(``preflight fabric``) is one; the collective's bisection plugs in the same way, after it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from preflight.collect.slurm_job import SlurmOptions
from preflight.collect.ssh import SshOptions
from preflight.model import Host, ProbeResult


@dataclass(frozen=True)
class StageContext:
    hosts: Sequence[Host]  # the inventory, in its order
    evidence: Mapping[str, Mapping[str, ProbeResult]]  # reached hosts' probe results
    on_result: Callable[[ProbeResult], None]  # saves into the bundle (host or fleet- pseudo-host)
    ssh: SshOptions
    slurm: SlurmOptions | None  # set: reach nodes through srun steps instead of SSH
    run_id: str


Stage = Callable[[StageContext], None]
