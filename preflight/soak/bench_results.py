"""The load generator's ``vllm bench serve``-shaped results, written out as files users compare.

Each serving agent's load summary in soak.json (``agents.<host>.summary.engine.load.results``)
holds one result a level (one for a soak at a fixed concurrency or rate), with the keys
``vllm bench serve --save-result`` writes (preflight/node/loadgen_bench.py lists them). They are
written to ``<run>/vllm-bench/<host>-c<concurrency>.json``, one file a level as a user's own
``vllm bench serve --max-concurrency N --save-result`` runs would be, so the two compare with
the same tools. A soak.json without them (a burn, an older agent, a hand-made directory) gives
no files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BENCH_DIR = "vllm-bench"


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host)


def results_of(extra: dict | None) -> dict[str, list[dict]]:
    """Host -> its results, from soak.json's fields beyond the contract's."""
    out: dict[str, list[dict]] = {}
    agents = (extra or {}).get("agents")
    for host, agent in (agents.items() if isinstance(agents, dict) else ()):
        try:
            results = agent["summary"]["engine"]["load"]["results"]
        except (KeyError, TypeError):
            continue
        docs = [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []
        if docs:
            out[str(host)] = docs
    return out


def write_results(extra: dict | None, run_dir: Path) -> list[Path]:
    """Writes every host's results under ``run_dir/vllm-bench``; returns the files written."""
    written = []
    for host, docs in results_of(extra).items():
        for doc in docs:
            level = doc.get("max_concurrency")
            path = run_dir / BENCH_DIR / f"{_safe(host)}-c{level if isinstance(level, int) else 'x'}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(doc) + "\n")
            os.replace(tmp, path)  # never a half-written result
            written.append(path)
    return written
