"""What `run --slurm` asks of each node (preflight/collect/slurm_job.py, slurm_fleet.py): the
GPUs slurm.conf gives it unless told otherwise, one allocation per GPU count, and no load
probe beside another job unless the run waits for the node or accepts to share it. Pure: the
node states are read from real `scontrol show node` captures (tests/fixtures/slurm)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from preflight.collect import dcgm, nccl
from preflight.collect.fanout import ExecPlan
from preflight.collect.probes import PROBES
from preflight.collect.slurm_fleet import loads_node, shared_refusals
from preflight.collect.slurm_job import SlurmOptions, gpu_groups
from preflight.parse.slurm import parse_show_node

FIX = Path(__file__).parents[1] / "fixtures" / "slurm"
MIXED = parse_show_node((FIX / "scontrol-show-node-gres-mixed.txt").read_text())[0]["gpu02"]  # 4 GPUs, a job
IDLE = parse_show_node((FIX / "scontrol-show-node-not-found.txt").read_text())[0]["n1"]  # no GRES, idle


def test_by_default_each_node_is_asked_for_every_gpu_slurm_gives_it():
    states = {"a": MIXED, "b": replace(MIXED, name="b"), "c": IDLE}
    assert gpu_groups(["a", "c", "b"], states, SlurmOptions()) == [(4, ["a", "b"]), (0, ["c"])]
    # An explicit count asks the same of every node; 0 asks for none.
    assert gpu_groups(["a", "c", "b"], states, SlurmOptions(gpus_per_node=2)) == [(2, ["a", "c", "b"])]
    assert gpu_groups(["a"], states, SlurmOptions(gpus_per_node=0)) == [(0, ["a"])]
    # Still at most --max-nodes-per-job nodes an allocation.
    many = {f"n{i}": replace(MIXED, name=f"n{i}") for i in range(5)}
    assert [g for _, g in gpu_groups(list(many), many, SlurmOptions(max_nodes_per_job=2))] == [
        ["n0", "n1"], ["n2", "n3"], ["n4"]]


def test_a_node_with_another_job_gets_no_load_probe_unless_the_run_waits_or_shares():
    states = {"gpu02": MIXED, "n1": IDLE}
    load = ExecPlan((PROBES["nvidia-smi-q-x"], nccl.PROBE.configured()))
    [(node, why)] = shared_refusals(states, load, SlurmOptions(), {}).items()
    assert node == "gpu02" and why.startswith("node runs another job (State=MIXED): the load probes (nccl-all-reduce)")
    assert shared_refusals(states, load, SlurmOptions(exclusive=True), {}) == {}
    assert shared_refusals(states, load, SlurmOptions(allow_shared=True), {}) == {}
    # Static probes only (run --quick): nothing to refuse.
    assert shared_refusals(states, ExecPlan((PROBES["nvidia-smi-q-x"],)), SlurmOptions(), {}) == {}
    # A node already refused (drained) keeps its first reason.
    assert shared_refusals(states, load, SlurmOptions(), {"gpu02": "drained"}) == {}


def test_dcgm_level_1_puts_no_load_on_the_gpus_level_2_does():
    assert not loads_node(dcgm.PROBE.configured(dcgm.DcgmOptions(level=1)))
    assert loads_node(dcgm.PROBE.configured(dcgm.DcgmOptions(level=2)))
    assert loads_node(nccl.PROBE.configured()) and not loads_node(PROBES["nvidia-smi-q-x"])
