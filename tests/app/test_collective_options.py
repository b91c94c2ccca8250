"""`run --nccl-multinode`'s collective options refused before anything runs: exit 2, a message
naming the option, nothing written (preflight/app/collective_options.py)."""

from __future__ import annotations

import pytest

from preflight.app.cli import main


def exit_code(argv: list[str]) -> int:
    """main's return, or the exit argparse makes for an option it cannot read."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize("args, said", [
    (["--mpirun-args", "--mca 'btl"], "--mpirun-args: No closing quotation"),
    (["--collective-slow-ratio", "2"], "argument --collective-slow-ratio: must be between 0 and 1 (exclusive): 2"),
    (["--collective-slow-ratio", "x"], "argument --collective-slow-ratio: not a number: 'x'"),
    (["--collective-bytes", "1Q"], "argument --collective-bytes: not a size: '1Q'"),
    (["--collective-tool", "torch"], "argument --collective-tool: invalid choice: 'torch'"),
])
def test_bad_collective_options(tmp_path, capsys, args, said):
    hosts = tmp_path / "hosts"
    hosts.write_text("gpu01\ngpu02\n")
    assert exit_code(["run", "--hosts", str(hosts), "--nccl-multinode", "--out", str(tmp_path / "r"), "-q", *args]) == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "r").exists()


def test_the_mpi_engine_is_not_offered_under_slurm(tmp_path, capsys):
    assert main(["run", "--slurm", "-w", "gpu[01-02]", "--nccl-multinode", "--collective-tool", "mpi",
                 "--out", str(tmp_path / "r"), "-q"]) == 2
    assert "--collective-tool mpi runs through mpirun over SSH: not with --slurm" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
