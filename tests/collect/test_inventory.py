import pytest

from preflight.collect.inventory import InventoryInvalid, load_hosts_file, parse_host_list, parse_hosts_text
from preflight.model import Host


def test_entries_ranges_comments_and_duplicates(tmp_path):
    f = tmp_path / "hosts.txt"
    f.write_text(
        "# rack 1\n"
        "gpu[001-003]\n"
        "\n"
        "admin@gpu004:2222   # odd port\n"
        "gpu002\n"             # duplicate of a range member: folded
        "[fd00::7]:2200\n"
        "rack[1-2]-n[1-2]\n"
    )
    hosts = load_hosts_file(f)
    assert [h.name for h in hosts] == ["gpu001", "gpu002", "gpu003", "gpu004", "fd00::7",
                                       "rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    assert hosts[3] == Host("gpu004", "admin", 2222)
    assert hosts[4].port == 2200


def test_every_bad_line_is_named_with_file_and_line(tmp_path):
    f = tmp_path / "hosts.txt"
    f.write_text("gpu01\ngpu02:99999\nbad host\n$(reboot)\ngpu[3-\nok@\n")
    with pytest.raises(InventoryInvalid) as exc:
        load_hosts_file(f)
    lines = [(e.line, e.problem) for e in exc.value.errors]
    assert [ln for ln, _ in lines] == [2, 3, 4, 5, 6]
    text = str(exc.value)
    assert f"{f}:2: bad port '99999'" in text
    assert f"{f}:3: one host entry per line" in text
    assert "bad host name '$(reboot)'" in text
    assert "bad host range" in text
    assert "missing host name" in text


def test_shell_metacharacters_never_become_hosts():
    for evil in ["a;b", "a|b", "`id`", "a'b", 'a"b', "a b", "-oProxyCommand=x", "a&&b"]:
        with pytest.raises(InventoryInvalid):
            parse_hosts_text(evil)


def test_inline_list_splits_outside_brackets():
    hosts = parse_host_list("a,gpu[01-02,05],root@b:23")
    assert [h.name for h in hosts] == ["a", "gpu01", "gpu02", "gpu05", "b"]
    assert hosts[-1].user == "root" and hosts[-1].port == 23


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    with pytest.raises(InventoryInvalid, match="no hosts in file"):
        load_hosts_file(empty)
    with pytest.raises(InventoryInvalid, match="cannot read"):
        load_hosts_file(tmp_path / "absent.txt")
