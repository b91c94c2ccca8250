"""The evidence bundle (contract ``preflight-bundle/1``): write it as a run goes, read it back.

    BUNDLE/bundle.json                  {"format": "preflight-bundle/1", "created": ..., "hosts": [...]}
    BUNDLE/hosts/<host>/<probe>.txt     raw stdout, byte for byte
    BUNDLE/hosts/<host>/<probe>.json    command, exit_code, stderr, started, duration_s, timed_out
    BUNDLE/hosts/fleet-/<probe>.txt     runs that span hosts (preflight/collect/multinode.py), same files

``fleet-`` (``FLEET_HOST``) is a pseudo-host: no inventory line can name it (a host name never
ends with "-"), it is not in ``bundle.json``'s hosts, and ``read_bundle`` returns its results
as ``Bundle.fleet``, so no host check ever runs on it.

Each result is written the moment it arrives, through a temporary file and a rename, so a
controller killed mid-run leaves a bundle whose every file is whole and which ``analyze``
reads as it reads a finished one. A missing ``.txt`` means the probe did not run or its
tool is absent; the ``.json`` says which.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from preflight.evidence.atomic import write_atomic
from preflight.model import ProbeResult

FORMAT = "preflight-bundle/1"
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")
FLEET_HOST = "fleet-"
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")  # what a run id's node part may not hold


class BundleError(ValueError):
    """The directory is not a readable preflight bundle; the message says where and why."""


def _safe_component(name: str, what: str) -> str:
    # Host and probe names become path components; inventory validation already restricts
    # them, this guards bundles assembled by other tools from escaping the directory.
    if not _SAFE.match(name) or name in (".", ".."):
        raise BundleError(f"{what} {name!r} cannot be used as a file name")
    return name


class BundleWriter:
    def __init__(self, root: Path, hosts: list[str], created: str, meta: dict | None = None):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "hosts").mkdir(exist_ok=True)
        header = {"format": FORMAT, "created": created, "hosts": hosts}
        if meta:
            header.update(meta)
        write_atomic(self.root / "bundle.json", (json.dumps(header, indent=2) + "\n").encode())
        # What was written, as the reader sees it: bundle.json goes through JSON, so does this.
        self.header: dict = json.loads(json.dumps(header))
        self._results: dict[str, dict[str, ProbeResult]] = {}
        self._host_dirs: dict[str, str] = {}

    def add(self, result: ProbeResult) -> None:
        host_dir = self._host_dir(result.host)
        probe = _safe_component(result.probe, "probe")
        stdout = result.stdout if result.stdout is not None and not result.tool_missing else None
        if stdout is not None:
            write_atomic(f"{host_dir}/{probe}.txt", stdout)
        meta = result.meta()
        write_atomic(f"{host_dir}/{probe}.json", (json.dumps(meta, indent=2) + "\n").encode())
        # Kept as the reader will see it (same normalisation), so that a run judges the bundle
        # without reading back every file it has just written.
        self._results.setdefault(result.host, {})[probe] = _result_from(result.host, probe, stdout, meta)

    def _host_dir(self, host: str) -> str:
        """The host's directory: made, and its path built, at the host's first record rather
        than joined again through pathlib for each file of every record."""
        path = self._host_dirs.get(host)
        if path is None:
            path = os.path.join(self.root, "hosts", _safe_component(host, "host"))
            Path(path).mkdir(exist_ok=True)
            self._host_dirs[host] = path
        return path

    def records_of(self, host: str) -> dict[str, ProbeResult]:
        """The host's records so far, as ``bundle()`` would give them: in the reader's order (by probe id)."""
        return dict(sorted(self._results.get(host, {}).items()))

    def bundle(self) -> Bundle:
        """The bundle as written so far, equal to what ``read_bundle`` reads from ``root``."""
        results = {host: self.records_of(host) for host in self.header["hosts"]}
        fleet = self.records_of(FLEET_HOST)
        return Bundle(self.root, str(self.header.get("created", "")), tuple(self.header["hosts"]), results,
                      dict(self.header), fleet)


@dataclass(frozen=True)
class Bundle:
    root: Path
    created: str
    hosts: tuple[str, ...]
    results: dict[str, dict[str, ProbeResult]]  # host -> probe id -> result
    header: dict
    fleet: dict[str, ProbeResult] = field(default_factory=dict)  # FLEET_HOST's results by probe id

    def probes_of(self, host: str) -> dict[str, ProbeResult]:
        return self.results.get(host, {})


def read_bundle(root: Path) -> Bundle:
    """The bundle at ``root``; ``BundleError`` naming the file and field for anything that
    breaks the contract (docs/contracts.md §3), a link that leaves the bundle included."""
    header_path = root / "bundle.json"
    if not header_path.is_file():
        raise BundleError(f"{root}: not a bundle (no bundle.json)")
    base = root.resolve()
    header = _read_json(header_path, base)
    if header.get("format") != FORMAT:
        raise BundleError(f"{header_path}: field 'format' is {header.get('format')!r}, expected {FORMAT!r}")
    hosts = header.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise BundleError(f"{header_path}: field 'hosts' must be a list of host names")
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise BundleError(f"{header_path}: field 'hosts' lists {', '.join(twice)} more than once")
    if not isinstance(header.get("created", ""), str):
        raise BundleError(f"{header_path}: field 'created' must be an ISO-8601 string")
    for key, what in (("probes", "probe ids"), ("checks", "check ids")):
        # Optional; when there, the judge looks names up in them, so anything but a list of
        # strings (a list of objects from another writer) is refused here rather than crashing it.
        names = header.get(key)
        if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
            bad = next((n for n in names if not isinstance(n, str)), names) if isinstance(names, list) else names
            raise BundleError(f"{header_path}: field {key!r} must be a list of {what} (strings), "
                              f"not {type(bad).__name__} {_short(bad)}")
    results: dict[str, dict[str, ProbeResult]] = {}
    for host in hosts:
        host_dir = root / "hosts" / _safe_component(host, "host")
        results[host] = _read_host(host, host_dir, base) if host_dir.is_dir() else {}
    fleet_dir = root / "hosts" / FLEET_HOST
    fleet = _read_host(FLEET_HOST, fleet_dir, base) if fleet_dir.is_dir() else {}
    return Bundle(root, str(header.get("created", "")), tuple(hosts), results, header, fleet)


def _short(value: object, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= width else text[:width - 3] + "..."


def _inside(path: Path, base: Path) -> Path:
    """``path``, refused when it (or a link on the way) leads out of the bundle: a bundle
    received from elsewhere must not make the analyst's own files (an SSH key) into evidence."""
    resolved = path.resolve()
    if resolved != base and base not in resolved.parents:
        raise BundleError(f"{path}: a link to {resolved}, outside the bundle; refused")
    return path


def _read_json(path: Path, base: Path | None) -> dict:
    """``base``: the bundle, to refuse a link out of it; None for a file already known inside."""
    try:
        doc = json.loads((_inside(path, base) if base is not None else path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: invalid JSON ({exc})") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot read ({exc.strerror})") from None
    if not isinstance(doc, dict):
        raise BundleError(f"{path}: not a JSON object")
    return doc


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# Each field of a probe's .json: (what it must be, the test). JSON has a boolean, so
# "timed_out": "false" is refused rather than read as a hang (any non-empty string is truthy).
_META_FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "command": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v)),
    "exit_code": ("an integer or null", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "stderr": ("a string", lambda v: isinstance(v, str)),
    "started": ("an ISO-8601 string", lambda v: isinstance(v, str)),
    "duration_s": ("a finite number of seconds", _is_number),
    "timed_out": ("true or false", lambda v: isinstance(v, bool)),
    "error": ("a string", lambda v: isinstance(v, str)),
}


def _read_meta(path: Path, base: Path | None) -> dict:
    meta = _read_json(path, base)
    for key, (kind, ok) in _META_FIELDS.items():
        if meta.get(key) is not None and not ok(meta[key]):
            raise BundleError(f"{path}: field {key!r} must be {kind}, not {meta[key]!r}")
    return meta


def _read_host(host: str, host_dir: Path, base: Path) -> dict[str, ProbeResult]:
    probes: dict[str, ProbeResult] = {}
    _inside(host_dir, base)
    # One directory scan instead of a stat per file, and a file resolved only when it is a link:
    # a plain file in a directory inside the bundle is inside it (resolving each of a large
    # fleet's files was most of the time `analyze` took to read it).
    ids: set[str] = set()
    files: set[str] = set()
    with os.scandir(host_dir) as entries:
        for entry in entries:
            stem, dot, suffix = entry.name.rpartition(".")
            if not dot or not stem or f".{suffix}" not in (".txt", ".json") or entry.name.startswith("."):
                continue
            ids.add(stem)
            if entry.is_file():  # follows a link; a dangling one, or a directory, is no file
                if entry.is_symlink():
                    _inside(Path(entry.path), base)
                files.add(entry.name)
    for probe in sorted(ids):
        txt, meta_path = host_dir / f"{probe}.txt", host_dir / f"{probe}.json"
        meta = _read_meta(meta_path, None) if meta_path.name in files else {}
        stdout = txt.read_bytes() if txt.name in files else None
        probes[probe] = _result_from(host, probe, stdout, meta)
    return probes


def _result_from(host: str, probe: str, stdout: bytes | None, meta: dict) -> ProbeResult:
    """One probe's record from its two files' contents; the writer's in-memory copy comes
    through here too, so a run and a later ``analyze`` judge the same records."""
    # A bare .txt (a capture a user dropped in by hand) counts as a clean run.
    exit_code = meta.get("exit_code", 0 if stdout is not None else None)
    return ProbeResult(
        probe=probe,
        host=host,
        command=tuple(meta.get("command") or ()),
        stdout=stdout,
        stderr=str(meta.get("stderr") or ""),
        exit_code=exit_code if isinstance(exit_code, int) else None,
        started=meta.get("started"),
        duration_s=meta.get("duration_s"),
        timed_out=bool(meta.get("timed_out", False)),
        error=meta.get("error"),
    )


def host_reachability(bundle: Bundle, host: str) -> tuple[bool, str | None]:
    """(reachable, why not): a host is unreachable when no probe got past the connection."""
    return reachability(bundle.probes_of(host))


def reachability(results: Mapping[str, ProbeResult]) -> tuple[bool, str | None]:
    """``host_reachability`` of one host's records."""
    if not results:
        return False, "no evidence recorded for this host (the run did not reach it)"
    errors = [r.error for r in results.values() if r.error]
    if len(errors) == len(results):
        return False, errors[0]
    return True, None


def new_run_id(node: str | None = None, now: datetime | None = None) -> str:
    """``YYYYMMDD-HHMMSS-NODE-R``: the UTC second, the node that made the run (its name as a file
    name may hold it, at most 63 characters) and 64 random bits R (16 hex digits). Unique by
    construction where the older ``YYYYMMDD-HHMMSS-xxxx`` (16 random bits) was not: Slurm starts
    every node's HealthCheckProgram on one tick, and 300 ids of one second drawn from 65,536
    collide with even odds. The node alone separates nodes, the 64 bits two runs of one node in
    one second (and nodes whose names reduce alike). Ids sort by time, as before."""
    now = now or datetime.now(timezone.utc)
    label = _ID_UNSAFE.sub("_", node or "")[:63].strip("_.-")
    return now.strftime("%Y%m%d-%H%M%S-") + (f"{label}-" if label else "") + secrets.token_hex(8)
