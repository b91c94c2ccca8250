"""The multi-node all_reduce as srun steps (preflight/collect/multinode_slurm.py), without a
cluster: the step's command line, the saved output and how it reads back. Outputs are the
derivations of tests/derived.py (mpirun_all_reduce: the real H200 run's header and the real
A3 Ultra table) without mpirun's tags, as a task under srun prints them; srun's own lines are
the real captures of tests/fixtures/slurm. The run on the real Slurm cluster is
tests/e2e/test_e2e_slurm_multinode.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from derived import mpirun_all_reduce

from preflight.collect import multinode_slurm
from preflight.collect.multinode import PROBE_FULL, PROBE_INTER, MultinodeOptions
from preflight.collect.node import CommandResult
from preflight.evidence.bundle import FLEET_HOST

FIX = Path(__file__).parents[1] / "fixtures" / "slurm"


def untagged(text: str) -> str:
    return re.sub(r"^\[1,\d+\]<std(?:out|err)>:", "", text, flags=re.MULTILINE)


def test_the_step_is_one_task_per_gpu_with_the_split_and_the_limit_on_the_nodes():
    opts = MultinodeOptions(max_bytes=8 << 30, timeout_s=300, tests_dir="/opt/nccl-tests/build/")
    argv = multinode_slurm.step_argv(7, ["gpu02", "gpu01"], 8, opts, "DIV 8")
    assert argv == ["srun", "--jobid=7", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8", "--nodelist=gpu[01-02]",
                    "--kill-on-bad-exit=1", "env", "NCCL_DEBUG=WARN", "NCCL_TESTS_SPLIT=DIV 8", "timeout", "-k", "10",
                    "300", "/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", str(8 << 30), "-f", "2", "-g", "1",
                    "-c", "1"]
    assert "NCCL_TESTS_SPLIT=" not in " ".join(multinode_slurm.step_argv(7, ["gpu01", "gpu02"], 8, opts))


def test_ranks_follow_slurms_sorted_node_list():
    assert multinode_slurm.rank_order(["gpu10", "gpu09", "gpu02"]) == ["gpu02", "gpu09", "gpu10"]


def run_one(monkeypatch, result: CommandResult, members=("gpu02", "gpu01"), probe=PROBE_FULL):
    monkeypatch.setattr(multinode_slurm, "slurm", lambda argv, timeout: result)
    saved = []
    one = multinode_slurm.one_step(7, 8, MultinodeOptions(timeout_s=5), saved.append, FLEET_HOST)
    run = one(probe, list(members))
    return run, saved[0]


def result(stdout: bytes | None, stderr: str = "", exit_code: int | None = 0, timed_out: bool = False) -> CommandResult:
    return CommandResult(("srun",), stdout, stderr, exit_code, "2026-12-01T00:00:00+00:00", 41.7, timed_out)


def test_a_passing_step_reads_back_as_the_mpirun_stage_does(monkeypatch):
    run, saved = run_one(monkeypatch, result(untagged(mpirun_all_reduce(["gpu01", "gpu02"])).encode()))
    assert run.state == "passed" and run.ok and run.hosts == ("gpu01", "gpu02") and run.slots == 8
    text = saved.text
    assert text.startswith("# preflight: tool=srun gpus=8 repetitions=1\n# preflight: expect busbw=none ratio=0.5\n"
                           "# preflight: host gpu01 slots=8\n")
    assert text.endswith("# preflight: repetition 1 exit=0 seconds=41\n")
    assert saved.host == FLEET_HOST and saved.command[0] == "srun" and saved.exit_code == 0


def test_a_rank_that_failed_is_a_failed_run_with_sruns_words(monkeypatch):
    said = (FIX / "srun-task-exit-code.stderr").read_text()  # real: "srun: error: n1: task 0: Exited with exit code 3"
    run, saved = run_one(monkeypatch, result(untagged(mpirun_all_reduce(["gpu01", "gpu02"], rows=2)).encode(), said, 3),
                         probe=PROBE_INTER)
    assert run.state == "failed" and not run.ok
    assert said.strip() in saved.text and "# preflight: repetition 1 exit=3" in saved.text


def test_a_step_the_controller_had_to_stop_is_a_hang(monkeypatch):
    run, saved = run_one(monkeypatch, result(b"", "", None, timed_out=True))
    assert run.state == "hung"
    assert "# preflight: repetition" not in saved.text


def test_all_reduce_perf_missing_on_the_nodes_is_not_run(monkeypatch):
    # timeout(1) exits 127 when it cannot run the program; srun passes the highest exit on.
    run, saved = run_one(monkeypatch, result(b"", "timeout: failed to run command 'all_reduce_perf': No such file "
                                                  "or directory\n", 127))
    assert run.state == "not-run" and saved.tool_missing


def test_a_rank_whose_limit_fired_is_a_hang_though_srun_returns_its_peers_143(monkeypatch):
    said = (FIX / "srun-timeout-kill-on-bad-exit.stderr").read_text()  # real; srun exited 143
    run, saved = run_one(monkeypatch, result(b"", said, 143))
    assert run.state == "hung" and "# preflight: repetition 1 exit=124" in saved.text


def test_the_mpi_engines_step_is_one_task_per_node_wired_by_pmix_with_the_mca_settings_in_its_environment():
    opts = MultinodeOptions(timeout_s=20, tool="mpi", mpi_bytes=1 << 20,
                            mpirun_args=("--mca", "btl_tcp_if_include", "eth0", "-mca", "btl", "tcp,self"))
    argv = multinode_slurm.step_argv(7, ["n2", "n1", "n3"], 1, opts)
    assert argv[:12] == ["srun", "--jobid=7", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--nodelist=n[1-3]",
                         "--kill-on-bad-exit=1", "--mpi=pmix", "env", "OMPI_MCA_btl_tcp_if_include=eth0",
                         "OMPI_MCA_btl=tcp,self", "timeout"]
    assert argv[12:15] == ["-k", "10", "20"] and argv[15:17] == ["python3", "-c"]
    assert argv[-2:] == ["--bytes", str(1 << 20)] and "# preflight mpi all_reduce" in argv[17]


@pytest.mark.parametrize("args, said", [
    (("--allow-run-as-root",), "'--allow-run-as-root' is an mpirun option: under --slurm srun starts the ranks"),
    (("--mca", "btl"), "--mca needs a parameter name and a value"),
    (("--mca", "a=b", "c"), "--mca 'a=b': not an MCA parameter name"),
])
def test_mpirun_options_that_srun_cannot_take_are_refused_by_name(args, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        multinode_slurm.mca_env(args)


def test_an_mpi_step_reads_back_as_the_cpu_engines_run(monkeypatch):
    # srun's real stdout of the four ranks (the Slurm test cluster, srun --mpi=pmix), untagged.
    out = (FIX / "srun-pmix-mpi-allreduce-4-nodes.stdout").read_bytes()
    monkeypatch.setattr(multinode_slurm, "slurm", lambda argv, timeout: result(out))
    saved = []
    one = multinode_slurm.one_step(7, 1, MultinodeOptions(timeout_s=5, tool="mpi"), saved.append, FLEET_HOST)
    run = one(PROBE_FULL, ["mp3", "mp1", "mp4", "mp2"])
    assert run.state == "passed" and run.tool == "mpi4py" and run.busbw_gbs == 0.0885
    assert run.hosts == ("mp1", "mp2", "mp3", "mp4") and run.mpi.done == {0: "mp1", 1: "mp2", 2: "mp3", 3: "mp4"}
    assert saved[0].text.startswith("# preflight: tool=mpi4py gpus=1 repetitions=1\n")


def test_an_mpi_plugin_srun_cannot_load_is_not_run_and_blames_no_node(monkeypatch):
    said = (FIX / "srun-mpi-pmix-library-missing.stderr").read_text()  # real, srun exited 1
    monkeypatch.setattr(multinode_slurm, "slurm", lambda argv, timeout: result(b"", said, 1))
    saved = []
    one = multinode_slurm.one_step(7, 1, MultinodeOptions(timeout_s=5, tool="mpi"), saved.append, FLEET_HOST)
    run = one(PROBE_FULL, ["mp1", "mp2"])
    assert run.state == "not-run"
    assert run.why == ("srun cannot start MPI tasks: MPI: Cannot create context for mpi/pmix "
                       "(pmi/pmix: can not load PMIx library)")


def test_the_fleet_run_repeats_as_steps_and_a_step_that_hung_once_is_flaky(monkeypatch):
    # --collective-reps 2: one step per repetition, each closed by its own marker; the second's
    # rank hit its limit (srun's real stderr of that case, exit 143).
    said = (FIX / "srun-timeout-kill-on-bad-exit.stderr").read_text()
    steps = iter([result(untagged(mpirun_all_reduce(["gpu01", "gpu02"])).encode()), result(b"", said, 143)])
    calls = []
    monkeypatch.setattr(multinode_slurm, "slurm", lambda argv, timeout: calls.append(argv) or next(steps))
    saved = []
    one = multinode_slurm.one_step(7, 8, MultinodeOptions(timeout_s=5, reps=2), saved.append, FLEET_HOST)
    run = one(PROBE_FULL, ["gpu01", "gpu02"])
    assert len(calls) == 2 and run.repetitions == ("passed", "hung") and run.flaky
    text = saved[0].text
    assert text.startswith("# preflight: tool=srun gpus=8 repetitions=2\n")
    assert "# preflight: repetition 1 exit=0 seconds=41\n" in text and text.endswith(
        "# preflight: repetition 2 exit=124 seconds=41\n")
    assert saved[0].duration_s == 41.7 * 2
    # The bisection's runs run once.
    steps = iter([result(untagged(mpirun_all_reduce(["gpu01", "gpu02"])).encode())])
    calls.clear()
    one("nccl-pair-gpu01-gpu02", ["gpu01", "gpu02"])
    assert len(calls) == 1
