"""`preflight prolog` on the command line (issue 34): it takes -q as the healthcheck does, and
without -q it says what it judged and, on a node where its checks could judge nothing (no GPU),
what it did not judge and why the exit status is still 0, where it used to print nothing."""

from __future__ import annotations

import os
import shutil

import pytest
from nodes import healthy_h200
from simcluster import write_shims

from preflight.app.cli import main


def prolog(capsys, tmp_path, *extra: str) -> tuple[int, str]:
    code = main(["prolog", "--no-db", "--out", str(tmp_path / "prolog"), *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi: not a GPU-less node")
def test_on_a_node_without_a_gpu_it_says_what_it_did_not_judge(capsys, tmp_path):
    code, out = prolog(capsys, tmp_path, "--node", "cpu01")
    assert code == 0
    last = " ".join(out.split()).rsplit("prolog: ", 1)[1]
    assert last.startswith("exit 0: nothing failed (could not tell is never a FAIL: the healthcheck looks again); "
                           "not judged: gpu-inventory, gpu-memory, gpu-reset")
    assert "nvidia-smi is not installed" in out


def test_quiet_is_accepted_and_prints_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{write_shims(healthy_h200('gpu001'), tmp_path / 'node')}{os.pathsep}"
                               f"{os.environ['PATH']}")
    code, out = prolog(capsys, tmp_path, "--node", "gpu001", "-q")
    # -q as everywhere: the verdicts counted and the report's path, on one line (issue 34)
    assert code == 0 and len(out.strip().splitlines()) == 1 and "report in" in out and "fail" not in out, out
    code, out = prolog(capsys, tmp_path, "--node", "gpu001")
    assert code == 0 and "PASS" in out and out.rstrip().endswith("prolog: exit 0: nothing failed")
