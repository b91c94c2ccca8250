"""What the store holds is printed as data (issue 31): a node name holding ESC, BEL, CR or a
newline, and a PCI-bus-id-like ``:ab:`` that rich would turn into an emoji, reach ``history``,
``history --fleet``, ``lifecycle`` and the RMA summary escaped, on one line, and never
interpreted; ``--json`` keeps them exact. The RMA summary of a report whose evidence has an
unexpected shape names the file and field instead of ending in a traceback."""

from __future__ import annotations

import json
import time

import pytest
import runs

from preflight.app import cli
from preflight.store import Store, location
from preflight.store import lifecycle as kept
from preflight.store.rows import rows_of

# A terminal title set, the screen cleared, a bell, a line overwritten, a line of its own and a
# Markdown heading, and ":ab:" (rich's emoji code for the AB button) as in 00000000:AB:00.0.
NODE = "gpu:ab:01\x1b]0;owned\x07\x1b[2J\rX\n# fake heading"
SHOWN = "gpu:ab:01\\x1b]0;owned\\x07\\x1b[2J\\rX\\n# fake heading"
RAW = ("\x1b", "\x07", "\r", "🆎")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def hostile_store(store_url, tmp_path) -> str:
    """Three incidents of NODE (a repeat offender), the last one's report on disk with
    evidence of shapes report.json never has, and a lifecycle state for NODE."""
    url = location.parse(store_url)
    with Store.open(url, create=True) as store:
        for i in range(5):  # failing, passing, failing ...: three incidents
            node = {"fail": ["xid"], "causes": ["gpu-fallen-off-bus"]} if i % 2 == 0 else {}
            report = runs.report(f"r{i}", 30 + i / 10, {NODE: node})
            report_dir = tmp_path / f"r{i}"
            if i == 4:
                report["findings"][0]["evidence"] = ["a string", {"probe": "kernel-log", "excerpt": ""},
                                                     {"probe": "dmesg", "excerpt": "NVRM: Xid (PCI:0000:ab:00): 79\nmore"}]
                report["findings"].append({"host": NODE, "check": "nvlink", "status": "fail", "summary": "s",
                                           "evidence": "not a list"})
                report_dir.mkdir()
                (report_dir / "report.json").write_text(json.dumps(report))
            store.record(rows_of(report, started_fallback=0.0, command="test", report_dir=str(report_dir)))
        # A step the lifecycle took, its capture and its outcome, each holding the hostile text.
        at = time.time() - 1800
        kept.put_state(store, {"node": NODE, "state": "drained", "since": time.time() - 3600,
                               "cause": "gpu-fallen-off-bus", "run_id": "r4", "step": None, "requested": None,
                               "retest_failures": 0}, None, (
            {"kind": "capture", "actor": "t", "at": at, "reason": NODE,
             "detail": {"step": "reboot", "outcome": "failed", "why": NODE, "directory": NODE, "bytes": 0,
                        "seconds": 1.0, "source": "", "step_at": at}},
            {"kind": "reboot", "actor": "t", "at": at, "reason": f"preflight: remediating {NODE}"},
            {"kind": "outcome", "actor": "t", "at": at + 60, "reason": NODE, "run_id": NODE,
             "detail": {"cause": "gpu-fallen-off-bus", "step": "reboot", "outcome": "ambiguous", "step_at": at,
                        "reading": NODE}}))
    return store_url


def _clean(out: str) -> None:
    for raw in RAW:
        assert raw not in out, (raw, out)


def test_history_prints_a_hostile_node_name_escaped_and_json_keeps_it(hostile_store, capsys):
    code, out, _ = run(capsys, "history", NODE, "--since", "3650d", "--db", hostile_store)
    assert code == 0
    _clean(out)
    lines = out.splitlines()
    # The heading, one line per run and one per event (a step, its capture, its outcome).
    assert lines[0].startswith(f"{SHOWN}: 5 run(s)") and len(lines) == 1 + 5 + 3
    code, out, _ = run(capsys, "history", NODE, "--since", "3650d", "--json", "--db", hostile_store)
    assert code == 0 and json.loads(out)["node"] == NODE


def test_the_fleet_view_and_the_lifecycle_listing_escape_it(hostile_store, capsys):
    code, out, _ = run(capsys, "history", "--fleet", "--since", "3650d", "--db", hostile_store)
    assert code == 0 and f"  {SHOWN}  gpu-fallen-off-bus  3 incidents" in out
    _clean(out)
    code, out, _ = run(capsys, "lifecycle", "--db", hostile_store)
    assert code == 0 and f"  {SHOWN}  for 1.0 h  gpu-fallen-off-bus  run r4" in out
    _clean(out)
    code, out, _ = run(capsys, "lifecycle", "--json", "--db", hostile_store)
    assert json.loads(out)["states"]["drained"][0]["node"] == NODE


def test_the_rma_summary_keeps_its_headings_and_names_evidence_it_could_not_read(hostile_store, tmp_path, capsys):
    code, out, err = run(capsys, "lifecycle", NODE, "--rma", "--since", "3650d", "--db", hostile_store)
    assert code == 0, err
    _clean(out)
    headings = [line for line in out.splitlines() if line.startswith("#")]
    assert headings == [f"# RMA summary: {SHOWN}", "## GPUs", "## NICs", "## Incidents (3)",
                        "## Remediation steps (1)", "## Kernel log", "## DCGM error codes", "## Not in the evidence"]
    assert f" reboot (preflight: remediating {SHOWN}): ambiguous ({SHOWN})\n" in out
    assert f"  - evidence kept before it: failed, 0 bytes in 1.0 s: {SHOWN}\n" in out
    report = tmp_path / "r4" / "report.json"
    assert f"- evidence left out: {report}: findings[0].evidence[0]: a {{probe, excerpt}} record expected, not str" in out
    assert f"- evidence left out: {report}: findings[1].evidence: a list of {{probe, excerpt}} records expected" in out
    assert "    `dmesg`: NVRM: Xid (PCI:0000:ab:00): 79" in out and "    `kernel-log`: " in out
