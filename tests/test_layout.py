"""The repository's layout as shipped: a wheel carries checks/ and playbooks/ as real files, every
package folder is packaged, and the installed copy runs on its own (no checkout beside it)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / "preflight").rglob("__init__.py")}
    assert found | {"preflight.builtin_checks", "preflight.playbooks"} == listed


def test_no_file_outside_the_repository_is_cited():
    """The project explains itself: no comment or document points at notes kept elsewhere."""
    cited = []
    for path in ROOT.rglob("*"):
        skip = {".git", "fixtures", "build", ".pytest_cache", "__pycache__"}
        if not path.is_file() or skip & set(path.relative_to(ROOT).parts) or path.suffix not in (
                ".py", ".md", ".yaml", ".toml", ".sh", ".tsv", ".txt"):
            continue
        if path == Path(__file__):
            continue
        text = path.read_text(errors="replace")
        for needle in ("FACTS.md", "DESIGN.md", "ARCHITECTURE.md", "../shared"):
            if needle in text:
                cited.append(f"{path.relative_to(ROOT)}: {needle}")
    assert not cited


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The project built into a wheel and unpacked as pip would install it."""
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the checkout's files: setuptools builds in the source tree.
    source = out / "source"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(source)], check=True, capture_output=True, cwd=out)
    [wheel] = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            assert not stat.S_ISLNK(info.external_attr >> 16), f"{info.filename} is a symlink in the wheel"
        names = set(z.namelist())
        z.extractall(out / "site")
    for wanted in ("preflight/builtin_checks/nvlink.py", "preflight/playbooks/causes.yaml",
                   "preflight/playbooks/profiles/hgx-h200.yaml", "preflight/node/models/tiny-llama-ci.json",
                   "preflight/collect/scripts/nccl_all_reduce.sh", "preflight/node/torch_allreduce.py"):
        assert wanted in names
    return out / "site"


def run_installed(site: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "preflight", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_installed_wheel_loads_its_own_checks_and_playbooks(installed, tmp_path):
    done = run_installed(installed, tmp_path, "checks")
    assert done.returncode == 0, done.stderr
    assert "nvlink\thost\t" in done.stdout and "gpu-inventory\thost\t" in done.stdout
    probe = subprocess.run([sys.executable, "-c", "import preflight.shipped as s; print(s.checks_dir()); "
                            "print(s.playbooks_dir())"], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(installed)})
    assert probe.stdout.split() == [f"{installed}/preflight/builtin_checks", f"{installed}/preflight/playbooks"]


def test_the_installed_wheel_analyses_the_example_to_the_same_verdicts(installed, tmp_path):
    done = run_installed(installed, tmp_path, "analyze", str(ROOT / "examples" / "h200-fleet"),
                         "--out", str(tmp_path / "out"), "-q", "--no-html")
    assert done.returncode == 1, done.stderr
    [report] = (tmp_path / "out").glob("*/report.json")
    got = json.loads(report.read_text())
    want = json.loads((ROOT / "tests" / "golden" / "examples" / "h200-fleet.json").read_text())
    assert got["diagnoses"] == want["diagnoses"] and got["hosts"] == want["hosts"]


def test_every_source_file_the_docs_name_exists():
    """docs/, README.md and the playbooks point readers at files; each such path must be there."""
    import re

    named = re.compile(r"(?<![\w/.-])((?:preflight|checks|tests|bench|playbooks|examples)/[\w/.-]+\.(?:py|sh|yaml|json|md))")
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "playbooks").rglob("*.yaml"))]:
        for path in set(named.findall(doc.read_text())):
            if "*" not in path and "<" not in path and not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, missing
