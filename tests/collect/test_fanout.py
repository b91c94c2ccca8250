"""The fan-out's scheduling on one node, with real processes on this machine (LocalNode): a hung
tool is waited for once, the node's deadline holds, and a timeout ends the whole process group."""

from __future__ import annotations

import os
import time

from preflight.collect.fanout import ExecPlan, run_node
from preflight.collect.local import LocalNode
from preflight.collect.probe import Probe
from preflight.model import ProbeResult
from preflight.node.schedule import NodeSchedule, hung_tool_of


def probe(pid: str, script: str, tool: str, active: bool = False, calls: tuple[str, ...] = ()) -> Probe:
    return Probe(pid, ("sh", "-c", script), pid, tool, calls=calls, active=active)


def result(p: Probe, timed_out=False, error=None) -> ProbeResult:
    return ProbeResult(p.id, "n", p.argv, b"", "", None if timed_out else 0, "t", 3.0, timed_out, error)


def test_after_a_hang_the_tools_other_probes_are_passed_over_with_the_reason():
    a, b, c = probe("a", "x", "nvidia-smi"), probe("b", "x", "nvidia-smi"), probe("c", "x", "dmesg")
    s = NodeSchedule([a, b, c], deadline=float("inf"))
    first, skipped = s.next()
    assert first is a and skipped == []
    s.finished(a, result(a, timed_out=True), connected=True)
    nxt, skipped = s.next()
    assert nxt is c
    assert skipped == [(b, "not run: nvidia-smi hung in a on this node (sh -c x stopped after 3 s)")]


def test_a_hung_tool_passes_over_every_later_probe_whose_script_calls_it():
    """Issue 26: the all_reduce probe's script counts GPUs with nvidia-smi; once nvidia-smi hung
    on the node, the probe is passed over, naming the tool and the probe it hung in, instead of
    waiting for nvidia-smi again. A probe that calls other tools only is still run."""
    smi = probe("nvidia-smi-q-x", "x", "nvidia-smi")
    bench = probe("nccl-all-reduce", "x", "all_reduce_perf", active=True, calls=("nvidia-smi", "python3"))
    dcgm = probe("dcgmi-diag", "x", "dcgmi", active=True)
    s = NodeSchedule([smi, dcgm, bench], deadline=float("inf"))
    assert s.next() == (smi, [])
    s.finished(smi, result(smi, timed_out=True), connected=True)
    assert s.next() == (dcgm, [])
    s.finished(dcgm, result(dcgm), connected=True)
    why = "not run: nvidia-smi hung in nvidia-smi-q-x on this node (sh -c x stopped after 3 s)"
    assert s.next() == (None, [(bench, why)])
    assert hung_tool_of(why) == "nvidia-smi"


def test_a_timeout_blames_the_probes_own_tool_not_the_ones_its_script_also_calls():
    bench = probe("nccl-all-reduce", "x", "all_reduce_perf", calls=("nvidia-smi",))
    smi = probe("nvidia-smi-q", "x", "nvidia-smi")
    s = NodeSchedule([bench, smi], deadline=float("inf"))
    assert s.next() == (bench, [])
    s.finished(bench, result(bench, timed_out=True), connected=True)
    assert s.next() == (smi, [])
    assert set(s.hung) == {"all_reduce_perf"}


def test_only_a_hang_reads_as_a_hung_tool():
    assert hung_tool_of("not run: nvidia-smi hung on this node (nvidia-smi -q stopped after 10 s)") == "nvidia-smi"
    for other in (None, "", "not run: the node's deadline passed (--node-timeout)",
                  "connection lost: ssh channel failed: EOF", "ssh: connect to host gpu01 port 22: hung in x"):
        assert hung_tool_of(other) is None


def test_past_the_deadline_or_after_the_connection_died_nothing_more_starts():
    now = [0.0]
    a, b, c = probe("a", "x", "t1"), probe("b", "x", "t2"), probe("c", "x", "t3")
    s = NodeSchedule([a, b, c], deadline=10.0, clock=lambda: now[0])
    assert s.next()[0] is a
    now[0] = 11.0
    assert s.next() == (None, [(b, "not run: the node's deadline passed (--node-timeout)"),
                               (c, "not run: the node's deadline passed (--node-timeout)")])
    s2 = NodeSchedule([a, b], deadline=float("inf"))
    s2.next()
    s2.finished(a, result(a, error="ssh channel failed: EOF"), connected=False)
    assert s2.next() == (None, [(b, "connection lost: ssh channel failed: EOF")])


def test_a_hung_tool_costs_one_timeout_on_a_real_node():
    hang = "sleep 60"
    probes = (probe("smi-1", hang, "nvidia-smi"), probe("smi-2", hang, "nvidia-smi"),
              probe("smi-3", hang, "nvidia-smi"), probe("log", "echo ok", "dmesg"),
              probe("bench", "echo bench", "all_reduce_perf", active=True))
    got: list[ProbeResult] = []
    started = time.monotonic()
    run_node(LocalNode("n"), ExecPlan(probes, timeout_s=1.0, per_node=1), got.append)
    elapsed = time.monotonic() - started
    by = {r.probe: r for r in got}
    assert len(got) == 5 and elapsed < 4, elapsed  # one timeout, not three
    assert by["smi-1"].timed_out and by["smi-1"].exit_code is None
    assert by["smi-2"].error == by["smi-3"].error == "not run: nvidia-smi hung in smi-1 on this node (sh -c " \
                                                     f"sleep 60 stopped after {by['smi-1'].duration_s:g} s)"
    assert by["log"].stdout == b"ok\n" and by["bench"].stdout == b"bench\n"
    assert [r.probe for r in got][-1] == "bench"  # active probes run last, alone


def test_a_timeout_ends_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child"
    r = LocalNode("n").run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout=1.0)
    assert r.timed_out and r.exit_code is None
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the backgrounded sleep {child} outlived the timeout")


def test_after_active_readings_run_once_the_active_probes_are_done(tmp_path):
    """The IB counters' second reading must come after the benchmark, the first before it."""
    log = tmp_path / "order"
    step = lambda name: ("sh", "-c", f"echo {name} >> {log}")  # noqa: E731
    probes = (Probe("after", step("after"), "", "sh", after_active=True),
              Probe("bench", step("bench"), "", "sh", active=True),
              Probe("static", step("static"), "", "sh"))
    got: list[ProbeResult] = []
    run_node(LocalNode("n"), ExecPlan(probes, timeout_s=10), got.append)
    assert log.read_text().split() == ["static", "bench", "after"]


def test_a_run_without_active_probes_drops_the_after_reading():
    from preflight.app.run import probes_for
    from preflight.judge.loader import load_checks
    checks = [c for c in load_checks(use_entry_points=False) if c.id == "ib-counters"]
    assert [p.id for p in probes_for(checks)] == ["ib-counters"]
    both = [c for c in load_checks(use_entry_points=False) if c.id in ("ib-counters", "nccl-all-reduce")]
    assert [p.id for p in probes_for(both)] == ["ib-counters", "nccl-all-reduce", "ib-counters-after"]


def test_timeout_bounds_the_mlxfwmanager_probe():
    # mlxfwmanager's limit follows --timeout (4 x, the 120 s it had fixed at the default 30 s).
    from preflight.collect.fanout import ExecPlan
    from preflight.collect.probes import PROBES

    probe = PROBES["mlxfwmanager"]
    assert ExecPlan((probe,), 30.0).limit_for(probe) == 120.0
    assert ExecPlan((probe,), 5.0).limit_for(probe) == 20.0
    assert ExecPlan((PROBES["ibstat"],), 5.0).limit_for(PROBES["ibstat"]) == 5.0
