"""The rail stage's saved record: written, read back, and read into measurements; a damaged
record is a ParseError (the check's ERROR), never anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.fabric.pairing import Rail
from preflight.fabric.record import PairRecord, RunRecord, Side, dump, load, measurements
from preflight.parse import ParseError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BW = (FIXTURES / "perftest" / "cx7-ndr-ib_write_bw-report_gbits.txt").read_text()
LAT = (FIXTURES / "perftest" / "dgx-spark-ib_write_lat-rdma_cm.txt").read_text()
OK = (FIXTURES / "iperf3" / "client-veth-t1.json").read_text()
REFUSED = (FIXTURES / "iperf3" / "client-connection-refused.json").read_text()
NDR = Rail("mlx5_0", 1, None, 400.0, "InfiniBand")


def side(stdout: str = "", error: str | None = None, timed_out: bool = False) -> Side:
    return Side(("tool",), None if error else 0, 1.0, timed_out, error, stdout, "")


def test_round_trip_and_perftest_measurements_with_latency():
    rec = PairRecord(2, "ib_write_bw", "a", "b", 1, (NDR,), (NDR,),
                     (RunRecord(0, 1, "bw", side(BW), side(BW)), RunRecord(0, 0, "lat", side(LAT), side(LAT))))
    back = load(dump(rec).decode())
    assert back == rec
    [m] = measurements(back)
    assert (m.node, m.partner, m.rail, m.gbps, m.latency_us) == ("a", "b", 0, pytest.approx(392.34), 1.47)


def test_iperf3_measurements_and_what_did_not_measure():
    eth = Rail("eth0", None, "10.0.0.2")
    rec = PairRecord(1, "iperf3", "a", "b", 3, (eth,), (eth,), (
        RunRecord(0, 1, "bw", side(OK), side("")),
        RunRecord(0, 2, "bw", side(REFUSED), side("")),
        RunRecord(0, 3, "bw", side(""), side(error="ssh: connection refused"))))
    got = measurements(rec)
    assert got[0].gbps == pytest.approx(6.3339, abs=1e-3) and got[0].why is None
    assert got[1].gbps is None and "Connection refused" in got[1].why and got[1].unreachable
    assert got[2].gbps is None and got[2].why.startswith("partner side did not start") and got[2].unreachable


@pytest.mark.parametrize("text", ["", "not json", "{}", '{"format": "preflight-fabric-rail/1"}',
                                  '{"format": "preflight-fabric-rail/1", "round": 1, "tool": "iperf3", "node": "a", '
                                  '"partner": "b", "reps": 1, "node_rails": [{"bogus": 1}], "partner_rails": [], '
                                  '"runs": []}'])
def test_a_damaged_record_is_a_parse_error(text):
    with pytest.raises(ParseError):
        load(text)


def test_the_side_that_did_not_answer_is_the_one_named():
    eth = Rail("eth0", None, "10.0.0.2")
    rec = PairRecord(2, "iperf3", "a", "b", 1, (eth,), (eth,), (
        RunRecord(0, 1, "bw", side(error="connect timed out"), side(error="not run: a did not answer (connect timed out)")),))
    [m] = measurements(rec)
    assert m.why == "client side did not start: connect timed out" and m.unreachable
