"""What a vendor case (an RMA) needs of one node, gathered from the store and the node's saved
evidence: the incidents with their evidence, the GPUs' serials, board part numbers and VBIOS
(``nvidia-smi -q``), the NICs' firmware and PSIDs, the kernel-log lines of its faults (Xid,
SXid, mlx5, PCIe AER) and the DCGM diagnostic's error codes. Read-only; a part the evidence
lacks is said to be missing, never guessed."""

from __future__ import annotations

import json
from pathlib import Path

from preflight.evidence.bundle import BundleError, read_bundle
from preflight.judge.context import EvidenceMissing, HostContext
from preflight.knowledge.profiles import GENERIC, load_profiles

# Kernel-log events that say what the node is, not what went wrong with it.
KERNEL_INFO = frozenset({"nvidia-driver-load", "mlx5-fw-version", "nvrm-gpu"})
MAX_LINES = 40


def _bundle_dir(report_dir: str | None) -> Path | None:
    if not report_dir:
        return None
    root = Path(report_dir)
    try:
        report = json.loads((root / "report.json").read_text())
    except (OSError, ValueError):
        report = {}
    named = report.get("bundle") if isinstance(report.get("bundle"), str) else "bundle"
    path = Path(named) if Path(named).is_absolute() else root / named
    return path if (path / "bundle.json").is_file() else None


def _evidence_of(report_dir: str | None, node: str) -> list[dict]:
    """The failing findings of the node in that run's report, with their evidence excerpts."""
    try:
        report = json.loads((Path(report_dir) / "report.json").read_text()) if report_dir else {}
    except (OSError, ValueError):
        return []
    return [{"check": f.get("check"), "status": f.get("status"), "summary": f.get("summary"),
             "evidence": f.get("evidence") or []}
            for f in report.get("findings") or () if isinstance(f, dict) and f.get("host") == node
            and f.get("status") in ("fail", "error")]


def hardware(bundle_dir: Path, node: str) -> dict:
    """The node's parts and fault lines as its bundle recorded them."""
    bundle = read_bundle(bundle_dir)
    ctx = HostContext(node, bundle.probes_of(node), load_profiles()[GENERIC])
    out: dict = {"bundle": str(bundle_dir), "collected": bundle.created, "missing": []}
    try:
        out["gpus"] = [{"index": g.index, "pci_bus_id": g.pci_bus_id, "name": g.name, "serial": g.serial,
                        "board_part_number": g.board_part_number, "vbios": g.vbios_version, "uuid": g.uuid}
                       for g in ctx.smi.gpus]
        out["driver"] = ctx.smi.driver_version
    except EvidenceMissing as exc:
        out["missing"].append(f"GPUs: {exc}")
    try:
        out["nics"] = [{"device": d.name, "firmware": d.fw_ver, "psid": d.board_id, "hca_type": d.hca_type,
                        "node_guid": d.node_guid} for d in ctx.ib.devices]
    except EvidenceMissing as exc:
        out["missing"].append(f"NICs: {exc}")
    try:
        events = [e for e in ctx.kernel_log.events if e.kind not in KERNEL_INFO]
        out["kernel_log"] = [e.raw for e in events[:MAX_LINES]]
    except EvidenceMissing as exc:
        out["missing"].append(f"kernel log: {exc}")
    try:
        diag = ctx.dcgm_diag
        codes = [m for t in diag.tests for m in t.messages if m.code is not None] + [
            m for m in diag.messages if m.code is not None]
        out["dcgm"] = [{"code": m.code, "gpu": m.gpu, "text": m.text} for m in codes]
    except EvidenceMissing as exc:
        out["missing"].append(f"DCGM diag: {exc}")
    return out


def summary(node: str, state: dict | None, timeline: dict, runs_dirs: dict[str, str | None]) -> dict:
    """``timeline``: ``read.node_history``; ``runs_dirs``: run id -> its report directory."""
    incidents = [{"run_id": r["run_id"], "started": r["started"], "kind": r["kind"], "status": r["status"],
                  "causes": [c["cause"] for c in r["causes"]],
                  "findings": _evidence_of(runs_dirs.get(r["run_id"]), node) or r["findings"]}
                 for r in timeline["runs"] if r["status"] in ("fail", "error")]
    latest = next((runs_dirs.get(r["run_id"]) for r in reversed(timeline["runs"])
                   if _bundle_dir(runs_dirs.get(r["run_id"])) is not None), None)
    parts: dict = {"missing": ["no saved bundle of this node is where its runs were recorded"]}
    if latest is not None:
        try:
            parts = hardware(_bundle_dir(latest), node)
        except BundleError as exc:
            parts = {"missing": [f"the bundle of {latest}: {exc}"]}
    return {"node": node, "state": state, "incidents": incidents, "events": timeline["events"], "hardware": parts}


def markdown(s: dict) -> str:
    """The summary as a vendor case's text."""
    lines = [f"# RMA summary: {s['node']}", ""]
    st = s.get("state") or {}
    if st:
        lines += [f"State: {st.get('state')} since {st.get('since_iso', '')}, cause {st.get('cause') or '-'}", ""]
    hw = s["hardware"]
    lines += ["## GPUs", ""]
    for g in hw.get("gpus") or ():
        lines.append(f"- GPU {g['index']} {g['pci_bus_id']} {g['name']}: serial {g['serial']}, board part number "
                     f"{g['board_part_number']}, VBIOS {g['vbios']}")
    if hw.get("driver"):
        lines.append(f"- driver {hw['driver']}")
    lines += ["", "## NICs", ""]
    lines += [f"- {n['device']}: firmware {n['firmware']}, PSID {n['psid']}, {n['hca_type']}"
              for n in hw.get("nics") or ()]
    lines += ["", f"## Incidents ({len(s['incidents'])})", ""]
    for i in s["incidents"]:
        lines.append(f"- {i['started']} {i['run_id']} ({i['kind']}): {', '.join(i['causes']) or i['status']}")
        for f in i["findings"]:
            lines.append(f"  - {f['check']}: {f['summary']}")
            for e in f.get("evidence") or ():
                lines.append(f"    `{e.get('probe')}`: {str(e.get('excerpt', '')).splitlines()[0][:160]}")
    lines += ["", "## Kernel log", ""] + [f"    {line}" for line in hw.get("kernel_log") or ()]
    lines += ["", "## DCGM error codes", ""] + [f"- {d['code']} (GPU {d['gpu']}): {d['text']}"
                                                 for d in hw.get("dcgm") or ()]
    if hw.get("missing"):
        lines += ["", "## Not in the evidence", ""] + [f"- {m}" for m in hw["missing"]]
    return "\n".join(lines) + "\n"
