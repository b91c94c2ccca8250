"""The files the guide ships for a site to install (examples/systemd/*, examples/slurm/*): every
systemd unit reads as one (configparser, and `systemd-analyze verify` where it is installed), a
timer starts a unit that is shipped, and every command line in them is one the CLI accepts."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "examples" / "systemd"
SLURM = ROOT / "examples" / "slurm"
BINARY = "/opt/preflight/bin/preflight"  # where docs/nodes.md installs the venv
UNITS = sorted(p for p in SYSTEMD.glob("preflight-*") if p.suffix in (".service", ".timer"))


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string(path.read_text(), source=str(path))
    return parser


def accepted(argv: list[str], where: str) -> None:
    """The command line parses with preflight's own parser (argparse exits 2 on a bad option)."""
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"{where}: preflight refuses {shlex.join(argv)}") from exc


def test_the_lifecycle_units_are_shipped():
    names = {p.name for p in UNITS}
    assert {"preflight-lifecycle.service", "preflight-lifecycle-once.service",
            "preflight-lifecycle-once.timer"} <= names, names


@pytest.mark.parametrize("path", [p for p in UNITS if p.suffix == ".service"], ids=lambda p: p.name)
def test_a_service_runs_a_preflight_command_the_cli_accepts(path):
    argv = shlex.split(unit(path)["Service"]["ExecStart"])
    assert argv[0] == BINARY, argv[0]
    accepted(argv[1:], path.name)


@pytest.mark.parametrize("path", [p for p in UNITS if p.suffix == ".timer"], ids=lambda p: p.name)
def test_a_timer_starts_a_shipped_service(path):
    timer = unit(path)
    assert (SYSTEMD / timer["Timer"]["Unit"]).is_file(), timer["Timer"]["Unit"]
    assert timer["Install"]["WantedBy"] == "timers.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt-get install "
                                                                   "systemd)")
def test_systemd_reads_every_unit_without_a_complaint(tmp_path):
    """systemd's own reading. It checks that ExecStart's program exists, so the copies point at
    this interpreter instead of the venv docs/nodes.md installs; any warning fails (an unknown
    key is only a warning to systemd)."""
    for path in UNITS:
        (tmp_path / path.name).write_text(path.read_text().replace(BINARY, sys.executable))
    proc = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / p.name) for p in UNITS)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr.strip() == "" and proc.stdout.strip() == "", proc.stderr


@pytest.mark.parametrize("name", ["preflight-healthcheck", "preflight-prolog"])
def test_the_slurm_wrappers_run_a_command_the_cli_accepts(name):
    """The wrapper's last line (the e2e tests replace only that line and the store file's path)."""
    last = (SLURM / name).read_text().rstrip("\n").split("\n")[-1]
    argv = shlex.split(last)
    assert argv[:2] == ["exec", "preflight"], last
    accepted(argv[2:], name)
