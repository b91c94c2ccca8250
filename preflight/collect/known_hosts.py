"""known_hosts files, read once per run and looked up per host in constant time.

paramiko's ``load_system_host_keys`` parses a whole known_hosts file into each client, and its
lookup walks every entry: with one client per node and a file that lists the fleet, both are
quadratic in the fleet (10,000 nodes: 10^8 entry visits). Here each file is parsed once (again
only when it changes), plain host names are indexed, and each connection is handed just the
keys recorded for its own name.

Lines paramiko cannot read (a corrupt key, an unknown key type, a marker such as
``@cert-authority``) are skipped with a warning naming the file and line, as OpenSSH does,
instead of one bad line making every host unreachable. Like paramiko, host patterns with
wildcards and negations are not matched; hashed names (``|1|salt|hash``) are.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry


@dataclass(frozen=True)
class HostKey:
    keytype: str
    key: paramiko.PKey


@dataclass
class KnownHosts:
    plain: dict[str, list[HostKey]] = field(default_factory=dict)  # name as written -> its keys
    hashed: list[tuple[bytes, bytes, HostKey]] = field(default_factory=list)  # (salt, digest, key)
    warnings: list[str] = field(default_factory=list)  # "FILE:LINE: why", one per skipped line

    def keys_for(self, name: str) -> list[HostKey]:
        """The keys recorded for ``name`` (``host`` or ``[host]:port``, as paramiko asks)."""
        found = list(self.plain.get(name, ()))
        raw = name.encode()
        for salt, digest, key in self.hashed:
            if hmac.compare_digest(hmac.new(salt, raw, hashlib.sha1).digest(), digest):
                found.append(key)
        return found


def parse(text: str, origin: str) -> KnownHosts:
    """One known_hosts file's text; ``origin`` names it in warnings."""
    known = KnownHosts()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            known.warnings.append(f"{origin}:{number}: marker {line.split()[0]} is not supported, line skipped")
            continue
        try:
            entry = HostKeyEntry.from_line(line, number)
        except Exception as exc:  # noqa: BLE001 - any unreadable line is skipped, as OpenSSH does
            entry, why = None, f"{type(exc).__name__}: {exc}"
        else:
            why = "not a host key line"
        if entry is None or entry.key is None:
            known.warnings.append(f"{origin}:{number}: {why}, line skipped")
            continue
        key = HostKey(entry.key.get_name(), entry.key)
        for name in entry.hostnames:
            if name.startswith("|1|"):
                try:
                    salt_b64, digest_b64 = name[3:].split("|", 1)
                    known.hashed.append((base64.b64decode(salt_b64), base64.b64decode(digest_b64), key))
                except ValueError:
                    known.warnings.append(f"{origin}:{number}: malformed hashed host name, skipped")
            else:
                known.plain.setdefault(name, []).append(key)
    return known


_cache: dict[Path, tuple[tuple[int, int], KnownHosts]] = {}
_cache_lock = threading.Lock()


def load(path: Path) -> KnownHosts:
    """The parsed file, from a cache keyed by its modification time and size; a file that
    cannot be read counts as empty, with a warning."""
    try:
        st = path.stat()
    except OSError:
        return KnownHosts()
    stamp = (st.st_mtime_ns, st.st_size)
    with _cache_lock:
        hit = _cache.get(path)
        if hit and hit[0] == stamp:
            return hit[1]
        try:
            known = parse(path.read_text(errors="replace"), str(path))
        except OSError as exc:
            known = KnownHosts(warnings=[f"{path}: cannot be read ({exc.strerror or exc})"])
        _cache[path] = (stamp, known)
    # Once per file version, on stderr, as ssh itself reports a line it skips.
    for warning in known.warnings:
        print(f"preflight: warning: known_hosts {warning}", file=sys.stderr)
    return known


def files_for(host_config: dict, extra: Path | None) -> list[Path]:
    """The known_hosts files one host is checked against, in OpenSSH's order: ``--known-hosts``,
    the ssh config's UserKnownHostsFile (else ~/.ssh/known_hosts), then the system file."""
    files = [extra] if extra else []
    files += [Path(os.path.expanduser(n)) for n in str(host_config.get("userknownhostsfile", "")).split()]
    if not files:
        files.append(Path.home() / ".ssh" / "known_hosts")
    files.append(Path("/etc/ssh/ssh_known_hosts"))
    return files
