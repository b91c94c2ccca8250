"""The collective's round judge (preflight/judge/collective.py): pass, fail, slow and no verdict,
on runs read from the real MPI-engine captures (tests/fixtures/corpus/openmpi): the healthy
4-rank run (busbw 0.0188 GB/s), the run with one host rate-limited (0.0028 GB/s) and the
launcher's ssh refused. Each capture is wrapped in the stage's markers with the host lines a test
needs (the figures are the captures')."""

from __future__ import annotations

from ctx import _CHECKS, make_host
from derived import CORPUS

from preflight.app.collective import with_profile_expectation
from preflight.collect.multinode import MultinodeOptions
from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.judge.analyze import _run_fleet_check
from preflight.judge.collective import Expectation, RoundJudge
from preflight.judge.context import FleetContext
from preflight.knowledge.profiles import load_profiles
from preflight.model import ProbeResult
from preflight.parse.collective_run import MPI_TOOL, read_run

OMPI = CORPUS / "openmpi"


def run(probe: str, capture: str, hosts: list[str], exit_code: int = 0):
    body = "".join(line + "\n" for line in (OMPI / capture).read_text().splitlines() if not line.startswith("# exit="))
    text = (f"# preflight: tool={MPI_TOOL} gpus=1 repetitions=1\n" + "".join(f"# preflight: host {h} slots=1\n"
                                                                           for h in hosts)
            + body + f"# preflight: repetition 1 exit={exit_code} seconds=3\n")
    return read_run(ProbeResult(probe, "fleet-", ("sh",), text.encode(), exit_code=0))


def test_relative_a_lone_fleet_run_passes_and_is_no_reference():
    judge = RoundJudge(Expectation.of(None, 0.5, relative=True))
    assert judge([run("nccl-multinode", "slow-n3.txt", ["a", "b", "c", "d"])]) == {"nccl-multinode": "pass"}
    assert judge.passed == []


def test_relative_the_slow_half_fails_against_the_median_of_its_round():
    judge = RoundJudge(Expectation.of(None, 0.5, relative=True))
    judge([run("nccl-multinode", "slow-n3.txt", list("abcdefgh"))])
    verdicts = judge([run("nccl-bisect-2-1", "healthy4.txt", list("abcd")), run("nccl-bisect-2-2", "slow-n3.txt",
                                                                              list("efgh"))])
    assert verdicts == {"nccl-bisect-2-1": "pass", "nccl-bisect-2-2": "fail"}
    assert judge.why["nccl-bisect-2-2"].startswith("slow: busbw 0.0028 GB/s, below 0.0")


def test_an_explicit_figure_judges_every_run_alone():
    judge = RoundJudge(Expectation.of(0.01, 0.5))
    assert judge([run("nccl-multinode", "healthy4.txt", list("abcd"))]) == {"nccl-multinode": "pass"}
    assert judge([run("nccl-multinode", "slow-n3.txt", list("abcd"))]) == {"nccl-multinode": "fail"}
    assert judge.why["nccl-multinode"] == "slow: busbw 0.0028 GB/s, below 0.005 (50% of the expected 0.01 GB/s)"


def test_without_relative_or_figure_speed_is_not_judged():
    judge = RoundJudge(Expectation.of(None, 0.5, relative=False))
    verdicts = judge([run("a", "healthy4.txt", list("abcd")), run("b", "slow-n3.txt", list("efgh"))])
    assert verdicts == {"a": "pass", "b": "pass"}


def test_never_ran_fails_so_the_bisection_corners_it_and_not_run_gives_no_verdict():
    judge = RoundJudge(Expectation.of(None, 0.5, relative=True))
    refused = run("nccl-pair-n5-n1", "refused.txt", ["n5", "n1"], exit_code=255)
    unreached = read_run(ProbeResult("nccl-multinode", "fleet-", (), None, exit_code=None,
                                     error="launcher n1: connection refused"))
    assert judge([refused, unreached]) == {"nccl-pair-n5-n1": "fail", "nccl-multinode": "unknown"}
    assert judge.why["nccl-pair-n5-n1"].startswith("never ran: the launcher could not start its daemons")


def test_the_check_names_a_flaky_fleet_run():
    hosts = ["n1", "n2", "n3", "n4"]
    healthy = "".join(line + "\n" for line in (OMPI / "healthy4.txt").read_text().splitlines()
                      if not line.startswith("# exit="))
    hung = "".join(line + "\n" for line in (OMPI / "dataport-drop-n3.txt").read_text().splitlines()
                   if not line.startswith("# exit="))
    text = (f"# preflight: tool={MPI_TOOL} gpus=1 repetitions=2\n" + "".join(f"# preflight: host {h} slots=1\n"
                                                                             for h in hosts)
            + healthy + "# preflight: repetition 1 exit=0 seconds=3\n" + hung
            + "# preflight: repetition 2 exit=124 seconds=12\n")
    ctxs = {h: make_host({}, "generic", h) for h in hosts}
    results = {"nccl-multinode": ProbeResult("nccl-multinode", "fleet-", ("sh",), text.encode(), exit_code=0)}
    (fleet,) = _run_fleet_check(_CHECKS["nccl-multinode"], FleetContext(ctxs, results))
    assert fleet.status.value == "fail" and "collective-flaky" in fleet.symptoms
    assert "flaky, passed, hung over 2 repetitions" in fleet.summary
    assert [d.cause for d in diagnose([fleet], load_knowledge())] == ["collective-flaky"]


def test_nccl_takes_the_shared_profiles_per_nic_figure_when_none_is_given():
    profiles = load_profiles()
    h200, generic = profiles["hgx-h200"], profiles["generic"]
    assert with_profile_expectation(MultinodeOptions(), [h200, h200]).expect_busbw_gbs == 46.0
    # Hosts that differ in profile, a profile without the figure, a message too small to reach
    # the link rate, an explicit figure, or the mpi engine: unchanged.
    assert with_profile_expectation(MultinodeOptions(), [h200, generic]).expect_busbw_gbs is None
    assert with_profile_expectation(MultinodeOptions(), [generic]).expect_busbw_gbs is None
    assert with_profile_expectation(MultinodeOptions(max_bytes=1 << 20), [h200]).expect_busbw_gbs is None
    assert with_profile_expectation(MultinodeOptions(expect_busbw_gbs=30.0), [h200]).expect_busbw_gbs == 30.0
    assert with_profile_expectation(MultinodeOptions(tool="mpi"), [h200]).expect_busbw_gbs is None
