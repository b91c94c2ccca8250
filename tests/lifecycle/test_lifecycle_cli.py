"""``preflight lifecycle`` on the command line, without a scheduler (each step handed to a person):
a pass over the shipped example's verdicts, the listing, a person's --clear, and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from preflight.app import cli
from preflight.store import Store, parse
from preflight.store import lifecycle as kept

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_pass_over_the_example_then_the_listing_and_a_clear(store_url, tmp_path, capsys):
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path), "-q", "--no-html", "--db", store_url)
    code, out, _ = run(capsys, "lifecycle", "--once", "--json", "--db", store_url)
    steps = {s["node"]: s for s in json.loads(out)["steps"]}
    assert code == 0
    # The NIC firmware mismatch is a fact one reading proves: drained (by a person: no scheduler).
    assert steps["gpu006"]["to"] == "drained" and steps["gpu006"]["done"] == [
        "for a person: drain gpu006 (preflight: drained nic-fw-driver-mismatch example)"]
    # An inactive NVLink and an unreachable host are confirmed first.
    assert steps["gpu007"]["to"] == steps["gpu009"]["to"] == "suspect"
    assert "gpu001" not in steps
    code, out, _ = run(capsys, "lifecycle", "--json", "--db", store_url)
    states = json.loads(out)["states"]
    assert [n["node"] for n in states["drained"]] == ["gpu006"] and states["drained"][0]["cause"] == \
        "nic-fw-driver-mismatch"
    assert [n["node"] for n in states["suspect"]] == ["gpu007", "gpu008", "gpu009"]
    code, out, _ = run(capsys, "lifecycle", "gpu006", "--clear", "--reason", "firmware flashed", "--db", store_url)
    assert code == 0 and "gpu006: drained -> healthy" in out
    code, out, _ = run(capsys, "history", "gpu006", "--since", "3650d", "--json", "--db", store_url)
    events = json.loads(out)["events"]
    assert events[-1]["reason"] == "-> healthy: cleared by a person: firmware flashed"


def test_watch_is_idempotent_and_stops_cleanly_at_sigterm(tmp_path, capsys):
    """--watch as a systemd unit runs it: passes every --interval over the same verdicts act once
    (the drain is handed to a person once, not every pass); SIGTERM between passes ends it with 0
    and the store's lock released."""
    db = f"sqlite:///{tmp_path}/s.sqlite"
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path), "-q", "--no-html", "--db", db)
    proc = subprocess.Popen([sys.executable, "-m", "preflight", "lifecycle", "--watch", "--interval", "0.2", "--json",
                             "--db", db], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(EXAMPLE.parents[1])})
    passes, buf = [], ""
    deadline = time.monotonic() + 60
    while len(passes) < 3 and time.monotonic() < deadline:
        buf += proc.stdout.readline()
        try:
            passes.append(json.loads(buf))
            buf = ""
        except json.JSONDecodeError:
            continue
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert len(passes) == 3 and proc.returncode == 0, err
    assert [s["node"] for s in passes[0]["steps"] if s["to"] == "drained"] == ["gpu006"]
    assert passes[1]["steps"] == passes[2]["steps"] == []
    code, out, _ = run(capsys, "history", "gpu006", "--since", "3650d", "--json", "--db", db)
    assert [e["kind"] for e in json.loads(out)["events"]] == ["transition", "for-a-person:drain"]
    with Store.open(parse(db), create=False) as store:
        assert kept.lock_holder(store, "lifecycle") is None


@pytest.mark.parametrize("argv, message", [
    (["lifecycle", "--once", "--watch"], "--once or --watch, not both"),
    (["lifecycle", "--once", "-H", "gpu1"], "only with --slurm"),
    (["lifecycle", "gpu1"], "only with --clear"),
    (["lifecycle", "--clear"], "name the NODE"),
])
def test_bad_lifecycle_usage_exits_2(argv, message, capsys, tmp_path):
    code, _, err = run(capsys, *argv, "--db", f"sqlite:///{tmp_path}/s.sqlite")
    assert code == 2 and message in err


@pytest.mark.parametrize("causes,said", [
    ("{gpu-ecc-uncorrectable: {step: pray}}", "causes.gpu-ecc-uncorrectable.step"),
    # every retest for the cause would fail on a check that does not exist
    ("{nvlink-down: {acceptance: [nccl-allreduce]}}", "causes.nvlink-down.acceptance: no such check: nccl-allreduce"),
])
def test_a_bad_site_file_exits_2_naming_it(causes, said, tmp_path, capsys):
    site = tmp_path / "site.yaml"
    site.write_text(f"format: preflight-lifecycle/1\ncauses: {causes}\n")
    code, _, err = run(capsys, "lifecycle", "--once", "--site", str(site), "--db", f"sqlite:///{tmp_path}/s.sqlite")
    assert code == 2 and f"{site}: {said}" in err
    assert not (tmp_path / "s.sqlite").exists()


def test_an_empty_lifecycle_says_so(store_url, tmp_path, capsys):
    # Issue 34: with no node in any state the listing printed nothing at all.
    with Store.open(parse(store_url), create=True):
        pass
    code, out, _ = run(capsys, "lifecycle", "--db", store_url)
    assert code == 0 and out.startswith("no node in any state: the lifecycle takes a node in at the first pass")
    code, out, _ = run(capsys, "lifecycle", "--once", "--db", store_url)
    assert code == 0 and out == "nothing to do: 0 node(s) looked at, none due a step\n"
