"""Merging a soak run: the per-host copies ``preflight soak`` made, as one ``preflight-soak/1`` dir.

``follow.py`` leaves ``reports/<run-id>/soak/<host>/``, each a byte-for-byte copy of one node's
soak directory; ``merge_soak`` writes ``reports/<run-id>/`` (soak.json, telemetry.csv,
throughput.csv, events.csv, and ib-counters.txt where the agents read the RDMA counters) from
them, which ``preflight analyze`` and the soak's analysis read like any soak directory.
soak.json also records each agent's outcome and the hosts that delivered nothing. The column
lists are preflight.contracts' (the agent's full ones, which start with the contract's): the
controller never imports the node's code for them.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from preflight.contracts import (
    AGENT_TELEMETRY_COLUMNS,
    AGENT_THROUGHPUT_COLUMNS,
    EVENT_COLUMNS,
    EVENTS_CSV,
    IB_COUNTERS_TXT,
    SOAK_FORMAT,
    SOAK_JSON,
    TELEMETRY_CSV,
    THROUGHPUT_CSV,
)
from preflight.soak.follow import HEARTBEAT_JSON, read_json, replace_file

# The merged files, with the header each gets when no host delivered a line.
MERGED_CSVS = {TELEMETRY_CSV: AGENT_TELEMETRY_COLUMNS, THROUGHPUT_CSV: AGENT_THROUGHPUT_COLUMNS,
               EVENTS_CSV: EVENT_COLUMNS}


def merge_soak(run_dir: Path, outcomes: dict[str, tuple[str, str | None]]) -> dict:
    """Merge ``run_dir/soak/<host>/`` into one ``preflight-soak/1`` directory at ``run_dir``.

    ``outcomes`` maps each host to (state, note). Only complete lines are merged (a copy cut
    mid-line loses that line). Hosts whose files share the first host's header are copied line
    for line; a host with other columns is mapped onto the union of the headers by name."""
    per_host = {h: run_dir / "soak" / h for h in outcomes}
    metas = {h: read_json(d / SOAK_JSON) for h, d in per_host.items()}
    beats = {h: read_json(d / HEARTBEAT_JSON) for h, d in per_host.items()}
    hosts = [h for h, m in metas.items() if m and m.get("format") == SOAK_FORMAT]
    for name, columns in MERGED_CSVS.items():
        _merge_csv(run_dir / name, [per_host[h] / name for h in hosts], columns)
    _merge_text(run_dir / IB_COUNTERS_TXT, [per_host[h] / IB_COUNTERS_TXT for h in hosts])
    engines = sorted({metas[h].get("engine") for h in hosts} - {None})
    doc = {
        "format": SOAK_FORMAT,
        "engine": engines[0] if len(engines) == 1 else ",".join(engines) or "unknown",
        "started": min((metas[h]["started"] for h in hosts), default=datetime.now(timezone.utc).isoformat()),
        "hosts": hosts,
        "run_id": run_dir.name,
        "planned_s": max((metas[h].get("planned_s", 0) for h in hosts), default=None),
        "interval_s": max((metas[h].get("interval_s", 0) for h in hosts), default=None),
        "gpus": {h: metas[h].get("gpus", {}).get(h, []) for h in hosts},
        "agents": {h: {"outcome": outcomes[h][0], "note": outcomes[h][1],
                       "elapsed_s": (beats[h] or {}).get("elapsed_s"),
                       "sampler_cpu_ms_per_tick": (beats[h] or {}).get("sampler_cpu_ms_per_tick"),
                       "summary": (beats[h] or {}).get("summary")} for h in outcomes},
        "missing": {h: outcomes[h][1] or outcomes[h][0] for h in outcomes if h not in hosts},
    }
    # Hosts whose agent ran without GPU telemetry (vllm on a machine without the NVIDIA driver).
    no_telemetry = {h: metas[h]["no_telemetry"][h] for h in hosts if h in (metas[h].get("no_telemetry") or {})}
    if no_telemetry:
        doc["no_telemetry"] = no_telemetry
    replace_file(run_dir / SOAK_JSON, (json.dumps(doc, indent=1) + "\n").encode())
    return doc


def _complete_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    return lines[:-1]  # the piece after the last newline is empty, or a half-written row


def _merge_csv(target: Path, sources: list[Path], default_header: Sequence[str]) -> None:
    contents = [lines for lines in map(_complete_lines, sources) if lines] or [[_csv_line(default_header)[:-1]]]
    tmp = target.with_name(f".{target.name}.tmp")
    with tmp.open("w", encoding="utf-8", newline="") as out:
        headers = [next(csv.reader([lines[0]])) for lines in contents]
        union = list(dict.fromkeys(col for cols in headers for col in cols))
        out.write(_csv_line(union))
        for cols, lines in zip(headers, contents, strict=True):
            if cols == union:
                out.writelines(line + "\n" for line in lines[1:])
            else:
                for row in csv.DictReader(lines):
                    out.write(_csv_line([row.get(col) or "" for col in union]))
    os.replace(tmp, target)


def _merge_text(target: Path, sources: list[Path]) -> None:
    """The hosts' ib-counters.txt one after the other (each block names its host), complete lines
    only; no file when no host wrote one (readings off, or agents that predate them)."""
    present = [p for p in sources if p.exists()]
    if not present:
        return
    tmp = target.with_name(f".{target.name}.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for path in present:
            out.writelines(line + "\n" for line in _complete_lines(path))
    os.replace(tmp, target)


def _csv_line(values: Sequence[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()
