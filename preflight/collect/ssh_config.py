"""The ssh config, looked up per host at a cost that does not grow with the fleet.

paramiko's ``SSHConfig.lookup`` walks every stanza of the file for every host (twice), so a
config with a ``Host`` stanza per node, which is how many sites generate theirs, made each
connection cost time in proportion to the fleet: quadratic over a run, and a tenth of the
controller's CPU at only 64 hosts. ``IndexedSSHConfig`` reads the same files, then answers a
lookup from the stanzas that can apply to that host: those naming it literally, and every one
that may match any host (a wildcard or negated pattern, a ``Match``, each file's leading
global part), in their order in the files. paramiko does the lookup itself on those, so its
semantics (first value wins, ``Match`` rules, token expansion) are untouched. A file using
``Include`` or ``CanonicalizeHostname`` (where a lookup may see another name) is looked up
the plain way.
"""

from __future__ import annotations

import io
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

# fabric's own choice of files: a given path alone, else the user's file then the system's.
DEFAULT_PATHS = (Path("~/.ssh/config"), Path("/etc/ssh/ssh_config"))

_WILDCARD = re.compile(r"[*?\[!]")
_WHOLE_FILE_NEEDED = re.compile(r"^\s*(?:include|canonicalizehostname)\b", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Stanza:
    """One ``Host``/``Match`` block as written, or a file's leading lines (which apply to every
    host); ``names``: the host names it applies to, None when it may apply to any."""

    text: str
    names: frozenset[str] | None


def stanzas(text: str) -> list[Stanza]:
    """The blocks of one ssh config file, in order; the leading part becomes ``Host *``, which
    is what paramiko makes of it, so that blocks from several files can be joined."""
    # (the Host line's patterns, or None for the leading part and a Match block; the lines)
    blocks: list[tuple[str | None, list[str]]] = [(None, ["Host *"])]
    for line in text.splitlines():
        match = re.match(paramiko.SSHConfig.SETTINGS_REGEX, line.strip())
        keyword = match.group(1).lower() if match else None
        if keyword in ("host", "match"):
            blocks.append((match.group(2) if keyword == "host" else None, [line]))
        else:
            blocks[-1][1].append(line)
    return [Stanza("\n".join(lines) + "\n", _names(patterns)) for patterns, lines in blocks]


def _names(patterns: str | None) -> frozenset[str] | None:
    if patterns is None:
        return None
    try:
        names = shlex.split(patterns)
    except ValueError:
        return None  # paramiko refuses the file anyway; no shortcut for it
    if not names or any(_WILDCARD.search(n) for n in names):
        return None
    return frozenset(names)


class IndexedSSHConfig(paramiko.SSHConfig):
    """An ``SSHConfig`` of several files' texts (in the order paramiko would parse them) whose
    ``lookup`` reads only the stanzas that can apply to the host."""

    def __init__(self, texts: Sequence[str] = ()):
        super().__init__()
        for text in texts:
            self.parse(io.StringIO(text))
        whole = any(_WHOLE_FILE_NEEDED.search(t) for t in texts)
        self._stanzas = None if whole else [s for t in texts for s in stanzas(t)]
        self._general: list[int] = []
        self._by_name: dict[str, list[int]] = {}
        for i, stanza in enumerate(self._stanzas or ()):
            if stanza.names is None:
                self._general.append(i)
            else:
                for name in stanza.names:
                    self._by_name.setdefault(name, []).append(i)

    @classmethod
    def from_paths(cls, paths: Sequence[Path]) -> IndexedSSHConfig:
        """The files that exist among ``paths``, read in order."""
        files = [p.expanduser() for p in paths]
        return cls([p.read_text() for p in files if p.is_file()])

    def lookup(self, hostname: str) -> paramiko.SSHConfigDict:
        if self._stanzas is None:
            return super().lookup(hostname)
        picked = sorted({*self._general, *self._by_name.get(hostname, ())})
        return paramiko.SSHConfig.from_text("".join(self._stanzas[i].text for i in picked)).lookup(hostname)
