"""A node install is the core package alone (issue 34): `healthcheck`, `prolog`, `run --local`
and the soak agent run without pandas, numpy and matplotlib, which are the ``analysis`` extra,
for a soak's analysis and plots on the controller. A command that needs them on a machine
without them exits 2 naming the extra, before it writes or starts anything.

The node-side commands run here as a node runs them: in a fresh interpreter, on the shipped
example's healthy node (examples/h200-fleet's gpu001, tests/nodes.py ``healthy_h200``), its tools
answered by the simulated cluster's command shims put first on PATH (simcluster.write_shims, no
namespace or root needed). tests/node_install/sitecustomize.py makes the three libraries
unimportable in those interpreters and logs every attempt to import them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from agent_runs import AGENT, heartbeat
from fake_nvml import FAKE_HOOK
from nodes import healthy_h200
from simcluster import write_shims

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = ROOT / "tests" / "node_install"
HEAVY = {"pandas", "numpy", "matplotlib"}


@pytest.fixture(scope="module")
def shims(tmp_path_factory) -> Path:
    return write_shims(healthy_h200("gpu001"), tmp_path_factory.mktemp("gpu001"))


def node_run(argv: list[str], tmp_path: Path, shims: Path | None = None, timeout: float = 60):
    """``argv`` in a fresh interpreter where the analysis libraries are not installed; returns
    the finished process and the modules it tried to import among them."""
    log = tmp_path / "blocked.log"
    env = dict(os.environ, PYTHONPATH=f"{BLOCKER}{os.pathsep}{ROOT}", PREFLIGHT_BLOCKED_LOG=str(log))
    if shims is not None:
        env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout)
    tried = set(log.read_text().split()) if log.exists() else set()
    return proc, tried


def test_the_blocker_blocks(tmp_path):
    proc, tried = node_run(["-c", "import pandas"], tmp_path)
    assert proc.returncode == 1 and "No module named 'pandas'" in proc.stderr
    assert tried == {"pandas"}


def test_core_dependencies_leave_the_analysis_libraries_to_an_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("[")[0].strip().lower() for d in project["dependencies"]}
    assert not names & HEAVY, names
    extras = project["optional-dependencies"]
    assert {d.split(">")[0] for d in extras["analysis"]} == HEAVY
    # `pip install -e '.[test]'` installs what the soak tests import.
    assert HEAVY <= {d.split(">")[0] for d in extras["test"]}


def test_healthcheck_runs_without_the_analysis_libraries(tmp_path, shims):
    out = tmp_path / "hc"
    proc, tried = node_run(["-m", "preflight", "healthcheck", "--no-drain", "--no-db", "--node", "gpu001",
                            "--out", str(out)], tmp_path, shims)
    assert proc.returncode == 0, proc.stderr
    assert tried == set()
    (run,) = out.iterdir()
    report = json.loads((run / "report.json").read_text())
    assert report["hosts"]["gpu001"]["status"] == "pass"
    assert "PASS" in proc.stdout and "Traceback" not in proc.stderr


def test_prolog_runs_without_the_analysis_libraries(tmp_path, shims):
    out = tmp_path / "prolog"
    proc, tried = node_run(["-m", "preflight", "prolog", "--no-db", "--node", "gpu001", "--out", str(out)],
                           tmp_path, shims)
    assert proc.returncode == 0, proc.stderr
    assert tried == set()
    (run,) = out.iterdir()
    assert json.loads((run / "report.json").read_text())["hosts"]["gpu001"]["status"] == "pass"


def test_run_local_runs_without_the_analysis_libraries(tmp_path, shims):
    proc, tried = node_run(["-m", "preflight", "run", "--local", "--quick", "--no-db", "--out", str(tmp_path / "r")],
                           tmp_path, shims)
    assert proc.returncode == 0, proc.stderr
    assert tried == set()
    (run,) = (tmp_path / "r").iterdir()
    report = json.loads((run / "report.json").read_text())
    assert [h["status"] for h in report["hosts"].values()] == ["pass"]
    assert (run / "report.html").is_file()


def test_the_soak_agent_runs_without_the_analysis_libraries(tmp_path):
    out = tmp_path / "soak"
    proc, tried = node_run([str(AGENT), "--out", str(out), "--engine", "none", "--seconds", "1", "--interval", "0.2",
                            "--fake-nvml", FAKE_HOOK], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert tried == set()
    assert heartbeat(out)["state"] == "finished"


def test_analyze_of_a_soak_without_the_extra_names_it(tmp_path):
    out = tmp_path / "reports"
    proc, _ = node_run(["-m", "preflight", "analyze", str(ROOT / "examples" / "h200-soak-5min"), "--no-db",
                        "--out", str(out)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("preflight: error: analyze of a soak directory needs pandas, numpy, matplotlib")
    assert "[analysis] extra (pip install 'preflight-gpu[analysis]')" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_a_soak_without_the_extra_is_refused_before_it_starts(tmp_path):
    out = tmp_path / "reports"
    proc, _ = node_run(["-m", "preflight", "soak", "-H", "gpu001", "--minutes", "1", "--no-db", "--out", str(out)],
                       tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "preflight soak needs pandas, numpy, matplotlib" in proc.stderr and "[analysis]" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_the_readme_first_command_needs_only_the_core(tmp_path):
    # README's set-up: `pip install . && preflight analyze examples/h200-fleet`, the report.html included.
    out = tmp_path / "reports"
    proc, tried = node_run(["-m", "preflight", "analyze", str(ROOT / "examples" / "h200-fleet"), "-q", "--no-db",
                            "--out", str(out)], tmp_path)
    assert proc.returncode == 1, proc.stderr  # the example's four faults
    assert tried == set()
    (run,) = out.iterdir()
    assert (run / "report.html").is_file()
