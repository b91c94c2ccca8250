"""``preflight checks``, ``facts`` and ``explain``: the listings a person reads on a terminal, a
script reads from a pipe (one tab-separated record per line) or as ``--json``; the records are
``preflight.app.listings``'."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.markup import escape

from preflight.app import listings
from preflight.app.errors import UsageError
from preflight.contracts import EXIT_OK
from preflight.diagnose.engine import load_knowledge
from preflight.diagnose.explain import UnknownCause, explain, find_cause, list_causes
from preflight.judge.loader import load_checks


def _listing(args, console: Console, records: list, plain: str, terminal_view) -> int:
    """``--json``: the records; a terminal: ``terminal_view()``; a pipe: ``plain``, one record per
    line, tab-separated, never wrapped (preflight.app.listings)."""
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(listings.as_json(records), indent=2) + "\n")
    elif console.is_terminal:
        terminal_view()
    else:
        sys.stdout.write(plain)
    return EXIT_OK


def cmd_checks(args, console: Console) -> int:
    records = listings.check_records(load_checks(args.checks_dir))

    def view() -> None:
        for c in records:
            reads = (f"\n    facts: {', '.join(c.facts)}" if c.facts else "") + (
                f"\n    probes: {', '.join(c.probes)}" if c.probes else "")
            console.print(f"[bold]{c.id}[/] ({c.scope}) {c.summary}{reads}", highlight=False)

    return _listing(args, console, records, listings.checks_tsv(records), view)


def cmd_facts(args, console: Console) -> int:
    """The facts a check can name, each with the probes it is derived from."""
    records = listings.fact_records()

    def view() -> None:
        for f in records:
            # The doc is data: a [...] in it is text, not rich markup.
            console.print(f"[bold]{f.name}[/] {escape(f.doc)}\n    probes: "
                          f"{', '.join(f.probes) or '(none: the profile)'}", highlight=False)

    return _listing(args, console, records, listings.facts_tsv(records), view)


def cmd_explain(args, console: Console) -> int:

    kb = load_knowledge()
    if args.cause and not args.list:
        try:
            cause = find_cause(args.cause, kb)
        except UnknownCause as exc:
            raise UsageError(str(exc)) from None
        if args.json:
            [record] = [r for r in listings.cause_records(kb) if r.id == cause.id]
            sys.stdout.write(json.dumps(listings.as_json([record])[0], indent=2) + "\n")
        else:
            console.print(explain(cause.id, kb), end="", markup=False, highlight=False, soft_wrap=True)
        return EXIT_OK
    records = listings.cause_records(kb)
    return _listing(args, console, records, listings.causes_tsv(records),
                    lambda: console.print(list_causes(kb), end="", markup=False, highlight=False, soft_wrap=True))
