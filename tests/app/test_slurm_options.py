"""`run --slurm`'s options refused before Slurm is asked anything, and a machine without the
Slurm commands: exit 2, nothing written (no cluster needed)."""

from __future__ import annotations

import pytest

from preflight.app.cli import main


@pytest.mark.parametrize("args, said", [
    (["-w", "gpu01"], "-w: only with --slurm"),
    (["--partition", "p", "-H", "gpu01"], "--partition: only with --slurm"),
    (["--slurm", "--local"], "--slurm and --local: choose one"),
    (["--slurm", "-w", "a", "-H", "b"], "-w and --hosts/-H both name the nodes: choose one"),
    (["--slurm", "-H", "root@gpu01"], "--slurm: nodes are Slurm node names, without user@ or :port (root@gpu01)"),
    # Under --slurm it runs as srun steps (tests/e2e/test_e2e_slurm_multinode.py), but not in a --quick run.
    (["--slurm", "-w", "gpu01", "--nccl-multinode"],
     "--nccl-multinode runs across --hosts and is an active test: not with --quick"),
])
def test_options_that_cannot_go_together(tmp_path, capsys, args, said):
    assert main(["run", "--quick", "--out", str(tmp_path / "r"), "-q", *args]) == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "r").exists()


def test_without_the_slurm_commands_on_path(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["run", "--slurm", "-w", "gpu01", "--quick", "--out", str(tmp_path / "r"), "-q"]) == 2
    assert "scontrol: scontrol not found: is this a Slurm login node?" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "r").exists()
