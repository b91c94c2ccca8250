"""The simulated cluster (tests/simcluster.py), proven with the real OpenSSH client and with
paramiko (the library under fabric, which preflight's executor uses), on real corpus outputs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest
from simcluster import Reply, SimCluster, SimClusterError, SimHost

pytestmark = pytest.mark.root

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
SMI_XML = CORPUS / "h200-vm" / "smi-q.xml"
TOPO = CORPUS / "h200-vm" / "topo.txt"
IBSTAT_OK = CORPUS / "ibv" / "ibstat-cx7-ndr-400g-active-ib.txt"
IBSTAT_PANIC = CORPUS / "ibv" / "ibstat-partial-output-then-ibpanic-stat-failed.txt"


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: bytes
    stderr: str


def openssh(cluster: SimCluster, alias: str, command: str) -> Result:
    proc = subprocess.run(["ssh", "-F", str(cluster.ssh_config), alias, command], capture_output=True, timeout=60)
    return Result(proc.returncode, proc.stdout, proc.stderr.decode())


def paramiko_client(known_hosts: Path) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def connect(client: paramiko.SSHClient, cluster: SimCluster, alias: str) -> None:
    client.connect(cluster.address(alias), username="root", key_filename=str(cluster.identity),
                   look_for_keys=False, allow_agent=False, timeout=10)


def with_paramiko(cluster: SimCluster, alias: str, command: str) -> Result:
    with paramiko_client(cluster.known_hosts) as client:
        connect(client, cluster, alias)
        _, out, err = client.exec_command(command, timeout=60)
        stdout, stderr = out.read(), err.read().decode()
        return Result(out.channel.recv_exit_status(), stdout, stderr)


CLIENTS = {"openssh": openssh, "paramiko": with_paramiko}


@pytest.fixture(params=CLIENTS)
def run(request):
    return CLIENTS[request.param]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A few nodes with recorded nvidia-smi outputs and faults, shared by the tests that only read."""
    healthy = {"nvidia-smi -q -x": Reply(stdout=SMI_XML), "nvidia-smi topo -m": Reply(stdout=TOPO)}
    hosts = [
        SimHost("gpu01", healthy),
        SimHost("gpu02", healthy),
        SimHost("nosmi"),  # driver not installed: no nvidia-smi at all
        SimHost("hung", {"nvidia-smi -q -x": Reply(stdout=SMI_XML, sleep_s=120)}),
        SimHost("dead", down=True),
    ]
    with SimCluster(hosts, tmp_path_factory.mktemp("fleet")) as cluster:
        yield cluster


def test_each_host_answers_hostname_with_its_own_name(fleet, run):
    for alias in ("gpu01", "gpu02", "nosmi", "hung"):
        assert run(fleet, alias, "hostname") == Result(0, f"{alias}\n".encode(), "")


def test_shim_writes_the_recorded_file_byte_for_byte(fleet, run):
    result = run(fleet, "gpu01", "nvidia-smi -q -x")
    assert result == Result(0, SMI_XML.read_bytes(), "")
    assert b"<product_name>NVIDIA H200</product_name>" in result.stdout
    assert run(fleet, "gpu02", "nvidia-smi topo -m").stdout == TOPO.read_bytes()


@pytest.mark.parametrize("wrapped", ["timeout -k 5 30 nvidia-smi topo -m", "sh -c 'nvidia-smi topo -m'"])
def test_shim_answers_through_the_wrappers_preflight_uses(fleet, run, wrapped):
    assert run(fleet, "gpu01", wrapped) == Result(0, TOPO.read_bytes(), "")


def test_unrecorded_command_line_exits_64_and_names_it(fleet, run):
    assert run(fleet, "gpu01", "nvidia-smi -q") == Result(64, b"", "simcluster: no recorded reply for: nvidia-smi -q\n")


def test_one_connection_carries_many_channels_at_once(fleet):
    # sshd's default MaxSessions (10) would refuse the 11th; a controller fans probes out like this.
    with paramiko_client(fleet.known_hosts) as client:
        connect(client, fleet, "gpu01")
        channels = [client.get_transport().open_session(timeout=10) for _ in range(24)]
        for channel in channels:
            channel.exec_command("nvidia-smi topo -m")
        outputs = [channel.makefile("rb").read() for channel in channels]
        assert [channel.recv_exit_status() for channel in channels] == [0] * 24
    assert outputs == [TOPO.read_bytes()] * 24


def test_tool_without_recordings_is_missing_with_127(fleet, run):
    result = run(fleet, "nosmi", "nvidia-smi -q -x")
    assert result.exit_code == 127
    assert "nvidia-smi: command not found" in result.stderr


def test_hang_outlasts_the_callers_timeout(fleet, run):
    started = time.monotonic()
    result = run(fleet, "hung", "timeout 0.3 nvidia-smi -q -x")
    assert (result.exit_code, result.stdout) == (124, b"")
    assert 0.3 <= time.monotonic() - started < 10


def test_down_host_refuses_openssh_quickly(fleet):
    started = time.monotonic()
    result = openssh(fleet, "dead", "hostname")
    assert result.exit_code == 255
    assert f"connect to host {fleet.address('dead')} port 22: Connection refused" in result.stderr
    assert time.monotonic() - started < 2


def test_down_host_refuses_paramiko_quickly(fleet):
    started = time.monotonic()
    with paramiko_client(fleet.known_hosts) as client, pytest.raises(paramiko.ssh_exception.NoValidConnectionsError):
        connect(client, fleet, "dead")
    assert time.monotonic() - started < 2


def test_unknown_host_key_is_rejected(fleet, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with paramiko_client(empty) as client, pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(client, fleet, "gpu01")
    proc = subprocess.run(["ssh", "-F", str(fleet.ssh_config), "-o", f"UserKnownHostsFile={empty}", "gpu01", "hostname"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 255
    assert "Host key verification failed." in proc.stderr


def test_known_hosts_lists_alias_and_address_with_the_hosts_real_key(fleet):
    lines = fleet.known_hosts.read_text().splitlines()
    assert len(lines) == len(fleet.hosts)
    assert re.fullmatch(rf"gpu01,{re.escape(fleet.address('gpu01'))} ssh-ed25519 \S+", lines[0])
    with paramiko_client(fleet.known_hosts) as client:
        connect(client, fleet, "gpu01")
        served = client.get_transport().get_remote_server_key().get_base64()
    assert lines[0].split()[2] == served


def test_hosts_file_lists_every_alias_under_a_comment(fleet):
    lines = fleet.hosts_file.read_text().splitlines()
    assert lines[0].startswith("# ")
    assert lines[1:] == ["gpu01", "gpu02", "nosmi", "hung", "dead"]


def test_replies_cycle_pass_hang_fail(sim_cluster, run):
    cluster = sim_cluster([SimHost("ib01", {"ibstat": [
        Reply(stdout=IBSTAT_OK),
        Reply(stdout=IBSTAT_OK, sleep_s=60),
        Reply(stdout="\n".join(IBSTAT_PANIC.read_text().splitlines()[:-1]) + "\n",
              stderr=IBSTAT_PANIC.read_text().splitlines()[-1] + "\n", exit_code=1),
    ]})])
    # 3 s: a shim answers in well under a second, also on a loaded machine (0.5 s was not enough once).
    seen = [run(cluster, "ib01", "timeout 3 ibstat") for _ in range(4)]
    assert [r.exit_code for r in seen] == [0, 124, 1, 0]
    assert seen[0].stdout == seen[3].stdout == IBSTAT_OK.read_bytes()
    assert seen[1].stdout == b""
    assert seen[2].stdout.startswith(b"...\n\nCA 'mlx5_7'")
    assert seen[2].stderr == "ibpanic: [1323906] main: stat of IB device 'mlx5_8' failed: No such file or directory\n"


def test_sysfs_is_per_host_and_globs_like_the_real_one(sim_cluster, run):
    # Firmware versions as the corpus' ibv_devinfo captures report them (fw28.39 RoCE, fw28.42 H100 node).
    cluster = sim_cluster([
        SimHost("roce01", sysfs={"infiniband/mlx5_0/fw_ver": "28.39.2048\n", "infiniband/mlx5_1/fw_ver": "28.39.2048\n",
                                 "infiniband/mlx5_0/ports/1/state": "4: ACTIVE\n"}),
        SimHost("h100n01", sysfs={"infiniband/mlx5_0/fw_ver": "28.42.1000\n"}),
    ])
    # The ib-sysfs probe's form: `grep -H . FILES`, with globs the node's shell expands.
    assert run(cluster, "roce01", "grep -H . /sys/class/infiniband/*/fw_ver /sys/class/infiniband/*/ports/*/state") \
        == Result(0, b"/sys/class/infiniband/mlx5_0/fw_ver:28.39.2048\n"
                     b"/sys/class/infiniband/mlx5_1/fw_ver:28.39.2048\n"
                     b"/sys/class/infiniband/mlx5_0/ports/1/state:4: ACTIVE\n", "")
    # The rest of /sys/class is still the host's own: its network namespace's interfaces.
    assert run(cluster, "h100n01", "grep -H . /sys/class/infiniband/*/fw_ver && ls /sys/class/net") \
        == Result(0, b"/sys/class/infiniband/mlx5_0/fw_ver:28.42.1000\neth0\nlo\n", "")


def test_32_hosts_come_up_and_all_answer(sim_cluster):
    hosts = [SimHost(f"node{n:03d}", {"nvidia-smi -q -x": Reply(stdout=SMI_XML)}) for n in range(1, 33)]
    started = time.monotonic()
    cluster = sim_cluster(hosts)
    took = time.monotonic() - started
    print(f"32 simulated hosts up in {took:.2f} s")
    assert took < 15
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda host: with_paramiko(cluster, host.name, "hostname").stdout, hosts))
    assert answers == [f"{host.name}\n".encode() for host in hosts]
    assert len({cluster.address(host.name) for host in hosts}) == 32


def _netns_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout
    return [int(pid) for pid in out.split()]


def _comm(pid: int) -> str:
    """The process's name; empty once it has exited (a listed pid may be gone by the time it is read)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text()
    except FileNotFoundError:
        return ""


def _traces(cluster: SimCluster, links_before: set[str]) -> dict[str, list[str]]:
    """What of `cluster` is visible on this machine right now, by kind. Links count by the
    cluster's own names (`sc<subnet>b`, `sc<subnet>v`): another cluster (another test run on
    the machine) has another subnet, and its links are not this one's leftovers."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    simdir = cluster.ssh_config.parent
    marks = (str(simdir), *cluster.namespaces.values())
    subnet = cluster.address(cluster.hosts[0].name).split(".")[2]
    own = (f"sc{subnet}b", f"sc{subnet}v")  # its bridge and veths (sc1v.. is not sc10v..)
    return {
        "netns": [ns for ns in cluster.namespaces.values() if ns in netns],
        "links": sorted(d for d in set(os.listdir("/sys/class/net")) - links_before if d.startswith(own)),
        "mounts": [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                   if any(mark in line for mark in marks)],
        "files": [str(simdir)] if simdir.exists() else [],
    }


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_teardown_leaves_nothing_even_when_the_test_fails(tmp_path):
    hosts = [SimHost("a", {"nvidia-smi -q -x": Reply(stdout=SMI_XML, sleep_s=300)}), SimHost("b"), SimHost("c", down=True)]
    links_before = set(os.listdir("/sys/class/net"))
    with pytest.raises(ZeroDivisionError):
        with SimCluster(hosts, tmp_path) as cluster:
            # A session stuck in a hung tool, still running when the cluster goes away.
            stuck = subprocess.Popen(["ssh", "-F", str(cluster.ssh_config), "a", "nvidia-smi -q -x"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while "sleep\n" not in [_comm(pid) for pid in _netns_pids(cluster.namespaces["a"])]:
                assert time.monotonic() < deadline, "the hung shim never started"
                time.sleep(0.05)
            pids = [pid for ns in cluster.namespaces.values() for pid in _netns_pids(ns)]
            assert len(pids) >= 5  # two sshd daemons, the session's sshd and shell, the shim's sleep
            during = _traces(cluster, links_before)
            assert len(during["netns"]) == 3 and len(during["links"]) == 4 and during["files"]  # bridge + 3 veths
            assert len(during["mounts"]) == 3  # /run/netns/NAME; the hosts' own mounts are private to them
            raise ZeroDivisionError  # the test's own failure, mid-context
    stuck.wait(timeout=10)
    assert _traces(cluster, links_before) == {"netns": [], "links": [], "mounts": [], "files": []}
    assert [pid for pid in pids if _alive(pid)] == []
    subnet = cluster.address("a").split(".")[2]
    assert Path(f"/run/simcluster/{subnet}.json").read_text() == ""


def test_a_dead_runs_leftovers_are_removed_by_the_next_cluster(tmp_path):
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from simcluster import SimCluster, SimHost\n"
         "with SimCluster([SimHost('orphan')], Path(sys.argv[1])) as c:\n"
         "    print(c.namespaces['orphan'], c.bridge, flush=True); time.sleep(600)\n",
         str(tmp_path / "dead-run")],
        cwd=Path(__file__).parents[1], stdout=subprocess.PIPE, text=True,
    )
    netns, bridge = owner.stdout.readline().split()
    owner.kill()  # no __exit__, no atexit: the way a CI job dies
    owner.wait(timeout=10)
    assert netns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    with SimCluster([SimHost("next")], tmp_path / "next-run"):
        assert netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not Path(f"/sys/class/net/{bridge}").exists()
        assert list((tmp_path / "dead-run").iterdir()) == []


def test_bad_hosts_are_refused_before_anything_is_built(tmp_path):
    with pytest.raises(SimClusterError, match="repeat"):
        SimCluster([SimHost("a"), SimHost("a")], tmp_path)
    with pytest.raises(SimClusterError, match="not a valid hostname"):
        SimCluster([SimHost("gpu 01")], tmp_path)
    with pytest.raises(SimClusterError, match="cannot shim"):
        with SimCluster([SimHost("a", {"timeout 5 nvidia-smi": Reply()})], tmp_path):
            pass
    assert list(tmp_path.iterdir()) == []


def test_extra_rails_are_links_of_their_own(tmp_path):
    """rails=2: every host has eth1 on a bridge and subnet of its own (127.78.K.N), beside eth0;
    the cluster's teardown removes them with the rest."""
    with SimCluster([SimHost("r1"), SimHost("r2")], tmp_path, rails=2) as cluster:
        shown = subprocess.run(["ip", "netns", "exec", cluster.namespaces["r1"], "ip", "-o", "-4", "addr", "show"],
                               capture_output=True, text=True, timeout=30).stdout
        bridges = (cluster.bridge, *cluster._resources.rail_bridges)
        links = (cluster.link_of("r2"), cluster.link_of("r2", 1))
        assert f"eth0    inet {cluster.address('r1')}/24" in shown
        assert f"eth1    inet {cluster.address('r1', 1)}/24" in shown
        assert cluster.address("r1", 1).startswith("127.78.") and links[0] != links[1]
    assert not any(Path(f"/sys/class/net/{dev}").exists() for dev in (*bridges, *links))
