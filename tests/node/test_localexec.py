"""Commands on this machine (preflight/node/localexec.py): several advanced from one thread by a
Poller, as the node runner does, and one at a time by run_local, as LocalNode does."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from preflight.node import localexec
from preflight.node.localexec import Command, Poller, run_local


def _run_all(commands: list[Command]) -> list[Command]:
    poller, running, ended = Poller(), [c for c in commands if c.result is None], []
    for command in running:
        poller.add(command)
    while running:
        for command in poller.wait(running):
            running.remove(command)
            ended.append(command)
    return ended


def test_commands_run_at_once_from_one_thread_and_each_keeps_its_own_output(tmp_path):
    # Each command records when it starts and ends; all four must have been running together.
    marks = tmp_path / "marks"
    script = f"echo start $(date +%s.%N) >> {marks}; sleep 0.5; echo end $(date +%s.%N) >> {marks}; echo out-$0; echo err-$0 >&2"
    commands = [Command(["sh", "-c", script, str(i)], timeout=20) for i in range(4)]
    _run_all(commands)
    assert [c.result.stdout for c in commands] == [f"out-{i}\n".encode() for i in range(4)]
    assert [c.result.stderr for c in commands] == [f"err-{i}\n" for i in range(4)]
    assert all(c.result.exit_code == 0 and not c.result.timed_out for c in commands)
    stamps = [line.split() for line in marks.read_text().splitlines()]
    last_start = max(float(t) for kind, t in stamps if kind == "start")
    first_end = min(float(t) for kind, t in stamps if kind == "end")
    assert last_start < first_end


def test_stdin_reaches_a_command_that_reads_it_and_is_dropped_by_one_that_does_not():
    big = os.urandom(1 << 20)  # more than a pipe holds: written as the command takes it
    r = run_local(["sh", "-c", "cat | wc -c"], stdin=big, timeout=20)
    assert r.stdout.strip() == str(len(big)).encode() and r.exit_code == 0
    r = run_local(["true"], stdin=big, timeout=20)
    assert r.exit_code == 0 and not r.timed_out


def test_missing_and_unrunnable_programs_are_what_a_shell_says(tmp_path):
    r = run_local(["no-such-tool-anywhere"], timeout=5)
    assert (r.stdout, r.exit_code, r.stderr) == (None, 127, "no-such-tool-anywhere: not found")
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\necho hi\n")
    r = run_local([str(script)], timeout=5)
    assert r.stdout is None and r.exit_code == 126 and "Permission denied" in r.stderr
    r = run_local(["sh", "-c", "kill -9 $$"], timeout=5)
    assert r.exit_code == -9  # as subprocess reports a signal


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(monkeypatch):
    monkeypatch.setattr(localexec, "KILL_AFTER_S", 0.5)
    t0 = time.monotonic()
    r = run_local(["sh", "-c", "trap '' TERM; echo started; sleep 30"], timeout=0.5)
    assert r.timed_out and r.exit_code is None and r.stdout == b"started\n"
    assert time.monotonic() - t0 < 10


def test_a_command_whose_child_keeps_its_output_open_ends_at_its_timeout():
    # The shell exits at once; the background sleep holds stdout until the timeout ends its group.
    r = run_local(["sh", "-c", "echo before; sleep 30 &"], timeout=1.0)
    assert r.timed_out and r.stdout == b"before\n"


def test_the_commands_own_session_has_no_terminal():
    r = run_local(["sh", "-c", "ps -o sid= -p $$; ps -o sid= -p $PPID"], timeout=5)
    own, parent = r.stdout.split()
    assert own != parent


def test_the_shipped_runner_imports_no_heavy_module_on_the_node(tmp_path):
    """The node's python3 startup is most of the runner's cost: it must not import json, re,
    subprocess, threading, signal or enum (each costs a node milliseconds)."""
    from preflight.collect.fanout import ExecPlan
    from preflight.collect.node_runner import BOOT, node_payload
    from preflight.collect.probe import Probe

    plan = ExecPlan((Probe("one", ("sh", "-c", "echo hi"), "one", "sh"),), timeout_s=10)
    proc = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", "-c", BOOT], input=node_payload(plan),
                          capture_output=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines() if "|" in line}
    assert imported and not imported & {"json", "re", "subprocess", "threading", "signal", "enum", "base64"}


def test_a_command_gets_the_default_sigpipe_that_python_itself_ignores():
    # Python ignores SIGPIPE and SIGXFSZ; a tool must not inherit that, or a pipeline in a probe
    # (`dmesg | head`) writes "Broken pipe" errors and exits differently than from a shell.
    r = run_local(["sh", "-c", "yes | head -n 1"], timeout=10)
    assert (r.stdout, r.stderr, r.exit_code) == (b"y\n", "", 0)
