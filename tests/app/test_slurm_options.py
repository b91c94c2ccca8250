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
    (["-H", "gpu01", "--gpus-per-node", "0"], "--gpus-per-node: only with --slurm"),
    (["-H", "gpu01", "--exclusive", "--allow-shared"], "--exclusive, --allow-shared: only with --slurm"),
])
def test_options_that_cannot_go_together(tmp_path, capsys, args, said):
    assert main(["run", "--quick", "--out", str(tmp_path / "r"), "-q", *args]) == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value, said", [("-1", "must be 0 to 1024: '-1'"), ("all", "not a whole number: 'all'")])
def test_a_gpu_count_that_is_not_one(tmp_path, capsys, value, said):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--slurm", "-w", "gpu01", "--gpus-per-node", value, "--out", str(tmp_path / "r")])
    assert exc.value.code == 2 and f"argument --gpus-per-node: {said}" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_without_the_slurm_commands_on_path(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["run", "--slurm", "-w", "gpu01", "--quick", "--out", str(tmp_path / "r"), "-q"]) == 2
    assert "scontrol: scontrol not found: is this a Slurm login node?" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "r").exists()
