"""Host inventory: ``hosts.txt`` files and ``-H a,b,c`` lists.

One entry per line: ``[user@]host[:port]``, where ``host`` may be a ClusterShell range such
as ``gpu[001-016]`` or ``rack[1-2]-gpu[01-08]``; ``#`` starts a comment; blank lines are
ignored; an IPv6 literal is written in brackets (``[fd00::1]:22``); a UTF-8 byte-order mark
is ignored. An entry that repeats an earlier one (same user, host and port: the same node) is
folded into it, with a note; entries that share a host name but differ in user or port are
different nodes and are all checked (``fold``). Every bad line is
reported with its file and line number: the caller turns the list into exit code 2 before
anything runs.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from preflight.model import Host

# Names we accept are what DNS, /etc/hosts and ssh_config aliases accept. Anything else
# (spaces, quotes, `;`, `$(`) is refused here, long before a command is built.
_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?$")
MAX_NAME = 253  # RFC 1035's limit on a whole name; it also keeps a name within a file name's 255
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
        address = m.group(1)
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise ValueError(f"bad IPv6 address {address!r}") from None
        # The address keys the bundle's directory, so its ':' (never allowed in a file name
        # there) become '_'; SSH connects to the address itself.
        return [Host(address.replace(":", "_"), user, _port(m.group(2)), address=address)]
    if text.startswith("[") and ":" in text.split("]")[0]:
        raise ValueError(f"bad IPv6 address {text!r} (expected [ADDRESS] or [ADDRESS]:PORT)")
    if text.count(":") > 1:
        raise ValueError("an IPv6 address goes in brackets: [fd00::1] or [fd00::1]:22")
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
        if len(name) > MAX_NAME:
            raise ValueError(f"host name longer than {MAX_NAME} characters (DNS allows no more)")
        if not _NAME.match(name):
            raise ValueError(f"bad host name {name!r}")
    return [Host(name, user, port) for name in names]


def _port(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"bad port {text!r}")
    return int(text)


def parse_hosts_text(text: str, source: str = "<hosts>", notes: list[str] | None = None) -> list[Host]:
    """Parse a whole hosts file; collect every bad line, then raise once. ``notes`` receives a
    line for each entry folded into an earlier one (the same user, host and port)."""
    entries: list[tuple[int, Host]] = []
    errors: list[InventoryError] = []
    for lineno, raw in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if len(line.split()) > 1:
            errors.append(InventoryError(source, lineno, raw.strip(), "one host entry per line"))
            continue
        try:
            entries.extend((lineno, h) for h in parse_entry(line))
        except ValueError as exc:
            errors.append(InventoryError(source, lineno, raw.strip(), str(exc)))
    if errors:
        raise InventoryInvalid(errors)
    return fold(entries, source, notes if notes is not None else [])


def load_hosts_file(path: Path, notes: list[str] | None = None) -> list[Host]:
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise InventoryInvalid([InventoryError(str(path), 0, "", "a directory, not a hosts file")]) from None
    except OSError as exc:
        raise InventoryInvalid([InventoryError(str(path), 0, "", f"cannot read: {exc.strerror}")]) from None
    except UnicodeDecodeError:
        raise InventoryInvalid([InventoryError(str(path), 0, "", "not a text file")]) from None
    hosts = parse_hosts_text(text, str(path), notes)
    if not hosts:
        raise InventoryInvalid([InventoryError(str(path), 0, "", "no hosts in file")])
    return hosts


def parse_host_list(text: str, notes: list[str] | None = None) -> list[Host]:
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
    hosts = parse_hosts_text("\n".join(e.strip() for e in entries), "-H", notes)
    if not hosts:
        raise InventoryInvalid([InventoryError("-H", 0, text, "no host given")])
    return hosts


def _entry(h: Host) -> str:
    return f"{h.user + '@' if h.user else ''}{h.target if ':' not in h.target else '[' + h.target + ']'}" \
        f"{':' + str(h.port) if h.port else ''}"


def fold(entries: list[tuple[int, Host]], source: str, notes: list[str]) -> list[Host]:
    """The inventory's hosts, one per node. A node is what SSH reaches: user, address and port.
    An entry that repeats an earlier one is folded into it, with a note; entries that share an
    address but differ in user or port are different nodes (behind one bastion, say) and each
    gets a name of its own, ``user_at_host_pPORT``, since the name keys the bundle and report."""
    first: dict[tuple[str | None, str, int | None], tuple[int, Host]] = {}
    for lineno, h in entries:
        key = (h.user, h.target, h.port)
        if key in first:
            notes.append(f"{source}:{lineno}: {_entry(h)} is the same node (user, host and port) as line "
                         f"{first[key][0]}: checked once")
        else:
            first[key] = (lineno, h)
    hosts = [h for _, h in first.values()]
    shared = {name for name in (h.name for h in hosts) if sum(1 for o in hosts if o.name == name) > 1}
    taken: set[str] = {h.name for h in hosts if h.name not in shared}
    out = []
    for h in hosts:
        if h.name in shared:
            base = f"{h.user + '_at_' if h.user else ''}{h.name}{'_p' + str(h.port) if h.port else ''}"
            name, n = base, 1
            while name in taken:
                n += 1
                name = f"{base}_{n}"
            taken.add(name)
            h = Host(name, h.user, h.port, h.target)
        out.append(h)
    return out


def dedupe(hosts: list[Host]) -> list[Host]:
    """``fold`` for hosts without line numbers."""
    return fold(list(enumerate(hosts, start=1)), "<hosts>", [])
