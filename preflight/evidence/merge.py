"""``preflight merge``: one bundle from many, for sites that run preflight on each node
themselves (``srun preflight run --local --out /shared/...``) and judge the fleet afterwards.

Each source is a bundle, a run directory holding ``bundle/``, or a directory of those (one
level down, as ``--out`` leaves them). Every host's results are copied, through the same
``BundleWriter`` a run uses, from the newest source (by ``created``) that recorded anything for
it; an older copy is listed as superseded. Expected hosts (``--expect``) that no source has are
listed in the merged bundle's ``hosts`` with no directory, which the analysis reports as
``run-incomplete`` ("no evidence recorded"), as for a run that never reached them. The header
says where each host came from (``merged_from``) and which expected hosts had nothing
(``expected_missing``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from preflight.evidence.bundle import FLEET_HOST, Bundle, BundleError, BundleWriter, read_bundle


def find_bundles(paths: Sequence[Path]) -> list[Path]:
    """The bundle directories the arguments name, in order; a path holding none is an error."""
    found: list[Path] = []
    for path in paths:
        if own := _bundle_at(path):
            found.append(own)
            continue
        inside = sorted(b for child in (sorted(path.iterdir()) if path.is_dir() else []) if (b := _bundle_at(child)))
        if not inside:
            raise BundleError(f"{path}: no preflight bundle here (neither bundle.json, bundle/bundle.json, "
                              "nor run directories holding one)")
        found.extend(inside)
    return list(dict.fromkeys(p.resolve() for p in found))


def _bundle_at(path: Path) -> Path | None:
    if (path / "bundle.json").is_file():
        return path
    if (path / "bundle" / "bundle.json").is_file():
        return path / "bundle"
    return None


@dataclass
class MergePlan:
    hosts: list[str]  # the merged bundle's inventory, in order
    source: dict[str, Bundle]  # host -> the bundle its results come from
    superseded: list[tuple[str, Path]] = field(default_factory=list)  # (host, older bundle) not used
    missing: list[str] = field(default_factory=list)  # expected, recorded by no source
    probes: list[str] | None = None  # planned by every source (None: no source said)
    fleet: Bundle | None = None  # the one source with fleet- results, if any
    checks: list[str] | None = None  # judged by any source (None: a source did not say)


def plan_merge(bundles: Sequence[Bundle], expect: Sequence[str] | None = None) -> MergePlan:
    newest_first = sorted(bundles, key=lambda b: b.created, reverse=True)
    source: dict[str, Bundle] = {}
    superseded: list[tuple[str, Path]] = []
    for b in newest_first:
        for host in b.hosts:
            if not b.probes_of(host):
                continue  # listed but never reached in that run: another source may have it
            if host in source:
                superseded.append((host, b.root))
            else:
                source[host] = b
    found = sorted(source)
    hosts = list(dict.fromkeys([*(expect or []), *found]))
    missing = [h for h in (expect or []) if h not in source]
    planned = [b.header.get("probes") for b in bundles if isinstance(b.header.get("probes"), list)]
    probes = [p for p in planned[0] if all(p in other for other in planned)] if planned else None
    with_fleet = [b for b in newest_first if b.fleet]
    if len(with_fleet) > 1:
        raise BundleError("several sources hold runs across hosts (hosts/fleet-): "
                          + ", ".join(str(b.root) for b in with_fleet) + "; merge per-node bundles only")
    judged = [b.header.get("checks") for b in bundles]
    # Any source's: a node from a --quick run is then judged "not run" on the active checks a
    # full run of the others judged, which is what happened to it.
    checks = (list(dict.fromkeys(c for j in judged for c in j)) if judged and all(isinstance(j, list) for j in judged)
              else None)
    return MergePlan(hosts, source, superseded, missing, probes, with_fleet[0] if with_fleet else None, checks)


def write_merged(plan: MergePlan, root: Path, created: str, meta: dict) -> None:
    header = dict(meta)
    if plan.probes is not None:
        header["probes"] = plan.probes
    if plan.checks is not None:
        header["checks"] = plan.checks
    header["merged_from"] = [
        {"bundle": str(b.root), "run_id": b.header.get("run_id"), "created": b.created,
         "hosts": [h for h in plan.hosts if plan.source.get(h) is b]}
        for b in {id(b): b for b in plan.source.values()}.values()  # each source once (bundles do not hash)
    ]
    header["expected_missing"] = plan.missing
    if plan.superseded:
        header["superseded"] = [{"host": h, "bundle": str(p)} for h, p in plan.superseded]
    writer = BundleWriter(root, plan.hosts, created, header)
    for host, b in plan.source.items():
        for result in b.probes_of(host).values():
            writer.add(result)
    if plan.fleet is not None:
        for result in plan.fleet.fleet.values():
            writer.add(result)


def read_sources(paths: Sequence[Path]) -> list[Bundle]:
    bundles = [read_bundle(p) for p in find_bundles(paths)]
    for b in bundles:
        if FLEET_HOST in b.hosts:
            raise BundleError(f"{b.root}: lists the pseudo-host {FLEET_HOST!r} as a host")
    return bundles
