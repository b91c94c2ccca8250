"""perftest and iperf3 reports read from real captures (tests/fixtures/perftest/SOURCES.tsv,
tests/fixtures/iperf3/SOURCES.tsv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.parse import ParseError
from preflight.parse.iperf3 import parse_iperf3
from preflight.parse.perftest import parse_perftest

PERFTEST = Path(__file__).resolve().parents[1] / "fixtures" / "perftest"
IPERF3 = Path(__file__).resolve().parents[1] / "fixtures" / "iperf3"


def read(name: str) -> str:
    return (PERFTEST / name).read_text()


def test_every_capture_has_its_provenance():
    for folder in (PERFTEST, IPERF3):
        listed = {line.split("\t")[0] for line in (folder / "SOURCES.tsv").read_text().splitlines()[1:]}
        assert {p.name for p in folder.iterdir() if p.name != "SOURCES.tsv"} == listed


def test_ndr_ib_write_bw_in_gbits_with_a_warning_between_header_and_row():
    r = parse_perftest(read("cx7-ndr-ib_write_bw-report_gbits.txt"))
    assert (r.title, r.kind, r.device, r.link_type, r.gid_index, r.qps, r.unit) == (
        "RDMA_Write BW Test", "bw", "mlx5_0", "IB", None, 1, "Gb/sec")
    assert [(row.size, row.iterations, row.peak, row.average) for row in r.bw_rows] == [(65536, 5000, 392.38, 392.34)]
    assert r.average_gbits == pytest.approx(392.34)
    assert any("Conflicting CPU frequency" in n for n in r.notes)


def test_default_mib_units_convert_to_the_rate_the_message_rate_gives():
    r = parse_perftest(read("cx7-ndr-ib_send_bw-default-mib.txt"))
    assert r.unit == "MiB/sec"
    row = r.largest
    # MsgRate x message size is the bandwidth in the tool's own terms: 0.744912 Mpps x 64 KiB.
    by_rate = row.msg_rate_mpps * 1e6 * row.size * 8 / 1e9
    assert r.gbits(row) == pytest.approx(by_rate, rel=0.001)
    assert r.gbits(row) == pytest.approx(390.55, abs=0.01)


def test_roce_sweep_reads_every_size_and_the_largest_is_the_rate():
    r = parse_perftest(read("roce-200g-ib_write_bw-client-a-report_gbits.txt"))
    assert (r.link_type, r.gid_index) == ("Ethernet", 3)
    assert len(r.bw_rows) == 23 and r.bw_rows[0].size == 2 and r.bw_rows[0].average == pytest.approx(0.088598)
    assert r.largest.size == 8388608 and r.average_gbits == pytest.approx(196.07)


def test_server_side_header_unit_is_its_own_flag_not_the_measurement():
    """The captured server printed MB/sec over the client's Gb/s figure: read as MB/s it is ~1.6
    Gb/s on a 200 Gb/s link, which is why only the client's report is judged."""
    server = parse_perftest(read("roce-200g-ib_write_bw-server-default.txt"))
    client = parse_perftest(read("roce-200g-ib_write_bw-client-a-report_gbits.txt"))
    assert server.unit == "MB/sec" and server.largest.average == client.largest.average
    assert server.average_gbits < client.average_gbits / 100


def test_rdma_cm_multi_qp_and_post_list_layouts():
    q4 = parse_perftest(read("dgx-spark-ib_write_bw-q4-rdma_cm.txt"))
    assert (q4.qps, q4.device, q4.average_gbits) == (4, "rocep1s0f1", pytest.approx(111.71))
    post = parse_perftest(read("roce-ib_write_bw-postlist-duration-8b.txt"))
    assert (post.title, post.device, post.gid_index) == ("RDMA_Write Post List BW Test", "ib0", 2)
    assert post.largest.peak == 0.0 and post.largest.iterations == 224958464


@pytest.mark.parametrize("name,avg,p99", [("cx7-ndr-ib_send_lat.txt", 1.27, 1.37),
                                          ("dgx-spark-ib_write_lat-rdma_cm.txt", 1.47, 1.57)])
def test_latency_reports(name, avg, p99):
    r = parse_perftest(read(name))
    assert r.kind == "lat" and r.unit is None and len(r.lat_rows) == 1
    assert (r.lat_rows[0].size, r.lat_rows[0].t_avg, r.lat_rows[0].p99) == (2, avg, p99)


def test_output_without_results_is_not_a_report():
    with pytest.raises(ParseError):
        parse_perftest(" Couldn't connect to 10.0.0.2:18515\nUnable to open file descriptor for socket connection")
    cut = read("cx7-ndr-ib_write_bw-report_gbits.txt").split(" 65536")[0]
    assert parse_perftest(cut).bw_rows == () and parse_perftest(cut).notes[-1].startswith("results header without")


def test_iperf3_reports():
    ok = parse_iperf3((IPERF3 / "client-veth-t1.json").read_text())
    assert ok.error is None and ok.gbits == pytest.approx(6.3339, abs=1e-3) and ok.remote_host == "10.251.0.2"
    slow = parse_iperf3((IPERF3 / "client-veth-tbf-20mbit-t1.json").read_text())
    assert slow.gbits < 0.025 < ok.gbits
    for name, said in (("client-connection-refused.json", "Connection refused"),
                       ("client-link-down-connect-timeout.json", "Network is unreachable")):
        failed = parse_iperf3((IPERF3 / name).read_text())
        assert said in failed.error and failed.gbits is None
    with pytest.raises(ParseError):
        parse_iperf3("iperf3: error - unable to connect to server")
