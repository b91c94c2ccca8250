"""A site profile: thresholds derived from a site's own known-good runs, for figures NVIDIA
does not publish (8 x B200/B300 or GB300 all_reduce busbw, and any figure a profile lacks).

``derive`` is the statistics, pure: samples in, a median and a robust spread out, with the
warn and fail lines. ``site_profile`` writes them into a copy of the profile the runs were
judged under, in the schema every profile uses, so ``--profile-file`` judges against it and
the runs it came from travel inside it (``baseline:``, a section of the site's own).

The threshold rule, and why:
- the figure is the **median** of the samples: one odd run cannot move it;
- the spread is the **MAD** (median absolute deviation) scaled by 1.4826, which makes it
  estimate a standard deviation for normal noise while ignoring the odd run a mean and stdev
  would take in;
- the margin is 3 of those (the usual robust outlier cut, Hampel's identifier), but never
  less than 5 % of the median: runs that happen to agree to the last digit (or one capture
  replayed) would otherwise flag ordinary run-to-run noise, and 5 % is the noise the project
  already allows between repetitions (``CV_TOLERANCE`` of checks/nccl_all_reduce.py); and never
  more than 15 %: a noisy baseline must not accept more than a published figure does (warn
  below 85 % of it, same check);
- below median - margin WARNs; below median - 2 x margin FAILs: twice what the site's own
  noise explains.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from statistics import median

MIN_SAMPLES = 3  # fewer, and the median is one of two runs: no spread can be told from them
MAD_SCALE = 1.4826  # MAD x this estimates a standard deviation for normally distributed noise
K = 3.0
FLOOR = 0.05
CAP = 0.15

# The figures a baseline can set: the profile key of the figure, and the keys of its lines.
FIGURES: dict[str, dict[str, str]] = {
    "nccl.all_reduce_busbw_gbs": {"warn": "nccl.all_reduce_busbw_warn_gbs",
                                  "fail": "nccl.all_reduce_busbw_fail_gbs",
                                  "what": "single-node all_reduce busbw at the largest size, GB/s"},
}


class BaselineError(ValueError):
    """Runs that cannot make a baseline; the message names the file and field."""


@dataclass(frozen=True)
class Sample:
    value: float
    run_id: str
    created: str
    host: str | None = None  # None: one run's median over its hosts


@dataclass(frozen=True)
class Spread:
    median: float
    mad: float
    sigma: float  # MAD x MAD_SCALE
    margin: float
    warn_below: float
    fail_below: float
    n: int


@dataclass(frozen=True)
class RunSource:
    run_id: str
    path: str
    created: str
    hosts: int


@dataclass(frozen=True)
class Context:
    """What every sample shares, so the figure is held only against a like run."""

    base: dict  # the profile the runs were judged under (its data)
    gpu_model: str | None
    ranks: int | None
    message_bytes: int | None
    from_fleet: bool


def derive(values: list[float]) -> Spread:
    """Median, MAD and the warn / fail lines of the rule above."""
    if len(values) < MIN_SAMPLES:
        raise BaselineError(f"{len(values)} sample(s): a baseline needs at least {MIN_SAMPLES}")
    if any(v <= 0 for v in values):
        raise BaselineError("a sample of 0 or less: not a measured bandwidth")
    mid = median(values)
    mad = median(abs(v - mid) for v in values)
    sigma = mad * MAD_SCALE
    margin = min(max(K * sigma, FLOOR * mid), CAP * mid)
    return Spread(mid, mad, sigma, margin, mid - margin, mid - 2 * margin, len(values))


def site_profile(figure: str, samples: list[Sample], runs: list[RunSource], ctx: Context,
                 derived_at: str) -> dict:
    """The profile YAML (as a dict): the base profile with the figure and its lines set, each
    with its source, and the samples and runs it came from under ``baseline``."""
    keys = FIGURES[figure]
    spread = derive([s.value for s in samples])
    data = copy.deepcopy(ctx.base)
    name = str(data.get("name", data.get("id")))
    data["name"] = name if name.endswith(" (site baseline)") else f"{name} (site baseline)"
    # Every figure of FIGURES lives in the nccl section (a profile may leave it empty or null).
    nccl = dict(data.get("nccl") or {})
    data["nccl"] = nccl
    nccl[figure.partition(".")[2]] = round(spread.median, 2)
    for line in ("warn", "fail"):
        nccl[keys[line].partition(".")[2]] = round(getattr(spread, f"{line}_below"), 2)
    if ctx.ranks is not None:
        nccl["all_reduce_ranks"] = ctx.ranks
    if ctx.message_bytes is not None:
        nccl["all_reduce_bytes"] = ctx.message_bytes
    if ctx.gpu_model:
        nccl["all_reduce_gpu_model"] = ctx.gpu_model
    how = "every node a sample, --from-fleet" if ctx.from_fleet else "one median per run"
    origin = (f"site baseline {derived_at}: median of {spread.n} samples ({how}) from "
              f"{', '.join(r.run_id for r in runs)}")
    sources = dict(data.get("sources") or {})
    data["sources"] = sources
    sources[figure] = origin
    sources[keys["warn"]] = (f"median - margin, margin = clamp(3 x 1.4826 x MAD, {FLOOR:.0%}, {CAP:.0%} of the "
                             f"median) = {spread.margin:.2f} GB/s (preflight/knowledge/site_profile.py)")
    sources[keys["fail"]] = "median - 2 x margin (preflight/knowledge/site_profile.py)"
    if ctx.ranks is not None:
        sources["nccl.all_reduce_ranks"] = f"the ranks of every sample ({origin})"
    if ctx.message_bytes is not None:
        sources["nccl.all_reduce_bytes"] = f"the largest message of every sample ({origin})"
    if ctx.gpu_model:
        sources["nccl.all_reduce_gpu_model"] = f"the GPU model of every sample's device lines ({origin})"
    data["baseline"] = {
        "derived": derived_at,
        "rule": "warn below median - margin, fail below median - 2 x margin; margin = 3 x 1.4826 x MAD, "
                f"at least {FLOOR:.0%} and at most {CAP:.0%} of the median",
        "from_fleet": ctx.from_fleet,
        "gpu_model": ctx.gpu_model,
        "runs": [{"run_id": r.run_id, "path": r.path, "created": r.created, "hosts": r.hosts} for r in runs],
        "figures": {figure: {
            "what": keys["what"], "median": round(spread.median, 3), "mad": round(spread.mad, 3),
            "sigma": round(spread.sigma, 3), "margin": round(spread.margin, 3),
            "warn_below": round(spread.warn_below, 3), "fail_below": round(spread.fail_below, 3),
            "samples": [{"value": s.value, "run_id": s.run_id, "created": s.created,
                         **({"host": s.host} if s.host else {})} for s in samples],
        }},
    }
    return data
