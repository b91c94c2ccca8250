"""No console of the project colours digits, paths or ids on its own (issue 34): a driver
version ``570.195.03`` printed half cyan, run ids and report paths in three colours. Every
Console is made by preflight/report/consoles.py, whose consoles leave rich's automatic
highlighting off; only the project's own markup (a verdict's colour) styles the output."""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

from preflight.app.progress import RunProgress, render
from preflight.report import consoles

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _terminal() -> tuple:
    out = io.StringIO()
    return consoles.make(file=out, force_terminal=True, width=200, color_system="truecolor"), out


def test_plain_text_keeps_its_versions_paths_and_run_ids_whole_on_a_colour_terminal():
    console, out = _terminal()
    line = ("gpu008: driver 570.195.03 — report in /srv/reports/20261203-123502-ctl-4f9a76df420666db "
            "(uuid GPU-5d1e5a8c-0d0b-4c1e-9f3e-2a1b3c4d5e6f, 0x80)")
    console.print(line)
    assert out.getvalue() == line + "\n"  # not one escape sequence


def test_the_live_view_colours_only_what_its_markup_says():
    console, out = _terminal()
    p = RunProgress(["gpu01", "gpu02"], probes_per_host=15, clock=lambda: 12.0)
    p.judged("gpu02", "fail")
    console.print(render(p.snapshot(), 15))
    text = out.getvalue()
    # The failing count is red by the view's own markup; the title's figures are not coloured.
    assert "\x1b[31m1\x1b[0m" in text
    title = next(line for line in text.splitlines() if "preflight run" in line)
    assert "preflight run: 0 of 2 hosts done, 0 s" in ANSI.sub("", title)
    assert "0 of 2 hosts done, 0 s" in title, repr(title)


def test_every_console_of_the_package_is_made_by_consoles_py():
    made = []
    for path in sorted((ROOT / "preflight").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Console":
                made.append(str(path.relative_to(ROOT)))
    assert made == ["preflight/report/consoles.py"], made
