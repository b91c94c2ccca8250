"""`preflight run --slurm --nccl-multinode` on the real Slurm 22.05 cluster (tests/slurmcluster.py):
the multi-node all_reduce as srun steps, one task per GPU, instead of mpirun from a launcher.

The fleet and its fault are those of tests/e2e/test_e2e_multinode.py (over SSH), on one-GPU
nodes so that one srun task runs per node: each node's own all_reduce is the real one-GPU H200
run (corpus h200-vm/all_reduce_1gpu.txt). all_reduce_perf on the nodes is a shim that replays,
call after call, what each rank of each run prints: rank 0 (the first node of the sorted
node list) the table of tests/derived.py's mpirun_all_reduce without mpirun's tags (srun adds
none), the other ranks nothing but a real NCCL WARN line where one is expected. The full run
hangs past its limit, the intra-node split passes, the inter-node split fails with gpu02's
error-12 line; the bisection (the groups of one round run as concurrent steps: the halves,
then the failing half's nodes with nodes that passed) must blame gpu03 alone. nccl-tests cannot run here (no GPUs);
the mpi engine's real Open MPI job under srun --mpi=pmix is tests/e2e/test_e2e_slurm_collective_mpi.py.
"""

from __future__ import annotations

import json
import re

import pytest
from derived import H200_RUN, h200_node_xml, mpirun_all_reduce, tagged_warn
from simcluster import Reply, SimHost
from slurmcluster import slurm_fleet
from test_e2e_multinode import assert_gpu03_isolated

from preflight.app.cli import main

pytestmark = pytest.mark.root

HOSTS = ["gpu01", "gpu02", "gpu03", "gpu04"]
MAX = 1 << 30
STEP = f"all_reduce_perf -b 8 -e {MAX} -f 2 -g 1 -c 1"  # what every task runs (under env and timeout)
HANG = Reply(sleep_s=60)
QUIET = Reply("")


def untagged(text: str) -> str:
    """mpirun --tag-output's "[1,R]<stdout>:" off every line: the same lines as a task under srun prints them."""
    return re.sub(r"^\[1,\d+\]<std(?:out|err)>:", "", text, flags=re.MULTILINE)


def table(hosts: list[str], **kwargs) -> str:
    return untagged(mpirun_all_reduce(hosts, gpus=1, **kwargs))


def warn(corpus_file: str, host: str) -> str:
    return untagged(tagged_warn(corpus_file, host, 0))


# Per node, the replies of its task in each run it takes part in, in the order the stage runs them:
# full, intra, inter, its half, then its pair (ranks follow the sorted node list: the first node
# of a step is its rank 0, which prints the table).
# A failing run is rank 0's table cut short plus the erring rank's real WARN line, every task
# exiting 0: a task that exits non-zero makes srun terminate the step (--kill-on-bad-exit), maybe
# before a slower node's task has started, and that node's replay would then fall one call
# behind. (A rank's non-zero exit is tested on srun's real output in tests/collect/test_multinode_slurm.py.)
STEPS = {
    "gpu01": [HANG, Reply(table(HOSTS)), Reply(table(HOSTS, rows=2)),
              Reply(table(["gpu01", "gpu02"])), Reply(table(["gpu01", "gpu03"], rows=1))],
    "gpu02": [HANG, QUIET, Reply(warn("azure-ib-error12-retry-exceeded-nccl-warn.txt", "gpu02")),
              QUIET, Reply(table(["gpu02", "gpu04"]))],
    "gpu03": [HANG, QUIET, QUIET] + [Reply(warn("hgx-nccl2.27-ibv-modify-qp-110-timeout-init-rtr-timestamped.txt",
                                                "gpu03"))] * 2,
    "gpu04": [HANG, QUIET, QUIET, QUIET, QUIET],
}


def node(name: str) -> SimHost:
    return SimHost(name, {
        "nvidia-smi -L": Reply("GPU 0: NVIDIA H200 (UUID: GPU-88c58391-6001-919c-8431-20f011c20000)\n"),
        "nvidia-smi -q -x": Reply(h200_node_xml(1)),
        f"all_reduce_perf -b 8 -e {MAX} -f 2 -g 1 -c 1 -n 20": Reply(H200_RUN),
        STEP: STEPS[name],
    })


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # One GPU a node in slurm.conf: the stage's allocation asks for it (--gres=gpu:1), so every
    # rank's step is given GPU 0, as under ConstrainDevices it must be.
    with slurm_fleet([node(h) for h in HOSTS], tmp_path_factory.mktemp("slurm"), gpus=1) as slurm:
        for h in HOSTS:
            shim = slurm.sim.workdir_of(h) / "bin" / "all_reduce_perf"
            head, _, rest = shim.read_text().partition("\n")
            shim.write_text(f'{head}\necho "$(hostname) $CUDA_VISIBLE_DEVICES" >> {shim.parent.parent / "ranks"}\n{rest}')
        yield slurm


def test_multinode_all_reduce_through_srun_names_the_culprit(cluster, tmp_path):
    out = tmp_path / "reports"
    code = main(["run", "--slurm", "-w", "gpu[01-04]", "--out", str(out), "--run-id", "r", "-q",
                 "--checks", "nccl-multinode", "--nccl-multinode", "--nccl-reps", "1",
                 "--nccl-max-bytes", str(MAX), "--nccl-timeout", "5"])
    # The same verdict as over SSH; the hung run stopped on the nodes by timeout, srun passing its exit on.
    saved = assert_gpu03_isolated(code, out / "r", gpus=1)
    # Each run is one step of one task per GPU, the split on the task's own command line.
    inter = json.loads((saved / "nccl-multinode-inter.json").read_text())["command"]
    assert inter[:7] == ["srun", inter[1], "--nodes=4", "--ntasks=4", "--ntasks-per-node=1",
                         "--nodelist=gpu[01-04]", "--kill-on-bad-exit=1"]
    assert inter[7:10] == ["env", "NCCL_DEBUG=WARN", "NCCL_TESTS_SPLIT=MOD 1"]
    pair = (saved / "nccl-pair-gpu03-gpu01.txt").read_text()
    assert pair.startswith("# preflight: tool=srun gpus=1 repetitions=1\n# preflight: expect busbw=none ratio=0.5\n"
                           "# preflight: host gpu01 slots=1\n# preflight: host gpu03 slots=1\n")
    # Every rank of every step (the runs, the bisection's) was given its node's GPU.
    for h in HOSTS:
        ranks = (cluster.sim.workdir_of(h) / "ranks").read_text().splitlines()
        assert ranks and set(ranks) == {f"{h} 0"}, (h, ranks)
    # Its allocation (and the probes') released; analyze of the bundle reaches the same verdicts.
    cluster.wait_idle()
    assert main(["analyze", str(out / "r"), "--out", str(tmp_path / "again"), "-q", "--checks", "nccl-multinode"]) == 1
