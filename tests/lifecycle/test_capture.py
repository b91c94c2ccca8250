"""The evidence the lifecycle keeps before a step (preflight/lifecycle/capture.py), collected over
real SSH from simulated nodes (tests/simcluster.py): one with the driver's nvidia-bug-report.sh,
one without it (the fallback set: kernel log, nvidia-smi -q, the fabric manager's and the
persistence daemon's journals, ibstat, the IB ports' sysfs state), one whose report hangs and is
cut at the limit, and one that cannot be reached.

The recorded outputs are real (tests/fixtures/recorded/MANIFEST.tsv, the healthy H200 node's
captures in tests/nodes.py). The bug report's bytes are opaque to preflight (stored, never
parsed): its stand-in is a real `nvidia-smi -q` capture gzipped, as the script gzips each section
it appends to its --output-file."""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from netfaults import controller_ssh_stalled
from nodes import SMI_Q, healthy_h200
from simcluster import Reply, SimCluster, SimHost

from preflight.collect.ssh import SshNode, SshOptions
from preflight.lifecycle import capture
from preflight.model import Host

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "recorded"
FM_JOURNAL = RECORDED / "journalctl-u-nvidia-fabricmanager-pre-nvl5-start-then-stop-nvtrust-128.txt"
PERSISTENCED_JOURNAL = RECORDED / "journalctl-nvidia-persistenced-start-then-signal-15-persistenced-2.txt"
SMI_Q_CAPTURE = ROOT / "tests" / "fixtures" / "corpus" / "h200-vm" / "smi-q.txt"
REPORT_LINE = f"{capture.BUG_REPORT_SCRIPT} --safe-mode --output-file {capture.BUG_REPORT}"


def journals(node: SimHost) -> SimHost:
    """The node's systemd journal of the fabric manager and the persistence daemon (real lines)."""
    return replace(node, commands={
        **node.commands,
        f"journalctl -u nvidia-fabricmanager -b --no-pager -n {capture.JOURNAL_LINES}": Reply(FM_JOURNAL),
        f"journalctl -u nvidia-persistenced -b --no-pager -n {capture.JOURNAL_LINES}": Reply(PERSISTENCED_JOURNAL)})


def with_bug_report(node: SimHost, report: Path, sleep_s: float = 0) -> SimHost:
    """The driver's script: writes its gzipped log where --output-file says (plus .gz)."""
    return replace(node, commands={**node.commands, REPORT_LINE: Reply(
        "nvidia-bug-report.sh will now collect information about your system\n", sleep_s=sleep_s,
        files=((capture.BUG_REPORT + ".gz", report),))})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("capture")
    report = work / "stand-in.log.gz"
    report.write_bytes(gzip.compress(SMI_Q_CAPTURE.read_bytes()))
    hosts = [with_bug_report(journals(healthy_h200("gpu01")), report), journals(healthy_h200("gpu02")),
             with_bug_report(journals(healthy_h200("gpu03")), report, sleep_s=3600), SimHost("gpu04", down=True)]
    with SimCluster(hosts, work) as cluster:
        cluster.report = report
        yield cluster


def node(cluster, name: str, connect_timeout_s: float = 5) -> SshNode:
    return SshNode(Host(name), SshOptions(ssh_config=cluster.ssh_config, known_hosts=cluster.known_hosts,
                                          identity=cluster.identity, connect_timeout_s=connect_timeout_s))


def collected(cluster, name: str, step: str, directory: Path, limits: capture.Limits) -> capture.Capture:
    """The lifecycle's capture of ``name`` before ``step``, over a connection of its own."""
    n = node(cluster, name)
    try:
        return capture.collect(n, step, directory, limits)
    finally:
        n.close()


def test_the_bug_report_is_kept_where_the_node_has_the_script(fleet, tmp_path):
    n = node(fleet, "gpu01")
    try:
        cap = capture.collect(n, "reset", tmp_path / "c", capture.Limits(60, 1 << 20))
        left = n.run(["ls", "/var/tmp"], timeout=10).stdout.decode()
    finally:
        n.close()
    assert (cap.outcome, cap.source, cap.why) == ("complete", "nvidia-bug-report", ""), cap
    kept = (tmp_path / "c" / "nvidia-bug-report.log.gz").read_bytes()
    assert kept == fleet.report.read_bytes() and cap.bytes == len(kept)
    assert gzip.decompress(kept) == SMI_Q_CAPTURE.read_bytes()
    assert [p.name for p in cap.parts] == ["nvidia-bug-report.sh", "nvidia-bug-report.log.gz"]
    assert cap.parts[0].argv == ("nvidia-bug-report.sh", "--safe-mode", "--output-file", capture.BUG_REPORT)
    assert "preflight-nvidia-bug-report" not in left  # read back, then removed from the node
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o700  # a node's logs and configuration: its operators'
    manifest = json.loads((tmp_path / "c" / "capture.json").read_text())
    assert manifest["outcome"] == "complete" and manifest["parts"][1]["bytes"] == len(kept)


def test_without_the_script_the_fallback_set_is_kept(fleet, tmp_path):
    cap = collected(fleet, "gpu02", "reboot", tmp_path / "c", capture.Limits(120, 8 << 20))
    d = tmp_path / "c"
    assert cap.source == "fallback" and cap.outcome == "complete", cap
    assert cap.why == "not on the node: nvidia-bug-report.sh, mlxlink"  # no MFT: the ports' state from sysfs
    h200 = healthy_h200("gpu02")
    assert (d / "kernel-log.txt").read_text() == h200.commands["dmesg"].stdout  # the real H200's dmesg
    assert (d / "nvidia-smi-q.txt").read_text() == h200.commands[SMI_Q].stdout
    assert (d / "nvidia-fabricmanager.journal.txt").read_bytes() == FM_JOURNAL.read_bytes()
    assert (d / "nvidia-persistenced.journal.txt").read_bytes() == PERSISTENCED_JOURNAL.read_bytes()
    assert (d / "ibstat.txt").read_text() == h200.commands["ibstat"].stdout
    port = (d / "ib-port-mlx5_0.txt").read_text()
    assert "/sys/class/infiniband/mlx5_0/ports/1/state:4: ACTIVE" in port
    assert "/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed:0" in port
    assert sum(p.bytes for p in cap.parts) == cap.bytes == sum(f.stat().st_size for f in d.iterdir()
                                                              if f.name != "capture.json")


def test_the_size_limit_cuts_and_says_so(fleet, tmp_path):
    cap = collected(fleet, "gpu02", "reset", tmp_path / "c", capture.Limits(120, 3000))
    assert cap.bytes == 3000 and cap.outcome == "partial" and "cut at the size limit" in cap.why
    assert [p.name for p in cap.parts if p.truncated] == ["kernel-log.txt"]


def test_a_hung_report_is_cut_at_the_limit_and_what_it_wrote_is_looked_for(fleet, tmp_path):
    """At the shortest limit a site may set (20 s, of which each command keeps 15 s for the
    transport's kill grace): the report still runs (once it did not, by a rounding), is killed,
    and the read-back and the clean-up still fit."""
    started = time.monotonic()
    cap = collected(fleet, "gpu03", "reset", tmp_path / "c", capture.Limits(20, 1 << 20))
    took = time.monotonic() - started
    assert took <= 20 and cap.seconds <= 20, (took, cap)
    assert cap.outcome == "timed-out" and cap.parts[0].timed_out and "nvidia-bug-report.sh" in cap.why
    assert cap.parts[0].seconds >= 2  # it ran, for what the limit left it
    # The read-back ran (the script writes nothing before its first section here) and says so.
    assert [p.name for p in cap.parts] == ["nvidia-bug-report.sh", "nvidia-bug-report.log.gz"]
    assert cap.parts[1].error == f"the report was not found on the node at {capture.BUG_REPORT}.gz"
    assert not (tmp_path / "c" / "nvidia-bug-report.log.gz").exists()


def test_a_transport_that_hangs_past_the_limit_is_cut_by_the_watchdog(fleet, tmp_path):
    """The SSH handshake itself hangs (the node's SYN stalls on its port) under a connect timeout
    longer than the capture's limit (a machine so loaded that paramiko's own waits ran long once
    made a 20 s capture take 68 s): the capture returns at its limit, timed out, saying where."""
    slow = node(fleet, "gpu02", connect_timeout_s=120)
    with controller_ssh_stalled(fleet, "gpu02"):
        started = time.monotonic()
        cap = capture.collect(slow, "reset", tmp_path / "c", capture.Limits(20, 1 << 20))
        took = time.monotonic() - started
    slow.close()  # the stall is gone: the connect left behind ends, and with it the worker
    assert took < 21 and cap.seconds < 21, (took, cap)
    assert cap.outcome == "timed-out" and cap.parts == [] and "passed in the SSH connection" in cap.why, cap
    assert json.loads((tmp_path / "c" / "capture.json").read_text())["outcome"] == "timed-out"


def test_a_node_that_cannot_be_reached_is_a_failed_capture_not_an_error(fleet, tmp_path):
    cap = collected(fleet, "gpu04", "reset", tmp_path / "c", capture.Limits(40, 1 << 20))
    assert cap.outcome == "failed" and "connection refused" in cap.why, cap
    assert cap.bytes == 0


def test_a_capture_of_zero_seconds_is_skipped(tmp_path):
    cap = capture.collect(None, "reset", tmp_path / "c", capture.Limits(0, 1))  # type: ignore[arg-type]
    assert cap.outcome == "skipped" and not (tmp_path / "c").exists()
