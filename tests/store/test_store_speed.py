"""The store's queries at fleet size (issue 31): what a query reads is bounded by its answer and
its window, not by the history around it. Counted, not timed (the times are bench/bench_store.py's):
the statements a command issues, and on SQLite the virtual machine's steps, which grow with the
rows a statement visits."""

from __future__ import annotations

import pytest
from runs import report

from preflight.store import Store, parse
from preflight.store.read import UnknownNode, Window, node_history
from preflight.store.rows import rows_of

NEIGHBOURS = [f"gpu{i:03d}" for i in range(1, 10)] + ["login01"]


def record(store: Store, rep: dict) -> None:
    assert store.record(rows_of(rep, started_fallback=0.0))


def counted(store: Store, monkeypatch) -> list[str]:
    """Every statement the store runs from now on."""
    seen: list[str] = []
    rows = store.rows

    def counting(sql, params=()):
        seen.append(sql)
        return rows(sql, params)

    monkeypatch.setattr(store, "rows", counting)
    return seen


def test_an_unknown_long_name_costs_one_lookup_not_one_per_prefix(store_url, monkeypatch):
    with Store.open(parse(store_url)) as store:
        record(store, report("r1", 1, {n: {} for n in NEIGHBOURS}))
        seen = counted(store, monkeypatch)
        with pytest.raises(UnknownNode, match="recorded nodes like it: gpu") as err:
            node_history(store, "gpu00x" + "9" * 10_000, Window(0))
    like = str(err.value).rsplit("like it: ", 1)[1].split(", ")
    assert 1 <= len(like) <= 5 and all(name.startswith("gpu00") for name in like)
    # The timeline's four statements (runs, events, and whether the node was ever seen), then the
    # did-you-mean: one, where each of the 10,006 prefixes of the name used to be one.
    assert len(seen) == 5, seen[4:8]


@pytest.mark.parametrize("name", ["GPU00", "gpu%_x", "zzz"])
def test_did_you_mean_finds_the_longest_shared_prefix(store_url, name):
    with Store.open(parse(store_url)) as store:
        record(store, report("r1", 1, {n: {} for n in [*NEIGHBOURS, "gpu%_"]}))
        with pytest.raises(UnknownNode) as err:
            node_history(store, name, Window(0))
    said = str(err.value)
    if name == "zzz":
        assert "like it" not in said  # no name shares even its first letter
    elif name == "GPU00":  # a name typed in the wrong case still finds its neighbours
        assert said.endswith("like it: gpu001, gpu002, gpu003, gpu004, gpu005"), said
    else:  # LIKE's wildcards, were they still used, would match every gpu name
        assert said.endswith("like it: gpu%_"), said


def _steps_of_lookup(tmp_path, runs: int) -> int:
    """SQLite VM steps (in hundreds) of the did-you-mean for an unknown name, on a store where
    gpu005 has ``runs`` runs and its nine neighbours one each."""
    url = f"sqlite:///{tmp_path / f'steps{runs}.sqlite'}"
    with Store.open(parse(url)) as store:
        record(store, report("r0", 0, {n: {} for n in NEIGHBOURS}))
        for k in range(1, runs):
            record(store, report(f"r{k}", k / 100, {"gpu005": {}}))
        steps = [0]

        def tick() -> int:
            steps[0] += 1
            return 0

        store.conn.set_progress_handler(tick, 100)
        with pytest.raises(UnknownNode, match="gpu005"):
            node_history(store, "gpu005x" + "y" * 200, Window(0))
        store.conn.set_progress_handler(None, 100)
    return steps[0]


def test_the_did_you_mean_does_not_read_a_nodes_runs(tmp_path):
    """A node with 400 runs beside the unknown name costs the lookup what one run does."""
    few, many = _steps_of_lookup(tmp_path, 2), _steps_of_lookup(tmp_path, 400)
    assert many <= few + 2, (few, many)
