"""report.html on a fixed bundle, the golden files of every report format, and the page in a
real headless browser.

The fixed bundle (``golden_analysis``) is eight H200 nodes whose nvidia-smi XML is derived from
the real 1-GPU capture (tests/derived.py): three healthy, one showing 7 of 8 GPUs, one on
another driver, one with persistence off on GPU 3, one without nvidia-smi (exit 127) and one
that refused SSH; judged by the four checks whose wording is settled (the golden files should
change when a report format changes, not when a new check lands), with a fixed soak section.

Golden files: tests/golden/report.md, junit.xml and report.html.body (the page between <body>
and </body>; the CSS in <head> may change freely). After an intended change of a format,
regenerate them with

    PREFLIGHT_REGEN_GOLDEN=1 python -m pytest -q tests/report/test_report_html.py

and review the diff like code.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import soak_scenarios
from derived import h200_node_xml, with_gpu_values
from test_cli import write_bundle

from preflight.app.cli import main
from preflight.diagnose.analysis import analyze
from preflight.diagnose.engine import load_knowledge
from preflight.evidence.bundle import read_bundle
from preflight.judge.loader import load_checks, select
from preflight.knowledge.profiles import load_profiles
from preflight.model import Analysis, Evidence, Finding, Status
from preflight.report import html, junit, markdown

GOLDEN = Path(__file__).parents[1] / "golden"
REGENERATE = os.environ.get("PREFLIGHT_REGEN_GOLDEN") == "1"
GOLDEN_CHECKS = ["gpu-inventory", "persistence-mode", "fleet-consistency", "vbios-consistency"]
SOAK_SECTION = {"gpu01": {"engine": "burn", "duration_s": 3600.0, "max_temperature_c": 66.0,
                          "min_sm_clock_mhz": 1440.0, "throttle_reasons_seen": ["sw_power_cap"],
                          "throughput_baseline": 674.2, "throughput_final": 671.9, "throughput_decay": 0.0034}}


def golden_hosts() -> dict[str, dict[str, object]]:
    return {
        "gpu01": {"nvidia-smi-q-x": h200_node_xml(8)},
        "gpu02": {"nvidia-smi-q-x": h200_node_xml(8)},
        "gpu03": {"nvidia-smi-q-x": h200_node_xml(8)},
        "gpu04": {"nvidia-smi-q-x": h200_node_xml(7)},
        "gpu05": {"nvidia-smi-q-x": h200_node_xml(8, driver="570.195.03")},
        "gpu06": {"nvidia-smi-q-x": with_gpu_values(h200_node_xml(8), 3, {"persistence_mode": "Disabled"})},
        "gpu07": {"nvidia-smi-q-x": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": 127,
                                     "stderr": "sh: 1: nvidia-smi: not found"}},
        "gpu08": {"nvidia-smi-q-x": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": None,
                                     "error": "connection refused: [Errno 111] Unable to connect to port 22"}},
    }


def golden_analysis(tmp_path: Path, hosts: dict | None = None, run_id: str = "golden") -> Analysis:
    """The fixed bundle (or `hosts` in its place) written under `tmp_path` and analysed."""
    root = write_bundle(tmp_path / f"bundle-{run_id}", hosts or golden_hosts())
    bundle = read_bundle(root)
    checks = select(load_checks(use_entry_points=False), GOLDEN_CHECKS)
    analysis = analyze(bundle, checks, load_profiles(), load_knowledge())
    analysis.meta.update({"run_id": run_id, "created": bundle.created, "preflight_version": "golden",
                          "bundle": "bundle", "soak": SOAK_SECTION})
    return analysis


def fresh(analysis: Analysis) -> Analysis:
    """A copy whose meta a test may change without touching the module's shared analysis."""
    return Analysis(analysis.hosts, analysis.findings, analysis.diagnoses, analysis.checks, dict(analysis.meta))


class Page(HTMLParser):
    """The page's ids, in-page links, tags and text."""

    def __init__(self, text: str):
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []
        self.tags: list[str] = []
        self.imgs: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "a" and a.get("href", "").startswith("#"):
            self.links.append(a["href"][1:])
        if tag == "img":
            self.imgs.append(a["src"])

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Analysis:
    return golden_analysis(tmp_path_factory.mktemp("golden"))


@pytest.fixture(scope="module")
def report(golden):
    return golden, html.render(golden)


@pytest.fixture(scope="module")
def plot_files(tmp_path_factory) -> dict[str, Path]:
    """A real soak plot: preflight.soak.plots on telemetry derived from the real H200 burn."""
    plots = pytest.importorskip("preflight.soak.plots", reason="matplotlib not installed (the plots extra)")
    run = tmp_path_factory.mktemp("run")
    return plots.plot_soak(soak_scenarios.steady(minutes=5, gpus=2, hosts=("gpu01",)), run / "plots", max_points=150)


def body(page: str) -> str:
    return page[page.index("<body>"): page.index("</body>") + len("</body>")] + "\n"


def test_every_in_page_link_has_its_target_and_ids_are_unique(report):
    _, page = report
    p = Page(page)
    assert len(p.ids) == len(set(p.ids))
    assert set(p.links) <= set(p.ids), set(p.links) - set(p.ids)
    assert {"summary", "diagnoses", "fleet", "hosts", "soak", "findings"} <= set(p.ids)


def test_each_finding_links_to_its_evidence_excerpt_and_back(report):
    analysis, page = report
    for i, f in enumerate(analysis.findings):
        for k, e in enumerate(f.evidence):
            anchor = f'<div class="evidence" id="ev-f-{i}-{k}"><a href="#f-{i}">'
            assert f'<a href="#ev-f-{i}-{k}">{e.probe}</a>' in page
            assert anchor in page
            excerpt = page[page.index(anchor):]
            assert html.escape(e.excerpt) in excerpt[: excerpt.index("</pre>")]
    missing = next(i for i, f in enumerate(analysis.findings) if f.host == "gpu04" and f.check == "gpu-inventory")
    assert f'<tr id="f-{missing}"><td class="nw">gpu-inventory</td><td><span class="badge b-fail">fail</span>' in page
    # The real XML's attached_gpus line is the excerpt: 7 on the derived 7-GPU node.
    assert "&lt;attached_gpus&gt;7&lt;/attached_gpus&gt;" in page


def test_summary_diagnoses_fleet_and_hosts(report):
    _, page = report
    text = re.sub(r"\s+", " ", "".join(Page(page).text))
    assert "Some hosts need attention. 8 hosts, 4 checks; findings: 2 fail, 3 errors, 1 warn, 35 pass." in text
    assert '<div class="tile fail"><div class="n">2</div>fail</div>' in page
    # Diagnoses: cause, confidence, hosts linked, next action.
    assert '<td><b>Fewer GPUs than the platform has</b><br><code>gpu-missing</code></td>' in page
    assert '<a href="#host-gpu04">gpu04</a>' in page
    assert "move gpu05 to driver 580.159.04 (it runs 570.195.03), then reboot and re-run preflight" in text
    # Fleet groupings from the findings' data: the majority counted, the odd host named.
    assert ('<tr class="odd"><td>driver_version (gpu-inventory)</td><td>5 hosts on 580.159.04; '
            '1 on 570.195.03: <a href="#host-gpu05">gpu05</a>; '
            'not reported by 2: <a href="#host-gpu07">gpu07</a>, <a href="#host-gpu08">gpu08</a></td></tr>') in page
    assert "<td>gpu_models (gpu-inventory)</td><td>6 hosts on NVIDIA H200; not reported by 2" in page
    # Hosts table: worst first; an unreachable host says so.
    hosts = page[page.index('<section id="hosts">'):page.index("</section>", page.index('<section id="hosts">'))]
    order = re.findall(r'<a href="#host-(gpu\d+)">', hosts)
    assert order == ["gpu04", "gpu05", "gpu07", "gpu08", "gpu06", "gpu01", "gpu02", "gpu03"]
    assert '<a href="#host-gpu08">gpu08</a> <span class="muted">(unreachable)</span>' in hosts


def test_passing_hosts_are_folded_and_faulty_ones_open(report):
    _, page = report
    assert '<details id="host-gpu01"><summary>gpu01 <span class="badge b-pass">pass</span>' in page
    assert '<div id="host-gpu04"><h3>gpu04 <span class="badge b-fail">fail</span>' in page


def test_soak_section_renders_the_contract_fields(report):
    _, page = report
    assert "<td>burn</td><td>3600.0</td><td>66.0</td><td>1440.0</td><td>sw_power_cap</td>" in page
    assert "<td>0.3%</td>" in page


def test_self_contained_no_scripts_no_external_fetches(report):
    _, page = report
    p = Page(page)
    assert "script" not in p.tags and "link" not in p.tags and "iframe" not in p.tags
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert "default-src 'none'; img-src data:; style-src 'unsafe-inline'" in page


def test_evidence_text_is_escaped():
    hostile = Finding("probe-x", "gpu<1>", Status.FAIL, '<script>alert("x")</script>', ("gpu-missing",),
                      (Evidence("kernel-log", "</pre><img src=http://evil/x>"),))
    from preflight.model import HostVerdict

    analysis = Analysis({"gpu<1>": HostVerdict("fail", True, "generic", "test")}, [hostile], [], [])
    page = html.render(analysis)
    assert "<script>" not in page and "<img src=http" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert '<a href="#host-gpu_1_">gpu&lt;1&gt;</a>' in page


def test_a_diagnosis_of_many_hosts_names_the_first_and_counts_the_rest():
    from preflight.model import Diagnosis, HostVerdict

    hosts = tuple(f"gpu{i:03d}" for i in range(1, 41))
    analysis = Analysis({h: HostVerdict("fail", True, "hgx-h200", "t") for h in hosts}, [],
                        [Diagnosis("nccl-fleet-config", hosts, "medium", ("nccl-low-bandwidth",), "check NCCL_*")], [])
    page = html.render(analysis)
    assert '<a href="#host-gpu024">gpu024</a> and <a href="#hosts">16 more</a></td>' in page
    assert '<a href="#host-gpu025">gpu025</a></td>' not in page.split('<section id="hosts">')[0]


def test_soak_plots_are_embedded_as_base64_png(plot_files):
    [png] = [p.read_bytes() for p in plot_files.values()]
    from preflight.model import HostVerdict

    analysis = Analysis({"gpu001": HostVerdict("pass", True, "hgx-h200", "test")}, [], [], [])
    p = Page(html.render(analysis, {"gpu001": png}))
    [src] = p.imgs
    assert src.startswith("data:image/png;base64,")
    assert base64.b64decode(src.split(",", 1)[1]) == png and png.startswith(b"\x89PNG")


def test_write_reports_embeds_the_plots_named_in_meta(golden, plot_files, tmp_path):
    from preflight.report.files import write_reports

    [plot] = plot_files.values()
    run = plot.parent.parent
    analysis = fresh(golden)
    analysis.meta["soak_plots"] = {h: str(p.relative_to(run)) for h, p in plot_files.items()}
    analysis.meta["soak_plots"]["gpu09"] = "plots/gone.png"  # missing file: left out, not fatal
    write_reports(run, analysis)
    page = (run / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 1
    assert '"soak_plots"' in (run / "report.json").read_text()
    write_reports(tmp_path / "nohtml", analysis, html=False)
    assert not (tmp_path / "nohtml" / "report.html").exists()


def test_cli_writes_report_html_unless_told_not_to(tmp_path):
    bundle = write_bundle(tmp_path / "b", {"a": {"nvidia-smi-q-x": h200_node_xml(8)}})
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "on"), "-q"]) == 0
    [page] = (tmp_path / "on").glob("*/report.html")
    assert "<h2>Summary</h2><p><b>Every host passed.</b>" in page.read_text()
    assert main(["analyze", str(bundle), "--out", str(tmp_path / "off"), "-q", "--no-html"]) == 0
    assert not list((tmp_path / "off").glob("*/report.html"))


# ---- golden files --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, render", [
    ("report.md", markdown.render),
    ("junit.xml", junit.render),
    ("report.html.body", lambda a: body(html.render(a))),
])
def test_golden(golden, name, render):
    text = render(golden)
    path = GOLDEN / name
    if REGENERATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path} missing: regenerate with PREFLIGHT_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from {path}; if intended, regenerate (module docstring)"


def test_golden_analysis_is_what_the_golden_files_describe(golden):
    """The fixed bundle keeps meaning what it should, so a golden diff is a format change."""
    analysis = golden
    assert {h: v.status for h, v in analysis.hosts.items()} == {
        "gpu01": "pass", "gpu02": "pass", "gpu03": "pass", "gpu04": "fail", "gpu05": "fail",
        "gpu06": "warn", "gpu07": "error", "gpu08": "error"}
    assert {d.cause: d.hosts for d in analysis.diagnoses} == {
        "gpu-missing": ("gpu04",), "driver-version-drift": ("gpu05",), "persistence-mode-off": ("gpu06",),
        "tool-missing": ("gpu07",), "host-unreachable": ("gpu08",)}


# ---- a real browser ------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--enable-logging=stderr", "--v=0"]


def chromium(url: str, profile: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def console_lines(stderr: str) -> list[str]:
    # Chromium logs each console message (and CSP refusals, uncaught errors) as ...:CONSOLE...
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(golden, plot_files, tmp_path):
    """The page with a real soak plot, opened in Debian's chromium: a screenshot that is not
    blank and shows the status colours, a DOM with the tables and the plot, no console output.
    A control page that logs an error proves the console check can see one."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow not installed (comes with matplotlib)")

    page = tmp_path / "report.html"
    page.write_text(html.render(golden, {h: p.read_bytes() for h, p in plot_files.items()}))
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><body><p>x</p><script>console.error("control-error")</script></body></html>')
    shot = tmp_path / "shot.png"
    # One browser takes the screenshot and dumps the DOM; the control runs beside it.
    procs = [chromium(page.as_uri(), tmp_path / "p1", f"--screenshot={shot}", "--window-size=1280,1600", "--dump-dom"),
             chromium(control.as_uri(), tmp_path / "p2", "--dump-dom")]
    (dom, err), (_, control_err) = (p.communicate(timeout=60) for p in procs)

    assert any("control-error" in line for line in console_lines(control_err))
    assert console_lines(err) == []

    dumped = Page(dom)
    assert dumped.tags.count("table") >= 5 and dumped.tags.count("tr") > 40
    assert "figure" in dumped.tags and dumped.imgs[0].startswith("data:image/png;base64,")
    assert {"summary", "diagnoses", "fleet", "hosts", "soak", "findings", "host-gpu04"} <= set(dumped.ids)

    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1600)
    colours = image.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # text, borders, badges: far from a blank page
    present = {c for _, c in colours}

    def near(rgb):
        return any(sum(abs(a - b) for a, b in zip(rgb, c, strict=True)) < 12 for c in present)

    assert near((0xb3, 0x26, 0x1e)) and near((0x1e, 0x7b, 0x34))  # the fail and pass badges
    image.save(tmp_path / "shot-checked.png")
    if os.environ.get("PREFLIGHT_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["PREFLIGHT_KEEP_SCREENSHOT"])
