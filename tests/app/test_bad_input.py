"""Bad input is refused up front: exit 2, a message naming the option, file or line, and nothing
written (docs/contracts.md §1). One validation layer: numbers through
``preflight.knowledge.datafile.positive``, hosts through ``collect/inventory.py``, the run
directory and ``--out`` through ``app/targets.py``, check selections through ``judge/loader.select``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from preflight.app import targets
from preflight.app.cli import build_parser, main
from preflight.collect import ssh

FLEET = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet"


def _refused(argv, capsys, tmp_path, message) -> None:
    """argv exits 2 naming ``message`` on stderr and leaves nothing under --out."""
    out = tmp_path / "out"
    try:
        code = main([*argv, "--out", str(out)] if "--out" not in argv else argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in " ".join(err.split()), err
    assert not out.exists() or not any(out.iterdir())


NUMERIC = [("run", "--timeout"), ("run", "--node-timeout"), ("run", "--connect-timeout"), ("run", "--nccl-timeout"),
           ("run", "--parallel"), ("run", "--per-node"), ("run", "--nccl-reps"), ("run", "--port"),
           ("soak", "--hours"), ("soak", "--minutes"), ("soak", "--interval"), ("soak", "--connect-timeout"),
           ("soak", "--port"), ("soak", "--poll")]


@pytest.mark.parametrize(("command", "flag"), NUMERIC, ids=lambda x: x)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0"])
def test_every_numeric_option_refuses_non_finite_and_non_positive(command, flag, value, capsys, tmp_path):
    _refused([command, "-H", "gpu01", f"{flag}={value}"], capsys, tmp_path, f"argument {flag}:")


@pytest.mark.parametrize("command", ["run", "soak"])
def test_a_port_above_65535_is_refused_by_run_and_soak(command, capsys, tmp_path):
    _refused([command, "-H", "gpu01", "--port", "70000"], capsys, tmp_path, "argument --port: must be at most 65535")


def test_a_timeout_of_a_year_is_refused(capsys, tmp_path):
    _refused(["run", "-H", "gpu01", "--timeout", "1e300"], capsys, tmp_path, "argument --timeout: must be at most")


def test_a_connect_timeout_under_a_second_stays_a_timeout(monkeypatch, tmp_path):
    args = build_parser().parse_args(["run", "-H", "gpu01", "--connect-timeout", "0.5"])
    seen = {}

    class Refuse:
        def __init__(self, host, **kw):
            seen.update(kw, host=host)
            raise OSError("stop here")

    monkeypatch.setattr(ssh, "Connection", Refuse)
    node = ssh.SshNode(targets.hosts_of(args)[0], targets.ssh_of(args))
    assert node.connect().startswith("connect failed")
    assert seen["connect_timeout"] == 0.5 and seen["host"] == "gpu01"  # int() made it 0: no timeout


def test_an_ipv6_host_connects_to_its_address(monkeypatch):
    args = build_parser().parse_args(["run", "-H", "[fd00::1]:2200"])
    seen = {}

    def refuse(host, **kw):
        seen.update(kw, host=host)
        raise OSError("stop here")

    monkeypatch.setattr(ssh, "Connection", refuse)
    [host] = targets.hosts_of(args)
    ssh.SshNode(host, targets.ssh_of(args)).connect()
    assert (seen["host"], seen["port"], host.name) == ("fd00::1", 2200, "fd00__1")


@pytest.mark.parametrize("hosts", ["", ","])
@pytest.mark.parametrize("command", ["run", "soak"])
def test_an_empty_host_list_is_refused_not_this_machine(command, hosts, capsys, tmp_path):
    _refused([command, "-H", hosts], capsys, tmp_path, "no host given")


def test_a_bom_in_the_hosts_file_is_ignored_and_ipv6_needs_brackets(capsys, tmp_path):
    f = tmp_path / "hosts.txt"
    f.write_bytes("gpu01\nfd00::1\n".encode("utf-8-sig"))
    _refused(["run", "--hosts", str(f)], capsys, tmp_path, f"{f}:2: an IPv6 address goes in brackets")


def test_an_over_long_run_id_and_host_name(capsys, tmp_path):
    _refused(["run", "-H", "gpu01", "--run-id", "r" * 300], capsys, tmp_path, "--run-id: longer than 200 bytes")
    _refused(["run", "-H", "g" * 300], capsys, tmp_path, "longer than 253 characters")


@pytest.mark.parametrize("command", [["run", "-H", "gpu01"], ["analyze", str(FLEET)]])
def test_out_naming_a_file_is_refused(command, capsys, tmp_path):
    target = tmp_path / "a-file"
    target.write_text("mine\n")
    _refused([*command, "--out", str(target)], capsys, tmp_path, f"--out: {target} is a file, not a directory")
    assert target.read_text() == "mine\n"


@pytest.mark.parametrize("command", [["run", "-H", "gpu01"], ["analyze", str(FLEET)]], ids=["run", "analyze"])
def test_out_that_cannot_be_created_is_refused_naming_it(command, capsys, tmp_path):
    """Issue 26: an --out below a file (or on a file system that refuses it) ended in mkdir's
    traceback after the run, with exit 1."""
    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    target = a_file / "reports"
    _refused([*command, "--out", str(target)], capsys, tmp_path,
             f"--out: cannot create {target}: {a_file} is a file, not a directory")
    _refused([*command, "--out", "/proc/preflight-reports"], capsys, tmp_path,
             "--out: cannot create /proc/preflight-reports: No such file or directory")
    assert a_file.read_text() == "mine\n"


def test_out_checked_for_real_leaves_no_folder_behind(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    assert targets.unwritable_dir(deep) is None
    assert list(tmp_path.iterdir()) == []


def test_out_made_by_another_run_between_the_look_and_the_mkdir_is_fine(tmp_path, monkeypatch):
    """srun tasks of per-node runs share one --out and start together: one makes the folder while
    another checks it (seen under load in tests/e2e/test_e2e_slurm.py's merge test as "--out:
    cannot create DIR/shared: File exists", exit 2 on that node)."""
    shared = tmp_path / "shared"
    real_mkdir = Path.mkdir

    def raced(self, *args, **kwargs):
        if self == shared:
            real_mkdir(self)  # the other task's, just before ours
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", raced)
    assert targets.unwritable_dir(shared) is None
    assert shared.is_dir()  # theirs: not taken away


def test_a_prometheus_path_that_is_a_directory_is_refused_before_the_run(capsys, tmp_path):
    folder = tmp_path / "textfile"
    folder.mkdir()
    _refused(["analyze", str(FLEET), "--prometheus", str(folder)], capsys, tmp_path,
             f"--prometheus: {folder} is a directory; name the file to write")
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(("selection", "message"), [("", "--checks: no check id given"),
                                                    (",", "--checks: no check id given"),
                                                    ("xid,xid", "--checks: xid named more than once")])
def test_empty_or_duplicate_check_selections(selection, message, capsys, tmp_path):
    _refused(["analyze", str(FLEET), "--checks", selection], capsys, tmp_path, message)


def test_a_bundle_whose_probes_are_objects_is_refused_naming_the_field(capsys, tmp_path):
    """Issue 26: the real example bundle with its `probes` rewritten as objects ended in a TypeError."""
    bundle = tmp_path / "bundle"
    shutil.copytree(FLEET, bundle)
    header = json.loads((bundle / "bundle.json").read_text())
    header["probes"] = [{"id": p} for p in header["probes"]]
    (bundle / "bundle.json").write_text(json.dumps(header))
    _refused(["analyze", str(bundle)], capsys, tmp_path,
             f"{bundle / 'bundle.json'}: field 'probes' must be a list of probe ids (strings), not dict")
