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
from preflight.printable import printable
from preflight.store.rows import iso

# Kernel-log events that say what the node is, not what went wrong with it.
KERNEL_INFO = frozenset({"nvidia-driver-load", "mlx5-fw-version", "nvrm-gpu"})
MAX_LINES = 40


def _report(report_dir: str | None) -> dict:
    """The run's report.json, or ``{}`` where it is gone, unreadable or not a JSON object."""
    try:
        report = json.loads((Path(report_dir) / "report.json").read_text()) if report_dir else {}
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def _bundle_dir(report_dir: str | None) -> Path | None:
    if not report_dir:
        return None
    root = Path(report_dir)
    report = _report(report_dir)
    named = report.get("bundle") if isinstance(report.get("bundle"), str) else "bundle"
    path = Path(named) if Path(named).is_absolute() else root / named
    return path if (path / "bundle.json").is_file() else None


def _evidence_of(report_dir: str | None, node: str, unread: list[str]) -> list[dict]:
    """The failing findings of the node in that run's report, with their evidence excerpts.
    A report is a file anyone may have edited: an excerpt of another shape than report.json's
    (docs/contracts.md: ``{probe, excerpt}`` records) is left out and named in ``unread``, with
    the file and the field, instead of stopping the summary."""
    report = _report(report_dir)
    findings = report.get("findings") if isinstance(report.get("findings"), list) else []
    out = []
    for i, f in enumerate(findings):
        if not (isinstance(f, dict) and f.get("host") == node and f.get("status") in ("fail", "error")):
            continue
        where = f"{Path(str(report_dir)) / 'report.json'}: findings[{i}].evidence"
        raw = f.get("evidence") or []
        if not isinstance(raw, list):
            unread.append(f"{where}: a list of {{probe, excerpt}} records expected, not {type(raw).__name__}")
            raw = []
        evidence = []
        for j, e in enumerate(raw):
            if isinstance(e, dict) and isinstance(e.get("probe", ""), str) and isinstance(e.get("excerpt", ""), str):
                evidence.append({"probe": e.get("probe"), "excerpt": e.get("excerpt", "")})
            else:
                unread.append(f"{where}[{j}]: a {{probe, excerpt}} record expected, not {type(e).__name__}")
        out.append({"check": f.get("check"), "status": f.get("status"), "summary": f.get("summary"),
                    "evidence": evidence})
    return out


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


STEP_KINDS = ("reset", "restart", "reboot")
EVIDENCE_KEYS = ("outcome", "why", "directory", "bytes", "seconds", "source")


def remediation(events: list[dict]) -> list[dict]:
    """Each step the lifecycle took, oldest first, with the evidence kept before it (the
    ``capture`` event of its time) and its outcomes (``outcome`` events naming its ``step_at``):
    ``{at, step, reason, evidence, outcomes: [{outcome, at, reading, why}], outcome}``, where
    ``outcome`` is the latest (None while the retest is due)."""
    steps: dict[tuple[str, str], dict] = {}
    for e in events:
        d = e.get("detail") if isinstance(e.get("detail"), dict) else {}
        if e.get("kind") in STEP_KINDS:
            # Its capture comes first, at the same time: the entry may be there already.
            entry = steps.setdefault((e["at"], e["kind"]), {"at": e["at"], "step": e["kind"], "reason": None,
                                                            "evidence": None, "outcomes": []})
            entry["reason"] = e.get("reason")
        elif e.get("kind") == "capture" and d.get("step") in STEP_KINDS:
            at = iso(d["step_at"]) if isinstance(d.get("step_at"), (int, float)) else e["at"]
            entry = steps.setdefault((at, d["step"]), {"at": at, "step": d["step"], "reason": None,
                                                       "evidence": None, "outcomes": []})
            entry["evidence"] = {k: d.get(k) for k in EVIDENCE_KEYS}
        elif e.get("kind") == "outcome" and d.get("step") in STEP_KINDS and isinstance(d.get("step_at"), (int, float)):
            at = iso(d["step_at"])
            entry = steps.setdefault((at, d["step"]), {"at": at, "step": d["step"], "reason": None, "evidence": None,
                                                       "outcomes": []})
            entry["outcomes"].append({"outcome": d.get("outcome"), "at": e["at"], "reading": d.get("reading"),
                                      "why": e.get("reason"), "cause": d.get("cause")})
    out = sorted(steps.values(), key=lambda s: s["at"])
    for s in out:
        s["outcome"] = s["outcomes"][-1]["outcome"] if s["outcomes"] else None
    return out


def summary(node: str, state: dict | None, timeline: dict, runs_dirs: dict[str, str | None]) -> dict:
    """``timeline``: ``read.node_history``; ``runs_dirs``: run id -> its report directory."""
    unread: list[str] = []
    incidents = [{"run_id": r["run_id"], "started": r["started"], "kind": r["kind"], "status": r["status"],
                  "causes": [c["cause"] for c in r["causes"]],
                  "findings": _evidence_of(runs_dirs.get(r["run_id"]), node, unread) or r["findings"]}
                 for r in timeline["runs"] if r["status"] in ("fail", "error")]
    latest = next((runs_dirs.get(r["run_id"]) for r in reversed(timeline["runs"])
                   if _bundle_dir(runs_dirs.get(r["run_id"])) is not None), None)
    parts: dict = {"missing": ["no saved bundle of this node is where its runs were recorded"]}
    if latest is not None:
        try:
            parts = hardware(_bundle_dir(latest), node)
        except BundleError as exc:
            parts = {"missing": [f"the bundle of {latest}: {exc}"]}
    if unread:
        parts = {**parts, "missing": [*parts.get("missing", []), *(f"evidence left out: {u}" for u in unread)]}
    return {"node": node, "state": state, "incidents": incidents, "steps": remediation(timeline["events"]),
            "events": timeline["events"], "hardware": parts}


def _first_line(text) -> str:
    lines = str(text or "").splitlines()
    return lines[0][:160] if lines else ""


def markdown(s: dict) -> str:
    """The summary as a vendor case's text. Every value from the store or the evidence goes
    through ``printable``: a node name holding a newline cannot start a heading of its own, nor
    an ESC drive the terminal the summary is printed on."""
    p = printable
    lines = [f"# RMA summary: {p(s['node'])}", ""]
    st = s.get("state") or {}
    if st:
        lines += [f"State: {p(st.get('state'))} since {p(st.get('since_iso', ''))}, cause {p(st.get('cause'))}", ""]
    hw = s["hardware"]
    lines += ["## GPUs", ""]
    for g in hw.get("gpus") or ():
        lines.append(f"- GPU {p(g['index'])} {p(g['pci_bus_id'])} {p(g['name'])}: serial {p(g['serial'])}, board part "
                     f"number {p(g['board_part_number'])}, VBIOS {p(g['vbios'])}")
    if hw.get("driver"):
        lines.append(f"- driver {p(hw['driver'])}")
    lines += ["", "## NICs", ""]
    lines += [f"- {p(n['device'])}: firmware {p(n['firmware'])}, PSID {p(n['psid'])}, {p(n['hca_type'])}"
              for n in hw.get("nics") or ()]
    lines += ["", f"## Incidents ({len(s['incidents'])})", ""]
    for i in s["incidents"]:
        lines.append(f"- {p(i['started'])} {p(i['run_id'])} ({p(i['kind'])}): "
                     f"{p(', '.join(i['causes']) or i['status'])}")
        for f in i["findings"]:
            lines.append(f"  - {p(f.get('check'))}: {p(f.get('summary'))}")
            for e in f.get("evidence") or ():
                lines.append(f"    `{p(e.get('probe'))}`: {p(_first_line(e.get('excerpt')))}")
    steps = s.get("steps") or []
    lines += ["", f"## Remediation steps ({len(steps)})", ""]
    for st in steps:
        said = ", then ".join(f"{p(o['outcome'])}" + (f" ({p(o['reading'])})" if o.get("reading") else "")
                              for o in st["outcomes"]) or "no outcome yet"
        lines.append(f"- {p(st['at'])} {p(st['step'])}" + (f" ({p(st['reason'])})" if st.get("reason") else "")
                     + f": {said}")
        ev = st.get("evidence")
        if ev:
            where = f" in {p(ev['directory'])}" if ev.get("directory") and ev.get("bytes") else ""
            lines.append(f"  - evidence kept before it: {p(ev['outcome'])}, {p(ev['bytes'])} bytes in "
                         f"{p(ev['seconds'])} s{where}" + (f": {p(ev['why'])}" if ev.get("why") else ""))
    lines += ["", "## Kernel log", ""] + [f"    {p(line)}" for line in hw.get("kernel_log") or ()]
    lines += ["", "## DCGM error codes", ""] + [f"- {p(d['code'])} (GPU {p(d['gpu'])}): {p(d['text'])}"
                                                 for d in hw.get("dcgm") or ()]
    if hw.get("missing"):
        lines += ["", "## Not in the evidence", ""] + [f"- {p(m)}" for m in hw["missing"]]
    return "\n".join(lines) + "\n"
