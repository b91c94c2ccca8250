"""A probe passed over because its tool hung earlier on the node (issue 26) is a skip of the checks
that read it, not a second failure: the hang is reported once, by the probe that timed out."""

from __future__ import annotations

from ctx import make_host, result, run_check

from preflight.model import Status

HUNG = "not run: nvidia-smi hung in nvidia-smi-q-x on this node (nvidia-smi -q -x stopped after 10 s)"


def test_a_probe_passed_over_for_a_hung_tool_skips_its_check_naming_the_tool_and_probe():
    host = make_host({"nccl-all-reduce": result("nccl-all-reduce", None, exit_code=None, error=HUNG)})
    [f] = run_check("nccl-all-reduce", host)
    assert f.status is Status.SKIP
    assert "nccl-all-reduce skipped because nvidia-smi hung in nvidia-smi-q-x" in f.summary


def test_other_reasons_for_not_running_stay_errors():
    for why in ("not run: the node's deadline passed (--node-timeout)", "connection lost: EOF",
                "not run: the controller's worker process died (exit code 1)"):
        host = make_host({"nccl-all-reduce": result("nccl-all-reduce", None, exit_code=None, error=why)})
        [f] = run_check("nccl-all-reduce", host)
        assert f.status is Status.ERROR and why in f.summary, (why, f)
