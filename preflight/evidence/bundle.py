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
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from preflight.evidence.atomic import write_atomic
from preflight.model import ProbeResult

FORMAT = "preflight-bundle/1"
_SAFE = re.compile(r"^[A-Za-z0-9_.\-]+$")
FLEET_HOST = "fleet-"


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

    def add(self, result: ProbeResult) -> None:
        host_dir = self.root / "hosts" / _safe_component(result.host, "host")
        host_dir.mkdir(exist_ok=True)
        probe = _safe_component(result.probe, "probe")
        if result.stdout is not None and not result.tool_missing:
            write_atomic(host_dir / f"{probe}.txt", result.stdout)
        write_atomic(host_dir / f"{probe}.json", (json.dumps(result.meta(), indent=2) + "\n").encode())


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
    header_path = root / "bundle.json"
    if not header_path.is_file():
        raise BundleError(f"{root}: not a bundle (no bundle.json)")
    try:
        header = json.loads(header_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{header_path}: invalid JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BundleError(f"{header_path}: field 'format' is {header.get('format')!r}, expected {FORMAT!r}"
                          if isinstance(header, dict) else f"{header_path}: not a JSON object")
    hosts = header.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise BundleError(f"{header_path}: field 'hosts' must be a list of host names")
    results: dict[str, dict[str, ProbeResult]] = {}
    for host in hosts:
        host_dir = root / "hosts" / _safe_component(host, "host")
        results[host] = _read_host(host, host_dir) if host_dir.is_dir() else {}
    fleet_dir = root / "hosts" / FLEET_HOST
    fleet = _read_host(FLEET_HOST, fleet_dir) if fleet_dir.is_dir() else {}
    return Bundle(root, str(header.get("created", "")), tuple(hosts), results, header, fleet)


def _read_host(host: str, host_dir: Path) -> dict[str, ProbeResult]:
    probes: dict[str, ProbeResult] = {}
    ids = {p.stem for p in host_dir.iterdir() if p.suffix in (".txt", ".json") and not p.name.startswith(".")}
    for probe in sorted(ids):
        txt, meta_path = host_dir / f"{probe}.txt", host_dir / f"{probe}.json"
        meta: dict = {}
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise BundleError(f"{meta_path}: invalid JSON ({exc})") from None
            if not isinstance(meta, dict):
                raise BundleError(f"{meta_path}: not a JSON object")
        stdout = txt.read_bytes() if txt.is_file() else None
        # A bare .txt (a capture a user dropped in by hand) counts as a clean run.
        exit_code = meta.get("exit_code", 0 if stdout is not None else None)
        probes[probe] = ProbeResult(
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
    return probes


def host_reachability(bundle: Bundle, host: str) -> tuple[bool, str | None]:
    """(reachable, why not): a host is unreachable when no probe got past the connection."""
    results = bundle.probes_of(host)
    if not results:
        return False, "no evidence recorded for this host (the run did not reach it)"
    errors = [r.error for r in results.values() if r.error]
    if len(errors) == len(results):
        return False, errors[0]
    return True, None


def new_run_id(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
