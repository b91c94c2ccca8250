"""A known_hosts file with one bad line: that line is skipped with a warning naming the file
and line, as OpenSSH does, and every other key still verifies its host (collect/known_hosts.py)."""

from __future__ import annotations

import paramiko

from preflight.collect import known_hosts
from preflight.collect.ssh import _load_known_hosts


def _known_hosts(tmp_path, lines: list[str]):
    path = tmp_path / "known_hosts"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_bad_line_is_skipped_with_a_warning_and_the_rest_is_used(tmp_path, capsys):
    key = paramiko.RSAKey.generate(1024)
    good = f"gpu01,10.0.0.1 {key.get_name()} {key.get_base64()}"
    path = _known_hosts(tmp_path, ["# fleet keys", "gpu00 ssh-ed25519 AAAA!!!not-base64!!!", good,
                                   "only-one-field"])
    client = paramiko.SSHClient()
    _load_known_hosts(client, {}, path)
    keys = client.get_host_keys()
    assert keys.lookup("gpu01")[key.get_name()] == key
    assert keys.lookup("10.0.0.1") is not None and keys.lookup("gpu00") is None
    err = capsys.readouterr().err
    assert f"preflight: warning: {path}:2: skipped:" in err
    assert f"{path}:4: skipped:" in err
    assert f"{path}:3" not in err


def test_the_warning_comes_once_per_file_however_many_hosts_connect(tmp_path, capsys):
    path = _known_hosts(tmp_path, ["gpu00 ssh-rsa %%%"])
    for _ in range(3):
        assert known_hosts.entries(path) == ()
    assert capsys.readouterr().err.count("skipped") == 1


def test_hashed_host_names_still_match(tmp_path):
    key = paramiko.RSAKey.generate(1024)
    hashed = paramiko.HostKeys.hash_host("gpu07")
    path = _known_hosts(tmp_path, [f"{hashed} {key.get_name()} {key.get_base64()}"])
    client = paramiko.SSHClient()
    _load_known_hosts(client, {}, path)
    assert client.get_host_keys().lookup("gpu07")[key.get_name()] == key
