"""Command line: ``preflight run | analyze | checks``.

Exit codes (contract): 0 nothing failed (warnings allowed), 1 a check failed or a host could
not be checked, 2 bad input or usage. Bad input is refused before anything runs or is
written, with the file, line or option that is wrong.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from . import __version__
from .bundle import BundleError, read_bundle
from .diagnosis import PlaybookError, load_knowledge
from .executor import ExecPlan, SshOptions
from .inventory import InventoryInvalid, load_hosts_file, parse_host_list
from .plugin import CheckLoadError, load_checks, select
from .profiles import ProfileError, load_profiles
from .report import terminal

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value

    return parse


def _common_analysis_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checks", metavar="IDS", help="comma-separated check ids to run (default: all)")
    p.add_argument("--checks-dir", metavar="DIR", action="append", type=Path, default=[],
                   help="also load checks from the *.py files in DIR (repeatable)")
    p.add_argument("--profile", metavar="ID", help="platform profile for every host (default: detect)")
    p.add_argument("--profile-file", metavar="FILE", action="append", type=Path, default=[],
                   help="extra or overriding platform profile YAML (repeatable)")
    p.add_argument("--out", metavar="DIR", type=Path, default=Path("reports"),
                   help="where run directories go (default: ./reports)")
    p.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="preflight", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"preflight {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="probe hosts, save the evidence, judge it, write reports")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="FILE", type=Path, help="hosts file: [user@]host[:port] per line, ranges like gpu[001-016]")
    where.add_argument("-H", dest="host_list", metavar="HOSTS", help="hosts inline: a,b,gpu[01-04]")
    where.add_argument("--local", action="store_true", help="check this machine, without SSH (the default with no hosts)")
    run.add_argument("--user", help="SSH user (default: ssh config, then the current user)")
    run.add_argument("--port", type=_positive(int), help="SSH port (default: ssh config, then 22)")
    run.add_argument("--identity", "-i", type=Path, metavar="KEY", help="SSH private key")
    run.add_argument("--ssh-config", type=Path, metavar="FILE", help="OpenSSH client config (default: ~/.ssh/config)")
    run.add_argument("--known-hosts", type=Path, metavar="FILE", help="extra known_hosts file")
    run.add_argument("--accept-new-host-keys", action="store_true",
                     help="accept host keys not in known_hosts (default: reject them)")
    run.add_argument("--parallel", type=_positive(int), default=64, help="hosts probed at once (default 64)")
    run.add_argument("--timeout", type=_positive(float), default=30.0, help="seconds per probe (default 30)")
    run.add_argument("--connect-timeout", type=_positive(float), default=10.0, help="seconds to connect (default 10)")
    run.add_argument("--run-id", help="name of the run directory (default: timestamp)")
    _common_analysis_options(run)

    an = sub.add_parser("analyze", help="judge a saved bundle (or run directory) offline")
    an.add_argument("bundle", type=Path, help="a bundle directory, or a run directory holding bundle/")
    _common_analysis_options(an)

    ch = sub.add_parser("checks", help="list the checks and the probes they need")
    ch.add_argument("--checks-dir", metavar="DIR", action="append", type=Path, default=[])
    return parser


def _load_checks(args):
    checks = load_checks(args.checks_dir)
    wanted = [c.strip() for c in args.checks.split(",") if c.strip()] if getattr(args, "checks", None) else None
    return select(checks, wanted)


def _load_profiles(args):
    profiles = load_profiles(args.profile_file)
    if args.profile and args.profile not in profiles:
        raise UsageError(f"--profile: unknown profile {args.profile!r}; known: {', '.join(sorted(profiles))}")
    return profiles


def cmd_checks(args, console: Console) -> int:
    for c in load_checks(args.checks_dir):
        console.print(f"[bold]{c.id}[/] ({c.scope}) {c.summary}\n    probes: {', '.join(c.probes)}",
                      highlight=False)
    return EXIT_OK


def cmd_run(args, console: Console) -> int:
    from .runner import RunRequest, execute, new_run_id, probes_for

    if args.hosts:
        hosts = load_hosts_file(args.hosts)
    elif args.host_list:
        hosts = parse_host_list(args.host_list)
    else:
        hosts = []
    checks = _load_checks(args)
    profiles = _load_profiles(args)
    kb = load_knowledge()
    run_id = args.run_id or new_run_id()
    if "/" in run_id or run_id in (".", ".."):
        raise UsageError(f"--run-id: {run_id!r} must be a plain directory name")
    if (args.out / run_id).exists():
        raise UsageError(f"--run-id: {args.out / run_id} already exists; choose another id")
    ssh = SshOptions(args.user, args.port, args.identity, args.ssh_config, args.known_hosts,
                     args.accept_new_host_keys, args.connect_timeout)
    for path, opt in ((args.identity, "--identity"), (args.ssh_config, "--ssh-config"), (args.known_hosts, "--known-hosts")):
        if path and not path.is_file():
            raise UsageError(f"{opt}: {path}: no such file")
    plan = ExecPlan(probes_for(checks), args.timeout, args.parallel, ssh)
    req = RunRequest(hosts, checks, profiles, kb, plan, args.out, run_id, args.profile)

    if args.quiet or not console.is_terminal:
        run_dir, analysis = execute(req)
    else:
        from rich.progress import Progress

        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("probing hosts", total=max(1, len(hosts)))
            run_dir, analysis = execute(req, lambda host, done, total: bar.update(task, completed=done))
    if not args.quiet:
        terminal.show(analysis, console, str(run_dir))
    return EXIT_FAILED if analysis.failed else EXIT_OK


def cmd_analyze(args, console: Console) -> int:
    from .analyze import analyze
    from .runner import write_reports

    root = args.bundle
    if (root / "bundle" / "bundle.json").is_file():
        root = root / "bundle"
    bundle = read_bundle(root)
    checks = _load_checks(args)
    profiles = _load_profiles(args)
    analysis = analyze(bundle, checks, profiles, load_knowledge(), args.profile)
    run_id = "analyze-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    analysis.meta.update({"run_id": run_id, "created": bundle.created, "preflight_version": __version__,
                          "bundle": str(root.resolve())})
    out = args.out / run_id
    write_reports(out, analysis)
    if not args.quiet:
        terminal.show(analysis, console, str(out))
    return EXIT_FAILED if analysis.failed else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    err = Console(stderr=True)
    handlers = {"run": cmd_run, "analyze": cmd_analyze, "checks": cmd_checks}
    try:
        return handlers[args.command](args, console)
    except (InventoryInvalid, UsageError, BundleError, ProfileError, PlaybookError, CheckLoadError) as exc:
        err.print(f"preflight: error: {exc}", highlight=False, markup=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("preflight: interrupted; the evidence saved so far is in the run's bundle/ directory")
        return 130


if __name__ == "__main__":
    sys.exit(main())
