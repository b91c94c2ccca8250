"""nccl all_reduce across nodes: does it finish, right results, fast enough, and whose fault.

Input: the runs of preflight/collect/multinode.py, saved under the bundle's pseudo-host: the full
multi-node all_reduce (``nccl-multinode``), its intra-node-only and inter-node-only variants
(``NCCL_TESTS_SPLIT`` DIV/MOD the GPUs per node), the bisection's runs (``nccl-bisect-<round>-<i>``,
``nccl-pair-<suspect>-<partner>``); plus every host's own single-node run (nccl-all-reduce). With
``--collective-tool mpi`` the runs are the MPI engine's (``tool=mpi4py``), one rank per host.

How faulty is told from normal, per run (as checks/nccl_all_reduce.py does for one node):
stopped by its timeout or cut off -> ``nccl-hang``; mpirun non-zero, a "Test ... failure"
line, or no complete table -> ``nccl-failed``; ``#wrong`` or out-of-bounds values ->
``nccl-data-corruption``; NCCL WARN signatures -> their symptoms (transport errors FAIL, the
rest WARN; "no IB device" is a WARN here, since between nodes it means TCP sockets).

Bandwidth (``nccl-low-bandwidth``), judged only on a passed run whose largest message is at
least 1 GiB (smaller ones do not reach the link rate, docs/sources.md §3), against the profile's
``nccl.inter_node_busbw_per_nic_gbs`` (46 GB/s per NDR NIC, docs/sources.md §3):
- the full run crosses the NICs of every node at once: per-NIC figure x the NICs in use (the
  profile's ``nic.count``, at most one per GPU rank on a node);
- the inter-node variant runs one communicator per local GPU index, each with one rank per
  node, so each communicator rides one NIC: the per-NIC figure;
- the intra-node variant is reported, not judged: each node's own nccl-all-reduce check
  already holds intra-node bandwidth against the single-node figure.
Below 85% WARNs, below 50% FAILs: the margins of checks/nccl_all_reduce.py, for the same
reasons (measured peaks; 15% absorbs NCCL versions and noise; half is a missing path).

Where the fault is (symptoms that are cause ids, or that rules.yaml combines):
- inter-node variant bad while intra-node passes -> ``nccl-inter-node-fabric``;
- intra-node variant bad while inter-node passes -> ``nccl-intra-node-failed``;
- a failed multi-node run (``nccl-multinode-failed``) while every host passed its own
  single-node run (``nccl-single-node-passed``) -> rules.yaml: the inter-node fabric;
- the bisection (preflight/fabric/bisection.py, replayed from the saved ``nccl-bisect-*`` and
  ``nccl-pair-*`` runs by preflight/judge/collective.py): a node that fails its 2-node runs
  with trusted partners FAILs on its own finding with ``nccl-pair-failed`` (plus its runs'
  hang and WARN symptoms); two nodes that fail only together FAIL with
  ``collective-path-fault``; the fleet finding then names them and carries no symptom of its
  own, so the diagnosis lands on those hosts only. Hosts cleared by a passing run PASS; hosts
  left unresolved WARN. The fleet finding says what the walk cost: rounds, runs, node-runs.
- the launcher could not start the test (ssh refused, Open MPI's daemon lost): the hosts it
  names get ``collective-never-ran`` (ERROR: nothing was measured on them; no fabric fault).
- NCCL failed before any results table: the transport its WARN line names
  (``nccl-init-net-failed`` with the HCA, ``nccl-init-nvls-failed``, ``nccl-init-p2p-failed``).
"""

from __future__ import annotations

import re

from preflight.check import error, fail, fleet_check, ok, skip, warn
from preflight.collect.multinode import PROBE_FULL, PROBE_INTER, PROBE_INTRA, VARIANTS, single_node_failed
from preflight.collect.nccl import PROBE_ID as SINGLE_NODE_PROBE
from preflight.fabric.bisection import PAIR_PREFIX
from preflight.judge.collective import Expectation, RoundJudge, hang_named, is_bisection_probe, replay
from preflight.model import Evidence
from preflight.parse.collective_run import MPI_TOOL, MultinodeRun, read_run
from preflight.parse.nccl_tests import NcclRun, largest_row

LOW_WARN = 0.85
LOW_FAIL = 0.50
MIN_JUDGED_BYTES = 1 << 30
FATAL_SIGNATURES = ("nccl-ib-retry-exceeded", "nccl-ib-completion-error", "nccl-ib-qp-timeout",
                    "nccl-net-unreachable", "nccl-socket-refused")
_LABEL = {PROBE_FULL: "all hosts", PROBE_INTRA: "intra-node only", PROBE_INTER: "inter-node only"}
INIT_SYMPTOM = {"NET/IB": "nccl-init-net-failed", "NVLS": "nccl-init-nvls-failed", "P2P": "nccl-init-p2p-failed"}


@fleet_check("nccl-multinode", probes=[SINGLE_NODE_PROBE],
             summary="all_reduce across nodes (mpirun; intra/inter-node split; culprit node or path by bisection)")
def nccl_multinode(fleet):
    if PROBE_FULL not in fleet.probes:
        return skip("not run: `preflight run --nccl-multinode` runs it on two or more reachable hosts")
    runs = {pid: read_run(fleet.probes[pid]) for pid in VARIANTS if pid in fleet.probes}
    walked = [read_run(r) for pid, r in fleet.probes.items() if is_bisection_probe(pid)]
    if all(r.state == "not-run" for r in runs.values()):
        missing = fleet.probes[PROBE_FULL].tool_missing
        return error(f"multi-node all_reduce could not run: {runs[PROBE_FULL].why}",
                     symptoms=["tool-missing"] if missing else [],
                     evidence=[Evidence(PROBE_FULL, runs[PROBE_FULL].why)])

    hosts = next((r.hosts for r in runs.values() if r.hosts), ())
    never = [r for r in runs.values() if r.state == "never-ran"]
    if never and not walked:
        return _never_ran(fleet, never[0], hosts)
    v = _Verdict()
    for pid, run in runs.items():
        _judge_run(fleet, run, hosts, v, f"{_LABEL[pid]} ({_shape(run)})")
    _localise(fleet, runs, hosts, v)
    # Where a failing or hung fleet run points by its own output: NCCL WARN lines' hosts and the
    # peers they name, the ranks that never finished (mpi engine).
    named = [h for r in runs.values() if not r.ok for h in hang_named(r, hosts, dict(r.addresses))]
    if named:
        v.infos.append(f"the failing fleet runs' output names: {', '.join(dict.fromkeys(named))}")
        v.data["named"] = list(dict.fromkeys(named))
    host_outcomes = _judge_bisection(fleet, runs, walked, hosts, v)

    culprits = [o.host for o in host_outcomes if o.status.value == "fail"]
    unreachable = [o.host for o in host_outcomes if "collective-never-ran" in o.symptoms]
    if culprits or unreachable:
        v.symptoms.clear()
    if culprits:
        v.fails.insert(0, f"isolated by bisection: {', '.join(culprits)} (see the host findings)")
    if unreachable:
        phrase = f"the test never ran: {', '.join(unreachable)} unreachable from the launcher (see the host findings)"
        if not v.fails:
            return [error("; ".join([phrase] + v.warns + v.infos), evidence=v.evidence, data=v.data)] + host_outcomes
        v.fails.insert(0, phrase)
    summary = "; ".join(v.fails + v.warns + v.infos)
    verdict = fail if v.fails else warn if v.warns else ok
    return [verdict(summary, symptoms=v.symptoms, evidence=v.evidence, data=v.data)] + host_outcomes


class _Verdict:
    def __init__(self) -> None:
        self.fails: list[str] = []
        self.warns: list[str] = []
        self.infos: list[str] = []
        self.symptoms: list[str] = []
        self.evidence: list[Evidence] = []
        self.data: dict = {"runs": {}}
        self.slow: set[str] = set()  # runs whose bandwidth FAILed

    def symptom(self, symptom: str) -> None:
        if symptom not in self.symptoms:
            self.symptoms.append(symptom)

    def add(self, severity: str, phrase: str, *symptoms: str, evidence: Evidence | None = None) -> None:
        {"fail": self.fails, "warn": self.warns, "info": self.infos}[severity].append(phrase)
        self.symptoms += [s for s in symptoms if s not in self.symptoms]
        if evidence:
            self.evidence.append(evidence)


def _shape(run: MultinodeRun) -> str:
    return f"{len(run.hosts)} hosts x {run.slots} GPUs" if run.hosts else "hosts unknown"


# --------------------------------------------------------------------------- one run


def _judge_run(fleet, run: MultinodeRun, hosts, v: _Verdict, label: str) -> None:
    v.data["runs"][run.probe] = {"state": run.state, "hosts": list(run.hosts), "wrong": run.wrong}
    if run.state == "not-run":
        v.add("warn", f"{label}: not run ({run.why})")
        return
    if run.state == "never-ran":
        v.add("warn", f"{label}: never ran ({run.why})")
        return
    if run.state in ("hung", "failed"):
        v.add("fail", f"{label}: {run.state} ({run.why})", "nccl-hang" if run.state == "hung" else "nccl-failed",
              evidence=_tail(fleet, run.probe))
    if run.flaky:
        v.add("fail", f"{label}: flaky, {', '.join(run.repetitions)} over {len(run.repetitions)} repetitions",
              "collective-flaky")
    if run.init_failure is not None:
        v.symptom(INIT_SYMPTOM[run.init_failure.transport])
        v.evidence.append(Evidence(run.probe, run.init_failure.line[:300]))
    if run.wrong:
        v.add("fail", f"{label}: {run.wrong} wrong values", "nccl-data-corruption",
              evidence=_lines(fleet, run.probe, r"Out of bounds values\s*:\s*[1-9]"))
    _judge_signatures(run, v, label)
    if run.state == "passed":
        _judge_bandwidth(fleet, run, hosts, v, label)


def _judge_signatures(run: MultinodeRun, v: _Verdict, label: str) -> None:
    seen: dict[str, list] = {}
    for sig in run.output.signatures if run.output else ():
        seen.setdefault(sig.symptom, []).append(sig)
    for symptom, sigs in seen.items():
        what = sigs[0].line.split("NCCL WARN", 1)[-1].strip()[:120] if symptom == "nccl-warn" else \
            re.split(r"[:;]|, so | \(", sigs[0].meaning)[0]
        v.add("fail" if symptom in FATAL_SIGNATURES else "warn", f"{label}: NCCL: {what}", symptom,
              evidence=Evidence(run.probe, sigs[0].line[:300]))


def _judge_bandwidth(fleet, run: MultinodeRun, hosts, v: _Verdict, label: str) -> None:
    if run.mpi is not None:
        # The CPU engine: its speed is judged against the other runs of the bisection, not a profile.
        v.data["runs"][run.probe].update(busbw_gbs=run.mpi.busbw_gbs, largest_bytes=run.mpi.nbytes)
        v.add("info", f"{label}: MPI all_reduce busbw {run.mpi.busbw_gbs:.4g} GB/s at {run.mpi.nbytes} bytes")
        return
    main = _main_run(run)
    row = largest_row(main) if main else None
    if row is None:
        return
    busbw = max(row.in_place.busbw, row.out_of_place.busbw if row.out_of_place else 0.0)
    v.data["runs"][run.probe].update(largest_bytes=row.size_bytes, busbw_gbs=busbw)
    measured = f"{label}: busbw {busbw:.1f} GB/s at {row.size_bytes / (1 << 30):g} GiB"
    evidence = _lines(fleet, run.probe, rf"^(?:\[\d+,\d+\]<stdout>:)?\s*{row.size_bytes}\s+\d+\s+\S")
    profile = _shared_profile(fleet, hosts)
    per_nic = profile.get("nccl.inter_node_busbw_per_nic_gbs") if profile else None
    collective = main.collective or ("all_reduce" if row.redop == "sum" else f"redop {row.redop or 'empty'}")
    reason = (f"{collective}, not all_reduce: no threshold" if collective != "all_reduce"
              else "largest size below 1 GiB: a connectivity run" if row.size_bytes < MIN_JUDGED_BYTES
              else "the intra-node figure is judged per host by nccl-all-reduce" if run.probe == PROBE_INTRA
              else "the hosts differ in profile, or it has no per-NIC figure: reported, not judged"
              if per_nic is None else None)
    if reason:
        v.add("info", f"{measured} ({reason})", evidence=evidence)
        return
    nics = 1 if run.probe == PROBE_INTER else min(profile.get("nic.count") or 1, run.slots or 1)
    expected = float(per_nic) * nics
    ratio = busbw / expected
    versus = (f"{measured}, {ratio:.0%} of {expected:g} GB/s ({nics} NIC x {per_nic} GB/s, {profile.id})")
    v.data["runs"][run.probe].update(expected_busbw_gbs=expected)
    if ratio < LOW_FAIL:
        v.slow.add(run.probe)
        v.add("fail", f"low bandwidth: {versus}", "nccl-low-bandwidth", evidence=evidence)
    elif ratio < LOW_WARN:
        v.add("warn", f"low bandwidth: {versus}", "nccl-low-bandwidth", evidence=evidence)
    else:
        v.add("info", versus, evidence=evidence)


def _main_run(run: MultinodeRun) -> NcclRun | None:
    with_rows = [r for rep in run.output.repetitions for r in rep.runs if r.rows] if run.output else []
    return with_rows[-1] if with_rows else None


def _shared_profile(fleet, hosts):
    profiles = {fleet.hosts[h].profile.id: fleet.hosts[h].profile for h in hosts if h in fleet.hosts}
    return next(iter(profiles.values())) if len(profiles) == 1 else None


# --------------------------------------------------------------------------- where the fault is


def _localise(fleet, runs: dict[str, MultinodeRun], hosts, v: _Verdict) -> None:
    bad = {pid for pid, r in runs.items() if r.state in ("hung", "failed") or r.wrong}
    intra, inter = runs.get(PROBE_INTRA), runs.get(PROBE_INTER)
    if inter and intra and intra.ok and (PROBE_INTER in bad | v.slow):
        v.add("fail", "inter-node traffic fails while intra-node passes: the fault is between the nodes "
                      "(NICs, cables, switch ports, routing)", "nccl-inter-node-fabric")
    if inter and intra and inter.ok and PROBE_INTRA in bad:
        v.add("fail", "intra-node traffic fails while inter-node passes: a node's NVLink/NVSwitch or GPU",
              "nccl-intra-node-failed")
    if not bad:
        return
    v.symptom("nccl-multinode-failed")
    judged = [fleet.hosts[h].result(SINGLE_NODE_PROBE) for h in hosts if h in fleet.hosts]
    if judged and len(judged) == len(hosts) and all(r is not None and r.ok and not single_node_failed(r)
                                                    for r in judged):
        v.add("info", f"every host passed its own single-node all_reduce ({len(hosts)} hosts)",
              "nccl-single-node-passed")


def _never_ran(fleet, run: MultinodeRun, hosts) -> list:
    """The launcher could not start the test: nothing was measured, no fabric is at fault."""
    named = [h for h in hosts if h in run.unreachable] or list(run.unreachable)
    who = ", ".join(named) or "a host Open MPI does not name"
    evidence = _tail(fleet, run.probe)
    summary = f"the test never ran: {who} unreachable from the launcher ({run.why})"
    out = [error(summary, symptoms=["collective-never-ran"], evidence=[evidence],
                 data={"unreachable": named, "runs": {run.probe: {"state": run.state, "hosts": list(run.hosts)}}})]
    out += [error(f"the multi-node test never ran: unreachable from the launcher ({run.why})", host=h,
                  symptoms=["collective-never-ran"], evidence=[evidence]) for h in named if h in hosts]
    return out


def _judge_bisection(fleet, runs: dict[str, MultinodeRun], walked: list[MultinodeRun], hosts, v: _Verdict) -> list:
    if not walked:
        return []
    full = runs.get(PROBE_FULL)
    floor, ratio = (full.expect if full and full.expect else (None, 0.5))
    judge = RoundJudge(Expectation.of(floor, ratio, relative=bool(full and full.tool == MPI_TOOL)))
    verdicts = judge(list(runs.values()))
    fleet_verdict = "fail" if any(x == "fail" for x in verdicts.values()) else "pass"
    found = replay(list(hosts), fleet_verdict, walked, judge, split_once=judge.expectation.relative)
    by_members = {frozenset(r.hosts): r for r in walked}
    seconds = sum((r.seconds or 0) * len(r.hosts) for r in walked)
    cost = (f"bisection: {found.rounds} rounds, {found.runs} runs, {found.node_runs} node-runs, "
            f"{seconds / 60:.1f} node-minutes")
    v.data.update(bisection={"rounds": found.rounds, "runs": found.runs, "node_runs": found.node_runs,
                             "node_minutes": round(seconds / 60, 2), "culprits": list(found.culprits),
                             "paths": [list(p) for p in found.paths], "unresolved": list(found.unresolved),
                             "cleared": list(found.cleared), "notes": list(found.notes)})
    v.infos.append(cost + "".join(f"; {n}" for n in found.notes))
    steps = [(step, by_members.get(frozenset(step.members))) for step, _ in found.steps[1:]]
    outcomes = []
    for host in found.culprits:
        failed = [r for step, r in steps if r is not None and host in r.hosts and judge.why.get(r.probe)]
        if failed and all(r.state == "never-ran" for r in failed):
            # Every run it was in never started: the launcher cannot reach it, the fabric is not judged.
            outcomes.append(error(f"the multi-node test never ran with this node: unreachable from the launcher "
                                  f"({failed[-1].why})", host=host, symptoms=["collective-never-ran"],
                                  evidence=[_tail(fleet, failed[-1].probe)]))
            continue
        symptoms = ["nccl-pair-failed"] + ["nccl-hang"] * any(r.state == "hung" for r in failed)
        symptoms += list(dict.fromkeys(s.symptom for r in failed for s in (r.output.signatures if r.output else ())
                                       if s.symptom in FATAL_SIGNATURES))
        pairs = [r for r in failed if r.probe.startswith(PAIR_PREFIX)]
        why = "; ".join(f"with {next(h for h in r.hosts if h != host)}: {judge.why[r.probe]}" for r in pairs[:3])
        outcomes.append(fail(f"the collective fails whenever this node takes part, with partners that pass "
                             f"with others ({why or 'its runs failed'})", host=host, symptoms=symptoms,
                             evidence=[_tail(fleet, r.probe) for r in failed[-2:]],
                             data={"runs": [r.probe for r in failed]}))
    for a, b in found.paths:
        run = by_members.get(frozenset((a, b)))
        reason = judge.why.get(run.probe, "") if run else ""
        for host, other in ((a, b), (b, a)):
            outcomes.append(fail(f"the collective fails when this node and {other} take part together, while each "
                                 f"passes with other nodes: the path between them (cable, switch port, route)"
                                 + (f" ({reason})" if reason else ""), host=host, symptoms=["collective-path-fault"],
                                 evidence=[_tail(fleet, run.probe)] if run else [], data={"partner": other}))
    blamed = set(found.culprits) | {h for p in found.paths for h in p}
    for host in found.cleared:
        if host not in blamed:
            outcomes.append(ok("passed the bisection's runs it took part in", host=host))
    for host in found.unresolved:
        outcomes.append(warn("in a failing group of the bisection, neither blamed nor cleared"
                             + (f" ({found.notes[0]})" if found.notes else ""), host=host))
    return outcomes


# --------------------------------------------------------------------------- evidence


def _tail(fleet, probe: str) -> Evidence | None:
    r = fleet.probes.get(probe)
    if r is None or r.stdout is None:
        return None
    lines = [line.strip() for line in r.text.splitlines() if line.strip()]
    return Evidence(probe, "\n".join(lines[-3:]))


def _lines(fleet, probe: str, pattern: str) -> Evidence | None:
    r = fleet.probes.get(probe)
    if r is None or r.stdout is None:
        return None
    rx = re.compile(pattern)
    picked = [line.strip() for line in r.text.splitlines() if rx.search(line.strip())][:3]
    return Evidence(probe, "\n".join(picked)) if picked else None
