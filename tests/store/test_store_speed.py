"""The store's queries at fleet size (issue 31): what a query reads is bounded by its answer and
its window, not by the history around it. Counted, not timed (the times are bench/bench_store.py's):
the statements a command issues, and on SQLite the virtual machine's steps, which grow with the
rows a statement visits."""

from __future__ import annotations

import pytest
from runs import T0, report

from preflight.store import Store, parse
from preflight.store.read import UnknownNode, Window, fleet, node_history
from preflight.store.rows import rows_of

NEIGHBOURS = [f"gpu{i:03d}" for i in range(1, 10)] + ["login01"]


def record(store: Store, rep: dict) -> None:
    # The histories run from runs.T0 for up to 120 days: recorded as by a clock at their end, so
    # that the store's bound on start times (a day past the recording clock) holds whatever today is.
    assert store.record(rows_of(rep, started_fallback=0.0, now=T0.timestamp() + 365 * 86400))


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


def fetched(store: Store, monkeypatch) -> list[int]:
    """The number of rows each statement from now on brings into Python."""
    sizes: list[int] = []
    rows = store.rows

    def counting(sql, params=()):
        out = rows(sql, params)
        sizes.append(len(out))
        return out

    monkeypatch.setattr(store, "rows", counting)
    return sizes


def test_the_fleets_reads_follow_its_answer_not_the_runs_in_its_window(store_url, monkeypatch):
    """120 daily runs of four nodes; gpu02 fails three times in the last month, flapping. Over
    the last 30 days and over all 120 the answers' rows are the same, and so are the rows read:
    the passing runs between are not fetched (they were, for every node that failed once)."""
    with Store.open(parse(store_url)) as store:
        for day in range(120):
            nodes = {f"gpu{i:02d}": {"busbw": 470.0 + (day * 7 + i) % 5} for i in range(4)}
            if day in (95, 100, 105):
                nodes["gpu02"].update(fail=["nvlink"], causes=["nvlink-down"])
            record(store, report(f"d{day:03d}", day, nodes))
        end = store.rows("SELECT MAX(started) FROM pf_runs")[0][0]
        sizes = fetched(store, monkeypatch)
        month = fleet(store, Window(end - 30 * 86400, end))
        read_month = sum(sizes)
        sizes.clear()
        year = fleet(store, Window(0, end))
        read_year = sum(sizes)
    assert [f["node"] for f in month["flapping"]] == [f["node"] for f in year["flapping"]] == ["gpu02"]
    assert month["nodes"] == year["nodes"] == 4 and year["host_runs"] == 480
    assert read_year <= read_month, (read_month, read_year)


def test_a_long_timeline_shows_its_latest_runs_and_counts_the_rest(store_url):
    with Store.open(parse(store_url)) as store:
        for day in range(40):
            record(store, report(f"d{day:03d}", day, {"gpu01": {"fail": ["xid"]} if day % 10 == 0 else {}}))
        end = store.rows("SELECT MAX(started) FROM pf_runs")[0][0]
        whole = node_history(store, "gpu01", Window(0, end))
        latest = node_history(store, "gpu01", Window(0, end), last=5)
    assert latest["runs"] == whole["runs"][-5:] and len(whole["runs"]) == 40
    assert (latest["runs_total"], latest["failing_total"], latest["events_total"]) == (40, 4, 0)
    assert "runs_total" not in whole  # the whole timeline's keys are docs/store.md's, unchanged


def test_the_text_timeline_says_how_many_runs_it_leaves_out(tmp_path, capsys):
    from preflight.app import cli

    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with Store.open(parse(url)) as store:
        for day in range(12):
            record(store, report(f"d{day:03d}", day, {"gpu01": {}}))
    assert cli.main(["history", "gpu01", "--since", "2026-10-01", "--last", "3", "--db", url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gpu01: 12 run(s) since") and "9 earlier run(s)" in out[1]
    assert [line.split()[3] for line in out[2:]] == ["d009", "d010", "d011"]
    assert cli.main(["history", "gpu01", "--since", "2026-10-01", "--last", "0", "--db", url]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 13
    assert cli.main(["history", "gpu01", "--last", "-1", "--db", url]) == 2
    assert "--last: -1" in capsys.readouterr().err


def test_the_fast_times_are_iso_to_the_second():
    import random

    from preflight.store.read import isos
    from preflight.store.rows import iso

    rng = random.Random(31)
    edges = [0.0, -0.5, -1e-7, 0.9999995, 0.99999949, 1.4999995, 86399.9999996, 1796292016.9999995,
             1764756016.213562, 951782400.0, 4102444799.9999999, -86400.0 * 365 * 80 + 0.25]
    times = edges + [rng.uniform(-3e9, 5e9) for _ in range(20000)] + [rng.randrange(0, 2**32) + k / 8 for k in range(8)]
    assert isos(times) == [iso(t) for t in times]


@pytest.mark.parametrize("name", ["gpu07", "gpu7", "GPU0007"])
def test_did_you_mean_puts_the_same_number_first(store_url, monkeypatch, name):
    # Issue 34: `history gpu07` suggested gpu001...gpu005, the names sharing its longest prefix
    # ("gpu0"), but not gpu007: in a 64-node fleet gpu007 is not even among the neighbours of
    # "gpu07" in sorted order (gpu060...gpu064 are).
    fleet64 = [f"gpu{i:03d}" for i in range(1, 65)]
    with Store.open(parse(store_url)) as store:
        record(store, report("r1", 1, {n: {} for n in fleet64}))
        seen = counted(store, monkeypatch)
        with pytest.raises(UnknownNode) as err:
            node_history(store, name, Window(0))
    like = str(err.value).rsplit("like it: ", 1)[1].split(", ")
    assert like[0] == "gpu007" and len(like) == 5 and like.count("gpu007") == 1
    assert len(seen) == 5  # still one statement for the did-you-mean
