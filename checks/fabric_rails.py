"""Every rail of every node against the same rail of a partner (``preflight fabric``).

Input: the rail stage's records (``fabric-rail-<round>`` under each pair's client node: both
sides' raw ib_write_bw / iperf3 output, per rail and repetition; preflight/fabric/record.py),
and each node's own rail listing (``ibv-devinfo``, else ``ibstat``: its active ports and rates;
``ip-addr``: its IPv4 interfaces, on a TCP test bed).

How faulty is told from normal: preflight/judge/fabric_rails.py. In short, a repetition below
the higher of 75 % of the fleet's median for that rail and 85 % of the port's line rate (where
the evidence gives one: not on a veth) is bad; a node bad with every partner (two at least) is
the culprit (``fabric-rail-slow``, ``-flaky`` when only some repetitions were bad,
``-unreachable`` when its partner side never answered); a pair bad only together is the path
between them (``fabric-path-slow``, WARN on both). A node listing fewer or more rails than the
fleet's usual count WARNs (``fabric-rail-missing``): its extra rails had no counterpart.

Findings name the node, the HCA and port (or interface), the partner(s) and the figures; the
fleet finding's ``data["matrix"]`` is the node x rail picture the HTML report draws.
"""

from __future__ import annotations

from preflight.check import error, fail, fleet_check, ok, skip, warn
from preflight.fabric.pairing import rail_counts
from preflight.fabric.rails import IBSTAT_PROBE, IBV_PROBE, IP_ADDR_PROBE, rails_from_ip_addr, rdma_rails
from preflight.fabric.record import is_rail_probe, load, measurements
from preflight.judge.fabric_rails import MISSING, judge_rails
from preflight.model import Evidence
from preflight.parse import ParseError


@fleet_check("fabric-rails", summary="every rail of every node against a partner's (preflight fabric): "
                                     "slow node, slow path, flaky rail")
def fabric_rails(fleet):
    records, unreadable = [], []
    for name, host in fleet.hosts.items():
        for probe, result in host.probes.items():
            if not is_rail_probe(probe):
                continue
            try:
                records.append((probe, load(result.text)))
            except ParseError as exc:
                unreadable.append((name, probe, str(exc)))
    if not records and not unreadable:
        return skip("not run: `preflight fabric` tests every rail of every node against a partner")
    out = [error(f"{probe}: {why}", host=name, symptoms=["probe-unreadable"], evidence=[Evidence(probe, why)])
           for name, probe, why in unreadable]
    tool = records[0][1].tool if records else None
    runs = [m for _, rec in records for m in measurements(rec)]
    verdict = judge_rails(runs)
    rails = _listed_rails(fleet, tool)
    usual, odd = rail_counts({n: r for n, r in rails.items() if r})
    probe_of = {(rec.node, rec.partner): probe for probe, rec in records}
    in_stage = sorted({n for _, rec in records for n in (rec.node, rec.partner)}, key=list(fleet.hosts).index)
    for name in fleet.hosts:
        if name in rails and not rails[name]:
            out.append(error(f"no rail to test: {_listing(tool)} lists none", host=name, symptoms=[MISSING]))
    for name in in_stage:
        out.append(_host_outcome(name, verdict, odd.get(name), usual, probe_of))
    out.insert(0, _fleet_outcome(verdict, in_stage, records, usual))
    return out


def _listing(tool: str | None) -> str:
    return "ip -o -4 addr show" if tool == "iperf3" else "ibv_devinfo / ibstat (no ACTIVE port)"


def _listed_rails(fleet, tool: str | None) -> dict[str, list]:
    """Each node's rails as its listing gives them; nodes without a readable listing are left
    out (their own probe findings say why)."""
    out = {}
    for name, host in fleet.hosts.items():
        if tool != "iperf3":
            if any(host.result(p) is not None and host.result(p).ok for p in (IBV_PROBE, IBSTAT_PROBE)):
                out[name] = rdma_rails(host.probes)
            continue
        r = host.result(IP_ADDR_PROBE)
        if r is None or not r.ok:
            continue
        try:
            out[name] = rails_from_ip_addr(r.text)
        except ParseError:
            continue
    return out


def _host_outcome(name: str, verdict, count: int | None, usual: int | None, probe_of: dict):
    mine = [b for b in verdict.blames if b.node == name]
    pairs = [p for p in verdict.pairs if p.involves(name)]
    evidence = [Evidence(probe_of.get((p.node, p.partner), "fabric-rail"), f"{p.rail_of(name)} with {p.other(name)} "
                                                        f"{p.rail_of(p.other(name))}: {_reps(p)}")
                for p in pairs if p.state != "ok"][:8]
    data = {"rails": {p.rail_of(name): {} for p in pairs}}
    for p in pairs:
        data["rails"][p.rail_of(name)][p.other(name)] = {"state": p.state, "gbps": p.gbps, "reps": list(p.reps),
                                                         "reference_gbps": p.reference, "why": p.why,
                                                         "latency_us": p.latency_us}
    phrases = [_phrase(b, pairs) for b in mine]
    symptoms = list(dict.fromkeys(b.cause for b in mine))
    if count is not None:
        phrases.append(f"{count} rail(s) where the fleet has {usual}: the rails beyond the shorter list had no partner")
        symptoms.append(MISSING)
    if any(b.severity == "fail" for b in mine):
        return fail("; ".join(phrases), host=name, symptoms=symptoms, evidence=evidence, data=data)
    if phrases:
        return warn("; ".join(phrases), host=name, symptoms=symptoms, evidence=evidence, data=data)
    rails = sorted({p.rail_of(name) for p in pairs})
    partners = sorted({p.other(name) for p in pairs})
    return ok(f"{len(rails)} rail(s) at speed with {len(partners)} partner(s) ({', '.join(partners)})",
              host=name, data=data)


def _reps(p) -> str:
    shown = ", ".join("no result" if g is None else f"{g:.3g}" for g in p.reps)
    ref = f" (needs {p.reference:.3g})" if p.reference else ""
    return f"{p.state}: {shown} Gb/s{ref}" + (f"; {p.why}" if p.why else "")


def _word(cause: str) -> str:
    return {"fabric-rail-slow": "slow", "fabric-rail-flaky": "flaky (slow in some repetitions)",
            "fabric-rail-unreachable": "no answer", "fabric-path-slow": "slow"}.get(cause, cause)


def _phrase(b, pairs) -> str:
    """"mlx5_0:1: slow with every partner (gpu02 190 Gb/s, gpu05 188 Gb/s; needs 294)"."""
    bad = [p for p in pairs if p.rail == b.rail and p.other(b.node) in b.partners]
    figures = ", ".join(f"{p.other(b.node)} " + (f"{p.gbps:.3g} Gb/s" if p.gbps is not None
                                                 else f"no result: {p.why or 'nothing measured'}") for p in bad)
    needs = next((p.reference for p in bad if p.reference), None)
    said = figures + (f"; needs {needs:.3g}" if needs else "")
    return f"{b.rail_name}: {_word(b.cause)} {b.detail} ({said})"


def _fleet_outcome(verdict, nodes: list[str], records, usual: int | None):
    rail_names = sorted({p.node_rail for p in verdict.pairs} | {p.partner_rail for p in verdict.pairs})
    indices = sorted(verdict.medians)
    matrix = {n: [dict(zip(("state", "gbps"), verdict.cell(n, i), strict=True)) for i in indices] for n in nodes}
    rounds = sorted({rec.round for _, rec in records})
    data = {"matrix": matrix, "rail_index": indices, "rail_names": rail_names,
            "references": {str(i): verdict.references.get(i) for i in indices},
            "medians_gbps": {str(i): verdict.medians[i] for i in indices},
        "rounds": len(rounds), "pair_tests": len(records), "tool": records[0][1].tool if records else None,
        "notes": list(verdict.notes)}
    if records and records[0][1].tool == "iperf3":
        data["line_rate"] = "not applicable: a TCP interface (veth on a test bed) has no published line rate; " \
                            "judged against the fleet median only"
    culprits = sorted({b.node for b in verdict.blames if b.severity == "fail"})
    paths = sorted({tuple(sorted((b.node, *b.partners))) for b in verdict.blames if b.cause == "fabric-path-slow"})
    head = (f"{len(nodes)} node(s) x {len(indices)} rail(s), {len(records)} pair test(s) in {len(rounds)} round(s): "
            + "; ".join(f"rail {i}: {verdict.references.get(i)}" for i in indices))
    if culprits or paths:
        said = ([f"culprit(s): {', '.join(culprits)}"] if culprits else []) + (
            [f"slow path(s): {', '.join('-'.join(p) for p in paths)}"] if paths else [])
        verdict_fn = fail if culprits else warn
        return verdict_fn(f"{'; '.join(said)} (see the host findings). {head}", data=data)
    return ok(f"no slow rail. {head}", data=data)
