"""Single-node all_reduce against the fleet's own median, where no profile figure exists.

NVIDIA publishes no all_reduce figure for 8 x B200/B300 or GB300 trays (playbooks/profiles,
docs/sources.md §3), so checks/nccl_all_reduce.py can only report their busbw. In a fleet of
like nodes the nodes themselves are the reference: a node far below its peers is slow even
when nobody published how fast it should be.

How faulty is told from normal:
- Only nodes whose profile has no ``nccl.all_reduce_busbw_gbs`` are compared (a published or
  site-baseline figure is judged by nccl-all-reduce itself), and only a clean run: every
  repetition passed, all_reduce on one host, more than one rank, largest message at least
  1 GiB (smaller ones do not reach the link rate, docs/sources.md §3). A node whose run hung or
  failed is already failed by nccl-all-reduce; this check says nothing about it.
- Nodes are compared only with their like: the same GPU model (from the run's device lines),
  the same rank count and the same largest message. Each such group needs ``MIN_FLEET`` (4)
  nodes: with 3 or fewer, one odd node is a third of the group or more, and two slow nodes of
  three make the healthy one the outlier. Below that the check names the group (SKIP, no host)
  and judges nobody; a node alone is not a fleet, and the check says nothing.
- The figure is the node's busbw at the largest size (median over its repetitions, the higher
  of out-of-place and in-place, as nccl-all-reduce reads it), against the group's median.
  More than 15 % below WARNs, more than 50 % below FAILs (``nccl-below-fleet-median``): the
  margins nccl-all-reduce holds against a published figure, for the same reasons (15 % absorbs
  noise; half is a link or GPU missing from the path). The summary says the judgement is
  relative: a fleet that is slow as a whole passes here, which only a published or site
  figure (``preflight baseline``) can catch.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from preflight.check import fail, fleet_check, ok, skip, warn
from preflight.collect.nccl import PROBE_ID
from preflight.model import Evidence
from preflight.parse.nccl_probe import NcclProbeOutput
from preflight.parse.nccl_tests import NcclRun, largest_row

MIN_FLEET = 4
REL_WARN = 0.15
REL_FAIL = 0.50
MIN_BYTES = 1 << 30
SYMPTOM = "nccl-below-fleet-median"
_REDUCTIONS = {"sum", "prod", "min", "max", "avg"}


@dataclass(frozen=True)
class Measure:
    busbw: float
    model: str | None
    ranks: int
    largest: int


@fleet_check("nccl-fleet-relative", facts=["nccl"],
             summary="single-node all_reduce busbw against the fleet's median where the profile has no figure")
def nccl_fleet_relative(fleet):
    groups: dict[tuple, dict[str, Measure]] = {}
    for name, host in fleet.hosts.items():
        if host.profile.get("nccl.all_reduce_busbw_gbs") is not None or host.result(PROBE_ID) is None:
            continue
        out = host.optional("nccl")
        m = measure(out) if out is not None else None
        if m is not None:
            groups.setdefault((m.model, m.ranks, m.largest), {})[name] = m
    findings = []
    for (model, ranks, largest), members in groups.items():
        like = f"{ranks} x {model or 'GPU (model not in the output)'} at {_size(largest)}"
        if len(members) == 1:
            continue  # one node is not a fleet: nothing to say
        if len(members) < MIN_FLEET:
            findings.append(skip(f"{len(members)} host(s) of {like} ({', '.join(members)}): fewer than {MIN_FLEET}, "
                                 "no fleet median to compare with"))
            continue
        findings += judge_group(fleet, members, like)
    return findings or None


def judge_group(fleet, members: dict[str, Measure], like: str) -> list:
    mid = median(m.busbw for m in members.values())
    out = []
    for name, m in members.items():
        below = 1 - m.busbw / mid if mid > 0 else 0.0
        data = {"busbw_gbs": m.busbw, "fleet_median_gbs": mid, "fleet_hosts": len(members),
                "below_median": below, "relative": True}
        measured = (f"busbw {m.busbw:.1f} GB/s, {abs(below):.0%} {'below' if below >= 0 else 'above'} the fleet's "
                    f"median {mid:.1f} GB/s over {len(members)} hosts of {like}")
        evidence = [_row(fleet, name, m.largest)]
        if below > REL_WARN:
            verdict = fail if below > REL_FAIL else warn
            out.append(verdict(f"slower than the fleet: {measured} (relative judgement: no published figure; "
                               f"warn beyond {REL_WARN:.0%}, fail beyond {REL_FAIL:.0%} below)",
                               host=name, symptoms=[SYMPTOM], evidence=evidence, data=data,
                               action=f"compare {name}'s NVLink, PCIe and clocks with a node near the median; "
                                      "then set a site figure with `preflight baseline`"))
        else:
            out.append(ok(f"{measured} (relative: within {REL_WARN:.0%})", host=name, evidence=evidence, data=data))
    return out


def measure(out: NcclProbeOutput) -> Measure | None:
    """The node's busbw when every repetition passed a single-host all_reduce the fleet can
    compare; None otherwise (nccl-all-reduce judges those runs on its own)."""
    reps = out.repetitions
    if not reps:
        return None
    figures, shapes = [], set()
    for i, rep in enumerate(reps):
        state = rep.state()
        clean = (state is None and rep.complete and not rep.errors
                 and not (out.cut_off and i == len(reps) - 1)) or (state is not None and state[0] == "passed")
        runs = [run for run in rep.runs if run.rows]
        if not clean or not runs:
            return None
        run = runs[-1]
        row = largest_row(run)
        hosts = {d.host for d in run.devices}
        if (not _all_reduce(run) or len(hosts) > 1 or not run.nranks or run.nranks < 2
                or row.size_bytes < MIN_BYTES):
            return None
        models = {d.name for d in run.devices if d.name}
        shapes.add((models.pop() if len(models) == 1 else None, run.nranks, row.size_bytes))
        figures.append(max(row.in_place.busbw, row.out_of_place.busbw if row.out_of_place else 0.0))
    if len(shapes) != 1:
        return None  # repetitions that differ in shape are not one figure
    model, ranks, largest = shapes.pop()
    return Measure(median(figures), model, ranks, largest)


def _all_reduce(run: NcclRun) -> bool:
    if run.collective:
        return run.collective == "all_reduce"
    # all_reduce_perf without its header: reductions carry an operator; gathers print "none".
    return bool({row.redop for row in run.rows} & _REDUCTIONS)


def _row(fleet, host: str, size: int) -> Evidence | None:
    return fleet.hosts[host].excerpt(PROBE_ID, rf"^\s*{size}\s+\d+\s+\S+", limit=2)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"
