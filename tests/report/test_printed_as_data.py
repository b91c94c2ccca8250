"""Text from nodes printed as data by the terminal summary and report.md (issue 31): control
characters shown as their escapes, rich's markup and emoji codes left as typed. A PCI bus id as
nvidia-smi prints it, 00000000:AB:00.0, once printed as 00000000🆎00.0."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from preflight.app import cli
from preflight.model import Analysis, Diagnosis, Evidence, Finding, HostVerdict, Status
from preflight.printable import printable, printable_lines
from preflight.report import markdown, terminal

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet"
HOST = "gpu01\x1b]0;owned\x07\r\n# heading"
SUMMARY = "GPU 00000000:AB:00.0 fell off the bus [bold]really[/bold] :thumbs_up:\x00\x9b"


def _analysis() -> Analysis:
    f = Finding("xid", HOST, Status.FAIL, SUMMARY, ("gpu-fallen-off-bus",),
                (Evidence("kernel-log", "NVRM: Xid (PCI:0000:ab:00): 79\n\x1b[2Jcleared\tnext"),))
    d = Diagnosis("gpu-fallen-off-bus", (HOST,), "high", ("xid",), "reboot the node", "GPU fallen off the bus",
                  "Xid 79 at 00000000:AB:00.0")
    return Analysis({HOST: HostVerdict("fail", True, "hgx-h200", "t")}, [f], [d], [])


def test_printable_escapes_controls_and_keeps_the_rest():
    assert printable("a\x1b[31mb\x00\x07\r\n\t\x7f\x9b\u202e\u2028\udcff") == \
        "a\\x1b[31mb\\x00\\x07\\r\\n\\t\\x7f\\x9b\\u202e\\u2028\\udcff"
    assert printable("00000000:AB:00.0 é 日本 [b]") == "00000000:AB:00.0 é 日本 [b]"
    assert printable(None) == "-" and printable(7) == "7"
    assert printable_lines("one\x1b\ttwo\nthree\r") == "one\\x1b\ttwo\nthree\\r"


def test_the_terminal_summary_shows_names_and_summaries_as_typed():
    buf = io.StringIO()
    # A console as a user's would be (emoji on), without colour so every ESC would be the data's.
    console = Console(file=buf, width=400, color_system=None, emoji=True)
    terminal.show(_analysis(), console, "reports/x")
    out = buf.getvalue()
    for raw in ("\x1b", "\x07", "\r", "\x00", "\x9b", "🆎", "👍"):
        assert raw not in out, raw
    assert "00000000:AB:00.0" in out and "[bold]really[/bold]" in out and ":thumbs_up:" in out
    assert "gpu01\\x1b]0;owned\\x07\\r\\n# heading" in out and "Xid 79 at 00000000:AB:00.0" in out


def test_report_md_keeps_every_stored_text_on_its_line():
    text = markdown.render(_analysis())
    for raw in ("\x1b", "\x07", "\r", "\x00", "\x9b"):
        assert raw not in text, raw
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert not any(h.startswith("# heading") for h in headings)
    # Markdown's own escape of "]" first, then the control characters' (a lone backslash before
    # a letter is literal in CommonMark: \x1b renders as typed).
    assert "| gpu01\\x1b\\]0;owned\\x07\\r\\n# heading | FAIL |" in text
    assert "- **Hosts:** gpu01\\x1b\\]0;owned" in text
    assert "\\x1b[2Jcleared\tnext" in text  # the excerpt keeps its lines and tabs, not its escapes


def test_a_bracketed_note_of_the_shipped_example_is_not_swallowed_as_markup(tmp_path, capsys):
    """The example's gpu006 finding ends "... [driver: DOCA-OFED 25.07-0.9.7, read from modinfo]":
    rich read the bracket as a style tag and the terminal summary printed nothing of it."""
    code = cli.main(["analyze", str(EXAMPLE), "--out", str(tmp_path), "--no-html", "--no-db"])
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert code == 1 and "(DOCA-OFED 25.07-0.9.7) [driver: DOCA-OFED 25.07-0.9.7, read from modinfo];" in out
