"""The store's tests run on both engines: SQLite in a temporary file, and a real PostgreSQL
server (tests/pgcluster.py, the ``pg`` fixture of tests/conftest.py) with a database of its own
per test."""

from __future__ import annotations

import itertools

import pytest

_names = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return request.getfixturevalue("pg").create_database(f"t{next(_names)}")
