"""One results store over SQLite or PostgreSQL: open it (creating or checking its schema),
write a run's rows in one transaction, read rows back. Queries are written once with ``?``
placeholders and bound parameters only; host names, summaries and reasons are data, never SQL.

Why the DB-API drivers (the standard library's ``sqlite3``, psycopg 3) and not SQLAlchemy and
Alembic: the store is a dozen statements that both engines already share (``ON CONFLICT``,
window functions, the same types but two), so a dialect layer would buy little; ``healthcheck``
and ``prolog`` open the store on every node every few minutes, where SQLAlchemy's import alone
costs more than the write; and a SQLite store then needs nothing beyond Python. The schema's
migrations are numbered statement lists (``schema.py``), applied under a lock, which is the
part of Alembic a store with one linear history uses.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from preflight.store import schema
from preflight.store.location import POSTGRES, SQLITE, StoreUrl, scrub
from preflight.store.rows import Rows, storable

SQLITE_MAGIC = b"SQLite format 3\x00"
# PostgreSQL's SQLSTATEs worth another try: too many connections, starting up, serialization
# failure, deadlock. 1,000 healthchecks landing in one minute meet the first of them.
_RETRY_STATES = {"53300", "57P03", "40001", "40P01"}
_TRANSIENT_CONNECT = ("too many clients", "the database system is starting up",
                      "Resource temporarily unavailable", "remaining connection slots are reserved")
_MIGRATION_LOCK = 0x7072_6566  # the advisory lock key taken while migrating ("pref")


class StoreError(Exception):
    """The store could not be used; the message names it (its password masked)."""


class StoreUnavailable(StoreError):
    """Down, refusing, locked past the busy timeout, read-only or full."""


class StoreCorrupt(StoreError):
    """Not a database, or a damaged one."""


class SchemaMismatch(StoreError):
    """The store's schema is not the one this preflight reads."""

    def __init__(self, message: str, found: int, expected: int):
        super().__init__(message)
        self.found, self.expected = found, expected


class Store:
    def __init__(self, url: StoreUrl, conn, timeout_s: float):
        self.url, self.conn, self.timeout_s = url, conn, timeout_s
        self.dialect = url.dialect

    # ---- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, url: StoreUrl, *, create: bool = True, migrate: bool = False, timeout_s: float = 10.0) -> Store:
        """Connect and check the schema. ``create``: an empty store gets the current schema (the
        embedded default needs no set-up); ``migrate``: an older one is brought up to date.
        Otherwise a store at another version raises SchemaMismatch, naming both versions."""
        store = cls.connect(url, create=create, timeout_s=timeout_s)
        try:
            store._check_schema(create, migrate)
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def connect(cls, url: StoreUrl, *, create: bool = True, timeout_s: float = 10.0) -> Store:
        """A connection whose schema is not checked yet: for ``migrate`` alone."""
        return cls(url, _connect(url, timeout_s, create), timeout_s)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- statements ---------------------------------------------------------------------------
    def _sql(self, sql: str) -> str:
        # psycopg's placeholders are %s: a literal % in the SQL (a LIKE pattern) is written %%.
        return sql.replace("%", "%%").replace("?", "%s") if self.dialect == POSTGRES else sql

    def rows(self, sql: str, params: Sequence = ()) -> list[tuple]:
        with self._errors():
            cur = self.conn.execute(self._sql(sql), _bound(params))
            out = cur.fetchall()
            if self.dialect == POSTGRES:
                self.conn.rollback()  # a read leaves no transaction open on the server
            return out

    @contextlib.contextmanager
    def transaction(self, lock: bool = False) -> Iterator[None]:
        """One transaction; PostgreSQL's retryable failures (too many clients, deadlock,
        serialization) are retried by ``write`` around it, not here."""
        with self._errors():
            if self.dialect == SQLITE:
                self.conn.execute("BEGIN IMMEDIATE" if lock else "BEGIN")
            try:
                yield
            except BaseException:
                self.conn.rollback()
                raise
            self.conn.commit()

    def execute(self, sql: str, params: Sequence = ()):
        return self.conn.execute(self._sql(sql), _bound(params))

    def executemany(self, sql: str, seq: list[tuple]) -> None:
        if not seq:
            return
        seq = [_bound(p) for p in seq]
        if self.dialect == SQLITE:
            self.conn.executemany(sql, seq)
        else:
            with self.conn.cursor() as cur:
                cur.executemany(self._sql(sql), seq)

    def write(self, work) -> object:
        """``work(store)`` in a transaction, retried with jittered back-off while PostgreSQL
        answers with a retryable state, until the store's timeout."""
        deadline = time.monotonic() + self.timeout_s
        delay = 0.05
        while True:
            try:
                with self.transaction():
                    return work(self)
            except StoreUnavailable as exc:
                if not getattr(exc, "retryable", False) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 2.0)

    # ---- the schema ---------------------------------------------------------------------------
    def version(self) -> int:
        if self.dialect == SQLITE:
            found = self.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?",
                              (schema.VERSION_TABLE,))
        else:
            found = [r for r in self.rows("SELECT to_regclass(?)", (schema.VERSION_TABLE,)) if r[0]]
        if not found:
            return 0
        got = self.rows(f"SELECT MAX(version) FROM {schema.VERSION_TABLE}")
        return int(got[0][0] or 0)

    def _check_schema(self, create: bool, migrate: bool) -> None:
        found = self.version()
        if found == schema.CURRENT:
            return
        if found > schema.CURRENT:
            raise SchemaMismatch(f"{self.url.shown}: the store's schema is version {found}, newer than the "
                                 f"version {schema.CURRENT} this preflight reads; upgrade preflight (a newer "
                                 "one migrated this store)", found, schema.CURRENT)
        if (found == 0 and create) or migrate:
            self.migrate()
            return
        raise SchemaMismatch(f"{self.url.shown}: the store's schema is version {found}; this preflight reads "
                             f"version {schema.CURRENT}: run `preflight history migrate --db URL` to migrate it",
                             found, schema.CURRENT)

    def migrate(self, upto: int | None = None) -> list[int]:
        """Apply the pending migrations (up to ``upto``, default all) in one transaction under a
        lock (two controllers that open an empty store at once create it once); return the
        versions applied."""
        with self._migration_lock(), self.transaction(lock=True):
            found = self._version_in_transaction()
            if found > schema.CURRENT:
                raise SchemaMismatch(f"{self.url.shown}: schema version {found} is newer than {schema.CURRENT}",
                                     found, schema.CURRENT)
            steps = schema.statements(self.dialect, found, upto)
            if found == 0 and steps:
                self.execute(f"CREATE TABLE IF NOT EXISTS {schema.VERSION_TABLE} "
                             "(version INTEGER NOT NULL, applied " + schema.WORDS[self.dialect]["real"] + " NOT NULL)")
            for version, stmts in steps:
                for stmt in stmts:
                    self.execute(stmt)
                self.execute(f"INSERT INTO {schema.VERSION_TABLE} (version, applied) VALUES (?, ?)",
                             (version, time.time()))
        return [v for v, _ in steps]

    @contextlib.contextmanager
    def _migration_lock(self) -> Iterator[None]:
        """PostgreSQL: a session advisory lock, taken in a transaction of its own that ends before
        the migration's begins. Taken inside the migration's transaction (as it once was), the
        lock was granted to a transaction that had started, and read its catalog caches, before
        the winner committed: the backend's negative cache entry for ``pf_schema`` (left by the
        version check that runs before ``migrate``) was not refreshed, every loser saw version 0
        and failed on ``relation "pf_runs" already exists``. A transaction begun after the lock
        is granted takes in the winner's catalog changes when it starts. SQLite's BEGIN
        IMMEDIATE is its lock already."""
        if self.dialect != POSTGRES:
            yield
            return
        with self._errors():
            self.conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
            self.conn.commit()
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                self.conn.rollback()
                self.conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
                self.conn.commit()

    def _version_in_transaction(self) -> int:
        if self.dialect == SQLITE:
            exists = self.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                  (schema.VERSION_TABLE,)).fetchall()
        else:
            exists = [r for r in self.execute("SELECT to_regclass(?)", (schema.VERSION_TABLE,)).fetchall() if r[0]]
        if not exists:
            return 0
        return int(self.execute(f"SELECT MAX(version) FROM {schema.VERSION_TABLE}").fetchall()[0][0] or 0)

    # ---- writing ------------------------------------------------------------------------------
    def record(self, rows: Rows) -> bool:
        """Write one run; False when it is already in the store (recording is idempotent: an
        import after a live record, or twice, adds nothing)."""
        return self.record_all([rows])[0].added

    def record_all(self, runs: Sequence[Rows]) -> list[Recorded]:
        """Write runs in one transaction: all of them or, on any error, none. A run whose id is
        taken by a re-recording of the same run (same fingerprint) is skipped; by another run
        (another fingerprint) it is kept under a derived id, ``RUNID~`` and 12 hex digits of its
        fingerprint, and says so (``Recorded.renamed_from``). Keeping both rather than refusing:
        the second run's report is usually on a node's disk or in a bundle no one will look at
        again, and refusing would lose it as surely as the silent skip did; a derived id loses
        nothing and names the collision."""
        return list(self.write(lambda store: [_insert(store, rows) for rows in runs]))

    def prune(self, before: float) -> int:
        """Forget every run (and event) that started before ``before``; returns the runs removed.
        One transaction: a reader sees the store before or after, never half of a run."""
        def work(store: Store) -> int:
            gone = store.execute("SELECT COUNT(*) FROM pf_runs WHERE started < ?", (before,)).fetchall()[0][0]
            for table in ("pf_host_results", "pf_findings", "pf_diagnoses", "pf_figures", "pf_runs"):
                store.execute(f"DELETE FROM {table} WHERE started < ?", (before,))
            store.execute("DELETE FROM pf_events WHERE at < ?", (before,))
            return int(gone)

        return int(self.write(work))

    def add_event(self, node: str, kind: str, actor: str, reason: str, run_id: str | None = None,
                  detail: str = "{}", at: float | None = None) -> None:
        """A drain, a resume or another change of a node's state, with who made it and why."""
        self.write(lambda s: s.execute(
            "INSERT INTO pf_events (node, kind, at, actor, reason, run_id, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (node, kind, time.time() if at is None else at, actor, reason, run_id, detail)))

    # ---- errors -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except sqlite3.Error as exc:
            raise _sqlite_error(self.url, exc) from None
        except Exception as exc:
            if self.dialect == POSTGRES and _is_psycopg(exc):
                raise _pg_error(self.url, exc) from None
            raise


@dataclass(frozen=True)
class Recorded:
    run_id: str  # the id the run is kept under
    added: bool  # False: it was there already
    renamed_from: str | None = None  # the report's own id, when another run had taken it


def _insert(store: Store, rows: Rows) -> Recorded:
    r = rows.run
    ids = [r.run_id] + ([f"{r.run_id}~{r.fingerprint[:12]}"] if r.fingerprint else [])
    for run_id in ids:
        cur = store.execute(
            "INSERT INTO pf_runs (run_id, kind, started, duration_s, launcher, version, command, status, "
            "checks, hosts, recorded, report_dir, fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (run_id) DO NOTHING",
            (run_id, r.kind, r.started, r.duration_s, r.launcher, r.version, r.command, r.status, r.checks,
             r.hosts, time.time(), r.report_dir, r.fingerprint))
        if cur.rowcount == 1:
            _insert_children(store, rows, run_id)
            return Recorded(run_id, True, None if run_id == r.run_id else r.run_id)
        # Taken. PostgreSQL's ON CONFLICT waited for a writer of the same id still in its
        # transaction, and this statement's snapshot sees what it committed.
        (held,) = store.execute("SELECT fingerprint FROM pf_runs WHERE run_id = ?", (run_id,)).fetchone()
        # A run recorded before fingerprints (held None) is matched by its id alone, as it was.
        if held is None or r.fingerprint is None or held == r.fingerprint:
            return Recorded(run_id, False)
    raise StoreError(f"{store.url.shown}: run id {r.run_id!r} and {ids[-1]!r} are both taken by other runs")


def _insert_children(store: Store, rows: Rows, run_id: str) -> None:
    def own(seq: list[tuple]) -> list[tuple]:
        return seq if run_id == rows.run.run_id else [(run_id, *t[1:]) for t in seq]

    store.executemany("INSERT INTO pf_host_results (run_id, host, started, status, reachable, profile) "
                      "VALUES (?, ?, ?, ?, ?, ?)", own([(*h[:4], int(h[4]), h[5]) for h in rows.hosts]))
    store.executemany("INSERT INTO pf_findings (run_id, host, started, check_id, status, symptoms, summary) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?)", own(rows.findings))
    store.executemany("INSERT INTO pf_diagnoses (run_id, host, started, cause, confidence, action) "
                      "VALUES (?, ?, ?, ?, ?, ?)", own(rows.diagnoses))
    store.executemany("INSERT INTO pf_figures (run_id, host, started, figure, value) VALUES (?, ?, ?, ?, ?)",
                      own(rows.figures))


def _bound(params: Sequence) -> tuple:
    # Every text the store binds, written or looked up, as both engines hold it (rows.storable).
    return tuple(storable(p) if isinstance(p, str) else p for p in params)


def _is_psycopg(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("psycopg")


def _sqlite_error(url: StoreUrl, exc: sqlite3.Error) -> StoreError:
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and ("not a database" in text or "malformed" in text):
        return StoreCorrupt(f"{url.shown}: {url.target} is not a SQLite database or is damaged ({text})")
    return StoreUnavailable(f"{url.shown}: {text}")


def _pg_error(url: StoreUrl, exc: Exception) -> StoreError:
    state = getattr(exc, "sqlstate", None)
    err = StoreUnavailable(f"{url.shown}: {scrub(str(exc).strip(), url)}")
    err.retryable = state in _RETRY_STATES
    return err


def _connect(url: StoreUrl, timeout_s: float, create: bool):
    if url.dialect == SQLITE:
        return _connect_sqlite(url, timeout_s, create)
    return _connect_pg(url, timeout_s)


def _connect_sqlite(url: StoreUrl, timeout_s: float, create: bool) -> sqlite3.Connection:
    path = Path(url.target).expanduser()
    if path.is_dir():
        raise StoreUnavailable(f"{url.shown}: {path} is a directory, not a SQLite file")
    if path.exists():
        _check_sqlite_file(url, path)
    elif not create:
        raise StoreUnavailable(f"{url.shown}: {path} does not exist (no run has been recorded there yet)")
    elif not path.parent.is_dir():
        raise StoreUnavailable(f"{url.shown}: no such directory {path.parent}")
    created = not path.exists()
    try:
        # isolation_level=None: transactions are begun explicitly (BEGIN / BEGIN IMMEDIATE).
        conn = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None)
        # WAL: readers (history queries) never block the writer, nor it them; a busy timeout makes
        # two writers of one file wait for each other instead of failing at once. NORMAL
        # synchronous is durable in WAL mode up to the last commit before a power cut.
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.Error as exc:
        raise _sqlite_error(url, exc) from None
    if created:
        owner_only(path)
    return conn


def _check_sqlite_file(url: StoreUrl, path: Path) -> None:
    """A regular file that is empty or starts as SQLite's do. Opened non-blocking and checked
    before a byte is read: a FIFO where the store should be would block any plain open (and
    SQLite's) until a writer came, past every timeout."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreUnavailable(f"{url.shown}: {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreUnavailable(f"{url.shown}: {path} is not a regular file, so not a SQLite database")
        head = fh.read(len(SQLITE_MAGIC))
    if head and head != SQLITE_MAGIC:
        raise StoreCorrupt(f"{url.shown}: {path} is not a SQLite database")


def _connect_pg(url: StoreUrl, timeout_s: float):
    try:
        import psycopg  # only for a PostgreSQL store: optional, 'pip install preflight-gpu[postgres]'
    except ImportError:
        raise StoreUnavailable(f"{url.shown}: a PostgreSQL store needs psycopg 3 "
                               "(pip install 'preflight-gpu[postgres]')") from None
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            conn = psycopg.connect(url.target, connect_timeout=max(1, int(timeout_s)),
                                   application_name="preflight", autocommit=False)
            _bound_waits(conn, timeout_s)
            return conn
        except psycopg.Error as exc:
            err = _pg_error(url, exc)
            # A server at its connection limit ("too many clients"), one starting up, or a unix
            # socket whose accept queue is full (EAGAIN: a thousand healthchecks in one second)
            # is worth waiting for. psycopg's connect errors carry no SQLSTATE: the words decide.
            text = str(exc)
            transient = err.retryable or any(w in text for w in _TRANSIENT_CONNECT)
            if not transient or time.monotonic() + delay > deadline:
                raise err from None
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 1.0)


def _bound_waits(conn, timeout_s: float) -> None:
    """No statement of this session waits on another's lock, or runs, past the store's timeout:
    PostgreSQL's defaults (0, no limit) let a session holding a table (LOCK TABLE, a VACUUM
    FULL, a migration left open) stall every healthcheck and ``history`` without end. Session
    settings (``set_config(..., false)``), committed so that they outlive this transaction."""
    # The lock's limit a little below the statement's: a wait on a lock then says so
    # ("canceling statement due to lock timeout") rather than "statement timeout".
    lock_ms, statement_ms = max(1, int(timeout_s * 900)), max(1, int(timeout_s * 1000))
    try:
        conn.execute("SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
                     (f"{lock_ms}ms", f"{statement_ms}ms"))
        conn.commit()
    except BaseException:
        conn.close()
        raise


def owner_only(path: Path) -> None:
    """A new SQLite file readable by its owner alone: it names every node and its faults."""
    with contextlib.suppress(OSError):
        os.chmod(path, 0o600)
