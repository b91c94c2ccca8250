"""The store loses nothing and never hangs (issue 31): run ids that cannot collide, a reused id
told from a re-recording, times a reader can find, imports that are all or nothing, text either
engine can hold, timeouts that bound every wait, and a schema created once by writers at once.
Each on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from preflight.store import Store, parse, schema


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
