"""The store's tables, versioned. A migration is a numbered list of statements written once
for both engines (``{real}`` and ``{serial}`` are the only words that differ); a store holds the
number of the last one applied, and preflight reads only a store at exactly its own version:
an older one is refused with the command that migrates it, a newer one with the advice to
upgrade preflight. Nothing is ever read through a schema the code was not written for.

Tables carry a ``pf_`` prefix: a PostgreSQL database a site already has may hold a ``runs`` of
its own.
"""

from __future__ import annotations

VERSION_TABLE = "pf_schema"

# Times are seconds since the epoch (UTC), as floats: one type on both engines, compared and
# indexed as numbers, turned into ISO-8601 only when shown.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, (
        """CREATE TABLE pf_runs (
            run_id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            started {real} NOT NULL,
            duration_s {real},
            launcher TEXT,
            version TEXT,
            command TEXT,
            status TEXT NOT NULL,
            checks TEXT NOT NULL,
            hosts INTEGER NOT NULL,
            recorded {real} NOT NULL)""",
        "CREATE INDEX pf_runs_started ON pf_runs (started)",
        """CREATE TABLE pf_host_results (
            run_id TEXT NOT NULL,
            host TEXT NOT NULL,
            started {real} NOT NULL,
            status TEXT NOT NULL,
            reachable INTEGER NOT NULL,
            profile TEXT,
            PRIMARY KEY (run_id, host))""",
        "CREATE INDEX pf_host_results_host ON pf_host_results (host, started)",
        "CREATE INDEX pf_host_results_started ON pf_host_results (started)",
        """CREATE TABLE pf_findings (
            run_id TEXT NOT NULL,
            host TEXT,
            started {real} NOT NULL,
            check_id TEXT NOT NULL,
            status TEXT NOT NULL,
            symptoms TEXT NOT NULL,
            summary TEXT NOT NULL)""",
        "CREATE INDEX pf_findings_host ON pf_findings (host, started)",
        "CREATE INDEX pf_findings_started ON pf_findings (started)",
        "CREATE INDEX pf_findings_run ON pf_findings (run_id)",
        """CREATE TABLE pf_diagnoses (
            run_id TEXT NOT NULL,
            host TEXT NOT NULL,
            started {real} NOT NULL,
            cause TEXT NOT NULL,
            confidence TEXT NOT NULL,
            action TEXT NOT NULL)""",
        "CREATE INDEX pf_diagnoses_host ON pf_diagnoses (host, started)",
        "CREATE INDEX pf_diagnoses_started ON pf_diagnoses (started)",
        "CREATE INDEX pf_diagnoses_run ON pf_diagnoses (run_id)",
        """CREATE TABLE pf_figures (
            run_id TEXT NOT NULL,
            host TEXT NOT NULL,
            started {real} NOT NULL,
            figure TEXT NOT NULL,
            value {real} NOT NULL)""",
        "CREATE INDEX pf_figures_host ON pf_figures (host, figure, started)",
        "CREATE INDEX pf_figures_started ON pf_figures (started)",
        "CREATE INDEX pf_figures_run ON pf_figures (run_id)",
        """CREATE TABLE pf_events (
            id {serial},
            node TEXT NOT NULL,
            kind TEXT NOT NULL,
            at {real} NOT NULL,
            actor TEXT NOT NULL,
            reason TEXT NOT NULL,
            run_id TEXT,
            detail TEXT NOT NULL)""",
        "CREATE INDEX pf_events_node ON pf_events (node, at)",
    )),
    # The return-to-service lifecycle (preflight lifecycle): each node's state, and the lock
    # that lets one controller act at a time.
    (2, (
        """CREATE TABLE pf_node_state (
            node TEXT PRIMARY KEY,
            state TEXT NOT NULL,
            since {real} NOT NULL,
            cause TEXT,
            run_id TEXT,
            step TEXT,
            requested {real},
            retest_failures INTEGER NOT NULL,
            updated {real} NOT NULL)""",
        "CREATE INDEX pf_node_state_state ON pf_node_state (state)",
        """CREATE TABLE pf_locks (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            expires {real} NOT NULL)""",
        # Where a run's reports and bundle are, for the RMA summary's serials and firmware.
        "ALTER TABLE pf_runs ADD COLUMN report_dir TEXT",
    )),
    # What tells a re-recording of a run (skipped) from another run that drew the same id (kept
    # under a derived id): rows.fingerprint. Runs recorded before it have none, and are matched
    # by id alone, as they were.
    (3, (
        "ALTER TABLE pf_runs ADD COLUMN fingerprint TEXT",
    )),
)
CURRENT = MIGRATIONS[-1][0]

WORDS = {
    "sqlite": {"real": "REAL", "serial": "INTEGER PRIMARY KEY AUTOINCREMENT"},
    "postgresql": {"real": "DOUBLE PRECISION", "serial": "BIGSERIAL PRIMARY KEY"},
}


def statements(dialect: str, after: int, upto: int | None = None) -> list[tuple[int, list[str]]]:
    """The migrations that take a store from version ``after`` to ``upto`` (the latest), in order."""
    words = WORDS[dialect]
    upto = MIGRATIONS[-1][0] if upto is None else upto
    return [(v, [s.format(**words) for s in stmts]) for v, stmts in MIGRATIONS if after < v <= upto]
