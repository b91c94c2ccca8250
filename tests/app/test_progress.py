"""The live view's bookkeeping and what it draws, without a terminal."""

from __future__ import annotations

from rich.console import Console

from preflight.app.progress import RunProgress, render
from preflight.model import ProbeResult


def result(host: str, probe: str, error: str | None = None) -> ProbeResult:
    return ProbeResult(probe, host, (probe,), None if error else b"x", "", None if error else 0, "t", 0.1,
                       False, error)


def test_hosts_move_from_not_heard_to_partly_heard_to_done_and_failed():
    now = [100.0]
    p = RunProgress(["a", "b", "c", "d"], probes_per_host=2, clock=lambda: now[0])
    s = p.snapshot()
    assert (s.done, s.failed, s.running, s.waiting) == (0, 0, 0, 4)
    p.record(result("a", "p1"))
    p.record(result("b", "p1", error="connection refused"))
    p.record(result("b", "p2", error="connection refused"))
    p.record(result("c", "p1"))
    p.record(result("c", "p2"))
    now[0] = 112.0
    s = p.snapshot()
    assert (s.done, s.failed, s.running, s.waiting) == (2, 1, 1, 1)
    assert s.behind == (("d", 0), ("a", 1)) and s.elapsed_s == 12.0
    # A result for a host already finished (the multi-node stage's) changes nothing.
    p.record(result("c", "nccl-multinode"))
    assert p.snapshot().done == 2


def test_the_view_shows_counts_and_the_slowest_hosts():
    p = RunProgress([f"gpu{i:02d}" for i in range(1, 9)], probes_per_host=15, clock=lambda: 0.0)
    for i in range(1, 8):
        for n in range(15 if i < 6 else i):
            p.record(result(f"gpu{i:02d}", f"p{n}", error="refused" if i == 5 else None))
    console = Console(record=True, width=100)
    console.print(render(p.snapshot(), 15))
    text = console.export_text()
    assert "preflight run: 5 of 8 hosts done" in text
    assert "furthest behind: gpu08 (0/15), gpu06 (6/15), gpu07 (7/15)" in " ".join(text.split())
    row = next(line for line in text.splitlines() if line.strip().startswith("5"))
    # done, failed, in progress, waiting; judged, failing (no host judged yet)
    assert [c for c in row.split() if c != "│"] == ["5", "1", "2", "1", "0", "0"]


def test_hosts_failing_their_own_checks_show_before_the_run_ends():
    """A run judges each host as its records complete (judge/incremental.py); the view counts
    them and names the failing ones, in inventory order, a later verdict replacing an earlier."""
    hosts = [f"gpu{i:02d}" for i in range(1, 10)]
    p = RunProgress(hosts, probes_per_host=1, clock=lambda: 0.0)
    for host, verdict in [("gpu03", "fail"), ("gpu01", "pass"), ("gpu09", "error"), ("gpu02", "warn"),
                          ("gpu05", "fail"), ("gpu04", "fail"), ("gpu06", "fail"), ("gpu07", "fail")]:
        p.judged(host, verdict)
    p.judged("gpu07", "pass")  # judged again on more records
    s = p.snapshot()
    assert s.judged == 8 and s.failing == ("gpu03", "gpu04", "gpu05", "gpu06", "gpu09")
    p.judged("gpu08", "fail")
    console = Console(record=True, width=120)
    console.print(render(p.snapshot(), 1))
    text = " ".join(console.export_text().split())
    assert "failing their own checks: gpu03, gpu04, gpu05, gpu06, gpu08 and 1 more" in text


def test_plain_lines_name_each_verdict_once_and_what_a_slow_run_waits_on():
    """Off a terminal (a CI log, `| tee`) the run's progress is lines (preflight/app/run_output.py):
    a host's verdict once it is judged (again only when a later judgement changes it), and a
    heartbeat naming the hosts furthest behind."""
    from preflight.app.run_output import ProgressLines

    now = [0.0]
    lines: list[str] = []
    tracker = RunProgress(["gpu01", "gpu02", "gpu03"], probes_per_host=2, clock=lambda: now[0])
    out = ProgressLines(tracker, 2, lines.append, every_s=0)
    out.start(3)
    for r in (result("gpu01", "p1"), result("gpu01", "p2"), result("gpu02", "p1")):
        tracker.record(r)
    now[0] = 4.0
    out.judged("gpu01", "fail")
    out.judged("gpu01", "fail")  # judged again on the same verdict: nothing new to say
    now[0] = 31.0
    out.heartbeat()
    for r in (result("gpu02", "p2"), result("gpu03", "p1", "refused"), result("gpu03", "p2", "refused")):
        tracker.record(r)
    out.judged("gpu03", "error")
    out.heartbeat()
    out.stop()
    assert lines == [
        "preflight run: 3 hosts, 2 probes each",
        "preflight run: gpu01 FAIL (1 of 3 hosts judged, 4 s)",
        "preflight run: 1 of 3 hosts done, 1 partly heard, 1 not heard yet, 31 s; "
        "furthest behind: gpu03 (0/2), gpu02 (1/2)",
        "preflight run: gpu03 ERROR (2 of 3 hosts judged, 31 s)",
        "preflight run: all 3 hosts probed, 31 s; the fleet's stages and the judgement go on",
    ]


def test_the_heartbeat_runs_on_its_own_until_stopped():
    import threading

    from preflight.app.run_output import ProgressLines

    lines: list[str] = []
    beat = threading.Event()
    out = ProgressLines(RunProgress(["gpu01"], 1), 1, lambda line: (lines.append(line), beat.set()), every_s=0.01)
    beat.clear()
    out.start(1)
    beat.clear()
    assert beat.wait(5)
    out.stop()
    count = len(lines)
    assert count >= 2 and lines[1].startswith("preflight run: 0 of 1 host done")
    assert len(lines) == count  # stopped: no more lines
