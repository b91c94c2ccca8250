"""known_hosts read once per run: the keys each host is handed, and lines that are skipped."""

import shutil
import subprocess

import pytest

from preflight.collect import known_hosts

needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen (openssh-client)")


def _pubkey(tmp_path, name):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    return (tmp_path / f"{name}.pub").read_text().split()[:2]  # keytype, base64


@needs_keygen
def test_each_name_gets_only_its_own_keys_and_a_bad_line_is_skipped_with_its_place(tmp_path):
    (t1, k1), (t2, k2) = _pubkey(tmp_path, "a"), _pubkey(tmp_path, "b")
    path = tmp_path / "known_hosts"
    path.write_text(f"# fleet\n"
                    f"node1,10.0.0.1 {t1} {k1}\n"
                    f"node2 {t2} AAAA-not-base64\n"        # a corrupt key: skipped, not fatal
                    f"@cert-authority *.example {t2} {k2}\n"
                    f"[node2]:2222 {t2} {k2}\n")
    known = known_hosts.parse(path.read_text(), str(path))
    assert [k.key.get_base64() for k in known.keys_for("node1")] == [k1]
    assert [k.key.get_base64() for k in known.keys_for("10.0.0.1")] == [k1]
    assert [k.key.get_base64() for k in known.keys_for("[node2]:2222")] == [k2]
    assert known.keys_for("node2") == [] and known.keys_for("node3") == []
    assert [w.split(": ", 1)[0] for w in known.warnings] == [f"{path}:3", f"{path}:4"]
    assert "@cert-authority" in known.warnings[1]


@needs_keygen
def test_hashed_names_as_ssh_keygen_writes_them_are_matched(tmp_path):
    t, k = _pubkey(tmp_path, "a")
    path = tmp_path / "known_hosts"
    path.write_text(f"node1 {t} {k}\n[node1]:2200 {t} {k}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(path)], check=True, capture_output=True)
    assert "node1" not in path.read_text() and path.read_text().startswith("|1|")
    known = known_hosts.parse(path.read_text(), str(path))
    assert known.plain == {} and len(known.hashed) == 2
    assert [x.key.get_base64() for x in known.keys_for("node1")] == [k]
    assert [x.key.get_base64() for x in known.keys_for("[node1]:2200")] == [k]
    assert known.keys_for("node2") == []


@needs_keygen
def test_a_file_is_parsed_again_only_when_it_changes(tmp_path, capsys):
    t, k = _pubkey(tmp_path, "a")
    path = tmp_path / "known_hosts"
    path.write_text(f"node1 {t} {k}\nbroken\n")
    first = known_hosts.load(path)
    assert known_hosts.load(path) is first
    assert capsys.readouterr().err.count(f"{path}:2") == 1  # warned once, not once per host
    path.write_text(f"node1 {t} {k}\nnode2 {t} {k}\n")
    again = known_hosts.load(path)
    assert again is not first and again.keys_for("node2") and again.warnings == []
    assert known_hosts.load(tmp_path / "absent").keys_for("node1") == []


def test_files_follow_openssh_order(tmp_path):
    extra = tmp_path / "extra"
    user = known_hosts.files_for({"userknownhostsfile": f"{tmp_path}/a {tmp_path}/b"}, extra)
    assert user[:3] == [extra, tmp_path / "a", tmp_path / "b"] and str(user[-1]) == "/etc/ssh/ssh_known_hosts"
    default = known_hosts.files_for({}, None)
    assert default[0].name == "known_hosts" and default[0].parent.name == ".ssh"
