"""The collective stage as one call: the hosts, the evidence so far, a launcher ``Node`` and the
options in; its runs out through ``on_result`` (the bundle's pseudo-host); the bisection it
walked back. ``run --nccl-multinode`` calls it over SSH; ``preflight fabric --collective`` can
call it with its own launcher.

It lives in app/ because it joins execution (collect/: which runs to launch, through the
launcher) with judgment (judge/collective.py: whether a round's runs passed), and collect/ may
not import judge/.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from preflight.collect.multinode import PROBE_FULL, VARIANTS, MultinodeOptions, record_not_run, run_stage, stage_members
from preflight.collect.node import Node
from preflight.collect.ssh import SshNode, SshOptions, address_of
from preflight.fabric.bisection import Bisection
from preflight.judge.collective import Expectation, RoundJudge
from preflight.knowledge.profiles import Profile
from preflight.model import Host, ProbeResult

PER_NIC = "nccl.inter_node_busbw_per_nic_gbs"
MIN_JUDGED_BYTES = 1 << 30  # smaller messages do not reach the link rate (docs/sources.md §3)


def judge_for(options: MultinodeOptions) -> RoundJudge:
    """The round judge the stage and the check share: relative for the mpi engine without an
    explicit expectation, none for nccl's bisection without one (the check holds the fleet runs
    against the profile)."""
    return RoundJudge(Expectation.of(options.expect_busbw_gbs, options.slow_ratio, relative=options.tool == "mpi"))


def with_profile_expectation(options: MultinodeOptions, profiles: Iterable[Profile]) -> MultinodeOptions:
    """nccl-tests without an explicit figure: the hosts' shared profile's per-NIC inter-node bus
    bandwidth (46 GB/s per NDR NIC, docs/sources.md §3), so a slow inter-node split is bisected
    too. Every run is held to the per-NIC figure: the inter-node split and the bisection's runs of
    it carry one NIC per communicator; the full and intra-node runs are faster than one NIC, so
    the figure is lenient there (the check holds them to their own figures). Not when the largest
    message is below 1 GiB, nor when the hosts differ in profile."""
    chosen = {p.id: p for p in profiles}
    figure = next(iter(chosen.values())).get(PER_NIC) if len(chosen) == 1 else None
    if options.tool != "nccl" or options.expect_busbw_gbs is not None or figure is None \
            or options.max_bytes < MIN_JUDGED_BYTES:
        return options
    return replace(options, expect_busbw_gbs=float(figure))


def collective_stage(hosts: Sequence[Host], evidence: Mapping[str, Mapping[str, ProbeResult]], launcher: Node,
                     options: MultinodeOptions, on_result: Callable[[ProbeResult], None], run_id: str,
                     fleet_host: str, addresses: Mapping[str, str] = {}) -> Bisection | str | None:
    """The fleet runs and, when one fails, hangs or is slow, the bisection. Returns the
    bisection walked; None when none was needed; a string saying why the stage could not run.
    ``addresses``: each host's address as the launcher's ssh reaches it, where not its name."""
    picked = stage_members(hosts, evidence, on_result, fleet_host, options.tool)
    if isinstance(picked, str):
        return picked
    members, gpus, _ = picked
    judge = judge_for(options)
    return run_stage([h.name for h in members], gpus, launcher, options, run_id, on_result, fleet_host, judge,
                     split_once=judge.expectation.relative, addresses=addresses)


def collective_over_ssh(hosts: Sequence[Host], evidence: Mapping[str, Mapping[str, ProbeResult]],
                        on_result: Callable[[ProbeResult], None], ssh: SshOptions, options: MultinodeOptions,
                        run_id: str, fleet_host: str) -> Bisection | str | None:
    """The stage with the first member host as the launcher (mpirun runs there)."""
    picked = stage_members(hosts, evidence, on_result, fleet_host, options.tool)
    if isinstance(picked, str):
        return picked
    members = picked[0]
    launcher = SshNode(members[0], ssh)
    why = launcher.connect()
    if why:
        record_not_run(VARIANTS if options.tool == "nccl" else [PROBE_FULL], on_result, fleet_host,
                       f"launcher {members[0].name}: {why}")
        return None
    try:
        return collective_stage(members, evidence, launcher, options, on_result, run_id, fleet_host,
                                addresses={h.name: address_of(h, ssh) for h in members})
    finally:
        launcher.close()
