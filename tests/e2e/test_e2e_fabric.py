"""``preflight fabric`` over real sshd in network namespaces, real iperf3 between them, real
faults on their links (tests/netfaults.py: tc tbf / htb, a link set down). The blame must land
where the fault is, and a healthy fleet is never blamed."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from netfaults import link_down, slow_host, slow_path
from simcluster import SimCluster, SimHost

from preflight.app.cli import build_parser, main
from preflight.app.fabric_cli import fabric_request, rail_options
from preflight.app.run import execute
from preflight.collect.fabric_rails import rail_stage

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 missing (apt-get install iperf3)")]

HOSTS = ["n1", "n2", "n3", "n4", "n5"]  # odd: one node sits out each round
# Capped so that tests sharing two cores stay comparable; 20 Mbit/s shaping is far below it. One
# second a test: a test of a few MB (--bytes) lasts ~0.1 s at the cap, where one scheduling stall
# of a loaded machine is a quarter of it (a healthy pair was once judged slow that way).
FAST = ["--pair-tool", "iperf3", "--seconds", "1", "--reps", "2", "--bitrate", "200M"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SimCluster([SimHost(h) for h in HOSTS], tmp_path_factory.mktemp("fabric")) as c:
        yield c


def argv(cluster, out: Path, run_id: str, *extra: str, db: bool = False) -> list[str]:
    return ["fabric", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
            "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
            "--out", str(out), "--run-id", run_id, "-q", *([] if db else ["--no-db"]), *FAST, *extra]


def report(out: Path, run_id: str) -> dict:
    return json.loads((out / run_id / "report.json").read_text())


def host_findings(rep: dict) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {f["host"]: (f["status"], tuple(f["symptoms"])) for f in rep["findings"]
            if f["check"] == "fabric-rails" and f["host"]}


def test_healthy_fleet_is_not_blamed_and_analyze_agrees(cluster, tmp_path, capsys):
    assert main(argv(cluster, tmp_path, "ok", db=True)) == 0
    rep = report(tmp_path, "ok")
    assert {h: s for h, (s, _) in host_findings(rep).items()} == {h: "pass" for h in HOSTS}
    fleet = next(f for f in rep["findings"] if f["check"] == "fabric-rails" and f["host"] is None)
    assert fleet["data"]["rounds"] == 3 and fleet["data"]["pair_tests"] == 6
    assert "not applicable" in fleet["data"]["line_rate"]
    assert all(cell["state"] == "ok" for row in fleet["data"]["matrix"].values() for cell in row)
    # Every rail test's raw iperf3 JSON is in the bundle, both sides.
    saved = sorted((tmp_path / "ok" / "bundle" / "hosts").glob("*/fabric-rail-*"))
    assert saved, "no rail record in the bundle"
    assert main(["analyze", str(tmp_path / "ok"), "--out", str(tmp_path / "again"), "-q", "--no-db"]) == 0
    # The results store recorded the run as it records `run`'s (the test's own store).
    capsys.readouterr()
    said = capsys.readouterr().out if main(["history", "n1"]) == 0 else ""
    assert "n1: 1 run(s)" in said and "PASS  run         ok" in said


def test_a_slow_host_is_the_culprit_with_every_partner(cluster, tmp_path):
    with slow_host(cluster, "n3", rate="20mbit"):
        assert main(argv(cluster, tmp_path, "slow")) == 1
    found = host_findings(report(tmp_path, "slow"))
    assert found.pop("n3") == ("fail", ("fabric-rail-slow",))
    assert {s for s, _ in found.values()} == {"pass"}
    diagnoses = {d["cause"]: d["hosts"] for d in report(tmp_path, "slow")["diagnoses"]}
    assert diagnoses.get("fabric-rail-slow") == ["n3"]
    # The report's node x rail picture marks n3's cell, and only it.
    html = (tmp_path / "slow" / "report.html").read_text()
    table = html.split('<table class="rails">')[1].split("</table>")[0]
    rows = {r.split("</a>")[0].rsplit(">", 1)[-1]: r for r in table.split("<tr>")[2:]}
    assert set(rows) == set(HOSTS) and "m-slow" in rows["n3"] and "SLOW" in rows["n3"]
    assert not any("m-slow" in row for host, row in rows.items() if host != "n3")


def test_a_slow_path_is_the_path_not_either_node(cluster, tmp_path):
    # n2 and n5 meet in round 1 of five nodes' plan.
    with slow_path(cluster, "n2", "n5", rate="20mbit"):
        main(argv(cluster, tmp_path, "path"))
    found = host_findings(report(tmp_path, "path"))
    assert found.pop("n2") == ("warn", ("fabric-path-slow",)) and found.pop("n5") == ("warn", ("fabric-path-slow",))
    assert {s for s, _ in found.values()} == {"pass"}


def test_a_rail_slow_in_some_repetitions_is_flaky(cluster, tmp_path):
    args = build_parser().parse_args(argv(cluster, tmp_path, "flaky"))
    shaping = {}

    def before_rep(round_number: int, rep: int) -> None:
        # Shaped during the second repetition of every round only.
        if rep == 2:
            shaping["cm"] = slow_host(cluster, "n4", rate="20mbit")
            shaping["cm"].__enter__()
        elif "cm" in shaping:
            shaping.pop("cm").__exit__(None, None, None)

    req = replace(fabric_request(args), stages=(rail_stage(rail_options(args), before_rep),))
    try:
        execute(req)
    finally:
        if "cm" in shaping:
            shaping.pop("cm").__exit__(None, None, None)
    found = host_findings(report(tmp_path, "flaky"))
    assert found.pop("n4") == ("fail", ("fabric-rail-flaky",))
    assert {s for s, _ in found.values()} == {"pass"}


def test_a_partner_whose_link_is_down_is_a_finding_and_the_rest_is_kept(cluster, tmp_path):
    """n1's link goes down after the rail listing (it sits out round 1 and meets n5 and n4 in
    rounds 2 and 3): its tests never run, which is a finding on n1; the others measured."""
    args = build_parser().parse_args(argv(cluster, tmp_path, "down", "--connect-timeout", "3"))
    args.reps = 1
    down = {}

    def before_rep(round_number: int, rep: int) -> None:
        if round_number == 1 and "cm" not in down:
            down["cm"] = link_down(cluster, "n1")
            down["cm"].__enter__()

    options = replace(rail_options(args), slack_s=2.0)
    req = replace(fabric_request(args), stages=(rail_stage(options, before_rep),))
    try:
        execute(req)
    finally:
        if "cm" in down:
            down.pop("cm").__exit__(None, None, None)
    rep = report(tmp_path, "down")
    found = host_findings(rep)
    assert found.pop("n1") == ("fail", ("fabric-rail-unreachable",))
    assert {s for s, _ in found.values()} == {"pass"}
    n1 = next(f for f in rep["findings"] if f["check"] == "fabric-rails" and f["host"] == "n1")
    assert "n5" in n1["summary"] and "n4" in n1["summary"] and "eth0" in n1["summary"]


def test_two_rails_a_slow_second_rail_is_named_and_the_first_passes(tmp_path, tmp_path_factory):
    """Hosts with two links (eth0, eth1: two rails); n2's eth1 shaped, its eth0 not. Only n2's
    eth1 is blamed, and the matrix marks that one cell."""
    hosts = ["n1", "n2", "n3", "n4"]
    with SimCluster([SimHost(h) for h in hosts], tmp_path_factory.mktemp("two-rails"), rails=2) as two:
        with slow_host(two, "n2", rate="20mbit", rail=1):
            code = main(["fabric", "--hosts", str(two.hosts_file), "--ssh-config", str(two.ssh_config),
                         "--known-hosts", str(two.known_hosts), "--identity", str(two.identity), "--out",
                         str(tmp_path), "--run-id", "two", "-q", "--no-db", "--pair-tool", "iperf3", "--seconds", "1",
                         "--reps", "1", "--bitrate", "200M"])
    rep = report(tmp_path, "two")
    found = host_findings(rep)
    assert code == 1 and found.pop("n2") == ("fail", ("fabric-rail-slow",))
    assert {s for s, _ in found.values()} == {"pass"}
    n2 = next(f for f in rep["findings"] if f["check"] == "fabric-rails" and f["host"] == "n2")
    assert n2["summary"].startswith("eth1: slow with every partner") and "eth0" not in n2["summary"]
    fleet = next(f for f in rep["findings"] if f["check"] == "fabric-rails" and f["host"] is None)
    assert fleet["data"]["rail_names"] == ["eth0", "eth1"]
    assert [c["state"] for c in fleet["data"]["matrix"]["n2"]] == ["ok", "slow"]
