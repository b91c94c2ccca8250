"""One option vocabulary: `run`, `soak` and the pytest plugin read targets, SSH and output options
from the same table, with the same types and the same refusals."""

from __future__ import annotations

import pytest

from preflight.app import options
from preflight.app.cli import build_parser, main

pytest_plugins = ["pytester"]


def flags_of(command: str) -> dict[str, dict]:
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices[command]
    return {s: {"type": a.type, "default": a.default} for a in sub._actions for s in a.option_strings}


@pytest.mark.parametrize("option", [o for o in options.TARGETS + options.SSH] + [options.OUTPUT[0]],
                         ids=lambda o: o.flags[0])
def test_run_and_soak_share_each_option(option):
    run, soak = flags_of("run"), flags_of("soak")
    for flag in option.flags:
        assert run[flag] == soak[flag], flag


@pytest.mark.parametrize("command", ["run", "soak"])
def test_a_bad_port_is_refused_alike(command, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, "--port", "0", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "argument --port:" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "soak"])
def test_a_missing_identity_file_is_the_same_usage_error(command, capsys, tmp_path):
    assert main([command, "--local", "--identity", "/nonexistent/key", "--out", str(tmp_path / "o")]) == 2
    assert "--identity: /nonexistent/key: no such file" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_pytest_plugin_offers_the_shared_options_under_its_prefix(pytester):
    result = pytester.runpytest("--help")
    text = result.stdout.str()
    for o in options.PYTEST_PASSED:
        assert options.pytest_flag(o) in text
    assert "--preflight-port" in text and "--preflight-connect-timeout" in text
