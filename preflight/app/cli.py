"""Command line: ``preflight run | analyze | merge | baseline | healthcheck | prolog | drain | resume | checks |
facts | explain | diff | soak``.

Exit codes (contract): 0 nothing failed (warnings allowed), 1 a check failed or a host could
not be checked, 2 bad input or usage. Bad input is refused before anything runs or is
written, with the file, line or option that is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from ClusterShell.NodeSet import NodeSet
from rich.console import Console

from preflight import __version__
from preflight.app import (
    baseline,
    collective_options,
    dcgm_options,
    drain_cli,
    extras,
    fabric_cli,
    healthcheck,
    interrupt,
    lifecycle_cli,
    listing_cli,
    options,
    prolog,
    run_output,
    soak_cli,
    store_cli,
    sweep_cli,
    targets,
)
from preflight.app.errors import INPUT_ERRORS, UsageError
from preflight.app.parser import Parser
from preflight.app.run import RunRequest, probes_for
from preflight.collect.dcgm import PROBE_ID as DCGM_PROBE_ID
from preflight.collect.fanout import ExecPlan
from preflight.collect.local import local_host_name
from preflight.collect.multinode import NODE_DIR
from preflight.collect.nccl import PROBE_ID as NCCL_PROBE_ID
from preflight.collect.nccl import NcclOptions
from preflight.collect.probes import PROBES
from preflight.collect.slurm_job import expand as expand_nodes
from preflight.contracts import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from preflight.diagnose.analysis import analyze
from preflight.diagnose.engine import load_knowledge
from preflight.evidence.bundle import new_run_id, read_bundle
from preflight.evidence.merge import plan_merge, read_sources, write_merged
from preflight.judge.figures import HISTORY_FACT
from preflight.judge.loader import load_checks, select
from preflight.knowledge.datafile import LONGEST_S, positive
from preflight.knowledge.profiles import load_profiles
from preflight.report import consoles, diff, json_report, prometheus
from preflight.report.diff import ReportError, diff_reports, load_report, render
from preflight.report.files import write_atomic, write_reports
from preflight.report.history import digest as history_digest

_positive = positive


# --help's description: the module docstring above is for readers of the code.
DESCRIPTION = ("Health checks for GPU cluster nodes before they serve traffic: probes over SSH or Slurm, "
               "evidence, verdicts, causes and actions. `preflight COMMAND --help` for each command.")

# The commands whose --json is their result on stdout, their people's output moved to stderr.
JSON_ON_STDOUT = ("run", "fabric", "analyze", "merge", "diff")

LISTING_NOTE = ("On a terminal, one entry per paragraph; piped, one record per line, tab-separated "
                "and never wrapped; --json for every field.")


def _active_test_options(run: argparse.ArgumentParser) -> None:
    g = run.add_argument_group("active tests", "nccl-tests all_reduce_perf on every node (a few minutes of full load)")
    g.add_argument("--nccl-reps", type=_positive(int), default=5, metavar="N",
                   help="repetitions of all_reduce_perf per node (default 5)")
    collective_options.add_engine(g)
    g.add_argument("--nccl-multinode", action="store_true",
                   help="also all_reduce across the hosts through mpirun on the first host, with intra- and "
                        "inter-node-only variants, then a bisection (halves, cross-boundary pairings, 2-node "
                        "confirmation) to name the culprit node or path; needs Open MPI's "
                        "mpirun there, passwordless SSH between the nodes and all_reduce_perf built with MPI=1; "
                        "with --slurm, srun steps instead (one task per GPU; the site's MPI plugin, no SSH)")
    collective_options.add_launcher(g)
    collective_options.add(g)
    dcgm_options.add(g)
    g.add_argument("--quick", action="store_true", help="static checks only: leave out active tests")


def _slurm_options(run: argparse.ArgumentParser) -> None:
    options.add_slurm(run, "run --slurm: one srun task per node runs the probes on that node "
                           "(nothing installed there but python3); no SSH",
                      "default: the node budget in minutes, plus 2")
    options.add(run, options.SLURM_RUN, "Slurm: the nodes' GPUs and other jobs")


def _common_analysis_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checks", metavar="IDS", help="comma-separated check ids to run (default: all)")
    p.add_argument("--checks-dir", metavar="DIR", action="append", type=Path, default=[],
                   help="also load checks from the *.py files in DIR (repeatable)")
    p.add_argument("--profile", metavar="ID", help="platform profile for every host (default: detect)")
    p.add_argument("--profile-file", metavar="FILE", action="append", type=Path, default=[],
                   help="extra or overriding platform profile YAML (repeatable)")
    options.add_output(p, skip=("run_id",))
    _report_options(p)
    store_cli.add_options(p, history=True)


def _report_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("reports", "report.json, report.md and junit.xml are always written")
    g.add_argument("--html", action=argparse.BooleanOptionalAction, default=True,
                   help="also write report.html, one self-contained page (default: on)")
    g.add_argument("--prometheus", metavar="FILE", type=Path,
                   help="also write verdicts and figures in node_exporter's textfile format (name it *.prom)")
    g.add_argument("--baseline", metavar="RUN", type=Path,
                   help="compare with an earlier run (its directory or report.json); the diff goes to diff.md")
    g.add_argument("--json", action="store_true",
                   help="print report.json on stdout, and nothing else there (the summary and progress go to "
                        "stderr); the exit code is the same")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="preflight", description=DESCRIPTION, epilog=options.examples(
        "preflight run --hosts hosts.txt", "preflight analyze examples/h200-fleet",
        "preflight explain nic-fw-driver-mismatch"))
    parser.add_argument("--version", action="version", version=f"preflight {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="probe hosts, save the evidence, judge it, write reports",
                         formatter_class=argparse.RawDescriptionHelpFormatter, epilog=options.examples(
                             "preflight run --hosts hosts.txt",
                             "preflight run -H gpu[001-016] --quick",
                             "preflight run --slurm -w gpu[001-064] --partition gpu --time 20"))
    options.add_targets(run)
    options.add_ssh(run)
    run.add_argument("--parallel", type=_positive(int), default=64, help="hosts probed at once (default 64)")
    run.add_argument("--timeout", type=_positive(float, LONGEST_S), default=30.0, help="seconds per probe (default 30)")
    run.add_argument("--node-timeout", type=_positive(float, LONGEST_S), metavar="SECONDS",
                     help="seconds a node's static probes may take in all (default 4 x --timeout; "
                          "active tests add their own limits)")
    run.add_argument("--per-node", type=_positive(int), default=4, metavar="N",
                     help="probes run at once on one node (default 4)")
    run.add_argument("--node-runner", action=argparse.BooleanOptionalAction, default=True,
                     help="SSH: one channel per node, whose python3 runs the node's probes itself, as a Slurm "
                          "task does (the default); --no-node-runner opens a channel per probe, which is also "
                          "how nodes without a usable python3 are probed")
    run.add_argument("--workers", type=_positive(int), metavar="N",
                     help="controller processes sharing the SSH fan-out (default: one per 64 hosts, "
                          "at most one per core)")
    run.add_argument("--run-id", help="name of the run directory (default: a timestamp)")
    _common_analysis_options(run)
    _active_test_options(run)
    _slurm_options(run)

    an = sub.add_parser("analyze", help="judge a saved bundle (or run directory) offline",
                        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=options.examples(
                            "preflight analyze examples/h200-fleet",
                            "preflight analyze reports/<run-id> --baseline reports/<earlier-run-id>",
                            "preflight analyze reports/<soak-run-id> --slo ttft_p99=2s --slo tpot_p99=100ms"))
    an.add_argument("bundle", type=Path, help="a bundle directory, or a run directory holding bundle/")
    _common_analysis_options(an)
    soak_cli.add_slo_options(an.add_argument_group("a soak directory's serving SLOs"))

    mg = sub.add_parser("merge", help="one bundle and report from per-node runs (srun preflight run --local ...)",
                        epilog=options.examples("preflight merge reports/node-runs --expect gpu[001-064]",
                                                "preflight merge reports/<run-a> reports/<run-b> --run-id merged"))
    mg.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                    help="a bundle, a run directory, or a directory of run directories")
    mg.add_argument("--expect", metavar="NODELIST",
                    help="the nodes that should have a result (gpu[001-064]); those without are reported")
    mg.add_argument("--run-id", help="name of the merged run directory (default: merge-<timestamp>)")
    _common_analysis_options(mg)

    bl = sub.add_parser("baseline", help="a site profile (median and spread per figure) from known-good runs, "
                                         "for figures NVIDIA does not publish; judge later runs with --profile-file",
                        epilog=options.examples(
                            "preflight baseline reports/<run-a> reports/<run-b> reports/<run-c> --out site.yaml",
                            "preflight baseline reports/<fleet-run-id> --from-fleet --out site.yaml",
                            "preflight baseline reports/<run-a> reports/<run-b> --profile hgx-h200"))
    bl.add_argument("runs", nargs="+", metavar="RUN", type=Path,
                    help="run directories or bundles of known-good nodes (every host must PASS the figure's check)")
    bl.add_argument("--from-fleet", action="store_true",
                    help="every host of the runs is a sample (one fleet run); default: one sample per RUN")
    bl.add_argument("--out", metavar="FILE", type=Path,
                    help="write the profile YAML here (default: print it)")
    bl.add_argument("--checks-dir", metavar="DIR", action="append", type=Path, default=[],
                    help="also load checks from the *.py files in DIR (repeatable)")
    bl.add_argument("--profile", metavar="ID", help="platform profile for every host (default: detect)")
    bl.add_argument("--profile-file", metavar="FILE", action="append", type=Path, default=[],
                    help="extra or overriding platform profile YAML (repeatable)")

    hc = sub.add_parser("healthcheck", help="for slurm.conf HealthCheckProgram: static checks of this node; "
                                            "drains it on FAIL, resumes only preflight's own drains",
                        epilog=options.examples("preflight healthcheck",
                                                "preflight healthcheck --no-drain --budget 30 -q",
                                                "preflight healthcheck --db postgresql://preflight@db01/preflight"))
    hc.add_argument("--budget", type=_positive(float), default=60.0, metavar="SECONDS",
                    help="the whole check's time budget (default 60; probes get a third each, at most 30 s)")
    hc.add_argument("--node", metavar="NAME", help="this node's Slurm name (default: $SLURMD_NODENAME, else the "
                                                   "short hostname)")
    hc.add_argument("--no-drain", dest="drain", action="store_false",
                    help="judge and report only; never call scontrol")
    hc.add_argument("--checks", metavar="IDS", help="comma-separated check ids (default: every static check)")
    hc.add_argument("--checks-dir", metavar="DIR", action="append", type=Path, default=[])
    hc.add_argument("--profile-file", metavar="FILE", action="append", type=Path, default=[])
    hc.add_argument("--out", type=Path, default=Path("/var/lib/preflight/healthcheck"), metavar="DIR",
                    help=f"where the node keeps its last {healthcheck.KEEP} reports "
                         "(default /var/lib/preflight/healthcheck)")
    hc.add_argument("-q", "--quiet", action="store_true",
                    help="print one line: the verdicts counted and the report's path")
    store_cli.add_options(hc)

    pl = sub.add_parser("prolog", help="for slurm.conf Prolog: the fast static checks of this node, in seconds; "
                                       "exit 1 on FAIL (Slurm then drains the node and requeues the job)",
                        epilog=options.examples("preflight prolog",
                                                "preflight prolog --budget 5 --checks gpu-inventory,ib-port-down"))
    pl.add_argument("--budget", type=_positive(float), default=prolog.DEFAULT_BUDGET_S, metavar="SECONDS",
                    help=f"the whole check's time budget (default {prolog.DEFAULT_BUDGET_S:g})")
    pl.add_argument("--node", metavar="NAME", help="this node's Slurm name (default: $SLURMD_NODENAME, else the "
                                                   "short hostname)")
    pl.add_argument("--checks", metavar="IDS", default=",".join(prolog.PROLOG_CHECKS),
                    help=f"comma-separated check ids (default {','.join(prolog.PROLOG_CHECKS)})")
    pl.add_argument("--checks-dir", metavar="DIR", action="append", type=Path, default=[])
    pl.add_argument("--profile-file", metavar="FILE", action="append", type=Path, default=[])
    pl.add_argument("--out", type=Path, default=Path("/var/lib/preflight/prolog"), metavar="DIR",
                    help=f"where the node keeps its last {healthcheck.KEEP} prolog reports "
                         "(default /var/lib/preflight/prolog)")
    pl.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")
    store_cli.add_options(pl)

    fabric_cli.add_parser(sub, _report_options, store_cli.add_options)
    drain_cli.add_parsers(sub)
    store_cli.add_parser(sub)
    lifecycle_cli.add_parser(sub)
    sweep_cli.add_parser(sub)

    ch = sub.add_parser("checks", help="list the checks, the facts they read and the probes they need",
                        description=LISTING_NOTE, epilog=options.examples(
                            "preflight checks", "preflight checks --json", "preflight checks --checks-dir site-checks"))
    ch.add_argument("--checks-dir", metavar="DIR", action="append", type=Path, default=[],
                    help="also load checks from the *.py files in DIR (repeatable)")
    ch.add_argument("--json", action="store_true", help="one JSON list of the checks")
    fa = sub.add_parser("facts", help="list the parsed facts a check can read, with their probes",
                        description=LISTING_NOTE, epilog=options.examples("preflight facts", "preflight facts --json"))
    fa.add_argument("--json", action="store_true", help="one JSON list of the facts")

    ex = sub.add_parser("explain", help="what a cause means, what points to it, what to do",
                        epilog=options.examples("preflight explain nic-fw-driver-mismatch", "preflight explain --list",
                                                "preflight explain nvlink-down --json"))
    ex.add_argument("cause", nargs="?", help="a cause id, e.g. nic-fw-driver-mismatch")
    ex.add_argument("--list", action="store_true", help="list every cause id with its title")
    ex.add_argument("--json", action="store_true",
                    help="the cause (or, with --list, every cause) as JSON: meaning, evidence, actions, "
                         "references and what points to it")

    df = sub.add_parser("diff", help="what got worse or better between two runs (exit 1 if anything got worse)",
                        epilog=options.examples("preflight diff reports/<earlier-run-id> reports/<run-id>",
                                                "preflight diff old/report.json new/report.json"))
    df.add_argument("old", type=Path, help="the earlier run directory or its report.json")
    df.add_argument("new", type=Path, help="the later run directory or its report.json")
    df.add_argument("--json", action="store_true",
                    help="the comparison as one JSON object on stdout (docs/contracts.md); same exit code")

    store_cli.add_options(soak_cli.add_parser(sub))
    return parser


def _load_checks(args, scopes: tuple[str, ...] = ("host", "fleet")):
    """The checks of these scopes (a bundle's by default; the soak's are run by its analysis),
    narrowed to ``--checks``."""
    checks = [c for c in load_checks(args.checks_dir) if c.scope in scopes]
    if not getattr(args, "history", False):
        # A node's past is judged only when asked for: without --history those checks would
        # only say "no history" on every node of every report.
        checks = [c for c in checks if HISTORY_FACT not in c.facts]
    given = getattr(args, "checks", None)
    wanted = [c.strip() for c in given.split(",") if c.strip()] if given is not None else None
    return select(checks, wanted)


def _checks_for(args, judged):
    """``--checks`` when given; else ``judged``, the checks a bundle's run judged, when its
    bundle.json names them (so that a --quick run's bundle is judged as the run judged it, its
    active checks not reported as not run); else every check."""
    checks = _load_checks(args)
    if getattr(args, "checks", None) is None and isinstance(judged, list):
        by_id = {c.id: c for c in checks}
        ran = [by_id[i] for i in dict.fromkeys(judged) if i in by_id]  # in the run's order
        # --history judges the past of any bundle, whether or not its own run asked for it.
        checks = ran + [c for c in checks if HISTORY_FACT in c.facts and c not in ran]
    return checks


def _load_profiles(args):
    profiles = load_profiles(args.profile_file)
    if args.profile and args.profile not in profiles:
        raise UsageError(f"--profile: unknown profile {args.profile!r}; known: {', '.join(sorted(profiles))}")
    return profiles


def run_request(args):
    """Everything ``run`` decides before it touches a host, from its parsed options: inventory,
    checks, profiles, SSH and probe settings, the run directory. Bad input raises one of
    ``INPUT_ERRORS`` here, before anything runs. The pytest plugin builds its runs with this
    too, so both read the same options the same way."""

    slurm = targets.slurm_of(args)
    hosts = targets.slurm_hosts_of(args, slurm) if slurm else targets.hosts_of(args)
    checks = _load_checks(args)
    if args.quick:
        checks = [c for c in checks if not all(p in PROBES and PROBES[p].active for p in c.probes)]
    profiles = _load_profiles(args)
    kb = load_knowledge()
    run_id = targets.run_id_of(args, new_run_id(local_host_name()))
    ssh = targets.ssh_of(args)
    nccl = NcclOptions(args.nccl_reps, args.nccl_max_bytes, args.nccl_timeout, args.nccl_tests_dir,
                       setup_timeout_s=args.timeout)
    active = {NCCL_PROBE_ID: nccl, DCGM_PROBE_ID: dcgm_options.options_of(args)}
    plan = ExecPlan(probes_for(checks, active), args.timeout, args.parallel, ssh,
                    per_node=args.per_node, node_timeout_s=args.node_timeout,
                    workers=getattr(args, "workers", None), node_runner=getattr(args, "node_runner", False))
    multinode = None
    if getattr(args, "nccl_multinode", False):
        if args.quick or not hosts:
            raise UsageError("--nccl-multinode runs across --hosts and is an active test: not with "
                             + ("--quick" if args.quick else "--local"))
        if any(c.id == "nccl-multinode" for c in checks):
            multinode = collective_options.options_of(args, nccl, args.nccl_node_dir or NODE_DIR)
    return RunRequest(hosts, checks, profiles, kb, plan, args.out, run_id, args.profile,
                      html=getattr(args, "html", True), multinode=multinode, slurm=slurm)


def cmd_run(args, console: Console) -> int:

    baseline = _report_inputs(args)
    store = store_cli.store_of(args)
    req = run_request(args)
    if args.history:
        names = [h.name for h in req.hosts] or [local_host_name()]
        req = replace(req, histories=store_cli.histories_for(store, names, console))
    run_dir, analysis = run_output.execute_shown(req, console, args.quiet)
    return _reported(args, run_dir, analysis, baseline, store, console)


def _reported(args, run_dir: Path, analysis, baseline: dict | None, store, console: Console) -> int:
    """A report command's end: its summary (one line with -q), the extras, the store, report.json
    on stdout with --json; the exit code."""
    run_output.show(analysis, console, run_dir, args.quiet)
    _report_extras(args, run_dir, analysis, baseline, console)
    store_cli.record_report(store, run_dir, console)
    if args.json:
        run_output.print_json(run_dir)
    return EXIT_FAILED if analysis.failed else EXIT_OK


def cmd_fabric(args, console: Console) -> int:
    """``preflight fabric``: a run whose stage is the rail stage (preflight/app/fabric_cli.py)."""
    baseline = _report_inputs(args)
    store = store_cli.store_of(args)
    run_dir, analysis = run_output.execute_shown(fabric_cli.fabric_request(args), console, args.quiet)
    return _reported(args, run_dir, analysis, baseline, store, console)


def analyze_saved(args):
    """``analyze`` without the terminal: judge the saved bundle, write the reports; return the
    report directory and the analysis (shared with the pytest plugin)."""

    if not args.bundle.exists():
        raise UsageError(f"{args.bundle}: does not exist")
    if not args.bundle.is_dir():
        raise UsageError(f"{args.bundle}: not a directory (a bundle, a run directory or a soak directory)")
    root = _bundle_root(args.bundle)
    run_id = "analyze-" + new_run_id(local_host_name())
    out = targets.out_dir_of(args) / run_id
    if _is_soak_dir(root):
        return out, _analyze_soak(root, out, args)
    if getattr(args, "slo", None):
        raise UsageError(f"--slo: {root} is a bundle; serving SLOs are judged on a soak directory")
    bundle = read_bundle(root)
    checks = _checks_for(args, bundle.header.get("checks"))
    profiles = _load_profiles(args)
    histories = None
    if getattr(args, "history", False):
        source = bundle.header.get("run_id") if isinstance(bundle.header.get("run_id"), str) else None
        histories = store_cli.histories_for(store_cli.store_of(args), list(bundle.hosts), consoles.make(stderr=True),
                                            exclude_run=source)
    analysis = analyze(bundle, checks, profiles, load_knowledge(), args.profile, histories=histories)
    analysis.meta.update({"run_id": run_id, "kind": "analyze", "created": bundle.created,
                          "preflight_version": __version__, "bundle": str(root.resolve())})
    if isinstance(bundle.header.get("run_id"), str) and bundle.header["run_id"]:
        # The results store keys a re-analysis by the run whose evidence it judged: analysing a
        # recorded run again adds nothing to the node's history (docs/store.md).
        analysis.meta["source_run_id"] = bundle.header["run_id"]
    if histories:
        analysis.meta["history"] = history_digest(analysis, histories)
    write_reports(out, analysis, getattr(args, "html", True))
    return out, analysis


def _bundle_root(path: Path) -> Path:
    """The bundle ``analyze`` was given: the directory itself, or a run directory's bundle/."""
    return path / "bundle" if (path / "bundle" / "bundle.json").is_file() else path


def _is_soak_dir(path: Path) -> bool:
    root = _bundle_root(path)
    return (root / "soak.json").is_file() and not (root / "bundle.json").is_file()


def _analyze_soak(soak_dir: Path, out: Path, args):
    """A preflight-soak/1 directory: judged by the soak analysis, reported like a bundle."""
    extras.require_analysis("analyze of a soak directory")
    # pandas, behind the soak's data and analysis, loads only for a soak directory.
    from preflight.soak.data import SoakDataError

    # The thresholds live beside the figures, pandas too.
    from preflight.soak.figures import Thresholds
    from preflight.soak.judge import judge_soak

    thresholds = Thresholds(slos=soak_cli.slos_of(args), slo_budget=getattr(args, "slo_budget", 0.05))
    try:
        analysis = judge_soak(soak_dir, load_knowledge(), plots_dir=out / "plots",
                              checks=_load_checks(args, scopes=("soak",)), thresholds=thresholds)
    except SoakDataError as exc:
        raise UsageError(str(exc)) from None
    analysis.meta.update({"run_id": out.name, "kind": "analyze", "preflight_version": __version__,
                          "soak_dir": str(soak_dir.resolve())})
    write_reports(out, analysis, getattr(args, "html", True))
    return analysis


def cmd_analyze(args, console: Console) -> int:
    baseline = _report_inputs(args, "soak" if _is_soak_dir(args.bundle) else "run")
    store = store_cli.store_of(args)
    out, analysis = analyze_saved(args)
    return _reported(args, out, analysis, baseline, store, console)


def _report_inputs(args, kind: str = "run") -> dict | None:
    """Check the report options before anything runs; return the baseline report, if any.
    ``kind``: what this command's report will be (``run`` or ``soak``, as diff.report_kind)."""

    if args.prometheus and args.prometheus.is_dir():
        raise UsageError(f"--prometheus: {args.prometheus} is a directory; name the file to write (*.prom)")
    if args.prometheus and not args.prometheus.parent.is_dir():
        raise UsageError(f"--prometheus: {args.prometheus.parent}: no such directory")
    if args.prometheus and not os.access(args.prometheus.parent, os.W_OK | os.X_OK):
        raise UsageError(f"--prometheus: {args.prometheus.parent}: not writable")
    if args.baseline is None:
        return None
    try:
        baseline = load_report(args.baseline)
    except ReportError as exc:
        raise UsageError(f"--baseline: {exc}") from None
    this = {"soak_dir": "."} if kind == "soak" else {}
    why = diff.incomparable(baseline, this, str(args.baseline), "this report")
    if why:
        raise UsageError(f"--baseline: {why}")
    return baseline


def _report_extras(args, run_dir: Path, analysis, baseline: dict | None, console: Console) -> None:

    if args.prometheus:
        write_atomic(args.prometheus, prometheus.render(analysis))
    if baseline is not None:
        text = diff.render(diff.diff_reports(baseline, json_report.to_dict(analysis)))
        write_atomic(run_dir / "diff.md", text)
        if not args.quiet:
            console.print(text, markup=False, highlight=False, soft_wrap=True)


def cmd_merge(args, console: Console) -> int:
    """Merge per-node bundles into ``--out/<run-id>/bundle`` and judge it as ``analyze`` does."""
    baseline = _report_inputs(args)
    store = store_cli.store_of(args)
    expect = expand_nodes(args.expect, "--expect") if args.expect else None
    sources = read_sources(args.dirs)
    plan = plan_merge(sources, expect)
    if not plan.hosts:
        raise UsageError("nothing to merge: the bundles record no host")
    checks = _checks_for(args, plan.checks)
    profiles = _load_profiles(args)
    kb = load_knowledge()
    histories = store_cli.histories_for(store, list(plan.hosts), console) if args.history else None
    run_id = targets.run_id_of(args, "merge-" + new_run_id(local_host_name()))
    run_dir = targets.out_dir_of(args) / run_id
    created = min(b.created for b in sources)
    write_merged(plan, run_dir / "bundle", created,
                 {"run_id": run_id, "preflight_version": __version__, "local": False})
    analysis = analyze(read_bundle(run_dir / "bundle"), checks, profiles, kb, args.profile, histories=histories)
    analysis.meta.update({"run_id": run_id, "kind": "merge", "created": created, "preflight_version": __version__,
                          "bundle": "bundle"})
    if histories:
        analysis.meta["history"] = history_digest(analysis, histories)
    write_reports(run_dir, analysis, getattr(args, "html", True))
    if plan.missing and not args.quiet:
        console.print(f"merge: no result for {len(plan.missing)} expected node(s): "
                      f"{NodeSet.fromlist(plan.missing)}", highlight=False, markup=False)
    return _reported(args, run_dir, analysis, baseline, store, console)


def cmd_baseline(args, console: Console) -> int:
    for run in args.runs:
        if not run.is_dir():
            raise UsageError(f"{run}: no such run directory or bundle")
    profile = baseline.build(args.runs, args.from_fleet, _load_checks(args), _load_profiles(args),
                             load_knowledge(), args.profile)
    if args.out is None:
        console.print(baseline.render(profile), end="", markup=False, highlight=False, soft_wrap=True)
        return EXIT_OK
    baseline.write(profile, args.out)
    figures = profile["baseline"]["figures"]
    for key, fig in figures.items():
        console.print(f"{key}: median {fig['median']:g} over {len(fig['samples'])} samples, warn below "
                      f"{fig['warn_below']:g}, fail below {fig['fail_below']:g}; written to {args.out}",
                      markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK


def cmd_healthcheck(args, console: Console) -> int:
    args.profile = None
    store = store_cli.store_of(args)
    checks = [c for c in _load_checks(args) if not all(p in PROBES and PROBES[p].active for p in c.probes)]
    probes = probes_for(checks)
    code, analysis, action, run_dir = healthcheck.run_healthcheck(
        probes, checks, _load_profiles(args), load_knowledge(), args.out, args.budget, args.node, args.drain)
    store_cli.record_report(store, run_dir, console)
    if (event := healthcheck.event_of(action, next(iter(analysis.hosts)), run_dir.name)) is not None:
        store_cli.record_events(store, [event], console)
    run_output.show(analysis, console, run_dir, args.quiet)
    if not args.quiet:
        console.print(f"healthcheck: {action.kind}" + (f" ({action.reason})" if action.reason else "")
                      + f": {action.why}", highlight=False, markup=False)
    return code


def cmd_prolog(args, console: Console) -> int:
    args.profile = None
    store = store_cli.store_of(args)
    checks = _load_checks(args)
    probes = prolog.prolog_probes(probes_for(checks))
    _, analysis, _, run_dir = healthcheck.run_healthcheck(
        probes, checks, _load_profiles(args), load_knowledge(), args.out, args.budget, args.node, drain=False,
        mode="prolog")
    store_cli.record_report(store, run_dir, console)
    code = prolog.exit_code(next(iter(analysis.hosts.values())).status)
    run_output.show(analysis, console, run_dir, args.quiet)
    if not args.quiet:
        console.print(prolog.summary(analysis, code), highlight=False, markup=False)
    return code


def cmd_diff(args, console: Console) -> int:

    try:
        old, new = load_report(args.old), load_report(args.new)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    why = diff.incomparable(old, new, str(args.old), str(args.new))
    if why:
        raise UsageError(why)
    result = diff_reports(old, new)
    if args.json:
        sys.stdout.write(json.dumps(diff.to_dict(result), indent=2) + "\n")
    else:
        console.print(render(result), end="", markup=False, highlight=False, soft_wrap=True)
    return EXIT_FAILED if result.worse else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # No emoji codes, no guessed colours (preflight/report/consoles.py): every line printed is
    # data or about data (preflight.printable).
    console = consoles.make()
    if getattr(args, "json", False) and args.command in JSON_ON_STDOUT:
        # stdout carries the JSON alone; what people read (the summary, progress, warnings) goes
        # to stderr, as it would have gone to the terminal.
        console = consoles.make(stderr=True)
    # Error messages name files and options: never folded inside a path, whatever the width.
    err = consoles.errors()

    handlers = {"run": cmd_run, "fabric": cmd_fabric, "analyze": cmd_analyze, "checks": listing_cli.cmd_checks,
                "facts": listing_cli.cmd_facts, "soak": soak_cli.cmd_soak, "explain": listing_cli.cmd_explain,
                "diff": cmd_diff, "merge": cmd_merge,
                "baseline": cmd_baseline,
                "healthcheck": cmd_healthcheck, "drain": drain_cli.cmd_drain, "resume": drain_cli.cmd_resume,
                "prolog": cmd_prolog, "history": store_cli.cmd_history,
                "lifecycle": lifecycle_cli.cmd_lifecycle, "sweep": sweep_cli.cmd_sweep}
    previous = interrupt.install()
    try:
        return handlers[args.command](args, console)
    except INPUT_ERRORS as exc:
        err.print(f"preflight: error: {exc}", highlight=False, markup=False)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        kept = getattr(exc, "kept", None)
        err.print("preflight: interrupted; the evidence saved so far is kept in "
                  + (f"{kept}" if kept else "the run's bundle/ directory"), highlight=False, markup=False)
        if argv is None:
            # The program itself, not a caller's function: out now, without waiting at exit for
            # the probes still running (up to their timeout, with SIGINT ignored meanwhile); each
            # record already saved is a whole file (preflight.evidence.atomic).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    finally:
        interrupt.restore(previous)


if __name__ == "__main__":
    sys.exit(main())
