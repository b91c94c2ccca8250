"""Slurm's own outputs read into records (preflight/parse/slurm.py), on real captures from the
test cluster (tests/fixtures/slurm/MANIFEST.tsv says which command printed each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.parse.slurm import (
    first_error,
    gpus_of,
    granted_job,
    is_input_error,
    parse_show_node,
    parse_step_stderr,
    task_exit_codes,
)

FIX = Path(__file__).parents[1] / "fixtures" / "slurm"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_an_idle_node_is_usable_and_a_drained_one_says_why_not_with_the_reason():
    idle = parse_show_node(read("scontrol-show-node-not-found.txt"))[0]["n1"]
    assert (idle.name, idle.state, idle.base, idle.flags, idle.unusable, idle.partitions) == (
        "n1", "IDLE", "IDLE", (), None, ("gpu",))
    drained = parse_show_node(read("scontrol-show-node-drained.txt"))[0]["n2"]
    assert drained.state == "IDLE+DRAIN" and drained.unusable == "drained"
    # The reason is free text with spaces and a colon; scontrol appends who set it and when.
    assert drained.reason == "someone else: bad fan [root@2026-12-01T13:53:35]"
    assert drained.describe() == "State=IDLE+DRAIN Reason=someone else: bad fan [root@2026-12-01T13:53:35]"


def test_a_completing_node_is_busy_not_unusable():
    for name in ("scontrol-show-node-completing.txt", "scontrol-show-node-completing-after-failed-launch.txt"):
        [node] = parse_show_node(read(name))[0].values()
        assert node.flags == ("COMPLETING",) and node.unusable is None and node.reason is None


def test_the_gpus_slurm_gives_a_node_and_whether_a_job_runs_there():
    mixed = parse_show_node(read("scontrol-show-node-gres-mixed.txt"))[0]["gpu02"]
    assert (mixed.gpus, mixed.busy, mixed.unusable) == (4, True, None)
    idle = parse_show_node(read("scontrol-show-node-not-found.txt"))[0]["n1"]
    assert (idle.gpus, idle.busy) == (0, False)  # Gres=(null)


@pytest.mark.parametrize("gres, gpus", [
    ("gpu:8", 8),
    ("(null)", 0),
    ("", 0),
    # scontrol(1), "Gres=": the sockets a GRES is bound to, in parentheses
    ("gpu:4(S:0)", 4),
    ("gpu:4(S:0-1)", 4),
    # Slurm's gres.html: typed GPUs and other resources on one node
    ("gpu:tesla:2,gpu:kepler:2,mps:400,bandwidth:lustre:no_consume:4G", 4),
    ("gpu:2,shard:64", 2),
])
def test_gpus_of_a_gres_value(gres, gpus):
    assert gpus_of(gres) == gpus


def test_names_slurm_does_not_know_are_listed():
    nodes, missing = parse_show_node(read("scontrol-show-node-not-found.txt"))
    assert list(nodes) == ["n1"] and missing == ["n9"]


@pytest.mark.parametrize("state, why", [
    ("DOWN*", "down, not responding"), ("IDLE*", "not responding"), ("MIXED+DRAIN", "draining"),
    ("DOWN+DRAIN", "down, drained"), ("IDLE+POWERED_DOWN", "powered down"), ("ALLOCATED", None),
    ("IDLE+COMPLETING", None), ("FUTURE", "not in service (FUTURE)"),
])
def test_states_slurm_will_not_start_a_job_in(state, why):
    # The state words are slurm.h's (node_state_string); the lines are built from the real one.
    line = read("scontrol-show-node-not-found.txt").splitlines()[0].replace("State=IDLE ", f"State={state} ")
    [node] = parse_show_node(line)[0].values()
    assert node.unusable == why


def test_a_failed_launch_names_the_node_and_slurms_reason():
    report = parse_step_stderr(read("srun-launch-failure.stderr"))
    assert report.launch_failed == {"n3": "Communication connection failure"}
    assert report.reason_for("n3") == "task launch failed: Communication connection failure"
    assert report.reason_for("n1") is None


def test_the_step_a_failed_launch_aborts_kills_the_other_tasks():
    report = parse_step_stderr(read("srun-launch-failure-step-aborted.stderr"))
    assert report.launch_failed == {"gpu03": "Communication connection failure"}
    assert report.task_ended == {"gpu04": "Killed", "gpu01": "Killed"}
    assert report.reason_for("gpu04") == "step cancelled (no reason given); task Killed"


def test_a_time_limit_speaks_for_every_node_of_the_step():
    report = parse_step_stderr(read("srun-time-limit.stderr"))
    assert report.cancelled == "DUE TO TIME LIMIT"
    assert report.reason_for("gpu02") == "step cancelled DUE TO TIME LIMIT; task Terminated"
    assert report.reason_for("gpu01") == "step cancelled DUE TO TIME LIMIT; task Terminated"


def test_task_exits_and_kills():
    assert parse_step_stderr(read("srun-task-exit-code.stderr")).task_ended == {"n1": "Exited with exit code 3"}
    assert parse_step_stderr(read("srun-task-killed.stderr")).task_ended == {"n1": "Killed", "n2": "Killed"}


def test_a_program_missing_on_the_node_is_named_by_that_nodes_slurmstepd():
    report = parse_step_stderr(read("srun-command-not-found.stderr"))
    assert report.reason_for("gpu02") == ("task Exited with exit code 2; "
                                          "execve(): no-such-python3: No such file or directory")
    # The time limit's own slurmstepd line is the cancellation, not a node's error.
    assert parse_step_stderr(read("srun-time-limit.stderr")).stepd == {}


def test_an_allocation_is_granted_with_a_job_id():
    assert granted_job(read("salloc-granted.stderr")) == 1
    assert granted_job(read("salloc-invalid-partition.stderr")) is None


@pytest.mark.parametrize("name, said, usage", [
    ("salloc-invalid-partition.stderr", "salloc: error: Job submit/allocate failed: Invalid partition name specified", True),
    ("srun-invalid-partition.stderr", "srun: error: Unable to allocate resources: Invalid partition name specified", True),
    ("srun-invalid-node.stderr", "srun: error: Unable to allocate resources: Invalid node name specified", True),
    ("salloc-controller-unreachable.stderr",
     "salloc: error: Job submit/allocate failed: Unable to contact slurm controller (connect failure)", True),
    ("scontrol-controller-unreachable.stderr",
     "slurm_load_node error: Unable to contact slurm controller (connect failure)", True),
    # Busy nodes are not bad input: they get a verdict each.
    ("srun-nodes-busy.stderr", "srun: error: Unable to allocate resources: Requested nodes are busy", False),
])
def test_slurms_final_word_and_whether_the_request_itself_was_wrong(name, said, usage):
    assert first_error(read(name)) == said
    assert is_input_error(said) is usage


def test_the_task_whose_limit_fired_is_seen_behind_the_peers_srun_terminated():
    text = read("srun-timeout-kill-on-bad-exit.stderr")  # srun itself exited 143
    assert task_exit_codes(text) == [124]
    assert parse_step_stderr(text).task_ended == {"gpu01": "Exited with exit code 124", "gpu02": "Terminated"}
    assert task_exit_codes(read("srun-task-exit-code.stderr")) == [3]
    assert task_exit_codes(read("srun-time-limit.stderr")) == []
