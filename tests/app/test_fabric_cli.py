"""`preflight fabric`'s bad input: a clear message naming the option, exit 2, nothing written."""

from __future__ import annotations

import pytest

from preflight.app.cli import main


@pytest.mark.parametrize("argv,said", [
    (["-H", "a"], "fabric: 1 node(s) named: a pairwise test needs two or more"),
    (["-H", "a,a"], "fabric: 1 node(s) named"),  # a node named twice is one node
    (["-H", "a,b", "--pair-tool", "iperf3", "--use-cuda"], "--use-cuda: only with --pair-tool ib_write_bw"),
    (["-H", "a,b", "--pair-tool", "iperf3", "--gid-index", "3"], "--gid-index: only with --pair-tool ib_write_bw"),
    (["-H", "a,b", "--bitrate", "1G"], "--bitrate: only with --pair-tool iperf3"),
    (["-H", "a,b", "--bytes", "2M"], "--bytes: only with --pair-tool iperf3"),
    (["-H", "a,b", "--pair-tool", "iperf3", "--bitrate", "1 G; rm -rf /"], "--bitrate: '1 G; rm -rf /' is not a number"),
    (["-H", "a,b", "--collective-tool", "mpi"], "--collective-tool: only with --collective"),
    (["-H", "a,b", "--mpirun-args", "-x A", "--collective-reps", "2"],
     "--mpirun-args, --collective-reps: only with --collective"),
    (["-H", "a,b", "--collective", "--mpirun-args", "'unclosed"], "--mpirun-args: No closing quotation"),
])
def test_refused_before_anything_runs(argv, said, tmp_path, capsys):
    assert main(["fabric", *argv, "--out", str(tmp_path / "out"), "--no-db"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("argv,said", [
    (["--gid-index", "-1"], "a GID index is a whole number from 0 to 255"),
    (["--gid-index", "256"], "a GID index is a whole number from 0 to 255"),
    (["--reps", "0"], "must be positive"),
    (["--seconds", "nan"], "must be a finite number"),
    (["--pair-tool", "ib_send_bw"], "invalid choice"),
])
def test_bad_option_values_are_usage_errors(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fabric", "-H", "a,b", *argv])
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_the_hosts_file_named_twice_is_folded_with_a_note(tmp_path, capsys):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("a\nb\na\n")
    # Two distinct nodes remain: the request is built; the note names the repeat. The run itself
    # would need SSH, so only the request is checked here.
    from preflight.app.cli import build_parser
    from preflight.app.fabric_cli import fabric_request

    req = fabric_request(build_parser().parse_args(["fabric", "--hosts", str(hosts), "--out", str(tmp_path)]))
    assert [h.name for h in req.hosts] == ["a", "b"] and len(req.stages) == 1
    assert [c.id for c in req.checks] == ["fabric-rails"] and [p.id for p in req.plan.probes] == ["ibv-devinfo", "ibstat"]
    assert f"{hosts}:3: a is the same node" in capsys.readouterr().err
