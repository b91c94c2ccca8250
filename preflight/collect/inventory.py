"""Host inventory: ``hosts.txt`` files and ``-H a,b,c`` lists.

One entry per line: ``[user@]host[:port]``, where ``host`` may be a ClusterShell range such
as ``gpu[001-016]`` or ``rack[1-2]-gpu[01-08]``; ``#`` starts a comment; blank lines are
ignored; an IPv6 literal is written in brackets (``[fd00::1]:22``). Duplicates are folded,
keeping the first spelling, so a host listed twice is checked once. Every bad line is
reported with its file and line number: the caller turns the list into exit code 2 before
anything runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from preflight.model import Host

# Names we accept are what DNS, /etc/hosts and ssh_config aliases accept. Anything else
# (spaces, quotes, `;`, `$(`) is refused here, long before a command is built.
_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?$")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_IPV6 = re.compile(r"^\[([0-9A-Fa-f:.]+)\](?::(\d+))?$")


@dataclass(frozen=True)
class InventoryError:
    source: str
    line: int
    text: str
    problem: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.problem}: {self.text!r}"


class InventoryInvalid(ValueError):
    def __init__(self, errors: list[InventoryError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def parse_entry(text: str) -> list[Host]:
    """Expand one ``[user@]host[:port]`` entry; raise ValueError naming what is wrong."""
    user = None
    if "@" in text:
        user, _, text = text.partition("@")
        if not _USER.match(user):
            raise ValueError(f"bad user name {user!r}")
    m = _IPV6.match(text)
    if m:
        return [Host(m.group(1), user, _port(m.group(2)))]
    port = None
    # A port follows the last ':' outside brackets; ranges never contain ':'.
    if ":" in text:
        text, _, port_text = text.rpartition(":")
        port = _port(port_text)
    if not text:
        raise ValueError("missing host name")
    try:
        names = list(NodeSet(text)) if "[" in text else [text]
    except NodeSetParseError as exc:
        raise ValueError(f"bad host range ({exc})") from None
    for name in names:
        if not _NAME.match(name):
            raise ValueError(f"bad host name {name!r}")
    return [Host(name, user, port) for name in names]


def _port(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"bad port {text!r}")
    return int(text)


def parse_hosts_text(text: str, source: str = "<hosts>") -> list[Host]:
    """Parse a whole hosts file; collect every bad line, then raise once."""
    hosts: list[Host] = []
    errors: list[InventoryError] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if len(line.split()) > 1:
            errors.append(InventoryError(source, lineno, raw.strip(), "one host entry per line"))
            continue
        try:
            hosts.extend(parse_entry(line))
        except ValueError as exc:
            errors.append(InventoryError(source, lineno, raw.strip(), str(exc)))
    if errors:
        raise InventoryInvalid(errors)
    return dedupe(hosts)


def load_hosts_file(path: Path) -> list[Host]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InventoryInvalid([InventoryError(str(path), 0, "", f"cannot read: {exc.strerror}")]) from None
    except UnicodeDecodeError:
        raise InventoryInvalid([InventoryError(str(path), 0, "", "not a text file")]) from None
    hosts = parse_hosts_text(text, str(path))
    if not hosts:
        raise InventoryInvalid([InventoryError(str(path), 0, "", "no hosts in file")])
    return hosts


def parse_host_list(text: str) -> list[Host]:
    """``-H a,b,gpu[01-04]``: commas separate entries, except inside a range's brackets."""
    entries, depth, current = [], 0, ""
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += ch
    entries.append(current)
    return parse_hosts_text("\n".join(e.strip() for e in entries), "-H")


def dedupe(hosts: list[Host]) -> list[Host]:
    seen: dict[str, Host] = {}
    for h in hosts:
        seen.setdefault(h.name, h)
    return list(seen.values())
