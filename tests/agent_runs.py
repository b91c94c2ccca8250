"""What the soak's tests share: the agent's files read back, and waiting on its heartbeat."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "preflight" / "node" / "agent.py"


def read_csv(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def wait_for(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def heartbeat(out: Path) -> dict | None:
    try:
        return json.loads((out / "heartbeat.json").read_text())
    except (OSError, ValueError):
        return None
