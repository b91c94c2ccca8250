"""The retest's command line (preflight/app/retest.py): the blamed checks and the acceptance,
DCGM at the retest's level, the SSH options again, the site's extra options; the store's URL
(and its password) only in the child's environment, never in its argv."""

from __future__ import annotations

import sys
from pathlib import Path

from preflight.app.retest import Retest
from preflight.collect.ssh import SshOptions
from preflight.lifecycle.machine import Action
from preflight.model import Host
from preflight.store import parse

URL = parse("postgresql://pf:s3cret@db01/preflight")


def test_the_retest_runs_the_blamed_checks_and_the_acceptance_over_ssh():
    r = Retest({"gpu07": Host("gpu07", user="ops", port=2222)},
               SshOptions(identity=Path("/k/id"), known_hosts=Path("/k/known"), connect_timeout_s=5.0), URL,
               Path("/var/lib/preflight/retests"), dcgm_level=3, extra=("--nccl-reps=2",))
    action = Action("retest", "gpu07", "", {"checks": ["dcgm-diag", "gpu-memory", "nccl-all-reduce"],
                                            "run": "retest-gpu07-20261202T120000.000"})
    argv = r.argv(action)
    assert argv[:4] == [sys.executable, "-m", "preflight", "run"]
    assert argv[argv.index("-H") + 1] == "ops@gpu07:2222"
    assert argv[argv.index("--checks") + 1] == "dcgm-diag,gpu-memory,nccl-all-reduce"
    assert argv[argv.index("--dcgm-level") + 1] == "3"
    assert argv[argv.index("--run-id") + 1] == "retest-gpu07-20261202T120000.000"
    assert argv[argv.index("--identity") + 1] == "/k/id" and argv[argv.index("--connect-timeout") + 1] == "5"
    assert argv[-1] == "--nccl-reps=2" and "--accept-new-host-keys" not in argv
    assert not any("s3cret" in a or "db01" in a for a in argv)
    # No DCGM in the checks: no level either (a level given makes a missing dcgmi an error).
    assert "--dcgm-level" not in r.argv(Action("retest", "gpu07", "", {"checks": ["xid"], "run": "x"}))


def test_a_retest_that_cannot_run_says_why(tmp_path):
    """A run refused as bad usage (here an unknown check id) is no reading: its message comes back."""
    r = Retest({"gpu07": Host("gpu07")}, SshOptions(), parse(f"sqlite:///{tmp_path}/s.sqlite"), tmp_path)
    said = r(Action("retest", "gpu07", "", {"checks": ["no-such-check"], "run": "retest-x"}))
    assert said and said.startswith("the retest run exited 2:") and "no-such-check" in said
