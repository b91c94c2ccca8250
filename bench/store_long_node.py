"""bench_store.py's sixth measurement (issue 31): one node's long past. A store holding
--node-runs healthchecks of one node, then `preflight history NODE` as a user runs it: text,
--json, and an unknown 10,000-character name."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from bench_store import _COLUMNS, BUSBW, CAUSES, NOISE, P_FAIL, ROOT, SEED, kept, mark

from preflight.store import Store, parse

LONG_NODE = "gpu-busy01"
HEALTHCHECK_EVERY = 300.0  # seconds: Slurm's HealthCheckInterval as sites set it


def node_tables(runs: int, now: float, checks: str, rng: random.Random) -> dict[str, list[tuple]]:
    """``runs`` healthchecks of LONG_NODE, one every HEALTHCHECK_EVERY seconds up to an hour ago,
    each with a host result and a busbw figure; a chance failure (P_FAIL) adds a failing finding
    and its diagnosis."""
    tables: dict[str, list[tuple]] = {t: [] for t in _COLUMNS}
    causes = list(CAUSES)
    for k in range(runs):
        run_id, started = f"healthcheck-{LONG_NODE}-{k:06d}", now - 3600.0 - (runs - 1 - k) * HEALTHCHECK_EVERY
        cause = rng.choice(causes) if rng.random() < P_FAIL else None
        status = "fail" if cause else "pass"
        tables["pf_runs"].append((run_id, "healthcheck", started, 20.0, "slurm", "bench", "preflight healthcheck",
                                  status, checks, 1, started + 20.0))
        tables["pf_host_results"].append((run_id, LONG_NODE, started, status, 1, "hgx-h200"))
        tables["pf_figures"].append((run_id, LONG_NODE, started, "busbw_gbs", BUSBW * (1 + rng.gauss(0.0, NOISE))))
        if cause:
            check, summary, action = CAUSES[cause]
            tables["pf_findings"].append((run_id, LONG_NODE, started, check, "fail", json.dumps([cause]), summary))
            tables["pf_diagnoses"].append((run_id, LONG_NODE, started, cause, "high", action))
    return tables


# The commands read their modules' bytecode from one cache, as an installed package's is: a
# shell with PYTHONDONTWRITEBYTECODE set would make each run compile preflight again (0.2 s here).
PYCACHE = tempfile.TemporaryDirectory(prefix="bench-store-pycache-")
CLI_ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
           "PYTHONPYCACHEPREFIX": PYCACHE.name}


def cli_seconds(url: str, argv: list[str], repeat: int, timeout: float = 600.0) -> tuple[float, int, int]:
    """Median wall seconds of ``preflight history ARGV --db URL`` in a new process, its stdout
    (a file, as in a pipe to less) lines and its exit code; a run past ``timeout`` counts as it.
    A first run of ``history --help``, untimed, fills the bytecode cache."""
    subprocess.run([sys.executable, "-m", "preflight", "history", "--help"], cwd=ROOT, env=CLI_ENV,
                   capture_output=True, check=True)
    times, lines, code = [], 0, 0
    for _ in range(repeat):
        with tempfile.TemporaryFile() as out:
            t0 = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, "-m", "preflight", "history", *argv, "--db", url], cwd=ROOT,
                                      env=CLI_ENV, stdout=out, stderr=subprocess.PIPE, timeout=timeout)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = -1
            times.append(time.perf_counter() - t0)
            out.seek(0)
            lines = out.read().count(b"\n")
    return statistics.median(times), lines, code


def bench_long_node(engine, args, checks: str) -> dict[str, str]:
    """`history NODE` over one node's --node-runs healthchecks: text, --json, an unknown long name."""
    out: dict[str, str] = {}
    name = f"node{args.node_runs}"
    url, built = kept(engine, args, name, {"node_runs": args.node_runs, "seed": SEED})
    if built is None:
        now = time.time()
        t0 = time.perf_counter()
        with Store.open(parse(url)) as store:
            engine.bulk(store, node_tables(args.node_runs, now, checks, random.Random(SEED + 2)))
        engine.settle(url)
        mark(engine, args, name, {"node_runs": args.node_runs, "seed": SEED, "now": now})
        print(f"{engine.name}: loaded {args.node_runs} runs of {LONG_NODE} in {time.perf_counter() - t0:.0f} s",
              flush=True)
    for key, argv in (("long_text", [LONG_NODE, "--since", "365d"]),
                      ("long_json", [LONG_NODE, "--since", "365d", "--json"])):
        seconds, lines, code = cli_seconds(url, argv, 3)
        out[key] = f"{seconds:.2f} s ({lines:,} lines, exit {code})"
        print(f"{engine.name}: history {' '.join(argv)}: {out[key]}", flush=True)
    seconds, _, code = cli_seconds(url, ["x" * 10000, "--since", "365d"], 1, timeout=args.unknown_timeout)
    out["unknown"] = (f"{seconds:.2f} s (exit {code})" if code != -1
                      else f"> {args.unknown_timeout:.0f} s (stopped)")
    print(f"{engine.name}: history of an unknown 10,000-character name: {out['unknown']}", flush=True)
    return out
