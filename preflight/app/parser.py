"""The command line's argparse parser, with the answers a mistyped command deserves (issue 34).

- No abbreviations: ``--host hosts.txt`` is not quietly taken for ``--hosts`` (nor ``--time``
  for ``--timeout``); an option is spelled out or refused.
- An unknown option gets the nearest ones this command has ("did you mean --quick?").
- A bad value is one line naming the option and the value, and where to read more: not the
  command's whole usage block above it.
Exit status 2 for all of them, as for every bad input (docs/contracts.md).
"""

from __future__ import annotations

import argparse
import difflib

from preflight.contracts import EXIT_USAGE
from preflight.store.location import mask_in


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, but an ``examples:`` epilog (preflight.app.options.examples) keeps its lines:
    one command line each, where the default formatter would run them into one paragraph."""

    def _fill_text(self, text, width, indent):
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with the rules above; its subparsers are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        # argparse quotes the words it refused: a store URL among them (``--d=postgresql://u:pw@h``,
        # an abbreviation no longer taken for --db) must not print its password.
        message = " ".join(mask_in(word) for word in message.split(" "))
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            command = chosen(self, parsed)
            command.error(unrecognized(unknown, command))
        return parsed


def chosen(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command's parser the arguments went to: the deepest one named in ``parsed``."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(parsed, subs[0].dest, None) if subs else None
        if not subs or name not in subs[0].choices:
            return parser
        parser = subs[0].choices[name]


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


def unrecognized(unknown: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's message, with the nearest option for each unknown ``--option``."""
    message = f"unrecognized arguments: {' '.join(unknown)}"
    known = option_strings(parser)
    hints = []
    for arg in unknown:
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        # A prefix (--host for --hosts) first, then the nearest spellings (--quik for --quick).
        near = [k for k in known if k.startswith(name)][:3] or difflib.get_close_matches(name, known, n=2, cutoff=0.8)
        if near:
            hints.append(f"{name}: did you mean {' or '.join(near)}?")
    return message + ("; " + "; ".join(hints) if hints else "")

