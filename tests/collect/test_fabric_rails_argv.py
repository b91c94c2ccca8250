"""The rail stage's command lines, as the nodes receive them (argv lists: no shell, so a rail
or host name cannot inject anything)."""

from __future__ import annotations

from preflight.collect.fabric_rails import RailOptions, client_argv, server_argv
from preflight.fabric.pairing import Rail

IB = Rail("mlx5_3", 1, None, 400.0, "InfiniBand")
ETH = Rail("eth1", None, "10.0.1.7")


def test_perftest_both_sides_with_gid_and_gpudirect():
    o = RailOptions("ib_write_bw", seconds=5, gid_index=3, use_cuda=True)
    assert server_argv(o, IB, 18518, 3) == ["ib_write_bw", "-d", "mlx5_3", "-i", "1", "-p", "18518", "-F",
                                            "--report_gbits", "-D", "5", "-x", "3", "--use_cuda=3"]
    assert client_argv(o, IB, 18518, "gpu07", 3) == server_argv(o, IB, 18518, 3) + ["gpu07"]
    assert client_argv(o, IB, 18518, "gpu07", 3, "lat") == ["ib_write_lat", "-d", "mlx5_3", "-i", "1", "-p", "18518",
                                                           "-F", "-n", "1000", "-x", "3", "gpu07"]


def test_iperf3_by_time_or_by_bytes_with_a_cap():
    o = RailOptions("iperf3", seconds=1, bitrate="200M")
    assert server_argv(o, ETH, 18516, 1) == ["iperf3", "-s", "-1", "-J", "-p", "18516"]
    assert client_argv(o, ETH, 18516, "10.0.1.8", 1) == ["iperf3", "-c", "10.0.1.8", "-p", "18516", "-t", "1", "-J",
                                                        "-b", "200M"]
    sized = RailOptions("iperf3", size="4M")
    assert client_argv(sized, ETH, 18516, "10.0.1.8", 1)[4:7] == ["18516", "-n", "4M"]


def test_a_hostile_name_stays_one_argument():
    o = RailOptions("ib_write_bw")
    argv = client_argv(o, IB, 18515, "gpu01; rm -rf /", 0)
    assert argv[-1] == "gpu01; rm -rf /"
