"""nccl all_reduce where no figure is published: a site baseline's own lines
(checks/nccl_all_reduce.py) and the fleet's own median (checks/nccl_fleet_relative.py).

Outputs are real captures (tests/fixtures/baseline/MANIFEST.tsv): two runs of one 8 x MI350X
node, one single-process (367.51 GB/s at 8 GiB) and one under mpirun (289.27 GB/s, 21 % lower,
below AMD's own 350 GB/s criterion), and the 8 x A100 capture of the corpus (235.26 GB/s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ctx import make_host, run_check, run_fleet_check

from preflight.collect.nccl import PROBE_ID
from preflight.judge.context import HostContext
from preflight.knowledge.profiles import Profile
from preflight.model import Status

FIXTURES = Path(__file__).parents[1] / "fixtures" / "baseline"
FAST = (FIXTURES / "mi350x-8gpu-allreduce-g8-single-process.txt").read_text()
SLOW = (FIXTURES / "mi350x-8gpu-allreduce-mpirun-np8-g1.txt").read_text()
A100 = (FIXTURES.parent / "corpus" / "nccl-tests" / "a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt").read_text()

# What `preflight baseline` writes for three runs of the single-process capture: median 367.51,
# MAD 0, so the 5 % floor: warn below 349.13, fail below 330.76 (tests/knowledge/test_site_profile.py).
SITE = {"nccl": {"all_reduce_busbw_gbs": 367.51, "all_reduce_busbw_warn_gbs": 349.13,
                 "all_reduce_busbw_fail_gbs": 330.76, "all_reduce_ranks": 8, "all_reduce_bytes": 8589934592}}


def site_host(text: str, data: dict = SITE) -> HostContext:
    host = make_host({PROBE_ID: text})
    return HostContext(host.name, host.probes, Profile("generic", "site baseline", data).chosen("test"))


def test_site_baseline_fails_the_slow_run_on_its_own_lines():
    [f] = run_check("nccl-all-reduce", site_host(SLOW))
    assert f.status is Status.FAIL
    assert f.symptoms == ("nccl-low-bandwidth",)
    assert "289.3 GB/s" in f.summary and "site baseline's median 367.51" in f.summary
    assert "fail below 330.76" in f.summary
    assert f.data["fail_threshold_gbs"] == 330.76


def test_site_baseline_passes_the_run_it_came_from():
    [f] = run_check("nccl-all-reduce", site_host(FAST))
    assert f.status is Status.PASS and not f.symptoms
    assert "100.0% of the site baseline's median" in f.summary


def test_between_the_lines_warns():
    # The A100 figure against lines drawn around it: 235.26 sits between warn 240 and fail 230.
    data = {"nccl": {"all_reduce_busbw_gbs": 250.0, "all_reduce_busbw_warn_gbs": 240.0,
                     "all_reduce_busbw_fail_gbs": 230.0}}
    [f] = run_check("nccl-all-reduce", site_host(A100, data))
    assert f.status is Status.WARN and f.symptoms == ("nccl-low-bandwidth",)


def test_a_run_at_another_message_size_is_not_held_against_the_site_figure():
    data = {"nccl": {**SITE["nccl"], "all_reduce_bytes": 17179869184}}
    [f] = run_check("nccl-all-reduce", site_host(SLOW, data))
    assert f.status is Status.PASS
    assert "measured at 16 GiB: not judged" in f.summary


def test_a_site_figure_is_not_held_against_another_gpu_model():
    # A baseline of MI350X runs under the generic profile must not judge the A100 generic also takes.
    data = {"nccl": {**SITE["nccl"], "all_reduce_gpu_model": "AMD Instinct MI350X"}}
    [f] = run_check("nccl-all-reduce", site_host(A100, data))
    assert f.status is Status.PASS and not f.symptoms
    assert "GPU model A100-SXM4-40GB, but the 367.51 GB/s of generic is for AMD Instinct MI350X" in f.summary
    [slow] = run_check("nccl-all-reduce", site_host(SLOW, data))
    assert slow.status is Status.FAIL


def test_the_site_rank_count_replaces_the_profile_gpu_count():
    data = {"gpu": {"count": 4}, "nccl": {**SITE["nccl"]}}  # 8 ranks is what the figure is for
    [f] = run_check("nccl-all-reduce", site_host(SLOW, data))
    assert f.status is Status.FAIL


# --------------------------------------------------------------------------- fleet median


def fleet(**texts: str) -> list[HostContext]:
    return [make_host({PROBE_ID: text}, name=name) for name, text in texts.items()]


def by_host(findings):
    return {f.host: f for f in findings}


def test_the_slow_node_of_a_fleet_warns_as_relative():
    found = by_host(run_fleet_check("nccl-fleet-relative",
                                    fleet(mi01=FAST, mi02=FAST, mi03=FAST, mi04=FAST, mi05=SLOW)))
    slow = found["mi05"]
    assert slow.status is Status.WARN
    assert slow.symptoms == ("nccl-below-fleet-median",)
    assert "slower than the fleet" in slow.summary and "21% below the fleet's median 367.5" in slow.summary
    assert "relative judgement: no published figure" in slow.summary
    assert slow.data["relative"] is True and slow.data["fleet_hosts"] == 5
    assert "8589934592" in slow.evidence[0].excerpt
    assert all(found[h].status is Status.PASS and not found[h].symptoms for h in ("mi01", "mi02", "mi03", "mi04"))


def test_half_the_fleet_median_fails():
    # The A100 capture with its busbw scaled to 40 % (the derivation test_check_nccl.py uses for
    # its low-bandwidth cases): more than half below the fleet of unscaled captures.
    from test_check_nccl import scale_a100_busbw

    found = by_host(run_fleet_check("nccl-fleet-relative", fleet(
        a1=A100, a2=A100, a3=A100, a4=A100, a5=scale_a100_busbw(A100, 0.4))))
    assert found["a5"].status is Status.FAIL and found["a5"].symptoms == ("nccl-below-fleet-median",)
    assert found["a1"].status is Status.PASS


def test_a_healthy_fleet_flags_nobody():
    found = run_fleet_check("nccl-fleet-relative", fleet(mi01=FAST, mi02=FAST, mi03=FAST, mi04=FAST))
    assert {f.status for f in found} == {Status.PASS}
    assert not any(f.symptoms for f in found)


def test_a_node_alone_is_not_a_fleet():
    assert run_fleet_check("nccl-fleet-relative", fleet(slow=SLOW)) == []


@pytest.mark.parametrize("n", [2, 3])
def test_below_the_minimum_fleet_it_judges_nobody(n):
    texts = {f"mi0{i}": FAST for i in range(1, n)} | {"slow": SLOW}
    found = run_fleet_check("nccl-fleet-relative", fleet(**texts))
    assert [(f.host, f.status) for f in found] == [(None, Status.SKIP)]
    assert f"{n} host(s)" in found[0].summary and "fewer than 4" in found[0].summary
    assert not found[0].symptoms


def test_nodes_are_compared_only_with_their_own_model():
    # Four A100 nodes beside four MI350X nodes: the A100s are 36 % below the MI350X median,
    # which says nothing about them; each model is its own group.
    found = by_host(run_fleet_check("nccl-fleet-relative", fleet(
        a1=A100, a2=A100, a3=A100, a4=A100, m1=FAST, m2=FAST, m3=FAST, m4=SLOW)))
    assert all(f.status is Status.PASS for h, f in found.items() if h.startswith("a"))
    assert found["m4"].status is Status.WARN


def test_a_node_with_a_profile_figure_is_left_to_nccl_all_reduce():
    hosts = fleet(mi01=FAST, mi02=FAST, mi03=FAST, mi04=SLOW)
    hosts[3] = HostContext("mi04", hosts[3].probes, Profile("site", "site", SITE).chosen("test"))
    found = run_fleet_check("nccl-fleet-relative", hosts)
    assert "mi04" not in by_host(found)
    assert [(f.host, f.status) for f in found] == [(None, Status.SKIP)]  # three left: below the minimum


def test_a_node_whose_run_failed_is_not_compared():
    hung = "\n".join(SLOW.splitlines()[:30]) + "\n"  # cut mid-table: nccl-all-reduce calls it a hang
    found = by_host(run_fleet_check("nccl-fleet-relative", fleet(
        mi01=FAST, mi02=FAST, mi03=FAST, mi04=FAST, mi05=hung)))
    assert "mi05" not in found
