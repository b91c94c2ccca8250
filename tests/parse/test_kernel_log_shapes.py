"""The common kernel-log shapes read as dmesg is (issue 26): raw /dev/kmsg records with their
continuation lines, `journalctl -k -o short-monotonic` and `-o json`, and syslog's kern.log.
Each fixture is a real dmesg capture rewritten into one shape (tests/fixtures/kernel-log-shapes/
MANIFEST.tsv says how), so the events must be those of the capture itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.parse.kernel_log import parse_kernel_log

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "tests" / "fixtures" / "kernel-log-shapes"
CORPUS = ROOT / "tests" / "fixtures" / "corpus" / "kernel-log"
SXID = CORPUS / "h100-cc-nvswitch-sxid-22013-minion-dlreq.txt"
MLX5 = CORPUS / "mlx5-health-compromised-irisc-not-responding-cx6-fw20.txt"
HEALTHY = ROOT / "tests" / "fixtures" / "h200-device" / "bundle" / "hosts" / "vm" / "kernel-log.txt"


def _what(log):
    """Each event as the checks read it; the time as seconds since boot where the shape has it."""
    return [(e.kind, e.code, e.device, e.detail, e.severity, e.link, e.message) for e in log.events]


@pytest.mark.parametrize(("shape", "source", "host", "stamps"), [
    ("kmsg-raw-nvswitch-sxid-22013.txt", SXID, None, True),
    ("kmsg-raw-mlx5-health-compromised-cx6.txt", MLX5, None, True),
    ("journalctl-k-short-monotonic-nvswitch-sxid-22013.txt", SXID, "gpu017", True),
    ("journalctl-k-json-mlx5-health-compromised-cx6.txt", MLX5, "gpu017", True),
    ("syslog-kern-log-nvswitch-sxid-22013.txt", SXID, "gpu017", False),
    ("kmsg-raw-h200-healthy-boot.txt", HEALTHY, None, True),
    ("journalctl-k-json-h200-healthy-boot.txt", HEALTHY, "vm", True),
])
def test_each_shape_reads_as_the_dmesg_it_came_from(shape, source, host, stamps):
    original = parse_kernel_log(source.read_text())
    log = parse_kernel_log((SHAPES / shape).read_text())
    assert log.events and _what(log) == _what(original)
    assert {e.host for e in log.events} == {host}
    if stamps:  # the kmsg microseconds and the journal's monotonic time, as dmesg prints them
        assert [e.timestamp for e in log.events] == [e.timestamp for e in original.events]


def test_kmsg_continuation_lines_are_the_records_dictionary_not_messages():
    text = (SHAPES / "kmsg-raw-mlx5-health-compromised-cx6.txt").read_text()
    log = parse_kernel_log(text)
    # The health dump's firmware version folds in as in dmesg: the dictionary lines between the
    # records do not push the dump's lines apart.
    health = next(e for e in log.events if e.kind == "mlx5-health-compromised")
    assert health.raw == "3,5121,198542853543,-;mlx5_core 0000:5e:00.0: device's health compromised - reached miss count"
    assert log.line_count == len(text.splitlines())
    assert not any("SUBSYSTEM" in e.message or "DEVICE=" in e.message for e in log.events)


@pytest.mark.parametrize("shape", ["kmsg-raw-h200-healthy-boot.txt", "journalctl-k-json-h200-healthy-boot.txt"])
def test_a_healthy_excerpt_in_record_form_is_a_kernel_log(shape):
    """The first 40 records of the healthy H200 boot hold no driver message at all: before, the
    kmsg and JSON forms were refused as "not a kernel log" (no line had a known prefix)."""
    head = "".join((SHAPES / shape).read_text().splitlines(keepends=True)[:40])
    log = parse_kernel_log(head)
    assert log.events == () and log.line_count == 40


def test_a_journal_record_of_another_transport_is_not_the_kernels():
    """A service's own journal entry quoting a driver line is not a kernel event."""
    kernel = (SHAPES / "journalctl-k-json-mlx5-health-compromised-cx6.txt").read_text().splitlines()
    quoted = kernel[1].replace('"_TRANSPORT":"kernel"', '"_TRANSPORT":"stdout"')
    log = parse_kernel_log("\n".join([kernel[0], quoted]) + "\n")
    assert [e.kind for e in log.events] == []
