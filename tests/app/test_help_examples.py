"""`--help` of the main commands ends with the command lines an operator types (issue 27), and each
of those lines is one the parser accepts: an example cannot drift from the options."""

from __future__ import annotations

import shlex

import pytest

from preflight.app import soak_cli
from preflight.app.cli import build_parser

COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)


def _help(parser, command: str) -> str:
    return parser._subparsers._group_actions[0].choices[command].format_help()


def test_every_command_is_walked():
    # Every subparser the command line has (README: "each ends with examples"), not a list kept by hand.
    assert {"run", "analyze", "merge", "baseline", "healthcheck", "prolog", "fabric", "drain", "resume", "history",
            "lifecycle", "checks", "facts", "explain", "diff", "soak"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_ends_with_examples_the_parser_accepts(command):
    parser = build_parser()
    text = _help(parser, command)
    assert "\nexamples:\n" in text, f"preflight {command} --help has no examples"
    lines = [line.strip() for line in text.split("\nexamples:\n", 1)[1].splitlines() if line.strip()]
    assert 2 <= len(lines) <= 6
    for line in lines:
        argv = shlex.split(line)
        assert argv[:2] == ["preflight", command], line
        args = parser.parse_args(argv[1:])  # a bad option or value exits 2 here
        assert args.command == command
        if command == "soak":
            assert soak_cli.soak_seconds(args) > 0  # option combinations the soak refuses raise here


def test_the_top_level_help_is_plain_text_and_ends_with_examples():
    parser = build_parser()
    text = parser.format_help()
    description = text.split("\n\n")[1]
    # Not the module's docstring (reStructuredText, cut at its first line).
    assert "``" not in text and description.rstrip().endswith("for each command.")
    examples = [line.strip() for line in text.split("\nexamples:\n", 1)[1].splitlines() if line.strip()]
    assert len(examples) >= 2
    for line in examples:
        assert parser.parse_args(shlex.split(line)[1:]).command
