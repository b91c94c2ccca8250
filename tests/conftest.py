"""Shared pytest wiring: the simulated-cluster fixture, and the skip rule for tests marked `root`."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest

# Tests live in folders named after the stage they test (tests/parse, tests/checks, ...). Some
# build their inputs with helpers of another stage's tests (`from test_cli import write_bundle`),
# so every folder is importable by module name, as when they shared one folder.
_HERE = Path(__file__).resolve().parent
for _folder in sorted(p for p in _HERE.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

import pgcluster  # noqa: E402 - after the path set-up above
from simcluster import SSHD, SimCluster, SimHost  # noqa: E402


@cache
def _why_no_simcluster() -> str | None:
    """Why tests that build network namespaces and run sshd cannot run here; None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, mounts and sshd of the simulated cluster)"
    missing = [tool for tool in ("ip", "unshare", "flock", "ssh", "ssh-keygen") if shutil.which(tool) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iproute2 openssh-server)"
    # Root inside an unprivileged container has no CAP_SYS_ADMIN / CAP_NET_ADMIN: try for real.
    for probe in (["unshare", "--net", "--mount", "--uts", "true"], ["ip", "netns", "list"]):
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        if proc.returncode:
            return f"`{' '.join(probe)}` failed: {proc.stderr.strip()}"
    return None


# Under pytest-xdist (the README's test command: -n 3 --dist loadgroup) the tests that run
# daemons (marked root: sshd, slurmd, PostgreSQL beside them) are three groups, each on a worker
# of its own and in order within it, so that two clusters of one group never compete (a starved
# slurmd would make a timing flaky) and a module's cluster fixture is built once: the fabric's
# (real iperf3 and mpirun between simulated hosts: they judge bandwidth relative to their own
# fleet, 10x shaping, a 0.2 ratio, which another group's load does not move), the real Slurm
# cluster's (tests/slurmcluster.py), and the rest (sshd in network namespaces). Their time is
# mostly waiting on daemons, timeouts and polls, so three groups on a two-core machine overlap
# their waits; one worker for all daemons made it the parallel part's longest path. Everything
# else spreads over the workers. The real vLLM servers (marked vllm) run after, on their own:
# vLLM's CPU engine spins a thread on every core, and beside anything else its generation stalls
# (CI saw 0 tokens/s for 20 s while the other worker ran unit tests).
_VLLM_FILES = {"test_vllm_cpu.py", "test_soak_vllm_e2e.py"}
_FABRIC_FILES = {"test_e2e_collective_mpi.py", "test_e2e_fabric.py", "test_e2e_fabric_perftest.py",
                 "test_netfaults.py", "test_e2e_slurm_collective_mpi.py"}


@cache
def _uses_slurm(path: Path) -> bool:
    return "slurmcluster" in path.read_text(errors="replace")


def _group(path: Path) -> str:
    if path.name in _FABRIC_FILES:
        return "fabric"
    return "slurm" if _uses_slurm(path) else "heavy"


# First among the hooks: xdist's worker reads each item's xdist_group mark in its own
# pytest_collection_modifyitems (to name its group in the node id), and, registered after this
# conftest, it would otherwise run before the marks exist: every daemon test then went to any
# worker, a module's cluster fixture was built on both, and a module's tests could see two clusters.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in _VLLM_FILES:
            item.add_marker(pytest.mark.vllm)
        if item.get_closest_marker("root") is not None:
            item.add_marker(pytest.mark.xdist_group(_group(item.path)))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") is not None and (reason := _why_no_simcluster()):
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _own_results_store(tmp_path_factory, monkeypatch):
    """Every test records into a store of its own (the embedded default lives under
    $XDG_STATE_HOME): none writes the machine's, and no two share one. Commands a test starts
    in a subprocess inherit it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("PREFLIGHT_DB", raising=False)


@pytest.fixture(scope="session")
def pg():
    """A real PostgreSQL server of the session's own (tests/pgcluster.py); 40 connections, so
    that writers beyond them wait for a slot as a fleet's would."""
    why = pgcluster.why_not()
    if why:
        pytest.skip(why)
    cluster = pgcluster.start(max_connections=40)
    yield cluster
    pgcluster.stop(cluster)


_databases = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """A results store of the test's own on each engine: SQLite in a temporary file, and a
    database of its own on the session's real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return request.getfixturevalue("pg").create_database(f"t{next(_databases)}")


@pytest.fixture
def sim_cluster(tmp_path: Path) -> Iterator[Callable[[list[SimHost]], SimCluster]]:
    """`make(hosts)` builds and enters a SimCluster; every one made is torn down when the test ends."""
    with contextlib.ExitStack() as clusters:
        yield lambda hosts: clusters.enter_context(SimCluster(hosts, tmp_path))
