"""`--help` of the main commands ends with the command lines an operator types (issue 27), and each
of those lines is one the parser accepts: an example cannot drift from the options."""

from __future__ import annotations

import shlex

import pytest

from preflight.app import soak_cli
from preflight.app.cli import build_parser

COMMANDS = ["run", "soak", "analyze", "history", "lifecycle"]


def _help(parser, command: str) -> str:
    return parser._subparsers._group_actions[0].choices[command].format_help()


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
