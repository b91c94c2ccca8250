"""The results store on the command line: ``--db``/``--no-db`` on every command that judges or
changes a node, the recording of each finished report, and ``preflight history``.

Recording never costs a verdict: it runs after the reports are on disk, and a store that is
down, locked, full or of another schema is a warning naming it, with the command that records
the run later (``preflight history import``). The history commands, whose whole job is the
store, exit 2 on the same faults instead.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import getpass
import json
import os
import re
import shlex
import stat
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from preflight.app import history_view
from preflight.app.errors import UsageError
from preflight.contracts import EXIT_OK
from preflight.judge.trends import Policy
from preflight.knowledge.datafile import positive
from preflight.report import consoles, json_lines
from preflight.report.files import write_atomic
from preflight.report.fleet_html import render_fleet
from preflight.store import Store, StoreError, StoreUrl, StoreUrlError, chosen, location
from preflight.store.db import Recorded
from preflight.store.read import UnknownNode, Window, fleet, host_histories, node_history, up_to_latest
from preflight.store.rows import ReportShapeError, rows_of
from preflight.store.series import fleet_series

PLAIN = {"markup": False, "highlight": False, "soft_wrap": True, "emoji": False}
WRITE_TIMEOUT_S = 10.0  # a store slower than this is skipped with a warning: the verdict is already on disk
_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


TEXT_LAST = 500  # runs a node's text timeline shows unless --last says otherwise: a screenful of pages
HISTORY_WINDOW_S = 90 * 86400  # the past a --history judgement reads: a season of daily runs


def add_options(p: argparse.ArgumentParser, history: bool = False) -> None:
    g = p.add_argument_group("results store", f"every verdict is kept for `preflight history` (default: "
                             f"{location.default_url().replace(str(Path.home()), '~')}, or ${location.ENV})")
    g.add_argument("--db", metavar="URL", help="sqlite:///PATH or postgresql://[USER@]HOST/DBNAME "
                   "(a password is better kept in ~/.pgpass than in the URL)")
    g.add_argument("--no-db", action="store_true", help="record nothing")
    if history:
        g.add_argument("--history", action="store_true",
                       help="also judge each node against its own past in the store: repeat offenders (the same "
                            "cause in 3 incidents in 7 days), flapping checks, figures getting worse beyond the "
                            "fleet's run-to-run spread (checks history-repeat, history-flapping, history-trend)")


def store_of(args) -> StoreUrl | None:
    """The store the command records into; a URL that cannot name a store is bad usage (exit 2,
    before anything runs)."""
    try:
        return chosen(getattr(args, "db", None), getattr(args, "no_db", False))
    except StoreUrlError as exc:
        raise UsageError(f"--db / ${location.ENV}: {exc}") from None


def histories_for(url: StoreUrl | None, nodes: list[str], console: Console, exclude_run: str | None = None):
    """The nodes' past for ``--history``; an empty one, with a warning, when the store cannot be
    read (the history checks then say there is none: the run itself goes on)."""
    if url is None:
        raise UsageError("--history reads the results store: not with --no-db or an empty $PREFLIGHT_DB")
    try:
        with Store.open(url, create=False, timeout_s=WRITE_TIMEOUT_S) as store:
            return host_histories(store, nodes, Window(time.time() - HISTORY_WINDOW_S), exclude_run)
    except StoreError as exc:
        if "does not exist" not in str(exc):
            warn(console, f"results store {url.shown}: no history read: {location.scrub(str(exc), url)}")
        return {}


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed, with every password masked: a URL's anywhere in a word, so that
    ``--db URL``, ``--db=URL``, an abbreviation argparse accepts (``--d=URL``) and an option
    passed through (``--retest-arg=--db=URL``) are masked alike, and any ``password=VALUE``."""
    words = list(sys.argv if argv is None else argv)
    words[0] = os.path.basename(words[0]) if words else "preflight"
    return " ".join(location.mask_in(w) for w in words)


def open_store(url: StoreUrl, create: bool, timeout_s: float = WRITE_TIMEOUT_S) -> Store:
    """Open ``url``; with ``create``, the embedded default's directory is made on first use, by
    every command that writes (run, analyze, history import, lifecycle --once alike)."""
    if create and url.dialect == location.SQLITE and url.target == location.default_url()[len("sqlite:///"):]:
        os.makedirs(Path(url.target).parent, mode=0o700, exist_ok=True)
    return Store.open(url, create=create, timeout_s=timeout_s)


def _open_for_write(url: StoreUrl) -> Store:
    return open_store(url, create=True)


def warn(console: Console, text: str) -> None:
    consoles.errors().print(f"preflight: warning: {printable(text)}", **PLAIN)


def printable(text: str) -> str:
    """``text`` with any lone surrogate (a name that was not UTF-8, through surrogateescape)
    written as its escape: a terminal's encoder refuses them."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def import_hint(url: StoreUrl, run_dir: Path) -> str:
    """The command that records ``run_dir`` later into the same store. The store is named as it
    was chosen, but for a password: the hint then says to pass the URL in $PREFLIGHT_DB (a
    command line is visible to every user of the machine, and the URL shown is masked)."""
    folder = shell_word(str(run_dir))
    default = url.dialect == location.SQLITE and url.target == location.default_url()[len("sqlite:///"):]
    if default and location.ENV not in os.environ:
        return f"`preflight history import {folder}`"
    if url.dialect == location.POSTGRES and url.shown != url.target:  # a password, masked in what is shown
        return (f"`preflight history import {folder}` with ${location.ENV} set to this store's URL, "
                f"password included ({url.shown})")
    return f"`preflight history import {folder} --db {shell_word(url.shown)}`"


def shell_word(text: str) -> str:
    """``text`` quoted for a POSIX shell; a name that was not UTF-8 (lone surrogates) in bash's
    $'...' with its bytes as \\xHH, so that the command printed reaches the very file."""
    try:
        text.encode("utf-8")
        return shlex.quote(text)
    except UnicodeEncodeError:
        raw = os.fsencode(text)
        return "$'" + "".join(chr(b) if 0x20 <= b < 0x7f and b not in b"'\\" else f"\\x{b:02x}" for b in raw) + "'"


def record_report(url: StoreUrl | None, run_dir: Path, console: Console, command: str | None = None) -> bool:
    """Record ``run_dir/report.json``; a warning (never an exception) when the store cannot take it."""
    if url is None:
        return False
    path = run_dir / "report.json"
    try:
        text, mtime = read_regular(path)
        rows = rows_of(json.loads(text), started_fallback=mtime,
                       command=command_line() if command is None else command, report_dir=str(run_dir.resolve()))
        with _open_for_write(url) as store:
            (done,) = store.record_all([rows])
        if done.renamed_from:
            warn(console, renamed(done, url))
        return True
    except (StoreError, ReportShapeError, OSError, ValueError) as exc:
        why = location.scrub(str(exc), url).removeprefix(f"{url.shown}: ")
        warn(console, f"results store {url.shown}: not recorded: {why}; the reports "
                      f"are in {run_dir}; record them later with {import_hint(url, run_dir)}")
        return False


def renamed(done: Recorded, url: StoreUrl) -> str:
    return (f"results store {url.shown}: another run is recorded as {done.renamed_from}; this one is "
            f"kept as {done.run_id}")


def read_regular(path: Path) -> tuple[str, float]:
    """A report's text and modification time, opening nothing but a regular file: a FIFO named
    report.json would block a plain open() until a writer came, which may be never. O_NONBLOCK
    makes the open return at once whatever the file is; fstat then says what it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        return fh.read().decode("utf-8"), st.st_mtime


def actor() -> str:
    """Who made a change: the person behind sudo when there is one."""
    user = os.environ.get("SUDO_USER")
    if not user:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid())
    return user


def record_events(url: StoreUrl | None, events: list[dict], console: Console) -> None:
    """Drains and resumes, with who, why and the run; a warning when the store cannot take them."""
    if url is None or not events:
        return
    try:
        with _open_for_write(url) as store:
            for e in events:
                store.add_event(e["node"], e["kind"], e.get("actor") or actor(), e.get("reason") or "",
                                e.get("run_id"), json.dumps(e.get("detail") or {}))
    except (StoreError, OSError) as exc:
        warn(console, f"results store {url.shown}: {len(events)} event(s) not recorded: "
                      f"{location.scrub(str(exc), url)}")


# ---- preflight history -----------------------------------------------------------------------

def since_of(text: str, now: float | None = None, option: str = "--since") -> float:
    """``30d``, ``12h``, ``2w``, ``90m`` back from now, or a date / ISO time (UTC when naive).
    The store counts time in seconds since 1970-01-01 UTC: a moment before it (``999999d``, a
    typo's worth of digits) is bad input naming ``option``, refused before anything is read or
    deleted."""
    now = time.time() if now is None else now
    if m := _SINCE.match(text):
        t = now - float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UsageError(f"{option}: {text!r} is neither a duration (30d, 12h, 2w, 90m) nor a date "
                             "(2026-11-01 or 2026-11-01T06:00)") from None
        t = (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    if not t >= 0:
        raise UsageError(f"{option}: {text!r} reaches back before 1970-01-01, where the store's time begins "
                         f"(at most {int(now // 86400)}d back)")
    try:
        datetime.fromtimestamp(t, timezone.utc)  # what every answer prints it as
    except (OverflowError, OSError, ValueError):
        raise UsageError(f"{option}: {text!r} is past the last date a time can be written as (9999-12-31)") from None
    return t


def duration_of(text: str, option: str) -> float:
    """A length of time above zero: ``7d``, ``36h``, ``2w``, ``90m``, ``600s``."""
    m = _SINCE.match(text)
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)] if m else 0.0
    if not m or not 0 < seconds <= 3650 * 86400:
        raise UsageError(f"{option}: {text!r} is not a length of time above zero and at most 10 years "
                         "(7d, 36h, 2w, 90m)")
    return seconds


def add_parser(sub) -> None:
    h = sub.add_parser(
        "history", help="what the store remembers: a node's timeline, the fleet's repeat offenders, flapping "
                        "checks, degrading figures, failure rates and how often its drains were right; also "
                        "`history import DIR...` and `history migrate`",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  preflight history gpu017 --since 14d\n  preflight history --fleet --json\n"
               "  preflight history --fleet --html fleet.html\n  preflight history import reports/\n"
               "  preflight history migrate --db postgresql://pf@db01/preflight\n  preflight history prune --keep 365d")
    h.add_argument("target", nargs="*", metavar="NODE | import DIR... | migrate | prune",
                   help="a node's timeline; `import DIR...` records saved runs (a run directory, a report.json "
                        "or a folder of runs; idempotent by run id); `migrate` brings the store's schema up to date; "
                        "`prune --keep AGE` forgets what is older")
    h.add_argument("--fleet", action="store_true", help="the fleet's questions instead of one node's timeline")
    h.add_argument("--keep", metavar="AGE", help="prune: forget the runs and events older than this (365d, 12w)")
    h.add_argument("--since", default="30d", help="how far back: 30d, 12h, 2w, or a date (default 30d)")
    h.add_argument("--json", action="store_true", help="print JSON (the keys are a contract: docs/store.md)")
    h.add_argument("--last", type=int, metavar="N",
                   help=f"a node's timeline: only its latest N runs and events (default {TEXT_LAST} on the terminal's "
                        "text, every one with --json; 0: every one)")
    h.add_argument("--html", metavar="FILE", type=Path, help="--fleet: also write a fleet page")
    h.add_argument("--repeat", type=int, default=Policy.repeat_count, metavar="K",
                   help=f"incidents of one cause that make a repeat offender (default {Policy.repeat_count})")
    h.add_argument("--flaps", type=int, default=Policy.flap_transitions, metavar="N",
                   help=f"fail/pass changes of one check that make it flapping (default {Policy.flap_transitions})")
    h.add_argument("--sigmas", type=positive(float, 1000.0), default=Policy.sigmas, metavar="Z",
                   help="fleet run-to-run spreads a figure must move to count as degrading "
                        f"(default {Policy.sigmas:g})")
    h.add_argument("--returns-within", metavar="AGE", default="7d",
                   help="--fleet's precision: a drain resumed with no step taken is unconfirmed once its cause has "
                        "stayed away from the node this long (default 7d; docs/lifecycle.md)")
    h.add_argument("--db", metavar="URL", help=f"the store (default ${location.ENV}, else the embedded SQLite file)")


def required_url(args) -> StoreUrl:
    """The store a command that reads or changes it needs (history, its import and migrate, the
    lifecycle): ``--db``, else ``$PREFLIGHT_DB``, else the embedded file; none is bad usage."""
    try:
        url = chosen(getattr(args, "db", None))
    except StoreUrlError as exc:
        raise UsageError(f"--db / ${location.ENV}: {exc}") from None
    if url is None:
        raise UsageError(f"${location.ENV} is empty (no store); name one with --db")
    return url


def open_required(args, create: bool = False) -> Store:
    # A store that cannot be opened is a StoreError: bad input to these commands (app.errors).
    return open_store(required_url(args), create=create, timeout_s=10.0)



def cmd_history(args, console: Console) -> int:
    target = list(args.target)
    if target[:1] == ["import"]:
        return _import(args, target[1:], console)
    if target[:1] == ["migrate"]:
        return _migrate(args, console)
    if target[:1] == ["prune"]:
        return _prune(args, console)
    if args.fleet == bool(target):
        raise UsageError("history: name one NODE, or give --fleet" if not target else
                         "history: a NODE or --fleet, not both")
    if len(target) > 1:
        raise UsageError(f"history: one node at a time (got {len(target)}: {' '.join(target)})")
    if args.html and not args.fleet:
        raise UsageError("--html: the fleet page comes with --fleet")
    if args.html and not args.html.parent.is_dir():
        raise UsageError(f"--html: {args.html.parent}: no such directory")
    for name in ("repeat", "flaps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name}: {getattr(args, name)} is not a positive count")
    if args.last is not None and args.last < 0:
        raise UsageError(f"--last: {args.last} is not a count (0 shows every run)")
    last = (None if args.json else TEXT_LAST) if args.last is None else (args.last or None)
    since = since_of(args.since)
    policy = Policy(repeat_count=args.repeat, flap_transitions=args.flaps, sigmas=args.sigmas,
                    returns_within_s=duration_of(args.returns_within, "--returns-within"))
    with open_required(args) as store, _collector_paused():
        try:
            window = up_to_latest(store, since)
            result = fleet(store, window, policy) if args.fleet else node_history(store, target[0], window, last)
        except UnknownNode as exc:
            raise UsageError(str(exc)) from None
        except StoreError as exc:
            raise UsageError(str(exc)) from None
        if args.html:
            write_atomic(args.html, render_fleet(result, fleet_series(store, window, result)))
    with _collector_paused():
        if args.json:
            console.print_json(data=result) if console.is_terminal else sys.stdout.write(json_lines.dumps(result))
        else:
            history_view.show(result, console, fleet=args.fleet)
    return EXIT_OK


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector off while an answer is built and printed: a node's year of
    five-minute healthchecks is some 400,000 small dicts and lists that live until the command
    ends and hold no cycles, and the collector's passes over them were a quarter of the time
    (bench/RESULTS.md). Reference counting still frees everything else."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _reports_under(paths: list[Path]) -> list[Path]:
    """The report.json of each path; a folder holding none is bad input (a mistyped folder
    would otherwise import nothing and say so only as "recorded 0 run(s)")."""
    found = []
    for p in paths:
        if p.is_dir():
            if os.path.lexists(p / "report.json"):
                found.append(p / "report.json")  # or something that is not a file: read_regular names it
                continue
            inside = sorted(p.glob("*/report.json"))
            if not inside:
                raise UsageError(f"history import: {p}: no report.json in it nor in its run directories "
                                 f"({p}/report.json or {p}/*/report.json)")
            found += inside
        elif os.path.lexists(p):
            found.append(p)  # a report.json, or something that is not a file: read_regular names it
        else:
            raise UsageError(f"history import: {p}: no such file or directory")
    return found


def _import(args, paths: list[str], console: Console) -> int:
    if not paths:
        raise UsageError("history import: name the run directories, report.json files or reports/ folders")
    reports = _reports_under([Path(p) for p in paths])
    # Read and check every report before the first write, then write them in one transaction:
    # a bad one, or a store that fails part-way, records none.
    rows = []
    for path in reports:
        try:
            text, mtime = read_regular(path)
            rows.append(rows_of(json.loads(text), started_fallback=mtime, report_dir=str(path.parent.resolve())))
        except (ReportShapeError, ValueError, OSError) as exc:
            raise UsageError(f"history import: {path}: {str(exc).removeprefix(f'{path}: ')}") from None
    with open_required(args, create=True) as store:
        try:
            done = store.record_all(rows)
        except StoreError as exc:
            raise UsageError(f"history import: {exc} (nothing recorded)") from None
        url = store.url
    for d in done:
        if d.renamed_from:
            warn(console, renamed(d, url))
    added = sum(d.added for d in done)
    console.print(f"recorded {added} run(s) in {url.shown}; {len(rows) - added} already there", **PLAIN)
    return EXIT_OK


def _prune(args, console: Console) -> int:
    if not args.keep or not _SINCE.match(args.keep):
        raise UsageError(f"history prune: --keep AGE (365d, 12w, 48h): got {args.keep!r}")
    before = since_of(args.keep, option="--keep")
    # Everything the message needs is known before the first row goes.
    when = datetime.fromtimestamp(before, timezone.utc).strftime("%Y-%m-%d %H:%M")
    with open_required(args) as store:
        try:
            gone = store.prune(before)
        except StoreError as exc:
            raise UsageError(str(exc)) from None
        shown = store.url.shown
    console.print(f"{shown}: forgot {gone} run(s) started before {when} UTC", **PLAIN)
    return EXIT_OK


def _migrate(args, console: Console) -> int:
    url = required_url(args)
    with Store.connect(url, create=True) as store:
        before = store.version()
        applied = store.migrate()
    console.print(f"{url.shown}: schema version {before}" + (f" -> {applied[-1]}" if applied else
                                                              " (up to date)"), **PLAIN)
    return EXIT_OK
