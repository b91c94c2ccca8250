"""`preflight fabric` with ib_write_bw, end to end over real sshd in network namespaces. RDMA cannot
run here, so perftest on the nodes is a shim replaying REAL captures (tests/fixtures/perftest,
provenance in its SOURCES.tsv; the nodes' `ibv_devinfo -v` is corpus
ibv/ibv-devinfo-cx7-roce-fw28.39-raw-tabs.txt, three ACTIVE RoCE ports): every command line the
stage runs is answered, so its construction (device, port, TCP port, GID index, the partner's
name), its transport, the saved record, the parse and the judgement are the real ones. The
fault: every test touching g3 answers with the 196.07 Gb/s capture (a 200 Gb/s port), the
others with the 392.34 Gb/s NDR capture, as a node whose ports trained at half rate would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from simcluster import Reply, SimHost

from preflight.app.cli import main
from preflight.collect.fabric_rails import RailOptions, client_argv, server_argv
from preflight.fabric.pairing import plan_rail_rounds
from preflight.fabric.rails import rails_from_ibv_devinfo

pytestmark = pytest.mark.root

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DEVINFO = (FIXTURES / "corpus" / "ibv" / "ibv-devinfo-cx7-roce-fw28.39-raw-tabs.txt").read_text()
NDR = (FIXTURES / "perftest" / "cx7-ndr-ib_write_bw-report_gbits.txt").read_text()
HALF = (FIXTURES / "perftest" / "roce-200g-ib_write_bw-client-a-report_gbits.txt").read_text()
SERVER = (FIXTURES / "perftest" / "roce-200g-ib_write_bw-server-default.txt").read_text()
LAT = (FIXTURES / "perftest" / "dgx-spark-ib_write_lat-rdma_cm.txt").read_text()
HOSTS = ["g1", "g2", "g3", "g4"]
OPTIONS = RailOptions("ib_write_bw", reps=1, seconds=5.0, gid_index=3)


def replies() -> dict[str, dict[str, Reply]]:
    rails = rails_from_ibv_devinfo(DEVINFO)
    out: dict[str, dict[str, Reply]] = {h: {"ibv_devinfo -v": Reply(DEVINFO)} for h in HOSTS}
    for rnd in plan_rail_rounds(HOSTS).rounds:
        for a, b in rnd.pairs:
            for i, rail in enumerate(rails):
                port = OPTIONS.base_port + i
                bw = HALF if "g3" in (a, b) else NDR
                for test, client_says in (("bw", bw), ("lat", LAT)):
                    out[a][" ".join(client_argv(OPTIONS, rail, port, b, i, test))] = Reply(client_says)
                    out[b][" ".join(server_argv(OPTIONS, rail, port, i, test))] = Reply(SERVER if test == "bw" else LAT)
    return out


def test_ib_write_bw_rails_judged_and_the_half_rate_node_blamed(sim_cluster, tmp_path):
    cluster = sim_cluster([SimHost(h, commands) for h, commands in replies().items()])
    code = main(["fabric", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                 "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                 "--out", str(tmp_path), "--run-id", "ib", "-q", "--no-db", "--reps", "1", "--gid-index", "3"])
    report = json.loads((tmp_path / "ib" / "report.json").read_text())
    found = {f["host"]: f for f in report["findings"] if f["check"] == "fabric-rails" and f["host"]}
    assert code == 1 and found["g3"]["status"] == "fail" and found["g3"]["symptoms"] == ["fabric-rail-slow"]
    assert {h: f["status"] for h, f in found.items() if h != "g3"} == {"g1": "pass", "g2": "pass", "g4": "pass"}
    # Every rail of g3 is named, with its HCA and port, and the partners it was slow with.
    for rail in ("mlx5_0:1", "mlx5_1:1", "mlx5_2:1"):
        assert rail in found["g3"]["summary"]
    fleet = next(f for f in report["findings"] if f["check"] == "fabric-rails" and f["host"] is None)
    assert fleet["data"]["rail_names"] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1"]
    assert fleet["data"]["medians_gbps"] == {"0": 392.34, "1": 392.34, "2": 392.34}
    assert [c["state"] for c in fleet["data"]["matrix"]["g3"]] == ["slow"] * 3
    # Every pair's bandwidth and its ib_write_lat figure (reported, not judged) per rail.
    g1 = found["g1"]["data"]["rails"]["mlx5_0:1"]
    assert all(v["state"] == "ok" and v["gbps"] == 392.34 for k, v in g1.items() if k != "g3")
    assert {v["latency_us"] for v in g1.values()} == {1.47}
