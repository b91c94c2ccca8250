"""The Xid catalog (``playbooks/xid.yaml``) as typed records, read once per process.

The YAML holds, per Xid, NVIDIA's mnemonic and action buckets and preflight's own severity
(fatal / error / info) and cause id; its header explains each field and where it comes from.
This module only reads it and refuses a catalog that would mislead a check: an unknown
severity, or an action bucket that the ``actions:`` table does not explain.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from preflight.knowledge.datafile import read_yaml
from preflight.shipped import playbooks_dir

CATALOG_PATH = playbooks_dir() / "xid.yaml"
FORMAT = "preflight-xid-catalog/1"
SEVERITIES = ("fatal", "error", "info")


class XidCatalogError(ValueError):
    pass


@dataclass(frozen=True)
class XidEntry:
    code: int
    mnemonic: str
    meaning: str
    action: str  # NVIDIA's immediate-action bucket, e.g. RESET_GPU
    action_meaning: str  # what that bucket asks the operator to do
    investigate: str
    severity: str  # fatal | error | info
    cause: str  # a cause id of playbooks/causes.yaml
    note: str | None = None


@dataclass(frozen=True)
class XidCatalog:
    entries: dict[int, XidEntry]
    causes: dict[str, str]  # cause ids the catalog introduces, with their one-line meaning

    def get(self, code: int | None) -> XidEntry | None:
        return self.entries.get(code) if code is not None else None


@cache
def load_xid_catalog(path: Path = CATALOG_PATH) -> XidCatalog:
    """The catalog at ``path``; raises XidCatalogError naming the file and the bad entry."""
    data = read_yaml(path, XidCatalogError)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise XidCatalogError(f"{path}: not a {FORMAT} file")
    buckets = {name: str(body.get("meaning", "")) for name, body in (data.get("actions") or {}).items()}
    entries = {}
    for code, body in (data.get("xids") or {}).items():
        where = f"{path}: Xid {code}"
        severity = body.get("severity")
        if severity not in SEVERITIES:
            raise XidCatalogError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
        if body.get("action") not in buckets:
            raise XidCatalogError(f"{where}: action {body.get('action')!r} is not under 'actions:'")
        if not body.get("cause"):
            raise XidCatalogError(f"{where}: no cause")
        entries[int(code)] = XidEntry(
            code=int(code), mnemonic=str(body.get("mnemonic", "")), meaning=str(body.get("meaning", "")),
            action=body["action"], action_meaning=buckets[body["action"]],
            investigate=str(body.get("investigate", "")), severity=severity, cause=body["cause"],
            note=body.get("note"))
    return XidCatalog(entries, {str(k): str(v) for k, v in (data.get("causes") or {}).items()})
