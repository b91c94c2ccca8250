"""Two quick Ctrl-C during a run (issue 34): the answer is one line naming the bundle that was
kept, exit 130, at once; never a traceback from a thread or from rich's live display, which the
second interrupt used to end in when it landed inside the first one's handling.

A real `preflight run --local` in a subprocess, on the example's healthy node whose nvidia-smi
-q -x hangs (tests/nodes.py's node, its tools as shims first on PATH), interrupted by two SIGINTs
as `timeout -s INT` sends them; once on a terminal (a pty: the live progress table is up) and once
piped."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from nodes import SMI_X, healthy_h200
from simcluster import Reply, write_shims

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hung_smi(tmp_path_factory) -> Path:
    node = healthy_h200("gpu001")
    node = replace(node, commands={**node.commands, SMI_X: Reply("", sleep_s=120)})
    return write_shims(node, tmp_path_factory.mktemp("hung"))


def _read_all(fd: int) -> str:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the pty closed with the process
            break
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")


@pytest.mark.parametrize("gap_s", [0.02, 0.3])
@pytest.mark.parametrize("terminal", [True, False], ids=["pty", "pipe"])
def test_two_interrupts_name_the_kept_bundle_and_no_traceback(tmp_path, hung_smi, terminal, gap_s):
    out = tmp_path / "reports"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{hung_smi}{os.pathsep}{os.environ['PATH']}", COLUMNS="100")
    argv = [sys.executable, "-m", "preflight", "run", "--local", "--quick", "--no-db", "--out", str(out)]
    if terminal:
        primary, secondary = pty.openpty()
        proc = subprocess.Popen(argv, stdin=secondary, stdout=secondary, stderr=secondary, env=env)
        os.close(secondary)
        # Read as it comes: the live table is redrawn twice a second, and a full pty would block it.
        reader = ThreadPoolExecutor(1).submit(_read_all, primary)
    else:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    deadline = time.monotonic() + 30
    # Interrupted while the hung probe runs: after the other probes' records are saved.
    while not any(out.glob("*/bundle/hosts/*/*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    time.sleep(gap_s)
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    said = reader.result(timeout=30) if terminal else proc.communicate(timeout=30)[0]
    proc.wait(timeout=30)
    if terminal:
        os.close(primary)
    assert time.monotonic() - t0 < 10  # not the hung probe's 120 s, nor its 30 s timeout
    assert proc.returncode == 130, said[-2000:]
    assert "Traceback" not in said and "Exception ignored" not in said, said[-3000:]
    (run,) = out.iterdir()
    assert f"preflight: interrupted; the evidence saved so far is kept in {run / 'bundle'}" in said
    assert (run / "bundle" / "bundle.json").is_file()
