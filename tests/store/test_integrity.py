"""The store loses nothing and never hangs (issue 31): run ids that cannot collide, a reused id
told from a re-recording, times a reader can find, imports that are all or nothing, text either
engine can hold, timeouts that bound every wait, and a schema created once by writers at once.
Each on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone

import pytest
from runs import report

from preflight.evidence.bundle import new_run_id
from preflight.store import SchemaMismatch, Store, StoreUnavailable, parse, schema
from preflight.store.read import Window, node_history
from preflight.store.rows import ReportShapeError, rows_of


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


def test_run_ids_of_one_second_are_unique_and_keep_their_shape():
    """A thousand nodes' healthchecks started on one Slurm tick, three runs each: 3,000 ids of
    one second. The old shape (16 random bits) collided with near certainty at this size."""
    tick = datetime(2026, 12, 3, 9, 45, tzinfo=timezone.utc)
    ids = [new_run_id(f"gpu{i:04d}.cluster.example", tick) for i in range(1000) for _ in range(3)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"20261203-094500-gpu\d{4}\.cluster\.example-[0-9a-f]{16}", i) for i in ids)
    # A name a file name cannot hold whole (a lone surrogate, a slash) is reduced, never refused.
    odd = new_run_id("n\udcff/1", tick)
    assert re.fullmatch(r"20261203-094500-n_1-[0-9a-f]{16}", odd) and odd.encode()
    assert re.fullmatch(r"20261203-094500-[0-9a-f]{16}", new_run_id(None, tick))


def test_a_reused_run_id_is_kept_apart_and_a_rerecording_adds_nothing(store_url):
    """Two healthchecks of two nodes that drew one id: the second was dropped without a word by
    ON CONFLICT DO NOTHING. Now it is kept under a derived id that says so; recording either
    again (an import after the live record) adds nothing."""
    first = report("healthcheck-20261101-000000-1a2b", 1, {"n1": {"fail": ["xid"], "causes": ["gpu-fallen-off-bus"]}})
    second = report("healthcheck-20261101-000000-1a2b", 1, {"n2": {"fail": ["nvlink"], "causes": ["nvlink-down"]}})
    with Store.open(parse(store_url)) as store:
        (a,) = store.record_all([rows_of(first, started_fallback=0.0)])
        (b,) = store.record_all([rows_of(second, started_fallback=0.0)])
        again = store.record_all([rows_of(first, started_fallback=0.0), rows_of(second, started_fallback=0.0)])
        assert (a.added, a.renamed_from) == (True, None)
        assert b.added and b.renamed_from == first["run_id"]
        assert re.fullmatch(r"healthcheck-20261101-000000-1a2b~[0-9a-f]{12}", b.run_id)
        assert [(d.run_id, d.added) for d in again] == [(a.run_id, False), (b.run_id, False)]
        assert store.rows("SELECT COUNT(*) FROM pf_runs") == [(2,)]
        (n2,) = node_history(store, "n2", Window(0))["runs"]
        assert n2["run_id"] == b.run_id and n2["causes"][0]["cause"] == "nvlink-down"
        assert node_history(store, "n1", Window(0))["runs"][0]["run_id"] == a.run_id


def test_eight_runs_recorded_at_once_under_one_id_are_all_kept(store_url):
    """Eight bundles analysed at once under one id (as `analyze-<second>` was): before, the store
    kept one or two of them."""
    Store.open(parse(store_url)).close()
    assert at_once(8, lambda i: record(store_url, report("analyze-20261101-000000", 1, {f"n{i}": {}}))) == []
    with Store.open(parse(store_url)) as store:
        assert store.rows("SELECT COUNT(*), COUNT(DISTINCT host) FROM pf_host_results") == [(8, 8)]
        assert store.rows("SELECT COUNT(*) FROM pf_runs WHERE run_id LIKE 'analyze-20261101-000000%'") == [(8,)]


def test_a_version_2_store_migrates_and_its_runs_are_still_matched_by_id(store_url):
    """A store as the release before this one wrote it (schema 2, no fingerprints): refused until
    migrated, then its runs are all there, a re-import of one of them adds nothing (matched by id
    alone, as before), and a new run gets its fingerprint."""
    old = report("run-old", 1, {"n1": {"fail": ["xid"]}})
    with Store.connect(parse(store_url)) as store:
        assert store.migrate(upto=2) == [1, 2]
        r = rows_of(old, started_fallback=0.0).run

        def release_2(s: Store) -> None:  # what schema 2's Store.record wrote for one run
            s.execute("INSERT INTO pf_runs (run_id, kind, started, duration_s, launcher, version, command, status, "
                      "checks, hosts, recorded, report_dir) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (r.run_id, r.kind, r.started, None, r.launcher, r.version, None, r.status, r.checks, r.hosts,
                       r.started, "/reports/run-old"))
            s.execute("INSERT INTO pf_host_results VALUES (?, 'n1', ?, 'fail', 1, 'hgx-h200')", (r.run_id, r.started))

        store.write(release_2)
    with pytest.raises(SchemaMismatch, match=r"version 2; this preflight reads version 3"):
        Store.open(parse(store_url))
    with Store.connect(parse(store_url)) as store:
        assert store.migrate() == [3]
    with Store.open(parse(store_url)) as store:
        assert store.record(rows_of(old, started_fallback=0.0)) is False
        assert store.record(rows_of(report("run-new", 2, {"n1": {}}), started_fallback=0.0)) is True
        assert store.rows("SELECT run_id, report_dir, fingerprint IS NULL FROM pf_runs ORDER BY run_id") == [
            ("run-new", None, False), ("run-old", "/reports/run-old", True)]
        assert [x["run_id"] for x in node_history(store, "n1", Window(0))["runs"]] == ["run-old", "run-new"]


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("started_at", 1_795_000_000_000.0, "1795000000000.0"),  # milliseconds: the year 58,850
    ("started_at", float("nan"), "nan"),
    ("started_at", -5.0, "-5.0"),
    ("created", "2999-01-01T00:00:00+00:00", "2999-01-01T00:00:00+00:00"),
    ("created", "1970-01-02T00:00:00", "1970-01-02T00:00:00+00:00"),
])
def test_a_start_time_that_cannot_be_is_refused_naming_its_field(field, value, shown):
    rep = {**report("r1", 1, {"n1": {}}), field: value}
    with pytest.raises(ReportShapeError, match=rf"^{field}: the run cannot have started at {re.escape(shown)}"):
        rows_of(rep, started_fallback=0.0)


def test_a_writer_whose_clock_is_ahead_is_recorded():
    now = datetime(2026, 11, 1, tzinfo=timezone.utc).timestamp()
    ahead = {**report("r1", 0, {"n1": {}}), "started_at": now + 3 * 3600}
    assert rows_of(ahead, started_fallback=0.0, now=now).run.started == now + 3 * 3600


def test_text_neither_engine_could_hold_is_stored_escaped(store_url):
    """NUL in a probe's output reaching a finding's summary (PostgreSQL's text refuses NUL: the
    run could be recorded neither live nor later), and names that were not UTF-8 (lone
    surrogates, which no driver encodes): stored with the escapes Python prints, and found by
    the same name."""
    host, run_id = "gpu\udcff1", "run-\udcfe"
    rep = report(run_id, 1, {host: {"fail": ["xid"]}})
    rep["findings"][0]["summary"] = "Xid 79\x00\x00 on GPU 0"
    assert record(store_url, rep) is True
    with Store.open(parse(store_url)) as store:
        (run,) = node_history(store, host, Window(0))["runs"]
        assert store.rows("SELECT summary FROM pf_findings") == [("Xid 79\\x00\\x00 on GPU 0",)]
    assert run["run_id"] == "run-\\udcfe" and run["findings"][0]["summary"] == "Xid 79\\x00\\x00 on GPU 0"
    assert record(store_url, rep) is False  # the same run, found again by its (escaped) id


def test_runs_recorded_together_are_all_or_nothing(store_url):
    """record_all is one transaction: a run the database refuses (here a host listed twice,
    against pf_host_results' key) takes the runs before it in the batch with it."""
    good = rows_of(report("good", 1, {"n1": {}}), started_fallback=0.0)
    bad = rows_of(report("bad", 1, {"n2": {}}), started_fallback=0.0)
    bad.hosts.append(bad.hosts[0])
    with Store.open(parse(store_url)) as store:
        with pytest.raises(StoreUnavailable):
            store.record_all([good, bad])
        assert store.rows("SELECT COUNT(*) FROM pf_runs") == [(0,)]
        assert store.rows("SELECT COUNT(*) FROM pf_host_results") == [(0,)]


def test_a_fifo_where_the_store_file_should_be_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "store.sqlite"
    os.mkfifo(fifo)
    out = bounded(lambda: Store.open(parse(f"sqlite:///{fifo}"), timeout_s=1.0), 10)
    assert isinstance(out.get("error"), StoreUnavailable), out
    assert f"{fifo} is not a regular file" in str(out["error"])


def test_a_migration_lock_held_elsewhere_costs_the_timeout(pg):
    """A controller stuck mid-migration (its session holds the advisory lock): another that
    opens the empty store gives up after its timeout rather than waiting for ever."""
    import psycopg

    from preflight.store.db import _MIGRATION_LOCK

    url = pg.create_database("stuck")
    with psycopg.connect(url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        out = bounded(lambda: Store.open(parse(url), timeout_s=1.0), 15)
    assert isinstance(out.get("error"), StoreUnavailable) and "lock timeout" in str(out["error"]), out
    assert out["took"] < 8
    Store.open(parse(url)).close()  # and once it is let go, the store is made
