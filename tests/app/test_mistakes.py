"""Mistakes a new operator makes, and the answers they get (issue 34): one line naming what is
wrong and what was meant, exit 2, nothing run or written."""

from __future__ import annotations

import pytest

from preflight.app.cli import main


def refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err


def test_an_abbreviated_option_is_not_taken_for_another(capsys, tmp_path):
    # argparse's abbreviations took `--host hosts.txt` for `--hosts`.
    (tmp_path / "hosts.txt").write_text("gpu001\n")
    err = refused(capsys, ["run", "--host", str(tmp_path / "hosts.txt"), "--out", str(tmp_path / "r")])
    assert err.startswith("preflight run: error: unrecognized arguments: --host ")
    assert "--host: did you mean --hosts?" in err
    assert not (tmp_path / "r").exists()


def test_an_unknown_option_gets_the_nearest_one(capsys):
    err = refused(capsys, ["run", "--local", "--quik"])
    assert "unrecognized arguments: --quik; --quik: did you mean --quick?" in err
    err = refused(capsys, ["history", "gpu001", "--lst", "5"])
    assert "--lst: did you mean --last?" in err


def test_a_bad_value_is_one_line_without_the_usage_block(capsys):
    err = refused(capsys, ["run", "--local", "--timeout", "abc"])
    assert err == ("preflight run: error: argument --timeout: not a number: 'abc' "
                   "(`preflight run --help` lists the options)\n")


def test_no_command_names_the_help(capsys):
    err = refused(capsys, [])
    assert err.startswith("preflight: error: the following arguments are required: command")
    assert "`preflight --help`" in err and "usage:" not in err


def test_analyze_of_a_path_that_does_not_exist_says_so(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["analyze", str(tmp_path / "nosuchdir"), "--no-db", "--out", str(tmp_path / "r")]))
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"preflight: error: {tmp_path / 'nosuchdir'}: does not exist\n"
    (tmp_path / "file").write_text("x")
    assert main(["analyze", str(tmp_path / "file"), "--no-db", "--out", str(tmp_path / "r")]) == 2
    assert "file: not a directory" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_two_analyses_in_one_second_keep_their_own_directories(tmp_path, monkeypatch):
    # Issue 34: two analyze runs started in the same second with one --out shared analyze-<second>.
    from preflight.evidence import bundle

    frozen = bundle.datetime(2026, 12, 3, 12, 0, 0, tzinfo=bundle.timezone.utc)
    monkeypatch.setattr(bundle, "new_run_id", lambda node=None, now=None, _f=bundle.new_run_id: _f(node, frozen))
    import preflight.app.cli as cli

    monkeypatch.setattr(cli, "new_run_id", bundle.new_run_id)
    example = str(cli.Path(__file__).resolve().parents[2] / "examples" / "h200-fleet")
    for _ in range(2):
        assert main(["analyze", example, "-q", "--no-db", "--no-html", "--out", str(tmp_path)]) == 1
    runs = sorted(p.name for p in tmp_path.iterdir())
    assert len(runs) == 2 and all(r.startswith("analyze-20261203-120000-") for r in runs), runs
