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
    # An IPv6 address keys the bundle with '_' for ':' and is connected to as written.
    assert [h.name for h in hosts] == ["gpu001", "gpu002", "gpu003", "gpu004", "fd00__7",
                                       "rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    assert hosts[3] == Host("gpu004", "admin", 2222)
    assert hosts[4].port == 2200 and hosts[4].target == "fd00::7"


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


def test_entries_that_differ_in_port_or_user_are_different_nodes(tmp_path):
    # Nodes behind one bastion: the port or the user picks the node. Each is checked, under a
    # name of its own; a repeated entry is the same node, folded with a note naming both lines.
    f = tmp_path / "hosts.txt"
    f.write_text("bastion:2222\nbastion:2223\nu1@bastion\nu2@bastion\nbastion:2222\ngpu01\n")
    notes: list[str] = []
    hosts = load_hosts_file(f, notes)
    assert [(h.name, h.target, h.user, h.port) for h in hosts] == [
        ("bastion_p2222", "bastion", None, 2222), ("bastion_p2223", "bastion", None, 2223),
        ("u1_at_bastion", "bastion", "u1", None), ("u2_at_bastion", "bastion", "u2", None),
        ("gpu01", "gpu01", None, None)]
    assert notes == [f"{f}:5: bastion:2222 is the same node (user, host and port) as line 1: checked once"]


def test_a_derived_name_never_takes_an_inventory_name():
    hosts = parse_hosts_text("h:1\nh:2\nh_p1\n")
    assert [h.name for h in hosts] == ["h_p1_2", "h_p2", "h_p1"]
    assert len({h.name for h in hosts}) == 3


def test_a_utf8_bom_is_not_part_of_line_1(tmp_path):
    f = tmp_path / "hosts.txt"
    f.write_bytes("gpu01\ngpu02\n".encode("utf-8-sig"))
    assert [h.name for h in load_hosts_file(f)] == ["gpu01", "gpu02"]


def test_ipv6_without_brackets_says_so():
    with pytest.raises(InventoryInvalid, match=r"<hosts>:1: an IPv6 address goes in brackets"):
        parse_hosts_text("fd00::1\n")
    with pytest.raises(InventoryInvalid, match="bad IPv6 address"):
        parse_hosts_text("[fd00:::zz]\n")


@pytest.mark.parametrize("text", ["", ",", " , "])
def test_an_empty_host_list_is_an_error_not_this_machine(text):
    with pytest.raises(InventoryInvalid, match="no host given"):
        parse_host_list(text)


def test_a_host_name_longer_than_dns_allows_is_refused():
    with pytest.raises(InventoryInvalid, match="longer than 253 characters"):
        parse_hosts_text("a" * 300 + "\n")


def test_a_directory_as_hosts_file(tmp_path):
    with pytest.raises(InventoryInvalid, match="a directory, not a hosts file"):
        load_hosts_file(tmp_path)
