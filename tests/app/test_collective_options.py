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


@pytest.mark.parametrize("args, said", [
    (["--mpirun-args", "--allow-run-as-root --mca btl tcp,self"],
     "--mpirun-args: '--allow-run-as-root' is an mpirun option: under --slurm srun starts the ranks, and only "
     "--mca NAME VALUE pairs apply"),
    (["--mpirun-args", "--mca btl"], "--mpirun-args: --mca needs a parameter name and a value"),
    (["--nccl-node-dir", "/tmp/x"], "--nccl-node-dir: the hostfiles of mpirun over SSH: not with --slurm"),
])
def test_mpirun_options_under_slurm_are_refused(tmp_path, capsys, args, said):
    # Under --slurm srun starts the ranks (the mpi engine wired by PMIx): mpirun's own options
    # have nothing to reach; the engine itself is offered.
    assert main(["run", "--slurm", "-w", "gpu[01-02]", "--nccl-multinode", "--collective-tool", "mpi",
                 "--out", str(tmp_path / "r"), "-q", *args]) == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "r").exists()


def test_fabric_collective_under_slurm_refuses_mpirun_options_too(tmp_path, capsys):
    assert main(["fabric", "--slurm", "-w", "gpu[01-02]", "--pair-tool", "iperf3", "--collective",
                 "--collective-tool", "mpi", "--mpirun-args", "-np 4", "--out", str(tmp_path / "r"), "-q"]) == 2
    assert "--mpirun-args: '-np' is an mpirun option" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
