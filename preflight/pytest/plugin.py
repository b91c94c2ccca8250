"""pytest plugin: preflight's verdicts as pytest items, and fixtures for acceptance tests.

Registered through the ``pytest11`` entry point under the name ``preflight`` (``-p
no:preflight`` turns it off). It is inert unless one of ``--preflight-hosts FILE``,
``--preflight-bundle DIR`` or ``--preflight-local`` is given: no items, no header line, no
summary, and its fixtures skip the test that asks for them, naming the missing option.

With one of them, preflight runs once, at session start (``--preflight-bundle``: the saved
bundle is analysed), writing its run directory under ``--preflight-out`` (default
``./reports``, as ``preflight run``). The options are turned into ``preflight run`` /
``preflight analyze`` arguments and parsed by the CLI's own parser, and ``cli.run_request`` /
``cli.analyze_saved`` do the work, so every default and every check of the input is the
CLI's; bad input is a pytest usage error (exit 4) with the CLI's message. Note that
``--collect-only`` runs preflight too: the items are its results.

Give path values as ``--preflight-bundle=DIR``: pytest chooses its rootdir (and ini file)
before any plugin's options are known, so in ``--preflight-bundle DIR`` it takes DIR for a
test path, and a bundle outside the project then becomes the rootdir.

Every host x check becomes one item, ``test_preflight[<host>-<check>]`` (``fleet`` for a
finding about the whole fleet), under a module-less collector ``preflight``, so ``-k``,
``-x``, ``--junitxml`` and the terminal treat them as any test:

- pass: passed; warn: passed, with a ``PreflightWarning`` in the warnings summary;
- fail: failed; the message (``repr_failure``) is the summary, each diagnosed cause with its
  action, and the evidence excerpts;
- skip: skipped, with the check's reason;
- error (the check could not tell: host unreachable, tool missing, evidence unreadable): the
  item raises ``PreflightError`` (a ``pytest.fail`` outcome without traceback) in its *setup*,
  which pytest counts and reports as an error, in JUnit as ``<error>``.

xdist: only the controller runs preflight; its session start comes before xdist starts the
workers, and it hands them report.json's contents through ``workerinput``. Workers build items
and fixtures from that, so an SSH sweep happens once, every worker collects the same items,
and remote workers need no shared disk. Without xdist the one process takes the same path:
items always come from report.json, so the session judges exactly what the saved report says.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from preflight.app import options
from preflight.model import Diagnosis, Finding, Status, worst
from preflight.pytest.acceptance import Report
from preflight.report.wording import not_checked, not_checked_line, plural, tally

FLEET = "fleet"  # host label of findings about the fleet as a whole
_WORKER_REPORT = "preflight_report"
_WORKER_RUN_DIR = "preflight_run_dir"


class PreflightFailure(Exception):
    """A check failed on a host; the message is what ``repr_failure`` shows."""


class PreflightError(pytest.fail.Exception):
    """A check could not judge a host. Raised in the item's setup, so pytest reports an error;
    as a ``pytest.fail`` outcome without traceback, its report is the message alone."""

    # As pytest does for its own outcomes: reports then read "PreflightError: ..." rather
    # than "preflight.pytest.plugin.PreflightError: ..." (summary line, JUnit message).
    __module__ = "builtins"

    def __init__(self, message: str) -> None:
        super().__init__(message, pytrace=False)


class PreflightWarning(UserWarning):
    """A check warned on a host: the item passes and the warning is listed."""


@dataclass(frozen=True)
class PreflightRun:
    """The session's one preflight run: where its reports are and what they say."""

    run_dir: Path  # report.json, report.md, junit.xml (and bundle/ after a live run)
    data: Mapping[str, Any]  # report.json as loaded (contract preflight-report/1)
    report: Report


RUN = pytest.StashKey[PreflightRun]()


@dataclass(frozen=True)
class Case:
    """What one item judges: the findings of one check on one host, and their diagnoses."""

    host: str | None
    check: str
    findings: tuple[Finding, ...]
    causes: tuple[Diagnosis, ...]

    @property
    def status(self) -> Status:
        return worst(f.status for f in self.findings)

    @property
    def name(self) -> str:
        return f"test_preflight[{self.host or FLEET}-{self.check}]"

    @property
    def message(self) -> str:
        notable = [f for f in self.findings if f.status not in (Status.PASS, Status.SKIP)] or list(self.findings)
        lines = [f.summary if len(notable) == 1 else f"[{f.status.value}] {f.summary}" for f in notable]
        # An unreached host is one item: the checks it could not run are named in it, once.
        lines += [not_checked_line(f) for f in notable if not_checked(f)]
        for d in self.causes:
            lines.append(f"cause: {d.cause} ({d.confidence} confidence){': ' + d.title if d.title else ''}")
            lines.append(f"action: {d.action}")
        for e in (e for f in notable for e in f.evidence):
            lines.append(f"evidence [{e.probe}]:")
            lines.extend("    " + line for line in e.excerpt.splitlines())
        return "\n".join(lines)


def cases(report: Report) -> list[Case]:
    """One case per host x check, hosts in report order, checks in the order they reported."""
    grouped: dict[tuple[str | None, str], list[Finding]] = {}
    for f in report.all_findings:
        grouped.setdefault((f.host, f.check), []).append(f)
    order = {h: i for i, h in enumerate(report.hosts)}
    keys = sorted(grouped, key=lambda k: order.get(k[0], len(order)))
    out = []
    for host, check in keys:
        findings = tuple(grouped[host, check])
        causes = {d: None for f in findings for d in report.explain(f)}
        out.append(Case(host, check, findings, tuple(causes)))
    return out


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("preflight", "preflight GPU node checks as test items (inert unless "
                                     "--preflight-hosts, --preflight-bundle or --preflight-local is given)")
    g.addoption("--preflight-bundle", metavar="DIR",
                help="judge a saved bundle (or a run directory holding bundle/) instead of running")
    # The targets, SSH and output options of `preflight run`, under the same names: the values
    # travel to `run` as typed, which checks them as it checks its own.
    for o in options.PYTEST_PASSED:
        kw = {k: v for k, v in o.kwargs.items() if k in ("help", "metavar", "action")}
        g.addoption(options.pytest_flag(o), dest=options.pytest_dest(o), **kw)
    g.addoption("--preflight-profile", metavar="ID", help="platform profile for every host (default: detect)")
    g.addoption("--preflight-checks", metavar="IDS", help="comma-separated check ids to run (default: all)")


_TARGETS = ("hosts", "local")


def cli_argv(config: pytest.Config) -> list[str] | None:
    """The ``preflight run`` / ``analyze`` arguments the options ask for; None when inert."""
    opt = config.getoption
    sources = {"--preflight-hosts": opt("preflight_hosts"), "--preflight-bundle": opt("preflight_bundle"),
               "--preflight-local": opt("preflight_local")}
    given = [name for name, value in sources.items() if value]
    if not given:
        return None
    if len(given) > 1:
        raise pytest.UsageError(f"{' and '.join(given)}: give only one of them")

    def path(value: str) -> str:
        # Relative to where pytest was started, as the user typed them (workers may chdir).
        return str(config.invocation_params.dir / value)

    common = [f"--out={path(opt('preflight_out') or 'reports')}"]
    common += [f"--profile={opt('preflight_profile')}"] if opt("preflight_profile") else []
    common += [f"--checks={opt('preflight_checks')}"] if opt("preflight_checks") else []
    ssh_args, ssh_names = [], []
    for o in options.SSH:
        value = opt(options.pytest_dest(o))
        if value in (None, False):
            continue
        ssh_names.append(options.pytest_flag(o))
        flag = o.flags[0]
        ssh_args.append(flag if value is True else f"{flag}={path(value) if o.is_path else value}")
    if ssh_args and given[0] != "--preflight-hosts":
        raise pytest.UsageError(f"{', '.join(ssh_names)}: only with --preflight-hosts")
    if given[0] == "--preflight-bundle":
        return ["analyze", path(sources["--preflight-bundle"]), *common]
    if given[0] == "--preflight-local":
        return ["run", "--local", *common]
    return ["run", f"--hosts={path(sources['--preflight-hosts'])}", *common, *ssh_args]


def run_preflight(argv: list[str]) -> tuple[Path, dict]:
    """Run or analyse as the CLI would; return the run directory and its report.json."""
    # Imported here: every pytest session loads this plugin, and most never use it.
    from preflight.app import cli
    from preflight.app.run import execute

    try:
        args = cli.build_parser().parse_args(argv)
    except SystemExit:
        # argparse has printed why; only an option value pytest passed through can cause it.
        raise pytest.UsageError(f"preflight: invalid options: {' '.join(argv)}") from None
    try:
        if args.command == "analyze":
            run_dir, _ = cli.analyze_saved(args)
        else:
            run_dir, _ = execute(cli.run_request(args))
    except cli.INPUT_ERRORS as exc:
        raise pytest.UsageError(f"preflight: {exc}") from None
    return run_dir, json.loads((run_dir / "report.json").read_text())


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # tryfirst: before the terminal prints the header and before xdist starts its workers.
    config = session.config
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if _WORKER_REPORT not in workerinput:
            return
        run_dir, data = Path(workerinput[_WORKER_RUN_DIR]), workerinput[_WORKER_REPORT]
    else:
        argv = cli_argv(config)
        if argv is None:
            return
        run_dir, data = run_preflight(argv)
    config.stash[RUN] = PreflightRun(run_dir, data, Report.from_dict(data))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist, on the controller: give each worker the report instead of a run of its own."""
    run = node.config.stash.get(RUN, None)
    if run is not None:
        node.workerinput[_WORKER_REPORT] = run.data
        node.workerinput[_WORKER_RUN_DIR] = str(run.run_dir)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    rep = yield
    run = collector.config.stash.get(RUN, None)
    if run is not None and isinstance(collector, pytest.Session) and rep.passed:
        rep.result.append(PreflightCollector.from_parent(collector, name="preflight", nodeid="preflight", run=run))
    return rep


class PreflightCollector(pytest.Collector):
    """The module-less node that holds one item per host x check of the session's run."""

    def __init__(self, *, run: PreflightRun, **kwargs) -> None:
        super().__init__(**kwargs)
        self.run = run

    def collect(self) -> Iterator[PreflightItem]:
        for case in cases(self.run.report):
            yield PreflightItem.from_parent(self, name=case.name, case=case)


class PreflightItem(pytest.Item):
    """One check on one host, passing, failing, skipping or erroring as its verdict says."""

    def __init__(self, *, case: Case, **kwargs) -> None:
        super().__init__(**kwargs)
        self.case = case
        # JUnit <properties>, so CI can group by host or check without parsing names.
        self.user_properties += [("preflight_host", case.host or FLEET), ("preflight_check", case.check),
                                 ("preflight_status", case.status.value)]
        if case.status is Status.SKIP:
            # A skip mark, not pytest.skip() in runtest: the skip is then reported at the item's
            # location (the report) rather than at a line of this plugin.
            self.add_marker(pytest.mark.skip(reason=case.message))

    def setup(self) -> None:
        if self.case.status is Status.ERROR:
            raise PreflightError(self.case.message)

    def runtest(self) -> None:
        status = self.case.status
        if status is Status.FAIL:
            raise PreflightFailure(self.case.message)
        if status is Status.WARN:
            warnings.warn(PreflightWarning(f"{self.case.host or FLEET} {self.case.check}: {self.case.message}"),
                          stacklevel=2)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, PreflightFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.report_file, 0, self.name

    @property
    def report_file(self) -> Path:
        return self.parent.run.run_dir / "report.json"


@pytest.fixture(scope="session")
def preflight_run(request: pytest.FixtureRequest) -> PreflightRun:
    """The session's preflight run (run once); skips the test when the plugin is inert."""
    run = request.config.stash.get(RUN, None)
    if run is None:
        pytest.skip("needs --preflight-hosts FILE, --preflight-bundle DIR or --preflight-local")
    return run


@pytest.fixture(scope="session")
def preflight_report(preflight_run: PreflightRun) -> Report:
    """The run's report as an acceptance object: ``preflight_report.host("gpu01").passed``."""
    return preflight_run.report


def pytest_report_header(config: pytest.Config) -> str | None:
    run = config.stash.get(RUN, None)
    if run is None:
        return None
    statuses = Counter(h.status for h in run.report.host_results.values())
    counts = tally(statuses, sorted(statuses))
    return f"preflight: {plural(len(run.report.hosts), 'host')} ({counts}); reports in {run.run_dir}"


def pytest_terminal_summary(terminalreporter) -> None:
    run = terminalreporter.config.stash.get(RUN, None)
    if run is None:
        return
    terminalreporter.write_sep("-", "preflight diagnoses")
    for d in run.report.all_diagnoses:
        hosts = ", ".join(d.hosts) or "the fleet"
        terminalreporter.write_line(f"{d.cause} ({d.confidence}) on {hosts}: {d.action}")
    if not run.report.all_diagnoses:
        terminalreporter.write_line("none")
    terminalreporter.write_line(f"reports: {run.run_dir}")
