"""IndexedSSHConfig (preflight/collect/ssh_config.py) looks a host up in the stanzas that can
apply to it; every answer must be paramiko's own answer over the whole files."""

from __future__ import annotations

import io

import paramiko
import pytest

from preflight.collect.ssh_config import IndexedSSHConfig, stanzas

USER = """\
# generated per node, as many sites do
User ops
IdentityFile ~/.ssh/fleet_ed25519

Host gpu001
    HostName 10.0.0.1
    Port 2201
Host gpu002 gpu003
    HostName 10.0.0.2
    IdentityFile ~/.ssh/gpu002
host=gpu004
    hostname 10.0.0.4
Host "gpu005"
    HostName 10.0.0.5
Host gpu0* !gpu007
    ProxyJump bastion
    IdentityFile ~/.ssh/rack1
Match host gpu006
    User matched
Host gpu00?
    ConnectTimeout 7
Host gpu001
    HostName never-used-the-first-value-wins
    ServerAliveInterval 30
Host *
    StrictHostKeyChecking yes
"""

SYSTEM = """\
Port 22
Host gpu002
    User from-system
Host *.example.com
    User example
"""

NAMES = ["gpu001", "gpu002", "gpu003", "gpu004", "gpu005", "gpu006", "gpu007", "gpu010", "bastion",
         "node.example.com", "gpu0", "GPU001", "unknown"]


def _plain(*texts: str) -> paramiko.SSHConfig:
    config = paramiko.SSHConfig()
    for text in texts:
        config.parse(io.StringIO(text))
    return config


@pytest.mark.parametrize("texts", [(USER,), (USER, SYSTEM), (SYSTEM, USER), ("",), ("Host gpu001\n  Port 1\n",)])
def test_every_lookup_is_paramikos_over_the_whole_files(texts):
    indexed, plain = IndexedSSHConfig(texts), _plain(*texts)
    assert indexed._stanzas is not None  # the shortcut is taken
    for name in NAMES:
        assert indexed.lookup(name) == plain.lookup(name), name


def test_a_fleet_of_per_node_stanzas_reads_only_the_nodes_own_and_the_general_ones():
    text = "".join(f"Host node{i:04d}\n    HostName 10.1.{i // 250}.{i % 250}\n" for i in range(1000))
    text += "Host node*\n    User fleet\n"
    indexed, plain = IndexedSSHConfig([text]), _plain(text)
    for name in ("node0000", "node0517", "node0999", "node1000"):
        assert indexed.lookup(name) == plain.lookup(name)
    assert len(indexed._by_name["node0517"]) == 1 and len(indexed._general) == 2  # its stanza; `node*` and the lead


def test_include_and_canonicalisation_fall_back_to_the_whole_file():
    for text in ("Include ~/.ssh/config.d/*\nHost a\n  Port 1\n",
                 "CanonicalizeHostname yes\nCanonicalDomains example.com\nHost a\n  Port 2\n"):
        indexed = IndexedSSHConfig([text])
        assert indexed._stanzas is None
        assert indexed.lookup("a")["port"] == _plain(text).lookup("a")["port"]


def test_stanzas_keep_the_files_text_and_name_only_literal_hosts():
    got = stanzas(USER)
    assert got[0].names is None and "IdentityFile ~/.ssh/fleet_ed25519" in got[0].text  # the lead, as Host *
    named = [s.names for s in got[1:]]
    assert named[:4] == [frozenset({"gpu001"}), frozenset({"gpu002", "gpu003"}), frozenset({"gpu004"}),
                         frozenset({"gpu005"})]
    assert named[4:7] == [None, None, None]  # wildcard with a negation, Match, `?`
    assert "".join(s.text for s in got).replace("Host *\n", "", 1) == USER


def test_a_file_paramiko_cannot_parse_is_refused_as_before():
    with pytest.raises(paramiko.ssh_exception.ConfigParseError):
        IndexedSSHConfig(["Host a\n  this-line-has-no-value\n"])


def test_every_connection_gets_a_fabric_config_of_its_own_around_one_parse(tmp_path):
    """A fabric Connection writes into its Config while it is built, which re-merges that
    Config from nothing. One Config shared by every node's thread made a thread that read it
    mid-merge fail to connect ("No attribute or config key found for 'user'", 1 host in 64
    under load). Node threads build Connections at once here, as a run does, and every one
    must see its user and port."""
    import sys
    import threading

    from fabric import Connection

    from preflight.collect import ssh

    config = tmp_path / "ssh_config"
    config.write_text(USER)
    first, second = ssh._base_config(config), ssh._base_config(config)
    assert first is not second
    assert first.base_ssh_config is second.base_ssh_config  # the file is parsed once

    failures: list[BaseException] = []
    start = threading.Barrier(8)

    def build() -> None:
        start.wait()
        for _ in range(30):
            try:
                conn = Connection("gpu001", config=ssh._base_config(config), connect_kwargs={"allow_agent": False})
                assert (conn.user, conn.port, conn.host) == ("ops", 2201, "10.0.0.1")
            except BaseException as exc:  # noqa: BLE001 - collected and reported below
                failures.append(exc)

    threads = [threading.Thread(target=build) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, as a loaded controller does
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures, failures[:3]
