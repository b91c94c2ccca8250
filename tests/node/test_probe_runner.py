"""The node side of `run --slurm`: framed records survive interleaving (preflight/node/frames.py),
and the runner carries out the controller's plan with the SSH path's schedule, shipped as
files through stdin with nothing of preflight installed (preflight/collect/node_runner.py BOOT)."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys

from preflight.collect.fanout import ExecPlan
from preflight.collect.node_runner import node_payload, runner_argv, runner_plan
from preflight.collect.probe import Probe
from preflight.node import frames, probe_runner


def test_records_of_many_nodes_interleaved_line_by_line_all_come_back_whole():
    big = random.Random(1).randbytes(20000)  # a probe's stdout, byte for byte, over many lines
    lines = []
    for node in ("gpu01", "gpu02", "gpu03"):
        lines += frames.encode(node, 1, {"kind": "result", "probe": "p"}, big + node.encode())
        lines += frames.encode(node, 2, {"kind": "end"})
    assert max(len(line) for line in lines) < 800 and len(lines) > 20
    random.Random(7).shuffle(lines)
    reader = frames.FrameReader()
    got = [rec for line in lines for rec in reader.feed(line)]
    assert sorted((n, s) for n, s, _, _ in got) == [(n, s) for n in ("gpu01", "gpu02", "gpu03") for s in (1, 2)]
    assert {n: p for n, s, _, p in got if s == 1} == {n: big + n.encode() for n in ("gpu01", "gpu02", "gpu03")}
    assert reader.damaged == 0 and reader.incomplete() == []


def test_a_damaged_line_is_dropped_and_its_record_stays_incomplete():
    lines = frames.encode("gpu01", 1, {"kind": "result"}, random.Random(2).randbytes(3000))
    bad = lines[1][:-5] + "AAAA\n"  # another task's bytes landed inside this line
    reader = frames.FrameReader()
    got = [rec for line in [lines[0], bad, *lines[2:], "python3: warning\n"] for rec in reader.feed(line)]
    assert got == [] and reader.damaged == 1 and reader.incomplete() == [("gpu01", 1)]
    assert reader.noise == ["python3: warning"]


def _plan() -> ExecPlan:
    def sh(pid, script, tool, active=False, calls=()):
        return Probe(pid, ("sh", "-c", script), pid, tool, calls=calls, active=active)

    return ExecPlan((sh("smi-1", "sleep 30", "nvidia-smi"), sh("smi-2", "echo never", "nvidia-smi"),
                     sh("log", "printf 'a\\0b'", "dmesg"), sh("missing", "exit 127", "ibstat"),
                     sh("bench", "echo bench", "all_reduce_perf", active=True),
                     # its script would call the hung nvidia-smi again: passed over on the node too
                     sh("smi-bench", "echo never", "all_reduce_perf", active=True, calls=("nvidia-smi",))),
                    timeout_s=1.0, per_node=1)


def _decode(text: str) -> list[tuple[str, int, dict, bytes]]:
    reader = frames.FrameReader()
    return [rec for line in text.splitlines(keepends=True) for rec in reader.feed(line)]


def test_the_runner_applies_the_ssh_paths_schedule_on_its_node(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    out = io.StringIO()
    plan = runner_plan(_plan())
    assert probe_runner.main(plan, out) == 0
    recs = _decode(out.getvalue())
    assert {n for n, _, _, _ in recs} == {"gpu07"}
    kinds = [h["kind"] for _, _, h, _ in recs]
    assert kinds[0] == "hello" and kinds[-1] == "end" and kinds.count("result") == 6
    by = {h["probe"]: (h, p) for _, _, h, p in recs if h["kind"] == "result"}
    assert by["smi-1"][0]["timed_out"] and by["smi-1"][0]["exit_code"] is None
    assert by["smi-2"][0]["error"].startswith("not run: nvidia-smi hung in smi-1 on this node (sh -c sleep 30 stopped")
    assert by["smi-bench"][0]["error"].startswith("not run: nvidia-smi hung in smi-1 on this node")
    assert by["log"][1] == b"a\0b" and by["log"][0]["exit_code"] == 0  # stdout byte for byte
    assert by["missing"][0]["exit_code"] == 127
    assert by["bench"][1] == b"bench\n"  # the active probe runs after the static ones


def test_the_shipped_runner_needs_nothing_of_preflight_on_the_node(tmp_path):
    """What srun runs on each node, run here with a bare python3: no preflight on its path."""
    proc = subprocess.run(runner_argv(sys.executable), input=node_payload(_plan()), capture_output=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "gpu09"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    recs = _decode(proc.stdout.decode())
    assert [h["kind"] for _, _, h, _ in recs][::len(recs) - 1] == ["hello", "end"]
    assert {h.get("probe") for _, _, h, _ in recs if h["kind"] == "result"} == {"smi-1", "smi-2", "log", "missing", "bench",
                                                                                    "smi-bench"}


def test_the_runner_stamps_times_as_the_controller_does():
    """The node runner writes its start times without importing datetime; the text is what
    datetime's isoformat gives, so records from SSH, Slurm and --local read alike."""
    import re
    from datetime import datetime, timezone

    from preflight.node.localexec import now_iso

    before = datetime.now(timezone.utc).replace(microsecond=0)
    stamp = now_iso()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", stamp)
    assert before <= datetime.fromisoformat(stamp) <= datetime.now(timezone.utc)


def test_a_header_is_written_as_json_writes_it_without_importing_json_on_the_node():
    header = {"kind": "result", "probe": "dmesg", "exit_code": 0, "timed_out": False, "error": None,
              "duration_s": 0.125, "started": "2026-12-01T22:00:00+00:00", "has_stdout": True,
              "stderr": 'quote " backslash \\ tab \t newline \n bell \x07 esc \x1b del \x7f é 漢 🚀'}
    assert frames._json(header) == json.dumps(header, sort_keys=True, ensure_ascii=False)
    odd = {"stderr": "surrogate \udcff here", "duration_s": float("inf"), "exit_code": -9}
    (_, _, decoded, _), = frames.FrameReader().feed(frames.encode("n1", 1, odd)[0])
    assert decoded == {"stderr": "surrogate ? here", "duration_s": None, "exit_code": -9}
