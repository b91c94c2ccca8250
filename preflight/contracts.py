"""The strings users and scripts rely on, written once: format names, file names, the soak's
CSV columns, and the exit codes. docs/contracts.md describes each in words.

Code that runs on nodes (``preflight.node``) cannot import this module and keeps its own copy
of what it writes; tests/test_contracts.py checks that the two agree.
"""

from __future__ import annotations

# ---- formats (a format string changes only with a version bump) ----------------------------
BUNDLE_FORMAT = "preflight-bundle/1"
REPORT_FORMAT = "preflight-report/1"
SOAK_FORMAT = "preflight-soak/1"
SOAK_RUN_FORMAT = "preflight-soak-run/1"  # the controller's plan of a soak (run.json)
HEARTBEAT_FORMAT = "preflight-soak-heartbeat/1"  # the agent's progress file on a node

# ---- the bundle ------------------------------------------------------------------------------
BUNDLE_JSON = "bundle.json"
# Evidence of runs that span hosts (multi-node all_reduce) lives under this pseudo-host; no
# inventory name can end in "-".
FLEET_HOST = "fleet-"
# A probe's `error` that Slurm reported (a node drained or down before the run, a task launch
# that failed, a task killed) starts with this; a host where every probe carries one is
# judged `slurm-node-unavailable` rather than `host-unreachable`.
SLURM_ERROR = "slurm: "
# The start of every Slurm drain reason preflight sets (healthcheck, drain); only a drain whose
# reason starts with it is ever resumed by preflight (docs/contracts.md).
DRAIN_REASON_PREFIX = "preflight:"

# ---- the report ------------------------------------------------------------------------------
# A host that was not reached has one finding, the `connectivity` check's ERROR, and its data
# lists under this key the ids of the host checks that did not run (docs/contracts.md §5).
CONNECTIVITY_CHECK = "connectivity"
NOT_CHECKED = "not_checked"

# ---- a soak directory ------------------------------------------------------------------------
SOAK_JSON = "soak.json"
TELEMETRY_CSV = "telemetry.csv"
THROUGHPUT_CSV = "throughput.csv"
EVENTS_CSV = "events.csv"
# The agent's readings of the RDMA port counters (optional; preflight/node/ib_snapshots.py).
IB_COUNTERS_TXT = "ib-counters.txt"
IB_COUNTERS_FORMAT = "preflight-ib-counters/1"
# The contract's columns; the agent writes more after them (``AGENT_TELEMETRY_COLUMNS``), and a
# soak directory assembled by hand may hold only these.
TELEMETRY_COLUMNS: tuple[str, ...] = (
    "time", "host", "gpu", "temperature_c", "memory_temperature_c", "sm_clock_mhz",
    "memory_clock_mhz", "power_w", "power_limit_w", "utilization_pct", "memory_used_mib",
    "clocks_event_reasons",
)
THROUGHPUT_COLUMNS: tuple[str, ...] = ("time", "host", "metric", "value")
SLOWDOWN_COLUMN = "slowdown_temperature_c"
# What the agent writes, in order: the contract's columns, then the extra ones it records.
AGENT_TELEMETRY_COLUMNS: tuple[str, ...] = TELEMETRY_COLUMNS + (
    SLOWDOWN_COLUMN, "memory_utilization_pct", "ecc_sbe_volatile", "ecc_dbe_volatile",
    "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
    "remapped_rows_failure", "sw_power_cap_ns", "sync_boost_ns", "sw_thermal_ns", "hw_thermal_ns",
    "hw_power_brake_ns",
)
AGENT_THROUGHPUT_COLUMNS: tuple[str, ...] = THROUGHPUT_COLUMNS + ("gpu",)
# soak.json's keys: the contract's, then those the agent (preflight/node/agent.py) and the merge
# (preflight/soak/merge.py) write (docs/contracts.md §6.2). Others are kept and named once.
SOAK_JSON_KEYS: tuple[str, ...] = (
    "format", "engine", "started", "hosts",
    "planned_s", "interval_s", "ib_interval_s", "agent", "gpus", "agents", "missing", "run_id", "no_telemetry",
)
EVENT_COLUMNS: tuple[str, ...] = ("time", "host", "gpu", "event", "data")

# ---- exit codes of every command -------------------------------------------------------------
EXIT_OK = 0  # nothing failed (warnings allowed)
EXIT_FAILED = 1  # a check failed or a host could not be checked; `diff`: something got worse
EXIT_USAGE = 2  # bad input or usage: refused before anything ran or was written
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
