"""Reading the collective's runs (preflight/parse/collective_run.py, parse/mpi_allreduce.py) on
real captures: Open MPI 4.1.4's own messages and the MPI engine's output captured on the namespace
test bed (tests/fixtures/corpus/openmpi, provenance in MANIFEST.tsv), NCCL WARN lines from public
nccl-tests / nccl issues (corpus nccl-tests/, nccl-init/)."""

from __future__ import annotations

import pytest
from derived import CORPUS

from preflight.model import ProbeResult
from preflight.parse.collective_run import MPI_TOOL, init_failure, launcher_failure, peer_hosts, read_run
from preflight.parse.mpi_allreduce import parse_mpi_allreduce

OMPI = CORPUS / "openmpi"
FOUR = ["n1", "n2", "n3", "n4"]


def saved(body: str, hosts, exit_code: int, tool: str = MPI_TOOL, notes: str = "") -> ProbeResult:
    """A run as the stage saves it (preflight/collect/scripts/multinode_all_reduce.sh)."""
    text = (f"# preflight: tool={tool} gpus=1 repetitions=1\n{notes}"
            + "".join(f"# preflight: host {h} slots=1\n" for h in hosts)
            + body + f"# preflight: repetition 1 exit={exit_code} seconds=3\n")
    return ProbeResult("nccl-multinode", "fleet-", ("sh",), text.encode(), exit_code=0)


def capture(name: str) -> str:
    # The capture script's own last line (mpirun's exit and wall time) is not mpirun's output.
    return "".join(line + "\n" for line in (OMPI / name).read_text().splitlines() if not line.startswith("# exit="))


def test_healthy_mpi_run_passes_with_its_figures():
    run = read_run(saved(capture("healthy4.txt"), FOUR, 0))
    assert run.state == "passed" and run.ok and run.busbw_gbs == pytest.approx(0.0188)
    assert run.mpi.ranks == 4 and run.mpi.done == {0: "n1", 1: "n2", 2: "n3", 3: "n4"} and run.mpi.wrong == 0


def test_rate_limited_run_passes_but_shows_its_low_figure():
    run = read_run(saved(capture("slow-n3.txt"), FOUR, 0))
    assert run.state == "passed" and run.busbw_gbs == pytest.approx(0.0028)


def test_stalled_data_path_is_a_hang_naming_the_ranks_that_never_finished():
    run = read_run(saved(capture("dataport-drop-n3.txt"), FOUR, 124))
    assert run.state == "hung"
    assert run.why == "stopped by its timeout; ranks that never finished: 0 (n1), 1 (n2), 2 (n3), 3 (n4)"


def test_ssh_refused_is_never_ran_naming_the_host_behind_the_address():
    notes = "# preflight: address n5 127.77.0.5\n"
    run = read_run(saved(capture("refused.txt"), ["n1", "n2", "n5"], 255, notes=notes))
    assert run.state == "never-ran" and run.unreachable == ("n5",)
    assert run.why == ("the launcher could not start its daemons on every node "
                       "(ssh to 127.77.0.5: Connection refused)")


def test_lost_daemon_is_never_ran_naming_its_node():
    why, named = launcher_failure(capture("daemon-lost-n3.txt"))
    assert named == ("n3",) and why.startswith("the launcher lost its daemon on a node")


def test_a_hang_before_any_rank_started_is_never_ran():
    run = read_run(saved("ssh: connect to host 127.77.0.4 port 22: Connection timed out\n", FOUR, 124,
                         notes="# preflight: address n4 127.77.0.4\n"))
    assert run.state == "never-ran" and run.unreachable == ("n4",)


def test_output_without_the_engine_lines_is_read_without_error():
    mpi = parse_mpi_allreduce("[vm:1] plm:rsh: Warning: setpgid failed\nTraceback (most recent call last):\n")
    assert mpi.ranks is None and not mpi.complete and mpi.stopped == {}


def test_nvls_init_failure_names_the_transport():
    text = (CORPUS / "nccl-init" / "h100-nvswitch-nvls-cuda-failure-invalid-argument-after-fm-restart.txt").read_text()
    found = init_failure(text)
    assert found.transport == "NVLS" and found.host == "node23"
    run = read_run(saved(text, ["node23", "node24"], 1, tool="mpirun"))
    assert run.state == "failed" and run.why.startswith("NCCL failed in NVLS on node23 before any results")


def test_ib_init_failure_names_the_hca_and_port():
    text = (CORPUS / "nccl-tests" / "hgx-nccl2.27-ibv-modify-qp-110-timeout-init-rtr-timestamped.txt").read_text()
    found = init_failure(text)
    assert (found.transport, found.hca, found.host) == ("NET/IB", "mlx_x:1", "host-01.example.com")


def test_warn_peer_address_maps_back_to_the_inventory_host():
    # NCCL's INFO line gives each rank's out-of-band address (the real l40 capture's format); the
    # azure WARN line names its peer by that address.
    init = (CORPUS / "nccl-tests" / "l40-2node-roce-irdma-nccl-info-init-excerpt.txt").read_text()
    warn = (CORPUS / "nccl-tests" / "azure-ib-error12-retry-exceeded-nccl-warn.txt").read_text()
    run = read_run(saved(init + warn.replace("10.2.0.5", "172.16.207.69"), ["ai-worker01", "ai-worker03"], 1,
                         tool="mpirun"))
    assert run.peers == ("172.16.207.69",)
    assert peer_hosts(run, ["ai-worker01.dc", "ai-worker03.dc"]) == ("ai-worker03.dc",)


def test_repetitions_that_pass_and_hang_read_as_flaky_naming_the_ranks_that_stopped():
    # Two repetitions of one fleet run, each closed by its marker: the healthy capture, then the
    # stalled-data-path capture (both real, from the same four hosts).
    text = ("# preflight: tool=mpi4py gpus=1 repetitions=2\n" + "".join(f"# preflight: host {h} slots=1\n" for h in FOUR)
            + capture("healthy4.txt") + "# preflight: repetition 1 exit=0 seconds=3\n"
            + capture("dataport-drop-n3.txt") + "# preflight: repetition 2 exit=124 seconds=12\n")
    run = read_run(ProbeResult("nccl-multinode", "fleet-", ("sh",), text.encode(), exit_code=0))
    assert run.state == "hung" and run.flaky and run.repetitions == ("passed", "hung")
    assert run.why.startswith("hung in repetition 2 of 2 (passed in 1): stopped by its timeout; ranks that never")
