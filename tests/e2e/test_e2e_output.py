"""Output for people and for scripts (issue 34), over real SSH: a simulated fleet with one node
whose sshd is gone (connection refused) and one whose link is down (tests/netfaults.py), run as
an operator's script would run it, with stdout and stderr on pipes.

- ``--json``: report.json's bytes on stdout and nothing else; the summary and the progress go
  to stderr, as plain lines (stdout is no terminal), never a live table; the exit code is run's.
- ``-q``: one line, the verdicts counted and the report's path.
- An unreached node is one finding, its connectivity ERROR naming the checks it could not run,
  in every report (JSON, Markdown, HTML, JUnit) and in the summary ("2 errors").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from netfaults import link_down
from simcluster import SimCluster, SimHost
from test_e2e_run import SMI_CHECKS, gpu_node

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
HOST_CHECKS = ["gpu-inventory", "persistence-mode"]  # SMI_CHECKS' host checks, in the run's order


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("output")
    with SimCluster([gpu_node("gpu01"), gpu_node("gpu02"), SimHost("gpu03", down=True), gpu_node("gpu04")],
                    work) as cluster, link_down(cluster, "gpu04"):
        yield cluster, work


def preflight(*argv: str) -> subprocess.CompletedProcess:
    # No results store: the default one in $HOME is not this test's.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFLIGHT_DB": "", "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "preflight", *argv], capture_output=True, env=env, timeout=120)


def run(fleet, run_id: str, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    cluster, work = fleet
    out = work / "reports"
    proc = preflight("run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                     "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                     "--connect-timeout", "3", "--out", str(out), "--run-id", run_id, "--checks", SMI_CHECKS, *extra)
    return proc, out / run_id


@pytest.fixture(scope="module")
def json_run(fleet):
    return run(fleet, "json", "--json")


def test_json_on_stdout_is_report_json_and_nothing_else(json_run):
    proc, run_dir = json_run
    assert proc.returncode == 1, proc.stderr.decode()
    assert proc.stdout == (run_dir / "report.json").read_bytes()
    report = json.loads(proc.stdout)
    assert report["format"] == "preflight-report/1"
    assert {h: v["status"] for h, v in report["hosts"].items()} == {
        "gpu01": "pass", "gpu02": "pass", "gpu03": "error", "gpu04": "error"}


def test_progress_and_summary_go_to_stderr_as_plain_lines(json_run):
    proc, run_dir = json_run
    err = proc.stderr.decode()
    assert "\x1b" not in err  # no live table, no colour: stderr is a pipe
    lines = err.splitlines()
    assert lines[0] == "preflight run: 4 hosts, 2 probes each"
    judged = [line.split(" (")[0] for line in lines if line.startswith("preflight run: gpu")]
    assert sorted(judged) == ["preflight run: gpu01 PASS", "preflight run: gpu02 PASS",
                              "preflight run: gpu03 ERROR", "preflight run: gpu04 ERROR"]
    # The summary a person reads, last, with its plural.
    assert lines[-1] == f"2 pass, 2 errors — report in {run_dir}"


def test_an_unreached_node_is_one_finding_naming_the_checks_not_run(json_run):
    proc, run_dir = json_run
    report = json.loads(proc.stdout)
    for host, why in (("gpu03", "connection refused"), ("gpu04", "")):
        [down] = [f for f in report["findings"] if f["host"] == host]
        assert down["check"] == "connectivity" and down["status"] == "error", down
        assert why in down["summary"] and down["symptoms"] == ["host-unreachable"]
        assert down["data"] == {"not_checked": HOST_CHECKS}
    assert sum(f["status"] == "error" for f in report["findings"]) == 2
    assert {d["cause"]: d["hosts"] for d in report["diagnoses"]} == {"host-unreachable": ["gpu03", "gpu04"]}
    # The terminal's row says it once.
    row = next(line for line in proc.stderr.decode().splitlines() if line.startswith("│ gpu03"))
    assert "connectivity: not checked: connection refused" in row
    # junit.xml: one test case per unreached node, an error that names the checks not run.
    suite = ET.parse(run_dir / "junit.xml").getroot().find("testsuite[@name='gpu03']")
    assert (suite.get("tests"), suite.get("errors")) == ("1", "1")
    assert suite.find("testcase/error").text == "2 checks not run: gpu-inventory, persistence-mode"
    md = (run_dir / "report.md").read_text()
    assert md.count("### gpu03 ·") == 1 and "2 checks not run: gpu-inventory, persistence-mode" in md
    assert "**Hosts:** 2 errors, 2 pass" in md
    html = (run_dir / "report.html").read_text()
    assert html.count('<td class="nw">gpu-inventory</td>') == 2  # the two reached nodes' rows only


def test_quiet_prints_one_line(fleet):
    proc, run_dir = run(fleet, "quiet", "-q")
    assert proc.returncode == 1
    assert proc.stdout.decode().splitlines() == [f"2 pass, 2 errors — report in {run_dir}"]
    assert proc.stderr == b""


def test_analyze_and_diff_print_json_with_run_exit_codes(fleet, json_run):
    _, run_dir = json_run
    cluster, work = fleet
    proc = preflight("analyze", str(run_dir), "--out", str(work / "again"), "--json", "--no-html")
    assert proc.returncode == 1
    [again] = (work / "again").iterdir()
    assert proc.stdout == (again / "report.json").read_bytes()
    assert json.loads(proc.stdout)["source_run_id"] == "json"
    proc = preflight("diff", str(run_dir), str(again), "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    d = json.loads(proc.stdout)
    assert d["format"] == "preflight-diff/1" and d["worse"] is False and d["checks"] == []
    assert [h["direction"] for h in d["hosts"]] == ["same"] * 4
    # Bad input: the message on stderr, nothing on stdout, exit 2.
    proc = preflight("diff", str(run_dir), str(work / "nowhere"), "--json")
    assert (proc.returncode, proc.stdout) == (2, b"") and b"no such file" in proc.stderr
