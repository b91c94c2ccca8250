"""One ``preflight run``: probes out to the hosts, evidence into a bundle, then the judgement.

The bundle is written as results arrive and the analysis reads only the bundle, so what a
run decides is exactly what ``preflight analyze`` on its bundle decides, and a run that dies
half-way still leaves evidence to analyse. Each host is judged from its saved records as soon
as they are complete (``judge.incremental``), so judging overlaps the rest of the collection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from preflight import __version__
from preflight.app.collective import collective_over_ssh, judge_for, with_profile_expectation
from preflight.app.interrupt import Interrupted
from preflight.collect.fanout import ExecPlan, run_node
from preflight.collect.local import LocalNode, local_host_name
from preflight.collect.multinode import MultinodeOptions
from preflight.collect.multinode_slurm import run_multinode_slurm
from preflight.collect.probes import PROBES, Probe
from preflight.collect.shards import auto_workers, run_sharded
from preflight.collect.slurm_fleet import prepare, run_slurm
from preflight.collect.slurm_job import SlurmOptions
from preflight.collect.stage import Stage, StageContext
from preflight.diagnose.analysis import analyze
from preflight.diagnose.engine import KnowledgeBase
from preflight.evidence.bundle import FLEET_HOST, BundleWriter, host_reachability
from preflight.judge.analyze import HostJudgement
from preflight.judge.incremental import IncrementalJudge
from preflight.judge.loader import CheckLoadError
from preflight.knowledge.profiles import Profile
from preflight.model import Analysis, Check, Host, HostHistory, ProbeResult
from preflight.report.files import write_reports
from preflight.report.history import digest as history_digest


def probes_for(checks: list[Check], options: Mapping[str, Any] | None = None) -> tuple[Probe, ...]:
    """Every probe the selected checks read, once, in catalogue order; a parametrised probe
    configured with the run's options for it (``options[probe id]``; its defaults when absent)."""
    wanted = {p for c in checks for p in c.probes}
    unknown = sorted(wanted - PROBES.keys())
    if unknown:
        raise CheckLoadError(f"checks need unknown probe(s): {', '.join(unknown)}")
    options = options or {}
    planned = tuple(p.configured(options.get(pid)) for pid, p in PROBES.items() if pid in wanted)
    # A reading "after the active tests" means nothing in a run without them (--quick).
    if not any(p.active for p in planned):
        planned = tuple(p for p in planned if not p.after_active)
    return planned


@dataclass(frozen=True)
class RunRequest:
    hosts: list[Host]  # empty: this machine, without SSH
    checks: list[Check]
    profiles: dict[str, Profile]
    kb: KnowledgeBase
    plan: ExecPlan
    out_dir: Path
    run_id: str
    forced_profile: str | None = None
    html: bool = True  # write report.html beside the other reports
    multinode: MultinodeOptions | None = None  # --nccl-multinode: after the per-host probes (mpirun or srun)
    slurm: SlurmOptions | None = None  # --slurm: the hosts are Slurm nodes, probed by srun tasks
    # --history: the nodes' past from the results store, for the checks that read it
    histories: Mapping[str, HostHistory] | None = None
    # Stages that run across the hosts after their own probes, in order (`preflight fabric`'s
    # rail stage; the collective's bisection after it). Each gets the reached hosts' evidence.
    stages: tuple[Stage, ...] = ()


def execute(req: RunRequest, progress: Callable[[ProbeResult], None] | None = None,
            judged: Callable[[HostJudgement], None] | None = None) -> tuple[Path, Analysis]:
    """Run, save, analyse, write the reports; return the run directory and the analysis.
    ``progress`` sees every result once it is saved (the live view's ``RunProgress.record``),
    ``judged`` every host's judgement from its own checks as soon as it is made."""
    run_dir = req.out_dir / req.run_id
    bundle_dir = run_dir / "bundle"
    local = not req.hosts
    names = [local_host_name()] if local else [h.name for h in req.hosts]
    started_at = time.time()
    created = datetime.fromtimestamp(started_at, timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    meta = {"run_id": req.run_id, "preflight_version": __version__, "probes": [p.id for p in req.plan.probes],
            "checks": [c.id for c in req.checks], "local": local}
    slurm = None
    if req.slurm:
        # Node states and allocations first: a request Slurm refuses leaves nothing written.
        slurm = prepare(names, req.plan, req.slurm, req.run_id)
        meta.update(launcher="slurm", slurm_jobs=[a.job for a in slurm.allocations if a.job is not None])
    try:
        writer = BundleWriter(bundle_dir, names, created, meta)
    except BaseException:
        if slurm:
            slurm.release()
        raise

    # Each host is judged as soon as its last record is saved, while the others are still being
    # probed; only the fleet checks, the diagnosis and the reports wait for the whole fleet.
    early = IncrementalJudge(req.checks, req.profiles, meta["probes"], req.forced_profile, judged, req.histories)

    def on_result(result: ProbeResult) -> None:
        writer.add(result)
        early.offer(result.host, writer.records_of(result.host))
        if progress:
            progress(result)

    try:
        if slurm:
            run_slurm(slurm, req.plan, on_result)
        elif local:
            run_node(LocalNode(names[0]), req.plan, on_result)
        else:
            run_sharded(req.hosts, req.plan, on_result, req.plan.workers or auto_workers(len(req.hosts)))
        # The run's stages (the rails of `preflight fabric`), before the collective across them.
        if req.stages and not local:
            bundle = writer.bundle()
            reached = {h.name: bundle.probes_of(h.name) for h in req.hosts if host_reachability(bundle, h.name)[0]}
            context = StageContext(req.hosts, reached, writer.add, req.plan.ssh, req.slurm, req.run_id)
            for stage in req.stages:
                stage(context)
        if req.multinode and not local:
            bundle = writer.bundle()
            reached = {h.name: bundle.probes_of(h.name) for h in req.hosts if host_reachability(bundle, h.name)[0]}
            # The hosts' profiles, as their own judgement chose them: the nccl engine's expectation.
            chosen = [j.profile for h, j in early.judged(bundle).items() if h in reached]
            multinode = with_profile_expectation(req.multinode, chosen)
            if req.slurm:
                judge = judge_for(multinode)
                run_multinode_slurm(req.hosts, reached, writer.add, req.slurm, multinode, req.run_id, FLEET_HOST,
                                    judge, split_once=judge.expectation.relative)
            else:
                collective_over_ssh(req.hosts, reached, writer.add, req.plan.ssh, multinode, req.run_id, FLEET_HOST)
        bundle = writer.bundle()
        judged = early.judged(bundle)
    except KeyboardInterrupt:
        raise Interrupted(bundle_dir) from None
    finally:
        early.close()

    analysis = analyze(bundle, req.checks, req.profiles, req.kb, req.forced_profile, judged, req.histories)
    analysis.meta.update({"run_id": req.run_id, "kind": "run", "created": created, "preflight_version": __version__,
                          "launcher": "slurm" if req.slurm else ("local" if local else "ssh"),
                          "duration_s": round(time.monotonic() - t0, 3), "started_at": round(started_at, 3),
                          "bundle": "bundle"})
    if req.histories:
        analysis.meta["history"] = history_digest(analysis, req.histories)
    write_reports(run_dir, analysis, req.html)
    return run_dir, analysis
