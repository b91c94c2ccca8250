"""The store loses nothing and never hangs (issue 31): run ids that cannot collide, a reused id
told from a re-recording, times a reader can find, imports that are all or nothing, text either
engine can hold, timeouts that bound every wait, and a schema created once by writers at once.
Each on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable

import pytest
from runs import report

from preflight.store import Store, StoreUnavailable, parse, schema
from preflight.store.read import Window, node_history
from preflight.store.rows import rows_of


def record(url: str, rep: dict, **kw) -> object:
    with Store.open(parse(url)) as store:
        return store.record(rows_of(rep, started_fallback=0.0, **kw))


def at_once(n: int, work: Callable[[int], object]) -> list[str]:
    """``work(i)`` in ``n`` threads released together; the errors they raised."""
    errors: list[str] = []
    start = threading.Barrier(n)

    def one(i: int) -> None:
        try:
            start.wait()
            work(i)
        except Exception as exc:  # noqa: BLE001 - collected for the caller to assert
            errors.append(repr(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.mark.parametrize("attempt", range(3))  # a race: three fresh databases
def test_eight_writers_reaching_an_empty_postgresql_create_the_schema_once(pg, attempt):
    """Eight controllers opening one new database at the same instant: before the fix 7 of the 8
    failed with 'relation "pf_runs" already exists' (the catalog lookup of a transaction begun
    before the migration lock was granted did not see the winner's tables)."""
    url = pg.create_database(f"race{attempt}")
    assert at_once(8, lambda i: Store.open(parse(url)).close()) == []
    with Store.open(parse(url)) as store:
        assert store.rows("SELECT COUNT(*) FROM pf_schema") == [(len(schema.MIGRATIONS),)]


@contextlib.contextmanager
def table_locked(url: str, table: str):
    """Another session holding ``table`` as a migration or a VACUUM FULL would: on PostgreSQL
    LOCK TABLE ... IN ACCESS EXCLUSIVE MODE (no reader or writer passes), on SQLite a write lock."""
    if url.startswith("sqlite"):
        holder = sqlite3.connect(parse(url).target, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
    else:
        import psycopg

        holder = psycopg.connect(url)
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    try:
        yield
    finally:
        holder.rollback()
        holder.close()


def bounded(work: Callable[[], object], limit_s: float) -> object:
    """``work()``'s result or exception, failing the test (not hanging it) past ``limit_s``."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = work()
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    began = time.monotonic()
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still waiting after {limit_s} s"
    box["took"] = time.monotonic() - began
    return box


def test_a_locked_table_costs_the_store_timeout_not_a_hang(store_url):
    """While another session holds the runs table, recording and reading give up after the
    store's timeout (PostgreSQL waited without end before: no lock or statement timeout)."""
    record(store_url, report("r1", 1, {"n1": {"fail": ["xid"]}}))
    with table_locked(store_url, "pf_runs"):
        def write() -> object:
            with Store.open(parse(store_url), timeout_s=1.0) as store:
                return store.record(rows_of(report("r2", 2, {"n1": {}}), started_fallback=0.0))

        def read() -> object:
            with Store.open(parse(store_url), timeout_s=1.0) as store:
                return node_history(store, "n1", Window(0))

        for work in (write, read) if store_url.startswith("postgresql") else (write,):
            out = bounded(work, 15)
            assert isinstance(out.get("error"), StoreUnavailable), out
            assert "lock" in str(out["error"]) and out["took"] < 8
