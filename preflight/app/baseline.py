"""``preflight baseline RUN... [--from-fleet] [--out FILE]``: a site profile from known-good runs.

Each RUN (a run directory or a bundle) is judged as ``analyze`` judges it; the figures of the
hosts whose check passed become the samples of ``preflight.knowledge.site_profile.derive``:
- by default one sample per RUN, the median over its hosts: repeated runs of known-good nodes,
  so the spread is the run-to-run noise;
- with ``--from-fleet`` every host of every RUN is a sample: one run of a fleet, so the spread
  is the node-to-node noise.

A run that cannot vouch for the figure is refused, naming the file and field: a host whose
check did not PASS, a host without the figure (single GPU, no active test), hosts or runs that
differ in profile, GPU model, rank count or message size (one baseline is for one platform and
one test shape), and too few samples. Nothing is written then.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from statistics import median

import yaml

from preflight.collect.nccl import PROBE_ID as NCCL_PROBE_ID
from preflight.diagnose.analysis import analyze
from preflight.diagnose.engine import KnowledgeBase
from preflight.evidence.bundle import read_bundle
from preflight.knowledge.profiles import Profile
from preflight.knowledge.site_profile import MIN_SAMPLES, BaselineError, Context, RunSource, Sample, site_profile
from preflight.model import Check, Status
from preflight.parse.nccl_probe import parse_probe_output
from preflight.report.files import write_atomic

FIGURE = "nccl.all_reduce_busbw_gbs"
CHECK_ID = "nccl-all-reduce"
# A host the fleet comparison holds below its peers is not known-good for this figure either.
ALSO_PASS = ("nccl-fleet-relative",)


@dataclass(frozen=True)
class HostFigure:
    run: RunSource
    where: str  # the probe file the figure was read from, for messages
    host: str
    value: float
    shape: dict  # what must match across samples: profile, GPU model, ranks, message size


def bundle_root(path: Path) -> Path:
    """A bundle, or the run directory holding one (as ``analyze`` accepts)."""
    return path / "bundle" if (path / "bundle" / "bundle.json").is_file() else path


def host_figures(path: Path, checks: list[Check], profiles: dict[str, Profile], kb: KnowledgeBase,
                 forced_profile: str | None) -> list[HostFigure]:
    root = bundle_root(path)
    bundle = read_bundle(root)
    analysis = analyze(bundle, checks, profiles, kb, forced_profile)
    run = RunSource(str(bundle.header.get("run_id") or path.resolve().name), str(path), bundle.created,
                    len(bundle.hosts))
    found = {f.host: f for f in analysis.findings if f.check == CHECK_ID and f.host}
    odd = {f.host: f for f in analysis.findings
           if f.check in ALSO_PASS and f.host and f.status not in (Status.PASS, Status.SKIP)}
    out = []
    for host in bundle.hosts:
        where = f"{root}/hosts/{host}/{NCCL_PROBE_ID}.txt"
        finding = found.get(host)
        if finding is None:
            raise BaselineError(f"{where}: host {host} has no {CHECK_ID} result (unreachable, or a run with --quick): "
                                "a baseline takes runs whose every host ran the all_reduce test")
        if finding.status is not Status.PASS:
            raise BaselineError(f"{where}: {CHECK_ID} is {finding.status.value.upper()}, not PASS "
                                f"({finding.summary}): a baseline takes known-good runs only")
        if host in odd:
            raise BaselineError(f"{where}: {odd[host].check} is {odd[host].status.value.upper()}, not PASS "
                                f"({odd[host].summary}): a baseline takes known-good hosts only")
        value = finding.data.get("busbw_median_gbs")
        if not isinstance(value, (int, float)) or value <= 0:
            raise BaselineError(f"{where}: field busbw_median_gbs: no bus bandwidth in a passing run "
                                f"({finding.summary})")
        shape = {"profile": analysis.hosts[host].profile, "GPU model": gpu_model(bundle.probes_of(host)),
                 "ranks": finding.data.get("nranks"), "largest message": finding.data.get("largest_bytes")}
        out.append(HostFigure(run, where, host, float(value), shape))
    if not out:
        raise BaselineError(f"{root}/bundle.json: field hosts: no host to take a figure from")
    return out


def gpu_model(probes: dict) -> str | None:
    """The GPU model the all_reduce ran on, from its device lines (one model, or None): the
    platform a figure belongs to, even when no nvidia-smi evidence came with the run."""
    result = probes.get(NCCL_PROBE_ID)
    if result is None or result.stdout is None:
        return None
    out = parse_probe_output(result.text)
    models = {d.name for rep in out.repetitions for run in rep.runs for d in run.devices if d.name}
    return models.pop() if len(models) == 1 else None


def _same_shape(figures: list[HostFigure]) -> None:
    first = figures[0]
    for f in figures[1:]:
        for key, value in f.shape.items():
            if value != first.shape[key]:
                raise BaselineError(
                    f"{f.where}: {key} {value!r}, but {first.where} has {first.shape[key]!r}: one baseline is for "
                    "one platform and one test shape (judge other platforms with their own baseline)")


def samples_of(figures: list[HostFigure], from_fleet: bool) -> tuple[list[Sample], list[RunSource]]:
    runs = list(dict.fromkeys(f.run for f in figures))
    if from_fleet:
        samples = [Sample(f.value, f.run.run_id, f.run.created, f.host) for f in figures]
    else:
        samples = [Sample(median(f.value for f in figures if f.run == r), r.run_id, r.created) for r in runs]
    if len(samples) < MIN_SAMPLES:
        how = (f"{len(samples)} host(s) with --from-fleet" if from_fleet
               else f"{len(samples)} run(s), one sample each (--from-fleet takes every host of a run as a sample)")
        raise BaselineError(f"{figures[0].run.path}: {how}: a baseline needs at least {MIN_SAMPLES} samples")
    return samples, runs


def build(paths: list[Path], from_fleet: bool, checks: list[Check], profiles: dict[str, Profile],
          kb: KnowledgeBase, forced_profile: str | None = None, now: datetime | None = None) -> dict:
    """The site profile (a dict in the profile schema) from the runs at ``paths``."""
    seen: dict[Path, Path] = {}
    for p in paths:
        real = bundle_root(p).resolve()
        if real in seen:
            raise BaselineError(f"{p}: the same run as {seen[real]}: each run counts once")
        seen[real] = p
    figures = [f for p in paths for f in host_figures(p, checks, profiles, kb, forced_profile)]
    _same_shape(figures)
    samples, runs = samples_of(figures, from_fleet)
    shape = figures[0].shape
    base = profiles[shape["profile"]]
    ctx = Context(base.data, shape["GPU model"], shape["ranks"], shape["largest message"], from_fleet)
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return site_profile(FIGURE, samples, runs, ctx, stamp)


def render(profile: dict) -> str:
    head = ("# Site profile written by `preflight baseline`: judge later runs with --profile-file THIS_FILE.\n"
            "# The figures under nccl are this site's own (see sources and baseline), not NVIDIA's.\n")
    return head + yaml.safe_dump(profile, sort_keys=False, allow_unicode=True, width=110)


def write(profile: dict, out: Path) -> None:
    if not out.parent.is_dir():
        raise BaselineError(f"--out: {out.parent}: no such directory")
    write_atomic(out, render(profile))
