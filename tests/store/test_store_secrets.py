"""A store URL's password reaches no stored command line and no message, however it was passed
(issue 31): ``--db URL``, ``--db=URL``, an abbreviation (``--d=URL``: refused since issue 34, and
its error names the word with the password masked), and a
password holding characters a URL should have percent-encoded (``#``, ``?``, ``/``, ``@``),
which urllib then reads as a fragment, a query or a path and finds no password in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from preflight.app import cli, store_cli
from preflight.store import Store, location

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "h200-fleet"
SECRET = "Hunter2%23x%3Fy"  # "Hunter2#x?y", percent-encoded as libpq asks; the test server's trust auth ignores it


def _with_password(url: str) -> str:
    """The test's PostgreSQL URL (``postgresql://USER@/DB?host=...``) with a password in it."""
    head, _, tail = url.partition("@")
    return f"{head}:{SECRET}@{tail}"


@pytest.mark.parametrize("form", ["--db URL", "--db=URL"])
def test_the_stored_command_line_keeps_no_password_in_any_form(store_url, form, tmp_path, capsys, monkeypatch):
    url = _with_password(store_url) if store_url.startswith("postgresql") else store_url
    flag, sep, _ = form.partition("=") if "=" in form else form.partition(" ")
    words = [f"{flag}={url}"] if sep == "=" else [flag, url]
    argv = ["analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--no-html", *words]
    monkeypatch.setattr(sys, "argv", ["/usr/bin/preflight", *argv])  # what the recording reads, as a shell gives it
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    with Store.open(location.parse(url), create=False) as store:
        [(command,)] = store.rows("SELECT command FROM pf_runs")
    assert "Hunter2" not in command + out + err
    if url.startswith("postgresql"):
        assert f"{location.mask(url)}" in command and ":***@" in command
    else:  # a SQLite path is no secret: kept exactly as typed
        assert command == "preflight " + " ".join(argv)


@pytest.mark.parametrize("form", ["--d=URL", "--d URL"])
def test_an_abbreviation_is_refused_without_printing_the_password(form, tmp_path, capsys):
    url = "postgresql://pf:Hunter2%23x@db01/pf"
    flag, sep, _ = form.partition("=") if "=" in form else form.partition(" ")
    words = [f"{flag}={url}"] if sep == "=" else [flag, url]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", *words])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and "did you mean --db?" in err and "pf:***@db01" in err
    assert "Hunter2" not in out + err and not (tmp_path / "r").exists()


@pytest.mark.parametrize("word, shown", [
    ("--db=postgresql://pf:s3cret@db01/pf", "--db=postgresql://pf:***@db01/pf"),
    ("--d=postgres://pf:s3cret@db01/pf", "--d=postgres://pf:***@db01/pf"),
    ("postgresql://pf:s3#cret@db01/pf", "postgresql://pf:***@db01/pf"),
    ("postgresql://pf:s3?cret@db01/pf", "postgresql://pf:***@db01/pf"),
    ("postgresql://pf:s3/cret@db01/pf", "postgresql://pf:***@db01/pf"),
    ("postgresql://pf:s3@cret@db01/pf?application_name=a@b", "postgresql://pf:***@db01/pf?application_name=a@b"),
    ("postgresql://pf@db01/pf?password=s3cret&sslmode=require", "postgresql://pf@db01/pf?password=***&sslmode=require"),
    ("--retest-arg=--db=postgresql://pf:s3cret@db01/pf", "--retest-arg=--db=postgresql://pf:***@db01/pf"),
    ("host=db01 password=s3cret dbname=pf", "host=db01 password=*** dbname=pf"),
    ("--endpoint=http://pf:tok3n@vllm01:8000/v1", "--endpoint=http://pf:***@vllm01:8000/v1"),  # soak's
    ("sqlite:///srv/u:x@y/h.sqlite", "sqlite:///srv/u:x@y/h.sqlite"),
    ("--out=/srv/reports", "--out=/srv/reports"),
])
def test_every_word_of_a_command_line_is_masked_by_parsing(word, shown):
    assert store_cli.command_line(["preflight", "run", word]) == f"preflight run {shown}"


@pytest.mark.parametrize("url", ["postgresql://pf:Se#cret@db01/pf", "postgresql://pf:Se?cret@db01/pf",
                                 "postgresql://pf:Se#cret@[::1/pf"])
def test_a_url_error_never_prints_the_password(url, capsys):
    code = cli.main(["history", "--fleet", "--db", url])
    err = capsys.readouterr().err
    assert code == 2 and "--db" in err and "Se#cret" not in err and "Se?cret" not in err and "Se" not in err
    assert "pf:***@" in err


def test_a_driver_message_is_scrubbed_of_the_password_as_typed_and_decoded():
    url = location.parse("postgresql://pf:p%40ss%23word@db01/pf?password=other")
    text = "connection to db01 failed for pf:p%40ss%23word, p@ss#word and other"
    assert "p%40ss" not in location.scrub(text, url) and "p@ss" not in location.scrub(text, url)
    assert "other" not in location.scrub(text, url)
