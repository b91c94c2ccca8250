"""Every probe names the programs it calls (issue 26), so that a tool that hung once on a node
passes over every later probe that would call it again (preflight/node/schedule.py)."""

from __future__ import annotations

import re

from preflight.collect.probes import PROBES


def _script_words(argv: tuple[str, ...]) -> set[str]:
    scripts = [a for i, a in enumerate(argv) if i and argv[i - 1] == "-c"]
    return {w for s in scripts for w in re.findall(r"[A-Za-z_][\w.-]*", s)}


def test_a_script_that_calls_another_probes_tool_declares_it():
    """The all_reduce script's `nvidia-smi -L` was undeclared: after nvidia-smi hung it waited again."""
    tools = {p.tool for p in PROBES.values()} - {"sh"}
    for probe in PROBES.values():
        called = _script_words(probe.argv) & tools
        assert called <= set(probe.tools), (probe.id, called - set(probe.tools))
    assert {"all_reduce_perf", "nvidia-smi", "python3"} <= set(PROBES["nccl-all-reduce"].tools)


def test_the_probes_own_tool_comes_first():
    for probe in PROBES.values():
        assert probe.tools[0] == probe.tool and len(set(probe.tools)) == len(probe.tools)
