"""`soak --slurm` without a cluster: the time limit it needs and refuses, the plan kept for
--attach, the agent step's command line, and Slurm's words on a step cancelled at its time
limit (the real capture tests/fixtures/slurm/srun-time-limit.stderr; MANIFEST.tsv there says
which command printed it). The end-to-end run is tests/e2e/test_e2e_slurm_soak.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from preflight.app.cli import main
from preflight.collect.slurm import SlurmNode, UnavailableNode
from preflight.collect.slurm_job import SlurmOptions
from preflight.model import Host
from preflight.node.agent import ServeParams
from preflight.parse.slurm import time_limit_s
from preflight.soak import slurm_soak
from preflight.soak.plan import SlurmJob, SlurmSoak, SoakPlan, load_plan, write_plan
from preflight.soak.ship import make_nodes

FIX = Path(__file__).parents[1] / "fixtures" / "slurm"


# sbatch(1): "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes", "days-hours:minutes:seconds"; 0 is no limit.
@pytest.mark.parametrize("text, seconds", [
    ("90", 5400), ("5:30", 330), ("2:00:00", 7200), ("1-12", 129600), ("1-0:30", 88200), ("2-1:2:3", 176523),
    ("0", None),
])
def test_slurm_time_formats(text, seconds):
    assert time_limit_s(text) == seconds


@pytest.mark.parametrize("text", ["1h", "1:2:3:4", "", "-5", "1-", "UNLIMITED"])
def test_a_time_slurm_does_not_read_that_way_is_refused(text):
    with pytest.raises(ValueError, match="is not a Slurm time limit"):
        time_limit_s(text)


def test_the_limit_covers_start_up_soak_bench_and_collection():
    assert slurm_soak.needed_s(3600, "burn") == 90 + 3600 + 240
    assert slurm_soak.needed_s(3600, "burn", bench_s=30) == 90 + 3600 + 30 + 240
    # a vllm soak's length counts from the server's answer: its start-up comes on top
    assert slurm_soak.needed_s(3600, "vllm") == 90 + 1200 + 3600 + 240
    assert slurm_soak.needed_s(3600, "vllm", ready_timeout_s=300) == 90 + 300 + 3600 + 240
    assert slurm_soak.time_limit(90 + 3600 + 240) == "66"


def test_the_vllm_start_up_allowance_is_the_agents_own_default():
    assert slurm_soak.VLLM_READY_DEFAULT_S == ServeParams.ready_timeout_s


@pytest.mark.parametrize("argv, said", [
    (["--hours", "1", "--time", "60"], "--time 60: the soak needs at least 66 minutes (3600 s of soak plus 330 s"),
    (["--minutes", "10", "--engine", "vllm", "--model", "tiny-llama-ci", "--time", "0:30:00"],
     "--time 0:30:00: the soak needs at least 36 minutes (600 s of soak plus 1530 s"),
    (["--minutes", "1", "--time", "1h"], "--time: '1h' is not a Slurm time limit"),
])
def test_soak_slurm_refuses_a_time_limit_shorter_than_the_soak(tmp_path, capsys, argv, said):
    out = tmp_path / "reports"
    code = main(["soak", "--slurm", "-w", "gpu[01-02]", "--out", str(out), "--run-id", "t", *argv])
    assert code == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_slurm_only_options_need_slurm(tmp_path, capsys):
    assert main(["soak", "-w", "gpu01", "--minutes", "1", "--out", str(tmp_path)]) == 2
    assert "-w: only with --slurm" in capsys.readouterr().err


def plan(tmp_path: Path) -> SoakPlan:
    slurm = SlurmSoak(SlurmOptions(partition="gpu", time="66", extra=("--qos=high",)),
                      (SlurmJob(41, ("gpu01", "gpu02")), SlurmJob(None, ("gpu04",), "allocation not granted: busy")),
                      {"gpu03": "node drained before the run (State=IDLE+DRAIN Reason=fan)"})
    return SoakPlan(run_id="r1", out=tmp_path, engine="burn", seconds=60.0, interval_s=1.0,
                    hosts=tuple(Host(n) for n in ("gpu01", "gpu02", "gpu03", "gpu04")), slurm=slurm)


def test_the_plan_keeps_its_allocations_for_attach(tmp_path):
    p = plan(tmp_path)
    write_plan(p)
    again = load_plan(tmp_path, "r1")
    assert again.slurm == p.slurm and again.node_python == "python3"
    assert again.node_subdir("gpu02") == "r1/gpu02"
    # A plan written before --slurm existed reads as an SSH plan.
    doc = json.loads((tmp_path / "r1/soak/run.json").read_text())
    del doc["slurm"]
    (tmp_path / "r1/soak/run.json").write_text(json.dumps(doc))
    assert load_plan(tmp_path, "r1").slurm is None and load_plan(tmp_path, "r1").node_subdir("gpu02") == "r1"


def test_a_damaged_slurm_section_is_refused_naming_the_file(tmp_path):
    write_plan(plan(tmp_path))
    path = tmp_path / "r1/soak/run.json"
    doc = json.loads(path.read_text())
    doc["slurm"]["jobs"][0]["job"] = "41; rm -rf /"
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception, match=r"run.json: field 'slurm' has a value no soak run writes"):
        load_plan(tmp_path, "r1")


def test_nodes_outside_a_running_allocation_are_never_sent_to_srun(tmp_path):
    nodes = {n.name: n for n in make_nodes(plan(tmp_path))}
    assert isinstance(nodes["gpu01"], SlurmNode) and nodes["gpu01"].job == 41
    assert isinstance(nodes["gpu03"], UnavailableNode) and isinstance(nodes["gpu04"], UnavailableNode)
    r = nodes["gpu04"].run(["true"], timeout=5)
    assert (r.stdout, r.exit_code, r.error) == (None, None, "slurm: allocation not granted: busy")


def test_the_agent_step_is_one_task_per_node_with_the_agent_on_stdin(tmp_path):
    argv = slurm_soak.step_argv(plan(tmp_path), 41, ["gpu01", "gpu02"], fresh=False)
    assert argv[:8] == ["srun", "--jobid=41", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--nodelist=gpu[01-02]", "--kill-on-bad-exit=0", "--input=all"]
    assert argv[8:10] == ["python3", "-c"] and argv[11:14] == ["~/.cache/preflight/soak", "r1", "0"]
    assert argv[14:] == ["--engine", "burn", "--seconds", "60.0", "--interval", "1.0"]


def test_a_step_cancelled_at_its_time_limit_marks_its_nodes_killed(tmp_path):
    p = plan(tmp_path)
    soak = tmp_path / "r1" / "soak"
    soak.mkdir(parents=True)
    # The real capture names gpu01 and gpu02, whose tasks the limit's SIGTERM ended.
    shutil.copy(FIX / "srun-time-limit.stderr", soak / "slurm-41.0.stderr")
    (soak / slurm_soak.STEPS_JSON).write_text(json.dumps({"gpu01": "slurm-41.0.stderr", "gpu02": "slurm-41.0.stderr"}))
    outcomes = {"gpu01": ("finished", None), "gpu02": ("died", "the agent is gone without finishing (killed?)"),
                "gpu03": ("not started", "slurm: node drained before the run")}
    got = slurm_soak.slurm_outcomes(p, outcomes)
    # The agent, told to stop by SIGTERM, ends tidily; Slurm's line says what stopped it.
    assert got["gpu01"] == ("killed", "slurm: step cancelled DUE TO TIME LIMIT; task Terminated")
    assert got["gpu02"] == ("killed", "slurm: step cancelled DUE TO TIME LIMIT; task Terminated")
    assert got["gpu03"] == outcomes["gpu03"]


def test_a_step_that_ended_normally_changes_nothing(tmp_path):
    p = plan(tmp_path)
    soak = tmp_path / "r1" / "soak"
    soak.mkdir(parents=True)
    (soak / "slurm-41.0.stderr").write_text("")
    (soak / slurm_soak.STEPS_JSON).write_text(json.dumps({"gpu01": "slurm-41.0.stderr"}))
    outcomes = {"gpu01": ("finished", None)}
    assert slurm_soak.slurm_outcomes(p, outcomes) == outcomes
