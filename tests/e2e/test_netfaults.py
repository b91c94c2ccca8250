"""The fault injector the fabric tests rely on does shape real traffic: a rate-limited host is slow
with every partner, a rate-limited path only between its two ends, and a downed link carries
nothing."""

from __future__ import annotations

import subprocess

import pytest
from netfaults import link_down, slow_host, slow_path
from simcluster import SimHost

pytestmark = pytest.mark.root

_SINK = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
         "s.bind((sys.argv[1],5201));s.listen(1);print('ready',flush=True)\nc,_=s.accept()\n"
         "while c.recv(65536):pass\n")
_SEND = ("import socket,sys,time\nc=socket.create_connection((sys.argv[1],5201),timeout=5)\n"
         "t=time.monotonic();c.sendall(b'x'*int(sys.argv[2]));c.shutdown(socket.SHUT_WR);c.recv(1)\n"
         "print(time.monotonic()-t)\n")
_BYTES = 400_000  # 3.2 Mbit: 0.8 s at 4 Mbit/s, milliseconds unshaped


def _seconds(cluster, src: str, dst: str) -> float:
    sink = subprocess.Popen(["ip", "netns", "exec", cluster.namespaces[dst], "python3", "-c", _SINK,
                             cluster.address(dst)], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        out = subprocess.run(["ip", "netns", "exec", cluster.namespaces[src], "python3", "-c", _SEND,
                              cluster.address(dst), str(_BYTES)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return float(out.stdout)
    finally:
        sink.kill()
        sink.wait()


def test_shaping_lands_where_it_is_put(sim_cluster):
    cluster = sim_cluster([SimHost("a"), SimHost("b"), SimHost("c")])
    assert _seconds(cluster, "a", "b") < 0.4
    with slow_host(cluster, "a", rate="4mbit"):
        assert _seconds(cluster, "a", "b") > 0.5  # a's egress
        assert _seconds(cluster, "c", "a") > 0.5  # a's ingress
        assert _seconds(cluster, "b", "c") < 0.4
    with slow_path(cluster, "a", "b", rate="4mbit"):
        assert _seconds(cluster, "a", "b") > 0.5
        assert _seconds(cluster, "b", "a") > 0.5
        assert _seconds(cluster, "a", "c") < 0.4
    assert _seconds(cluster, "a", "b") < 0.4  # the shaping is gone with its context


def test_a_downed_link_carries_nothing(sim_cluster):
    cluster = sim_cluster([SimHost("a"), SimHost("b")])
    with link_down(cluster, "b"):
        out = subprocess.run(["ip", "netns", "exec", cluster.namespaces["a"], "python3", "-c", _SEND,
                              cluster.address("b"), "10"], capture_output=True, text=True, timeout=30)
        # A new connection finds no neighbour (ARP goes unanswered for about 3 s); one already open stalls.
        assert out.returncode != 0 and ("No route to host" in out.stderr or "timed out" in out.stderr)
    assert _seconds(cluster, "a", "b") < 0.4
