"""checks/ib_counters.py on real sysfs counter captures (tests/fixtures/corpus/ibcounters, provenance
in MANIFEST.tsv). A second reading is the same capture with the growth each test names: constructed
for the test, as the fixture provenance says."""

from pathlib import Path

from ctx import make_host, result, run_check

from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Status
from preflight.parse.ib_counters import parse_ib_counters

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus" / "ibcounters"
GPUD = (CORPUS / "mlx5-sysfs-counters-saturated-link-downed-xmit-discards-gpud943.txt").read_text()
I40IW = (CORPUS / "i40iw-sysfs-counters-na-no-pma-excerpt.txt").read_text()
BEFORE, AFTER = "ib-counters", "ib-counters-after"
KB = load_knowledge()
T0, T1 = "2026-12-01T10:00:00+00:00", "2026-12-01T10:10:00+00:00"  # a 600 s window


def grow(text: str, **values: int) -> str:
    """The capture with these counters set to new values (the constructed second reading)."""
    lines = []
    for line in text.splitlines():
        path, _, value = line.rpartition(":")
        name = path.rsplit("/", 1)[-1]
        lines.append(f"{path}:{values[name]}" if name in values else line)
    return "\n".join(lines) + "\n"


def with_state(text: str, state: str, phys: str) -> str:
    port = "/sys/class/infiniband/mlx5_1/ports/1"
    return text + f"{port}/state:{state}\n{port}/phys_state:{phys}\n{port}/link_layer:InfiniBand\n"


def judge(before: str, after: str | None = None, active=True):
    probes = {BEFORE: result(BEFORE, before, started=T0)}
    if after is not None:
        probes[AFTER] = result(AFTER, after, started=T1)
    if active:
        probes["nccl-all-reduce"] = result("nccl-all-reduce", "x")
    [f] = run_check("ib-counters", make_host(probes))
    return f


def causes(f):
    return {d.cause for d in diagnose([f], KB)}


def test_parser_reads_the_real_capture():
    (port,) = parse_ib_counters(GPUD).ports
    assert (port.device, port.port, port.counters["link_downed"], port.counters["port_xmit_discards"]) == (
        "mlx5_1", 1, 255, 65535)
    assert port.saturated() == ["link_downed", "port_xmit_discards", "excessive_buffer_overrun_errors"]
    (na,) = parse_ib_counters(I40IW).ports
    assert na.counters == {} and "link_downed (N/A (no PMA))" in na.unreadable


def test_single_reading_reports_history_and_saturation_with_the_caveat():
    f = judge(GPUD, active=False)
    assert f.status is Status.WARN and f.summary.startswith("one reading only")
    assert "at the maximum of their width, so further errors are not counted: mlx5_1 port 1 link_downed, " \
           "port_xmit_discards, excessive_buffer_overrun_errors" in f.summary
    assert f.symptoms == ("ib-counters-saturated",)  # its other error counters read 0
    assert "perfquery -x -R" in f.action
    f = judge(grow(GPUD, symbol_error=5), active=False)
    assert "non-zero since their last clear (history, not necessarily growth now): mlx5_1 port 1 symbol_error=5" \
           in f.summary
    assert set(f.symptoms) == {"ib-counters-nonzero", "ib-counters-saturated"}


def test_no_growth_between_identical_readings_only_warns_about_saturation():
    f = judge(GPUD, GPUD)
    assert f.status is Status.WARN and f.symptoms == ("ib-counters-saturated",)
    assert "counters over 600 s of nccl-all-reduce" in f.summary
    assert "lifetime values (context, not judged)" in f.summary


def test_symbol_errors_faster_than_the_ibta_bound_fail():
    after = grow(GPUD, symbol_error=37, link_error_recovery=2)  # 37 in 600 s = 222/hour > 120
    f = judge(GPUD, after)
    assert f.status is Status.FAIL
    assert "mlx5_1 port 1 symbol_error +37 (0 -> 37, 222/hour)" in f.summary
    assert "link_error_recovery +2" in f.summary
    assert "ib-link-errors" in causes(f)
    assert f.data["grew"] == {"mlx5_1 port 1": {"symbol_error": 37, "link_error_recovery": 2}}


def test_slow_symbol_error_growth_warns():
    f = judge(GPUD, grow(GPUD, symbol_error=3))  # 18/hour
    assert f.status is Status.WARN and "symbol_error +3" in f.summary


def test_saturated_counters_are_not_judged_on_growth():
    # link_downed reads 255 in both: it cannot show the flap, and the check says so instead.
    f = judge(GPUD, GPUD)
    assert "link_downed +" not in f.summary and "cannot be seen" in f.summary


def test_link_downed_growth_is_a_flap():
    # Counters as they would read after a clear (perfquery -R): the capture with the saturated
    # ones at 0, then link_downed 0 -> 1 in the second reading.
    cleared = grow(GPUD, link_downed=0, port_xmit_discards=0, excessive_buffer_overrun_errors=0)
    f = judge(cleared, grow(cleared, link_downed=1))
    assert f.status is Status.FAIL and "link_downed +1" in f.summary
    assert causes(f) == {"ib-link-flapping"}


def test_port_state_change_is_a_flap_and_explains_the_port_down():
    cleared = grow(GPUD, link_downed=0, port_xmit_discards=0, excessive_buffer_overrun_errors=0)
    f = judge(with_state(cleared, "4: ACTIVE", "5: LinkUp"), with_state(cleared, "1: DOWN", "2: Polling"))
    assert f.status is Status.FAIL
    assert "changed state during the tests: ACTIVE/LINKUP -> DOWN/POLLING" in f.summary
    assert causes(f) == {"ib-link-flapping"}  # the rule explains ib-port-down


def test_host_side_counters():
    cleared = grow(GPUD, link_downed=0, port_xmit_discards=0, excessive_buffer_overrun_errors=0)
    hw = "/sys/class/infiniband/mlx5_1/ports/1/hw_counters/out_of_buffer:"
    f = judge(cleared + hw + "0\n", cleared + hw + "1200\n")
    assert f.status is Status.WARN and "out_of_buffer +1200" in f.summary
    assert causes(f) == {"ib-host-buffer-exhausted"}


def test_clean_port_passes_and_no_device_skips():
    cleared = grow(GPUD, link_downed=0, port_xmit_discards=0, excessive_buffer_overrun_errors=0)
    f = judge(cleared, cleared)
    assert f.status is Status.PASS and "no error counter grew over 600 s" in f.summary
    # port_rcv_switch_relay_errors=2 is a switch's counter, not judged on an HCA port
    assert judge(cleared, active=False).status is Status.PASS
    assert judge("").status is Status.SKIP
    assert judge(I40IW).status is Status.SKIP


def test_cleared_during_the_window():
    f = judge(grow(GPUD, symbol_error=9), GPUD)
    assert f.status is Status.WARN and "cleared during the tests, growth unknown" in f.summary


def test_a_few_symbol_errors_in_a_short_window_warn():
    probes = {BEFORE: result(BEFORE, GPUD, started=T0),
              AFTER: result(AFTER, grow(GPUD, symbol_error=2), started="2026-12-01T10:00:05+00:00")}
    [f] = run_check("ib-counters", make_host(probes))
    assert f.status is Status.WARN and "symbol_error +2 (0 -> 2, 1440/hour)" in f.summary


PERFQUERY = (CORPUS / "perfquery-x-lid10-port1-all-zero-rhel75.txt").read_text()


def test_perfquery_tables_read_like_sysfs():
    (port,) = parse_ib_counters(PERFQUERY).ports
    assert (port.device, port.port, port.wide) == ("lid10", 1, True)
    assert port.counters["symbol_error"] == 0 and port.counters["VL15_dropped"] == 0 and len(port.counters) == 21
    f = judge(PERFQUERY, active=False)  # a user's ib-counters.txt holding perfquery -x output
    assert f.status is Status.PASS and "1 port(s): every error counter at 0" in f.summary
    # Extended counters are 64-bit: 255 there is a count, not a saturated 8-bit counter.
    f = judge(PERFQUERY.replace("LinkDownedCounter:...............0", "LinkDownedCounter:...............255"),
              active=False)
    assert f.symptoms == ("ib-counters-nonzero",)
