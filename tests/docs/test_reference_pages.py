"""docs/reference/*.md are generated from the code (preflight/app/docsgen.py) and must be what the code
makes of them today: a new check, cause, probe, fact or option changes a page, and this fails until
the pages are regenerated."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from preflight.app import docsgen
from preflight.app.cli import build_parser
from preflight.collect.probe import Probe
from preflight.collect.probes import PROBES
from preflight.diagnose.engine import load_knowledge
from preflight.judge.loader import load_checks

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python3 -m preflight.app.docsgen"


def _page(name: str) -> str:
    return (ROOT / "docs" / "reference" / name).read_text()


def _anchors(text: str) -> set[str]:
    """The ids of the `### `id`` headings (their slug is the id itself)."""
    return set(re.findall(r"^#+ `([\w-]+)`$", text, re.M))


def test_the_reference_pages_are_what_the_code_makes():
    stale = docsgen.stale(ROOT)
    assert not stale, f"stale generated pages {stale}: regenerate with `{REGENERATE}` and commit them"


def test_a_new_probe_makes_the_pages_stale(tmp_path, monkeypatch):
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "docs", root / "docs")
    assert docsgen.stale(root) == []
    monkeypatch.setitem(PROBES, "new-probe", Probe("new-probe", ("newtool", "--all"), "a tool not yet documented",
                                                   "newtool"))
    assert docsgen.stale(root) == ["docs/reference/probes.md"]
    assert docsgen.main(["--root", str(root), "--check"]) == 1
    assert docsgen.main(["--root", str(root)]) == 0
    assert "## `new-probe`\n" in (root / "docs/reference/probes.md").read_text()
    assert docsgen.main(["--root", str(root), "--check"]) == 0


def test_the_check_command_names_the_stale_page_and_the_fix(tmp_path, capsys):
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "docs", root / "docs")
    (root / "docs/reference/causes.md").write_text("edited by hand\n")
    assert docsgen.main(["--root", str(root), "--check"]) == 1
    err = capsys.readouterr().err
    assert "stale: docs/reference/causes.md" in err and REGENERATE in err


def test_the_pages_do_not_depend_on_the_terminal_or_the_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "a"))
    narrow = docsgen.cli_page(docsgen._parser_as_shipped())
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "b"))
    monkeypatch.setenv("PREFLIGHT_DB", "postgresql://db01/preflight")
    assert docsgen.cli_page(docsgen._parser_as_shipped()) == narrow
    assert str(tmp_path) not in narrow


def test_every_check_cause_and_probe_has_its_entry():
    checks = load_checks(use_entry_points=False)
    assert {c.id for c in checks} <= _anchors(_page("checks.md"))
    assert set(load_knowledge().causes) <= _anchors(_page("causes.md"))
    assert set(PROBES) <= _anchors(_page("probes.md"))


def test_every_command_and_option_is_in_the_cli_page():
    text = _page("cli.md")
    for name, sub in docsgen._subcommands(build_parser()).items():
        assert f"## `preflight {name}`\n" in text
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in text or f", {option}" in text, f"preflight {name} {option}"


def test_a_check_entry_says_what_it_reads_and_answers():
    text = _page("checks.md")
    entry = text.split("### `nvlink`\n", 1)[1].split("\n### ", 1)[0]
    assert "- facts: [`nvlink_status`](facts.md#nvlink_status), [`topo`](facts.md#topo)" in entry
    assert "[`nvidia-smi-nvlink-status`](probes.md#nvidia-smi-nvlink-status)" in entry
    assert "- answers: PASS, FAIL, SKIP, ERROR" in entry
    assert "- causes: [`nvlink-down`](causes.md#nvlink-down)" in entry
    soak = text.split("### `soak-thermal`\n", 1)[1].split("\n### ", 1)[0]
    assert "`thermal-throttling`" in soak  # followed through the soak context's judge_* methods


def test_markdown_in_the_codes_text_is_shown_as_written():
    assert docsgen.md("reports/<run-id> and /sys/*/ports/*") == r"reports/&lt;run-id&gt; and /sys/\*/ports/\*"
    assert docsgen.md("keep `a_b<c>` as code") == "keep `a_b<c>` as code"
